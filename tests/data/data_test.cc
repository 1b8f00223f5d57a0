// Token shards (format, validation), data streams (disjoint, exact resume, wrap), KJV reference stripping and
// the whole `dloco-data prepare` tool on a small corpus, with the tokenizer client decoding its output.
#include <gtest/gtest.h>

#include <cstring>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <numeric>
#include <set>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "data/prepare.h"
#include "data/shards.h"
#include "data/stream.h"
#include "data/tokenizer.h"

namespace dloco {
namespace {

namespace fs = std::filesystem;

class DataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dloco_data_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "_" +
            std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A split of `n` tokens 0, 1, 2, … (mod vocab) in shards of `per_shard` tokens.
  std::shared_ptr<TokenSplit> counting_split(int64_t n, int64_t per_shard, uint32_t vocab = 70000) {
    std::vector<fs::path> paths;
    for (int64_t at = 0, k = 0; at < n; at += per_shard, ++k) {
      std::vector<int32_t> tokens;
      for (int64_t i = at; i < std::min(n, at + per_shard); ++i) tokens.push_back(static_cast<int32_t>(i % vocab));
      paths.push_back(dir_ / ("train_" + std::to_string(k) + ".bin"));
      write_shard(paths.back(), tokens, vocab);
    }
    return std::make_shared<TokenSplit>(paths);
  }

