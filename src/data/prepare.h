// `dloco data prepare`: text (files, folders, JSONL with a "text" field, or Debian's KJV bible) -> a
// SentencePiece BPE tokenizer + token shards with a train/validation split, written to a staging folder and
// moved into place only when complete (an existing prepared folder is never half-overwritten).
// Output folder: tokenizer.model, tokenizer.vocab, train_000.bin…, val_000.bin…, meta.json.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dloco {

struct PrepareOptions {
  std::vector<std::filesystem::path> inputs;  // files or folders (.txt, .md, .text, .jsonl), read in sorted order
  bool kjv = false;                           // add the KJV bible from `bible -f "Gen1:1-Rev22:21"`, references stripped
  std::filesystem::path out = "data/kjv";     // output folder
  int64_t vocab_size = 4096;                  // BPE vocabulary, tokens
  double val_fraction = 0.05;                 // tail of the token stream held out for validation
  int64_t shard_tokens = 100'000'000;         // tokens per shard file
  int threads = 2;                            // SentencePiece training threads
  bool force = false;                         // replace an existing prepared folder
};

/// Runs the preparation and returns meta.json's content: token counts, vocabulary, tokenizer hash, and the
/// unigram cross-entropy of the validation split under train-split unigram frequencies (nats/token: the
/// score any model must beat). Throws InputError for: no input, a missing input path, a JSONL line without a
/// string "text" field (naming file:line), `bible` not installed, an existing output without `force`, or a
/// corpus too small for the vocabulary.
nlohmann::json prepare_corpus(const PrepareOptions& options);

/// Removes a KJV verse reference ("Ge1:1 ", "1Sam3:4 ") from the start of a line, if there is one.
std::string strip_verse_reference(const std::string& line);

}  // namespace dloco
