// kiln/data/text.hpp: a byte-level language-modelling corpus from plain text files.
//
// Every byte is a token (vocabulary 256: no tokenizer to train or ship, and any text works).
// The files under a path are read in name order and joined into one token stream; its tail
// (eval_fraction of it) is held out for evaluation, so no evaluation window overlaps a training
// one. Each part is packed into fixed-length sequences that follow each other: sequence i reads
// tokens [i*L, i*L + L) and predicts [i*L + 1, i*L + L + 1), so every token but the first is a
// target exactly once per epoch and no padding is wasted (GPT-2's packing).
//
// Debian's `fortunes` package is the default corpus: about 1.3 MB of English text in
// /usr/share/games/fortunes. Its strfile indexes (*.dat) are binary and its *.u8 names are
// links to the text files; binary files (a NUL byte in the first 4 KiB) and links are skipped.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include <torch/torch.h>

#include "kiln/data/source.hpp"
#include "kiln/data/tensor_pair.hpp"
#include "kiln/errors.hpp"
#include "kiln/settings/fields.hpp"

namespace kiln::data {

inline constexpr std::int64_t byte_vocabulary = 256;
inline constexpr const char* default_text_path = "/usr/share/games/fortunes";

struct text_options {
  std::filesystem::path path = default_text_path;  // a file, or a folder read recursively
  std::int64_t seq_len = 128;                       // tokens per sequence
  double eval_fraction = 0.05;                      // the stream's tail held out for evaluation
};

struct text_corpus {
  tensor_pair train, eval;            // int64 [n, seq_len] inputs and next-token targets
  std::int64_t bytes = 0;             // tokens in the stream
  std::vector<std::filesystem::path> files;  // what was read, in order
};

}  // namespace kiln::data

namespace kiln::detail {

inline bool is_binary_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  char head[4096];
  in.read(head, sizeof head);
  return std::find(head, head + in.gcount(), '\0') != head + in.gcount();
}

// The text files a corpus path names, in a fixed order.
inline std::vector<std::filesystem::path> text_files(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code error;
  const auto status = fs::status(path, error);
  if (!fs::exists(status))
    throw data_error("text corpus " + path.string() + " does not exist" +
                     (path == data::default_text_path ? " (Debian: apt-get install fortunes)" : ""));
  if (fs::is_regular_file(status)) return {path};
  std::vector<fs::path> files;
  for (const auto& entry : fs::recursive_directory_iterator(path)) {
    if (entry.is_symlink() || !entry.is_regular_file() || is_binary_file(entry.path())) continue;
    files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) throw data_error("text corpus " + path.string() + " has no text files (binary files and links are skipped)");
  return files;
}

// Sequences of seq_len tokens packed back to back from `tokens`, with their next-token targets.
inline data::tensor_pair pack_sequences(const torch::Tensor& tokens, std::int64_t seq_len) {
  const auto n = (tokens.numel() - 1) / seq_len;
  // unfold with step seq_len: row i is tokens[i*L, i*L + L], the last token shared with row i+1.
  auto windows = tokens.slice(0, 0, n * seq_len + 1).unfold(0, seq_len + 1, seq_len);
  return {windows.slice(1, 0, seq_len).contiguous(), windows.slice(1, 1, seq_len + 1).contiguous()};
}

}  // namespace kiln::detail

namespace kiln::data {

inline text_corpus load_text(const text_options& options) {
  if (options.seq_len < 1) throw data_error("text corpus: seq_len must be >= 1, got " + std::to_string(options.seq_len));
  if (!(options.eval_fraction > 0.0 && options.eval_fraction < 1.0))
    throw data_error("text corpus: eval_fraction must be in (0, 1), got " + std::to_string(options.eval_fraction));

  text_corpus corpus;
  corpus.files = detail::text_files(options.path);
  std::vector<std::uint8_t> bytes;
  for (const auto& file : corpus.files) {
    std::ifstream in(file, std::ios::binary);
    if (!in) throw data_error("text corpus: cannot read " + file.string());
    bytes.insert(bytes.end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  corpus.bytes = static_cast<std::int64_t>(bytes.size());

  const auto tokens = torch::from_blob(bytes.data(), {corpus.bytes}, torch::kUInt8).to(torch::kInt64);
  const auto eval_tokens = static_cast<std::int64_t>(static_cast<double>(corpus.bytes) * options.eval_fraction);
  const auto train_tokens = corpus.bytes - eval_tokens;
  if (eval_tokens < options.seq_len + 1 || train_tokens < options.seq_len + 1)
    throw data_error("text corpus " + options.path.string() + " has " + std::to_string(corpus.bytes) +
                     " bytes: too few for one training and one evaluation sequence of " +
                     std::to_string(options.seq_len) + " tokens with eval_fraction " +
                     std::to_string(options.eval_fraction));
  corpus.train = detail::pack_sequences(tokens.slice(0, 0, train_tokens), options.seq_len);
  corpus.eval = detail::pack_sequences(tokens.slice(0, train_tokens), options.seq_len);
  return corpus;
}

// The [data] kind "text" of a recipe (kiln/recipe/components.hpp): byte-level language modelling.
struct text_settings {
  static constexpr std::string_view kind = "text";
  std::string path = default_text_path;
  std::int64_t seq_len = 64;
  double eval_fraction = 0.05;

  template <class V>
  void describe(V& v) {
    v.field("path", path, "a text file, or a folder of them read recursively (byte tokens)", checks::not_empty);
    v.field("seq_len", seq_len, "tokens per packed sequence", checks::positive);
    v.field("eval_fraction", eval_fraction, "share of the token stream held out for evaluation (its tail)",
            checks::in_range(0.001, 0.5));
  }
  loaded load(const data_request&) const {
    auto corpus = load_text({.path = path, .seq_len = seq_len, .eval_fraction = eval_fraction});
    std::fprintf(stderr, "kiln: text corpus %s: %zu files, %lld bytes\n", path.c_str(), corpus.files.size(),
                 (long long)corpus.bytes);
    return {std::move(corpus.train), std::move(corpus.eval), byte_vocabulary, targets::tokens};
  }
};

}  // namespace kiln::data