  std::string error_reading(const fs::path& p) {
    try {
      read_shard_header(p);
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  }

  fs::path dir_;
};

TEST_F(DataTest, ShardRoundTripAcrossShardsAndTokenSizes) {
  for (uint32_t vocab : {300u, 70000u}) {  // uint16 and uint32 storage
    auto split = counting_split(1000, 333, vocab);
    EXPECT_EQ(split->size(), 1000);
    EXPECT_EQ(split->vocab_size(), vocab);
    std::vector<int64_t> out(400);
    split->copy(300, out);  // crosses shard boundaries at 333 and 666
    for (int64_t i = 0; i < 400; ++i) ASSERT_EQ(out[i], (300 + i) % vocab);
  }
}

TEST_F(DataTest, ShardValidationNamesTheProblem) {
  const auto path = dir_ / "a.bin";
  write_shard(path, std::vector<int32_t>{1, 2, 3}, 10);
  EXPECT_EQ(read_shard_header(path).token_count, 3u);
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto write = [&](const std::string& b) { std::ofstream(path, std::ios::binary | std::ios::trunc) << b; };
  write(bytes.substr(0, bytes.size() - 1));
  EXPECT_NE(error_reading(path).find("truncated or corrupt"), std::string::npos);
  std::string wrong_magic = bytes;
  wrong_magic[0] = 'X';
  write(wrong_magic);
  EXPECT_NE(error_reading(path).find("wrong magic"), std::string::npos);
  std::string wrong_version = bytes;
  wrong_version[8] = 9;
  write(wrong_version);
  EXPECT_NE(error_reading(path).find("format version 9"), std::string::npos);
  write("short");
  EXPECT_NE(error_reading(path).find("shorter than its 64-byte header"), std::string::npos);
  EXPECT_THROW(write_shard(dir_ / "b.bin", std::vector<int32_t>{10}, 10), InputError);  // id out of vocabulary
  EXPECT_THROW(split_shards(dir_ / "nowhere", "train"), InputError);
}

// Found by fuzz/shard.cc: a header-only shard whose count times its token size wraps around 2^64 to 0 (2^62 tokens
// of 4 bytes) passed the size check, and the first read went 2^64 bytes past the mapping.
TEST_F(DataTest, ATokenCountThatWrapsTheSizeCheckIsRefused) {
  const auto path = dir_ / "wrap.bin";
  write_shard(path, std::vector<int32_t>{}, 70000);  // 4-byte tokens, 0 of them: the 64-byte header alone
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  ASSERT_EQ(bytes.size(), 64u);
  const uint64_t count = uint64_t{1} << 62;
  std::memcpy(bytes.data() + 24, &count, sizeof(count));
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  EXPECT_NE(error_reading(path).find("truncated or corrupt"), std::string::npos);
  EXPECT_THROW(TokenSplit({path}), InputError);
}

TEST_F(DataTest, TokenOutsideTheVocabularyIsACorruptShard) {
  auto split = counting_split(100, 100, 300);  // tokens 0..99, vocabulary 300
  {
    std::fstream f(dir_ / "train_0.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(64 + 2 * 50);
    const uint16_t bad = 0xFFFF;
    f.write(reinterpret_cast<const char*>(&bad), 2);
  }
  TokenSplit poked({dir_ / "train_0.bin"});
  std::vector<int64_t> out(60);
  try {
    poked.copy(0, out);
    FAIL() << "a token id outside the vocabulary reached the caller";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("token id 65535 at position 50"), std::string::npos) << e.what();
  }
}

TEST_F(DataTest, StreamsAreDisjointAndAdvanceByBT) {
  auto split = counting_split(10000, 4000);
  const int64_t B = 2, T = 8, S = 4;
  for (int64_t s = 0; s < S; ++s) {
    DataStream stream(split, s, S, B, T, StreamCursor{s, 0, 0, 0});
    std::vector<int64_t> window(window_tokens(B, T));
    ASSERT_EQ(window.size(), B * (T + 1));
    stream.next(window);
    for (int64_t r = 0; r < B; ++r) {  // row r: tokens r·T … r·T + T of the stream (rows share a token)
      for (int64_t i = 0; i <= T; ++i) EXPECT_EQ(window[r * (T + 1) + i], s * 2500 + r * T + i) << r << "," << i;
    }
    stream.next(window);
    EXPECT_EQ(window.front(), s * 2500 + B * T);
    EXPECT_EQ(window.back(), s * 2500 + 2 * B * T);
    EXPECT_EQ(stream.cursor().tokens_served, 2 * B * T);
  }
}

TEST_F(DataTest, StreamResumesExactlyFromItsCursor) {
  auto split = counting_split(5000, 1500);
  const int64_t B = 3, T = 7;
  DataStream a(split, 1, 2, B, T, StreamCursor{1, 0, 0, 0});
  std::vector<int64_t> w(window_tokens(B, T)), v(window_tokens(B, T));
  for (int i = 0; i < 37; ++i) a.next(w);  // crosses a wrap: stream length 2500, 21 tokens per batch
  const nlohmann::json saved = a.cursor().to_json();
  DataStream b(split, 1, 2, B, T, StreamCursor::from_json(saved));
  for (int i = 0; i < 200; ++i) {
    a.next(w);
    b.next(v);
    ASSERT_EQ(w, v) << "batch " << i << " after resume";
  }
  EXPECT_EQ(a.cursor(), b.cursor());
  EXPECT_GT(a.cursor().epoch, 0);
}

TEST_F(DataTest, StreamWrapsAndCountsEveryTokenOncePerEpoch) {
  auto split = counting_split(100, 100);
  DataStream s(split, 0, 1, 1, 10, StreamCursor{});
  std::vector<int64_t> w(11);
  std::vector<int> seen(100, 0);
  while (s.cursor().epoch == 0) {
    s.next(w);
    for (int i = 0; i < 10; ++i) seen[w[i]]++;
  }
  // 9 windows of 10 fit (the 10th would need token 100): tokens 0..89 once, none twice.
  for (int i = 0; i < 90; ++i) EXPECT_EQ(seen[i], 1) << i;
  EXPECT_EQ(s.cursor().position, 0);
}

TEST_F(DataTest, StreamRefusesBadSetups) {
  auto split = counting_split(100, 100);
  EXPECT_THROW(DataStream(split, 0, 10, 2, 8, StreamCursor{}), InputError);         // stream shorter than a window
  EXPECT_THROW(DataStream(split, 0, 1, 1, 8, StreamCursor{1, 0, 0, 0}), InputError);  // another stream's cursor
  EXPECT_THROW(StreamCursor::from_json({{"stream", 0}}), InputError);
}

// data.order = "shuffled": S streams own the row slots j ≡ s (mod S) of T tokens of the whole split; each row of a
// batch reads its own slot (T + 1 consecutive tokens); in an epoch a stream reads ⌊n_s / B⌋·B of its slots once each,
// in an order that changes every epoch; together the S streams read every slot at most once an epoch.
TEST_F(DataTest, ShuffledStreamsReadEachRowSlotAtMostOnceAnEpochInAnOrderThatChanges) {
  const int64_t B = 2, T = 8, S = 3;
  auto split = counting_split(10000, 3000);  // token i is i: a row's first token names its slot
  const int64_t n = (10000 - 1) / T;         // 1249 row slots
  std::vector<int> read(static_cast<size_t>(n), 0);
  for (int64_t s = 0; s < S; ++s) {
    DataStream stream(split, s, S, B, T, StreamCursor{s, 0, 0, 0}, DataOrder::kShuffled);
    std::vector<int64_t> window(window_tokens(B, T)), epoch0, epoch1;
    while (stream.cursor().epoch < 2) {
      const int64_t epoch = stream.cursor().epoch;
      stream.next(window);
      for (int64_t r = 0; r < B; ++r) {
        const int64_t* row = window.data() + r * (T + 1);
        ASSERT_EQ(row[T], row[0] + T);  // T + 1 consecutive tokens
        ASSERT_EQ(row[0] % T, 0);
        const int64_t slot = row[0] / T;
        ASSERT_EQ(slot % S, s) << "stream " << s << " read another stream's slot";
        (epoch == 0 ? epoch0 : epoch1).push_back(slot);
        if (epoch == 0) read[static_cast<size_t>(slot)]++;
      }
    }
    const int64_t owned = (n - s + S - 1) / S;
    EXPECT_EQ(static_cast<int64_t>(epoch0.size()), owned / B * B);
    EXPECT_EQ(std::set<int64_t>(epoch0.begin(), epoch0.end()).size(), epoch0.size()) << "a slot twice in an epoch";
    EXPECT_NE(epoch0, epoch1) << "stream " << s << ": the same order in two epochs";
    // not the contiguous order: fewer than a tenth of consecutive rows are neighbouring slots
    int neighbours = 0;
    for (size_t i = 1; i < epoch0.size(); ++i) neighbours += epoch0[i] == epoch0[i - 1] + S;
    EXPECT_LT(neighbours, static_cast<int>(epoch0.size() / 10)) << "stream " << s;
  }
  int64_t once = 0;
  for (int64_t j = 0; j < n; ++j) {
    EXPECT_LE(read[static_cast<size_t>(j)], 1) << "slot " << j;
    once += read[static_cast<size_t>(j)];
  }
  EXPECT_GE(once, n - S * (B - 1));  // at most B − 1 slots of each stream left out an epoch
}

TEST_F(DataTest, ShuffledStreamResumesExactlyFromItsCursorAndRefusesAForeignOne) {
  auto split = counting_split(5000, 1500);
  const int64_t B = 3, T = 7;
  DataStream a(split, 1, 2, B, T, StreamCursor{1, 0, 0, 0}, DataOrder::kShuffled);
  std::vector<int64_t> w(window_tokens(B, T)), v(window_tokens(B, T));
  for (int i = 0; i < 150; ++i) a.next(w);  // crosses a wrap: 357 row slots of 7 tokens (every other), 119 batches
  EXPECT_GT(a.cursor().epoch, 0);
  DataStream b(split, 1, 2, B, T, StreamCursor::from_json(a.cursor().to_json()), DataOrder::kShuffled);
  for (int i = 0; i < 200; ++i) {
    a.next(w);
    b.next(v);
    ASSERT_EQ(w, v) << "batch " << i << " after resume";
  }
  // a position between two windows, or past the stream's last slot
  EXPECT_THROW(DataStream(split, 1, 2, B, T, StreamCursor{1, 5, 0, 5}, DataOrder::kShuffled), InputError);
  EXPECT_THROW(DataStream(split, 1, 2, B, T, StreamCursor{1, 119 * 21, 0, 0}, DataOrder::kShuffled), InputError);
  // fewer row slots than a batch's rows: 12 slots of 8 tokens over 8 streams leave stream 7 one
  EXPECT_THROW(DataStream(counting_split(100, 100), 7, 8, 2, 8, StreamCursor{7, 0, 0, 0}, DataOrder::kShuffled),
               InputError);
}

// The Python learner lays shuffled streams out the same way (python/dloco_learner/data.py; tests/python/units_test.py
// asserts these same slots).
TEST_F(DataTest, ShuffledSlotsArePinned) {
  auto split = counting_split(10000, 10000);
  DataStream stream(split, 2, 3, 2, 8, StreamCursor{2, 0, 0, 0}, DataOrder::kShuffled);
  std::vector<int64_t> window(window_tokens(2, 8)), slots;
  const auto rows = [&](int batches) {  // the row slots of the next batches
    slots.clear();
    for (int i = 0; i < batches; ++i) {
      stream.next(window);
      slots.push_back(window[0] / 8);
      slots.push_back(window[9] / 8);
    }
  };
  rows(3);
  EXPECT_EQ(slots, (std::vector<int64_t>{1091, 1052, 650, 395, 602, 314}));
  // and the first two batches of epoch 1 (n_s = 416 row slots walked on 2^10: some rows cycle-walk)
  for (int i = 3; i < 208; ++i) stream.next(window);
  rows(2);
  EXPECT_EQ(stream.cursor().epoch, 1);
  EXPECT_EQ(slots, (std::vector<int64_t>{230, 1199, 266, 17}));
}

TEST(Prepare, StripsKjvVerseReferences) {
  EXPECT_EQ(strip_verse_reference("Ge1:1 In the beginning"), "In the beginning");
  EXPECT_EQ(strip_verse_reference("1Sam3:4 That the LORD called"), "That the LORD called");
  EXPECT_EQ(strip_verse_reference("Rev22:21 The grace"), "The grace");
  EXPECT_EQ(strip_verse_reference("No reference 1:2 here"), "No reference 1:2 here");
}

// Runs a command line; returns its exit status.
int run(const std::string& command) { return WEXITSTATUS(std::system((command + " >/dev/null 2>&1").c_str())); }

TEST_F(DataTest, PrepareToolBuildsTokenizerAndShardsFromTextAndJsonl) {
  {
    std::ofstream txt(dir_ / "a.txt");
    for (int i = 0; i < 400; ++i) txt << "In the beginning was the word number " << i << ", and the word was good.\n";
    std::ofstream jsonl(dir_ / "b.jsonl");
    for (int i = 0; i < 100; ++i) jsonl << nlohmann::json{{"text", "Second source line " + std::to_string(i)}} << "\n";
  }
  const std::string tool = std::string(DLOCO_BINARY_DIR) + "/bin/dloco-data";
  const fs::path out = dir_ / "prepared";
  ASSERT_EQ(run(tool + " prepare " + (dir_ / "a.txt").string() + " " + (dir_ / "b.jsonl").string() + " --out " +
                out.string() + " --vocab-size 400 --threads 1"),
            0);
  const auto meta = nlohmann::json::parse(std::ifstream(out / "meta.json"));
  EXPECT_EQ(meta["vocab_size"], 400);
  EXPECT_EQ(meta["lines"], 500);
  EXPECT_GT(meta["val_tokens"].get<int64_t>(), 0);
  TokenSplit train(split_shards(out, "train")), val(split_shards(out, "val"));
  EXPECT_EQ(train.size(), meta["train_tokens"].get<int64_t>());
  EXPECT_EQ(val.size(), meta["val_tokens"].get<int64_t>());

  // The tokenizer client decodes what the tool encoded, newlines at end-of-sentence ids.
  setenv("DLOCO_DATA_BIN", tool.c_str(), 1);
  Tokenizer tok(out / "tokenizer.model");
  EXPECT_EQ(tok.vocab_size(), 400);
  const auto ids = tok.encode("the word was good");
  ASSERT_FALSE(ids.empty());
  std::vector<int64_t> with_eos(ids.begin(), ids.end());
  with_eos.push_back(tok.eos_id());
  EXPECT_EQ(tok.decode(with_eos), "the word was good\n");
  const std::vector<int64_t> half_character = {3 + 0xC3};  // byte piece <0xC3> without its continuation byte
  EXPECT_EQ(tok.decode(half_character), "\xef\xbf\xbd");    // U+FFFD, never invalid UTF-8
  std::vector<int64_t> first(64);
  train.copy(0, first);
  EXPECT_EQ(tok.decode(first).rfind("In the beginning was the word number 0, and the word was good.\n", 0), 0u);

  // Existing output is kept unless --force; bad JSONL is named with its line.
  EXPECT_EQ(run(tool + " prepare " + (dir_ / "a.txt").string() + " --out " + out.string() + " --vocab-size 400"), 2);
  EXPECT_TRUE(fs::exists(out / "train_000.bin"));
  // --force replaces a prepared dataset, never a folder of something else.
  fs::create_directories(dir_ / "precious");
  std::ofstream(dir_ / "precious" / "notes.txt") << "keep me";
  EXPECT_EQ(run(tool + " prepare " + (dir_ / "a.txt").string() + " --out " + (dir_ / "precious").string() +
                " --vocab-size 400 --force"),
            2);
  EXPECT_TRUE(fs::exists(dir_ / "precious" / "notes.txt"));
  EXPECT_FALSE(fs::exists(dir_ / "precious.staging")) << "a failed preparation leaves no staging folder";
  EXPECT_EQ(run(tool + " prepare " + (dir_ / "a.txt").string() + " --out " + out.string() +
                " --vocab-size 400 --threads 1 --force"),
            0);
  std::ofstream(dir_ / "bad.jsonl") << "{\"text\": \"ok\"}\n{\"body\": 1}\n";
  EXPECT_EQ(run(tool + " prepare " + (dir_ / "bad.jsonl").string() + " --out " + (dir_ / "o2").string()), 2);
  EXPECT_EQ(run(tool + " prepare " + (dir_ / "missing.txt").string() + " --out " + (dir_ / "o3").string()), 2);
}

}  // namespace
}  // namespace dloco
