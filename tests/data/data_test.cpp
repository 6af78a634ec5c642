// Tests for kiln/data: the Fashion-MNIST reader on the real files and on broken ones written
// here, and the synthetic generators' determinism.
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "kiln/data/fashion_mnist.hpp"
#include "kiln/data/synthetic.hpp"

// doctest comes after the LibTorch headers: Debian's LibTorch is built with glog, whose
// CHECK macros would otherwise replace doctest's CHECK without a word.
#include <doctest/doctest.h>

#include <set>

#include "../temp_dir.hpp"
#include "../text_checks.hpp"

namespace fs = std::filesystem;

namespace {

using kiln::test::contains;
using kiln::test::temp_dir;

void put_u32(std::vector<unsigned char>& out, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<unsigned char>(v >> shift));
}

std::vector<unsigned char> idx_images(std::uint32_t magic, std::uint32_t promised, std::size_t actual) {
  std::vector<unsigned char> out;
  put_u32(out, magic);
  put_u32(out, promised);
  put_u32(out, 28);
  put_u32(out, 28);
  out.resize(out.size() + actual * 28 * 28, 7);
  return out;
}

std::vector<unsigned char> idx_labels(std::uint32_t count) {
  std::vector<unsigned char> out;
  put_u32(out, 0x00000801);
  put_u32(out, count);
  for (std::uint32_t i = 0; i < count; ++i) out.push_back(static_cast<unsigned char>(i % 10));
  return out;
}

void write_gz(const fs::path& path, const std::vector<unsigned char>& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  REQUIRE(file != nullptr);
  REQUIRE(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())) ==
          static_cast<int>(bytes.size()));
  REQUIRE(gzclose(file) == Z_OK);
}

