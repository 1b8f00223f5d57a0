// Corpus preparation; see prepare.h.
#include "data/prepare.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <regex>

#include "core/check.h"
#include "data/shards.h"
#include "data/spm.h"
#include "data/tokenizer.h"
#include "process/atomic_file.h"

namespace dloco {

namespace fs = std::filesystem;

namespace {

bool is_text_file(const fs::path& p) {
  const std::string ext = p.extension().string();
  return ext == ".txt" || ext == ".md" || ext == ".text" || ext == ".jsonl";
}

// Appends the non-empty lines of one input file (for JSONL: the lines of each record's "text").
void read_lines(const fs::path& path, std::vector<std::string>& lines) {
  std::ifstream in(path);
  if (!in) throw InputError("cannot read input '" + path.string() + "'");
  const bool jsonl = path.extension() == ".jsonl";
  std::string line;
  int64_t line_no = 0;
  auto add_text = [&](const std::string& text) {
    size_t start = 0;
    while (start <= text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      std::string piece = text.substr(start, end - start);
      if (!piece.empty() && piece.back() == '\r') piece.pop_back();
      if (piece.find_first_not_of(" \t") != std::string::npos) lines.push_back(std::move(piece));
      start = end + 1;
    }
  };
  while (std::getline(in, line)) {
    ++line_no;
    if (!jsonl) {
      add_text(line);
      continue;
    }
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json record;
    try {
      record = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw InputError(path.string() + ":" + std::to_string(line_no) + ": not valid JSON (" + e.what() + ")");
    }
    if (!record.is_object() || !record.contains("text") || !record["text"].is_string()) {
      throw InputError(path.string() + ":" + std::to_string(line_no) + ": a JSONL record needs a string \"text\" field");
    }
    add_text(record["text"].get<std::string>());
  }
}

void read_kjv(std::vector<std::string>& lines) {
  FILE* pipe = ::popen("bible -f 'Gen1:1-Rev22:21' 2>/dev/null", "r");
  if (!pipe) throw InputError("cannot run `bible`: install Debian's bible-kjv (scripts/setup.sh does)");
  std::string current;
  char buf[8192];
  size_t before = lines.size();
  while (size_t n = std::fread(buf, 1, sizeof(buf), pipe)) {
    for (size_t i = 0; i < n; ++i) {
      if (buf[i] == '\n') {
        std::string verse = strip_verse_reference(current);
        if (!verse.empty()) lines.push_back(std::move(verse));
        current.clear();
      } else {
        current += buf[i];
      }
    }
  }
  const int rc = ::pclose(pipe);
  if (rc != 0 || lines.size() - before < 1000) {
    throw InputError("`bible -f 'Gen1:1-Rev22:21'` failed or printed almost nothing: install Debian's bible-kjv "
                     "(scripts/setup.sh does)");
  }
}

}  // namespace

std::string strip_verse_reference(const std::string& line) {
  static const std::regex kRef(R"(^[1-3]?[A-Za-z]+[0-9]+:[0-9]+\s+)");
  return std::regex_replace(line, kRef, "", std::regex_constants::format_first_only);
}

namespace {
nlohmann::json prepare_corpus_impl(const PrepareOptions& o);
}  // namespace

nlohmann::json prepare_corpus(const PrepareOptions& o) {
  fs::path staging = o.out;
  staging += ".staging";
  try {
    return prepare_corpus_impl(o);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(staging, ec);  // a failed preparation leaves nothing behind
    throw;
  }
}

namespace {

void check_prepare_options(const PrepareOptions& o) {
  if (o.inputs.empty() && !o.kjv) throw InputError("no input: give text files/folders, or --kjv for the KJV bible");
  if (o.vocab_size < 300) throw InputError("--vocab-size must be ≥ 300 (bytes plus a few merges)");
  if (!(o.val_fraction > 0 && o.val_fraction < 0.5)) throw InputError("--val-fraction must be in (0, 0.5)");
  if (o.shard_tokens < 1) throw InputError("--shard-tokens must be ≥ 1");
  if (fs::exists(o.out) && !fs::is_empty(o.out)) {
    if (!o.force) throw InputError("output folder '" + o.out.string() + "' already holds data; pass --force to replace it");
    // --force replaces a prepared dataset, never an arbitrary folder.
    bool dataset = false;
    try {
      std::ifstream in(o.out / "meta.json");
      dataset = in && nlohmann::json::parse(in).value("format", "") == "dloco-tokens";
    } catch (const std::exception&) {
    }
    if (!dataset) {
      throw InputError("output folder '" + o.out.string() + "' is not a dloco dataset (no meta.json of format "
                       "dloco-tokens): refusing to replace it even with --force; pick an empty or new folder");
    }
  }
}

// The lines of the KJV (--kjv) and of every input file (folders: their text files, sorted), and a description
// of each source.
void collect_lines(const PrepareOptions& o, std::vector<std::string>& lines, std::vector<std::string>& sources) {
  if (o.kjv) {
    read_kjv(lines);
    sources.push_back("bible-kjv (Gen1:1-Rev22:21, verse references stripped)");
  }
  for (const auto& input : o.inputs) {
    if (!fs::exists(input)) throw InputError("input '" + input.string() + "' does not exist");
    std::vector<fs::path> files;
    if (fs::is_directory(input)) {
      for (const auto& e : fs::recursive_directory_iterator(input)) {
        if (e.is_regular_file() && is_text_file(e.path())) files.push_back(e.path());
      }
      std::sort(files.begin(), files.end());
      if (files.empty()) throw InputError("folder '" + input.string() + "' has no .txt/.md/.text/.jsonl files");
    } else {
      files.push_back(input);
    }
    for (const auto& f : files) read_lines(f, lines);
    sources.push_back(input.string());
  }
  if (lines.empty()) throw InputError("the inputs contain no text");
}

// Trains the BPE tokenizer on the first `train_lines` lines into staging/tokenizer.model.
void train_tokenizer(const PrepareOptions& o, const fs::path& staging, const std::vector<std::string>& lines,
                     size_t train_lines) {
  {
    std::ofstream corpus(staging / "corpus.txt");
    for (size_t i = 0; i < train_lines; ++i) corpus << lines[i] << '\n';
    if (!corpus) throw InputError("cannot write '" + (staging / "corpus.txt").string() + "'");
  }
  SentencePieceTokenizer::train_bpe(staging / "corpus.txt", staging / "tokenizer", o.vocab_size, o.threads);
  fs::remove(staging / "corpus.txt");
}

// Each line followed by the end-of-sentence id.
std::vector<int32_t> encode_lines(const SentencePieceTokenizer& tok, const std::vector<std::string>& lines) {
  std::vector<int32_t> tokens;
  tokens.reserve(lines.size() * 32);
  for (const auto& line : lines) {
    auto ids = tok.encode(line);
    tokens.insert(tokens.end(), ids.begin(), ids.end());
    tokens.push_back(tok.eos_id());
  }
  return tokens;
}

// tokens[begin, begin + count) as <split>_000.bin, <split>_001.bin, … of at most shard_tokens each. Returns the
// number of shards.
int write_split(const fs::path& staging, const std::string& split, const std::vector<int32_t>& tokens, int64_t begin,
                int64_t count, int64_t shard_tokens, uint32_t vocab) {
  int shard = 0;
  for (int64_t at = 0; at < count; at += shard_tokens, ++shard) {
    char name[64];
    std::snprintf(name, sizeof(name), "%s_%03d.bin", split.c_str(), shard);
    const int64_t n = std::min(shard_tokens, count - at);
    write_shard(staging / name, std::span<const int32_t>(tokens.data() + begin + at, static_cast<size_t>(n)), vocab);
  }
  return shard;
}

// Unigram baseline: the validation cross-entropy (summed nats) under add-one-smoothed train frequencies.
double unigram_val_nll(const std::vector<int32_t>& tokens, int64_t n_train, uint32_t vocab) {
  const int64_t total = static_cast<int64_t>(tokens.size());
  std::vector<double> counts(vocab, 1.0);
  for (int64_t i = 0; i < n_train; ++i) counts[static_cast<size_t>(tokens[i])] += 1.0;
  const double norm = static_cast<double>(n_train) + vocab;
  double nll = 0;
  for (int64_t i = n_train; i < total; ++i) nll -= std::log(counts[static_cast<size_t>(tokens[i])] / norm);
  return nll;
}

nlohmann::json prepare_corpus_impl(const PrepareOptions& o) {
  const auto started = std::chrono::steady_clock::now();
  check_prepare_options(o);

  // 1) collect lines
  std::vector<std::string> lines;
  std::vector<std::string> sources;
  collect_lines(o, lines, sources);

  // 2) staging folder; the tokenizer is trained on the training part of the text only
  fs::path staging = o.out;
  staging += ".staging";
  fs::remove_all(staging);
  fs::create_directories(staging);
  const size_t train_lines = std::max<size_t>(1, static_cast<size_t>(lines.size() * (1.0 - o.val_fraction)));
  train_tokenizer(o, staging, lines, train_lines);
  SentencePieceTokenizer tok(staging / "tokenizer.model");

  // 3) encode: each line followed by the end-of-sentence id
  const std::vector<int32_t> tokens = encode_lines(tok, lines);
  const int64_t total = static_cast<int64_t>(tokens.size());
  const int64_t n_val = std::max<int64_t>(1, static_cast<int64_t>(std::llround(total * o.val_fraction)));
  const int64_t n_train = total - n_val;

  // 4) shards
  const auto vocab = static_cast<uint32_t>(tok.vocab_size());
  const int train_shards = write_split(staging, "train", tokens, 0, n_train, o.shard_tokens, vocab);
  const int val_shards = write_split(staging, "val", tokens, n_train, n_val, o.shard_tokens, vocab);

  // 5) unigram baseline
  const double nll = unigram_val_nll(tokens, n_train, vocab);

  nlohmann::json meta = {
      {"format", "dloco-tokens"},
      {"version", kShardVersion},
      {"vocab_size", vocab},
      {"tokenizer", "tokenizer.model"},
      {"tokenizer_hash", tokenizer_file_hash(staging / "tokenizer.model")},
      {"eos_id", tok.eos_id()},
      {"train_tokens", n_train},
      {"val_tokens", n_val},
      {"train_shards", train_shards},
      {"val_shards", val_shards},
      {"lines", lines.size()},
      {"sources", sources},
      {"val_fraction", o.val_fraction},
      {"unigram_val_nats_per_token", nll / static_cast<double>(n_val)},
  };
  write_file_atomically(staging / "meta.json", meta.dump(2) + "\n");

  // 6) move into place: the old folder is removed only now that the new one is complete
  fs::remove_all(o.out);
  if (o.out.has_parent_path()) fs::create_directories(o.out.parent_path());
  fs::rename(staging, o.out);
  meta["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return meta;
}

}  // namespace

}  // namespace dloco
