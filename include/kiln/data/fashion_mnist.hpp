// kiln/data/fashion_mnist.hpp: Fashion-MNIST from the gzipped IDX files.
//
// Reads the files Debian's dataset-fashion-mnist package installs, whole, into tensors.
// Every way the files can be wrong ends in a kiln::data_error naming the file and the cause,
// because a bad dataset should stop a run before training starts, not corrupt it silently.
#pragma once

#include <torch/torch.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "kiln/data/source.hpp"
#include "kiln/data/tensor_pair.hpp"
#include "kiln/errors.hpp"
#include "kiln/settings/fields.hpp"

namespace kiln::data {

enum class split { train, test };

inline const std::filesystem::path default_fashion_mnist_dir{"/usr/share/datasets/fashion-mnist"};

}  // namespace kiln::data

namespace kiln::detail {

struct gz_closer {
  void operator()(gzFile file) const { gzclose(file); }
};
using gz_handle = std::unique_ptr<gzFile_s, gz_closer>;

[[noreturn]] inline void fail_idx(const std::filesystem::path& path, const std::string& cause) {
  throw data_error("fashion-mnist: " + path.string() + ": " + cause);
}

// Reads up to `size` bytes; fewer means the stream ended early. A stream that is cut
// mid-deflate-block reports a zlib error instead of a short count: that is truncation too.
inline std::uint64_t gz_read_up_to(gzFile file, void* buffer, std::uint64_t size,
                                   const std::filesystem::path& path) {
  auto* out = static_cast<unsigned char*>(buffer);
  std::uint64_t done = 0;
  while (done < size) {
    const std::uint64_t chunk = std::min<std::uint64_t>(size - done, 1u << 30);
    const int got = gzread(file, out + done, static_cast<unsigned>(chunk));
    if (got < 0) {
      int code = 0;
      const char* message = gzerror(file, &code);
      fail_idx(path, std::string("truncated or corrupt gzip data (zlib: ") +
                         (message ? message : "unknown error") + ")");
    }
    if (got == 0) break;
    done += static_cast<std::uint64_t>(got);
  }
  return done;
}

inline std::uint32_t read_big_endian_u32(gzFile file, const std::filesystem::path& path,
                                         const char* what) {
  unsigned char bytes[4];
  if (gz_read_up_to(file, bytes, 4, path) != 4)
    fail_idx(path, std::string("truncated file: it ends inside the IDX header (") + what + ")");
  return (std::uint32_t{bytes[0]} << 24) | (std::uint32_t{bytes[1]} << 16) |
         (std::uint32_t{bytes[2]} << 8) | std::uint32_t{bytes[3]};
}

struct idx_contents {
  std::vector<std::int64_t> dims;
  torch::Tensor bytes;  // uint8, flat
};

// IDX: big-endian magic (0x00000800 | element type << 8 ... | number of dims), one u32 per
// dim, then the elements. Fashion-MNIST uses unsigned bytes only: 0x803 images, 0x801 labels.
inline idx_contents read_idx_gz(const std::filesystem::path& path, std::uint32_t magic,
                                const char* kind) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    fail_idx(path, "file not found (install Debian's dataset-fashion-mnist package or set "
                   "[data] path)");
  const auto compressed_size = std::filesystem::file_size(path, ec);

  gz_handle file(gzopen(path.c_str(), "rb"));
  if (!file) fail_idx(path, "cannot open the file");
  gzbuffer(file.get(), 1u << 20);

  const std::uint32_t found = read_big_endian_u32(file.get(), path, "magic number");
  if (found != magic) {
    char text[128];
    std::snprintf(text, sizeof text, "bad magic number 0x%08x, expected 0x%08x (IDX %s)",
                  static_cast<unsigned>(found), static_cast<unsigned>(magic), kind);
    fail_idx(path, text);
  }

  idx_contents idx;
  std::uint64_t total = 1;
  for (std::uint32_t i = 0; i < (magic & 0xffu); ++i) {
    const std::uint32_t dim = read_big_endian_u32(file.get(), path, "dimensions");
    idx.dims.push_back(dim);
    total *= dim;
    // Checked per dim so the product cannot overflow; no real IDX file is near 1 TiB.
    if (total > (std::uint64_t{1} << 40))
      fail_idx(path, "corrupt header: it promises more than 2^40 bytes of data");
  }
  // Deflate cannot expand data more than ~1032:1, so a header promising more than that is a
  // cut-off file (or a corrupt header); say so before trying to allocate it.
  if (!ec && total > compressed_size * 1100 + (1u << 20))
    fail_idx(path, "truncated file: the header promises " + std::to_string(total) +
                       " bytes of data, more than a " + std::to_string(compressed_size) +
                       "-byte gzip file can hold");

  idx.bytes = torch::empty({static_cast<std::int64_t>(total)}, torch::kUInt8);
  const std::uint64_t got =
      gz_read_up_to(file.get(), idx.bytes.data_ptr<std::uint8_t>(), total, path);
  if (got < total)
    fail_idx(path, "truncated file: the header promises " + std::to_string(total) +
                       " bytes of data but only " + std::to_string(got) + " follow");
  return idx;
}

}  // namespace kiln::detail

namespace kiln::data {

// inputs: float32 [N, 1, 28, 28], standardised with the training set's mean and std;
// targets: int64 [N] in [0, 9]. N is 60000 for train, 10000 for test.
inline tensor_pair load_fashion_mnist(const std::filesystem::path& dir, split s) {
  const std::string prefix = s == split::train ? "train" : "t10k";
  const auto images_path = dir / (prefix + "-images-idx3-ubyte.gz");
  const auto labels_path = dir / (prefix + "-labels-idx1-ubyte.gz");

  auto images = detail::read_idx_gz(images_path, 0x00000803u, "images, 3 dims of unsigned bytes");
  auto labels = detail::read_idx_gz(labels_path, 0x00000801u, "labels, 1 dim of unsigned bytes");

  const std::int64_t n = images.dims[0], rows = images.dims[1], cols = images.dims[2];
  if (labels.dims[0] != n)
    throw data_error("fashion-mnist: " + images_path.string() + " holds " + std::to_string(n) +
                     " images but " + labels_path.string() + " holds " +
                     std::to_string(labels.dims[0]) + " labels (count mismatch)");
  if (n > 0 && labels.bytes.max().item<std::int64_t>() > 9)
    detail::fail_idx(labels_path, "label " + std::to_string(labels.bytes.max().item<std::int64_t>()) +
                                      " is out of range [0, 9]");

  // Mean 0.2860 and std 0.3530 of the training pixels (scaled to [0, 1]); the test split
  // uses the same constants, as it must.
  constexpr double mean = 0.2860, std_dev = 0.3530;
  tensor_pair pair;
  pair.inputs = images.bytes.view({n, 1, rows, cols})
                    .to(torch::kFloat)
                    .mul_(1.0 / (255.0 * std_dev))
                    .sub_(mean / std_dev);
  pair.targets = labels.bytes.to(torch::kLong);
  return pair;
}

// The [data] kind "fashion-mnist" of a recipe (kiln/recipe/components.hpp): the 60000
// training images, evaluated on the 10000 test images.
struct fashion_mnist_settings {
  static constexpr std::string_view kind = "fashion-mnist";
  std::string path = "/usr/share/datasets/fashion-mnist";

  template <class V>
  void describe(V& v) {
    v.field("path", path, "folder with the *-ubyte.gz files", checks::not_empty);
  }
  loaded load(const data_request&) const {
    return {load_fashion_mnist(path, split::train), load_fashion_mnist(path, split::test), 10, targets::classes};
  }
};

}  // namespace kiln::data