std::string data_error_text(const fs::path& dir, kiln::data::split s = kiln::data::split::train) {
  try {
    kiln::data::load_fashion_mnist(dir, s);
  } catch (const kiln::data_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("fashion-mnist: the installed dataset loads") {
  if (!fs::exists(kiln::data::default_fashion_mnist_dir / "train-images-idx3-ubyte.gz")) {
    MESSAGE("skipped: Debian's dataset-fashion-mnist is not installed");
    return;
  }
  auto train = kiln::data::load_fashion_mnist(kiln::data::default_fashion_mnist_dir,
                                              kiln::data::split::train);
  CHECK(train.inputs.sizes() == torch::IntArrayRef({60000, 1, 28, 28}));
  CHECK(train.inputs.dtype() == torch::kFloat);
  CHECK(train.targets.sizes() == torch::IntArrayRef({60000}));
  CHECK(train.targets.dtype() == torch::kLong);
  CHECK(train.targets.min().item<std::int64_t>() == 0);
  CHECK(train.targets.max().item<std::int64_t>() == 9);
  CHECK(std::abs(train.inputs.mean().item<double>()) < 0.01);
  CHECK(train.inputs.std().item<double>() == doctest::Approx(1.0).epsilon(0.01));
  // Every class is present 6000 times in the training split.
  CHECK(torch::bincount(train.targets).eq(6000).all().item<bool>());

  auto test = kiln::data::load_fashion_mnist(kiln::data::default_fashion_mnist_dir,
                                             kiln::data::split::test);
  CHECK(test.inputs.sizes() == torch::IntArrayRef({10000, 1, 28, 28}));
  CHECK(test.targets.sizes() == torch::IntArrayRef({10000}));
  CHECK(test.targets.min().item<std::int64_t>() >= 0);
  CHECK(test.targets.max().item<std::int64_t>() <= 9);
}

TEST_CASE("fashion-mnist: a missing directory names the path and the package") {
  const fs::path missing = fs::temp_directory_path() / "kiln_no_such_dir_for_fashion_mnist";
  const auto text = data_error_text(missing);
  CHECK(contains(text, missing.string()));
  CHECK(contains(text, "dataset-fashion-mnist"));
}

TEST_CASE("fashion-mnist: broken files") {
  temp_dir dir("broken");
  const auto images = dir.path / "train-images-idx3-ubyte.gz";
  const auto labels = dir.path / "train-labels-idx1-ubyte.gz";

  SUBCASE("a header promising 100 images followed by 10") {
    write_gz(images, idx_images(0x00000803, 100, 10));
    write_gz(labels, idx_labels(100));
    const auto text = data_error_text(dir.path);
    CHECK(contains(text, "truncated"));
    CHECK(contains(text, images.string()));
  }
  SUBCASE("a gzip stream cut short") {
    write_gz(images, idx_images(0x00000803, 100, 100));
    write_gz(labels, idx_labels(100));
    const auto size = fs::file_size(images);
    fs::resize_file(images, size / 2);
    CHECK(contains(data_error_text(dir.path), "truncated"));
  }
  SUBCASE("wrong magic: a labels file where images should be") {
    write_gz(images, idx_labels(100));
    write_gz(labels, idx_labels(100));
    const auto text = data_error_text(dir.path);
    CHECK(contains(text, "magic"));
    CHECK(contains(text, images.string()));
  }
  SUBCASE("an empty file") {
    std::ofstream(images).close();
    write_gz(labels, idx_labels(100));
    CHECK(contains(data_error_text(dir.path), "truncated"));
  }
  SUBCASE("image and label counts differ") {
    write_gz(images, idx_images(0x00000803, 20, 20));
    write_gz(labels, idx_labels(30));
    const auto text = data_error_text(dir.path);
    CHECK(contains(text, "mismatch"));
    CHECK(contains(text, "20"));
    CHECK(contains(text, "30"));
  }
  SUBCASE("a missing labels file") {
    write_gz(images, idx_images(0x00000803, 20, 20));
    CHECK(contains(data_error_text(dir.path), labels.string()));
  }
  SUBCASE("small valid files load, uncompressed-size independent of the real dataset") {
    write_gz(images, idx_images(0x00000803, 20, 20));
    write_gz(labels, idx_labels(20));
    auto pair = kiln::data::load_fashion_mnist(dir.path, kiln::data::split::train);
    CHECK(pair.inputs.sizes() == torch::IntArrayRef({20, 1, 28, 28}));
    CHECK(pair.inputs[3][0][5][7].item<float>() ==
          doctest::Approx((7.0 / 255.0 - 0.2860) / 0.3530).epsilon(1e-5));
    CHECK(pair.targets[13].item<std::int64_t>() == 3);
  }
}

TEST_CASE("synthetic: make_classification is deterministic per seed and leaves torch's RNG alone") {
  torch::manual_seed(123);
  const auto before = torch::rand({4});
  torch::manual_seed(123);

  auto a = kiln::data::make_classification(500, 10, 3, 1);
  auto b = kiln::data::make_classification(500, 10, 3, 1);
  auto c = kiln::data::make_classification(500, 10, 3, 2);
  CHECK(torch::rand({4}).equal(before));

  CHECK(a.inputs.sizes() == torch::IntArrayRef({500, 10}));
  CHECK(a.inputs.dtype() == torch::kFloat);
  CHECK(a.targets.sizes() == torch::IntArrayRef({500}));
  CHECK(a.targets.dtype() == torch::kLong);
  CHECK(a.inputs.equal(b.inputs));
  CHECK(a.targets.equal(b.targets));
  CHECK(!a.inputs.equal(c.inputs));
  CHECK(a.targets.min().item<std::int64_t>() >= 0);
  CHECK(a.targets.max().item<std::int64_t>() <= 2);
  CHECK(std::abs(a.inputs.mean().item<double>()) < 0.05);
  CHECK(a.inputs.std().item<double>() == doctest::Approx(1.0).epsilon(0.05));
  // The teacher is centred, so no class is starved.
  auto counts = torch::bincount(a.targets, {}, 3);
  CHECK(counts.min().item<std::int64_t>() > 500 / 10);
}

TEST_CASE("synthetic: make_token_sequences is deterministic and learnable in structure") {
  torch::manual_seed(5);
  const auto before = torch::rand({4});
  torch::manual_seed(5);

  auto a = kiln::data::make_token_sequences(64, 32, 50, 1);
  auto b = kiln::data::make_token_sequences(64, 32, 50, 1);
  auto c = kiln::data::make_token_sequences(64, 32, 50, 2);
  CHECK(torch::rand({4}).equal(before));

  CHECK(a.inputs.sizes() == torch::IntArrayRef({64, 32}));
  CHECK(a.targets.sizes() == torch::IntArrayRef({64, 32}));
  CHECK(a.inputs.dtype() == torch::kLong);
  CHECK(a.targets.dtype() == torch::kLong);
  CHECK(a.inputs.equal(b.inputs));
  CHECK(a.targets.equal(b.targets));
  CHECK(!a.inputs.equal(c.inputs));
  CHECK(a.inputs.min().item<std::int64_t>() >= 0);
  CHECK(a.inputs.max().item<std::int64_t>() < 50);
  // targets are inputs shifted by one
  CHECK(a.inputs.slice(1, 1, 32).equal(a.targets.slice(1, 0, 31)));

  // Each token's successors concentrate on few tokens: the top 3 successors of a token
  // cover most of its transitions (0.95 + a little from the uniform part).
  auto big = kiln::data::make_token_sequences(400, 64, 50, 3);
  auto pairs = big.inputs.flatten() * 50 + big.targets.flatten();
  auto table = torch::bincount(pairs, {}, 50 * 50).view({50, 50}).to(torch::kDouble);
  auto top3 = std::get<0>(table.topk(3, 1)).sum(1) / table.sum(1);
  CHECK(top3.mean().item<double>() > 0.9);
}

TEST_CASE("synthetic: min_len pads variable-length token sequences with ignored targets") {
  const auto full = kiln::data::make_token_sequences(200, 16, 50, 4);
  const auto padded = kiln::data::make_token_sequences(200, 16, 50, 4, /*min_len=*/3);
  std::set<std::int64_t> lengths;
  for (std::int64_t row = 0; row < 200; ++row) {
    const auto real = padded.targets[row].ne(-100);
    const auto length = real.sum().item<std::int64_t>();
    lengths.insert(length);
    REQUIRE(length >= 3);
    REQUIRE(length <= 16);
    // Real tokens first, then padding: inputs 0, targets the ignore index.
    CHECK(real.slice(0, 0, length).all().item<bool>());
    CHECK(padded.inputs[row].slice(0, length).eq(0).all().item<bool>());
    // Before the padding, the tokens of the unpadded draw.
    CHECK(padded.inputs[row].slice(0, 0, length).equal(full.inputs[row].slice(0, 0, length)));
    CHECK(padded.targets[row].slice(0, 0, length).equal(full.targets[row].slice(0, 0, length)));
  }
  CHECK(lengths.size() == 14);  // every length from 3 to 16 occurs in 200 draws
  CHECK(kiln::data::make_token_sequences(8, 16, 50, 4, 16).targets.equal(
      kiln::data::make_token_sequences(8, 16, 50, 4).targets));
  CHECK_THROWS_WITH_AS(kiln::data::make_token_sequences(8, 16, 50, 4, 17),
                       doctest::Contains("min_len must be from 1 to seq_len (16), got 17"), kiln::config_error);
}
