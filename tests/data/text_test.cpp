// The byte-level text corpus: packing checked against hand-built sequences, the files it reads,
// and the errors for paths it cannot use.
// kiln (and with it LibTorch) before doctest: glog's CHECK macros would replace doctest's.
#include <kiln/kiln.hpp>
#include <kiln/datasets.hpp>

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "../temp_dir.hpp"

namespace {

torch::Tensor bytes_of(const std::string& text) {
  auto t = torch::empty({static_cast<std::int64_t>(text.size())}, torch::kInt64);
  for (std::size_t i = 0; i < text.size(); ++i) t[static_cast<std::int64_t>(i)] = static_cast<unsigned char>(text[i]);
  return t;
}

std::string error_of(const kiln::data::text_options& options) {
  try {
    kiln::data::load_text(options);
  } catch (const kiln::data_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_SUITE("data") {
  TEST_CASE("text: packed sequences follow each other and predict the next byte") {
    kiln::test::temp_dir dir("text_pack");
    const std::string text = "abcdefghijklmnopqrst";  // 20 bytes: 15 for training, the last 5 held out
    const auto file = dir.write("corpus.txt", text);
    auto corpus = kiln::data::load_text({.path = file, .seq_len = 3, .eval_fraction = 0.25});
    CHECK(corpus.bytes == 20);
    REQUIRE(corpus.files.size() == 1);

    // Training stream "abcdefghijklmno": (15 - 1) / 3 = 4 sequences, "abc"->"bcd", "def"->"efg", ...
    REQUIRE(corpus.train.inputs.sizes() == torch::IntArrayRef({4, 3}));
    CHECK((corpus.train.inputs.scalar_type() == torch::kInt64));
    CHECK(torch::equal(corpus.train.inputs.reshape({-1}), bytes_of("abcdefghijkl")));
    CHECK(torch::equal(corpus.train.targets.reshape({-1}), bytes_of("bcdefghijklm")));
    // Held out "pqrst": one sequence, none of it seen in training.
    REQUIRE(corpus.eval.inputs.sizes() == torch::IntArrayRef({1, 3}));
    CHECK(torch::equal(corpus.eval.inputs.reshape({-1}), bytes_of("pqr")));
    CHECK(torch::equal(corpus.eval.targets.reshape({-1}), bytes_of("qrs")));
  }

  TEST_CASE("text: a folder is read in name order, recursively, without binary files or links") {
    kiln::test::temp_dir dir("text_folder");
    std::filesystem::create_directories(dir.path / "sub");
    dir.write("b.txt", "BBBBBBBB");
    dir.write("a.txt", "AAAAAAAA");
    dir.write("sub/c", "CCCCCCCC");
    {
      std::ofstream index(dir.path / "a.dat", std::ios::binary);  // a strfile index: binary
      index << std::string("\x02\0\0\0zzzzzzzz", 12);
    }
    std::filesystem::create_symlink(dir.path / "a.txt", dir.path / "a.u8");

    auto corpus = kiln::data::load_text({.path = dir.path, .seq_len = 2, .eval_fraction = 0.25});
    REQUIRE(corpus.files.size() == 3);
    CHECK(corpus.files[0].filename() == "a.txt");
    CHECK(corpus.files[1].filename() == "b.txt");
    CHECK(corpus.files[2].filename() == "c");
    CHECK(corpus.bytes == 24);
    // The first training sequence starts the stream with a.txt; the held-out tail ends it with c.
    CHECK(corpus.train.inputs[0][0].item<std::int64_t>() == 'A');
    CHECK(corpus.eval.targets[-1][-1].item<std::int64_t>() == 'C');
  }

  TEST_CASE("text: unusable paths and sizes are errors that name the cause") {
    kiln::test::temp_dir dir("text_errors");
    CHECK(error_of({.path = dir.path / "missing"}).find("missing does not exist") != std::string::npos);
    CHECK(error_of({.path = dir.path}).find("has no text files") != std::string::npos);
    const auto small = dir.write("small.txt", "tiny");
    CHECK(error_of({.path = small, .seq_len = 8}).find("too few for one training and one evaluation sequence") !=
          std::string::npos);
    CHECK(error_of({.path = small, .seq_len = 0}).find("seq_len must be >= 1") != std::string::npos);
  }

  TEST_CASE("text: the fortunes corpus, where installed, packs into byte tokens") {
    if (!std::filesystem::exists(kiln::data::default_text_path)) return;  // ./kiln installs it
    auto corpus = kiln::data::load_text({.seq_len = 64});
    CHECK(corpus.bytes > 1'000'000);
    CHECK(corpus.train.inputs.max().item<std::int64_t>() < kiln::data::byte_vocabulary);
    CHECK(corpus.eval.inputs.size(0) >= corpus.bytes / 20 / 64 - 1);
  }
}
