// Tokenizer as the `dloco` process sees it: decoding reads the SentencePiece vocabulary file (tokenizer.vocab,
// one "piece<TAB>score" line per id) directly; encoding runs `dloco-data encode` in a child process, because
// Debian's libsentencepiece cannot share a process with libprotobuf (see data/spm.h). Encoding is only
// needed for prompts (reports, `dloco generate`), never on the training path.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dloco {

/// FNV-1a 64 of a tokenizer model file's bytes: identifies the tokenizer in manifests and handshakes.
/// Throws InputError if the file cannot be read.
uint64_t tokenizer_file_hash(const std::filesystem::path& model_file);

/// Path of the `dloco-data` helper: $DLOCO_DATA_BIN if set, else `dloco-data` beside the running executable.
std::filesystem::path data_tool_path();

class Tokenizer {
 public:
  /// Loads `model_file` (tokenizer.model) and the vocabulary beside it (tokenizer.vocab). Throws InputError if
  /// either is missing (with the `dloco data prepare` command to run) or the vocabulary is malformed.
  explicit Tokenizer(const std::filesystem::path& model_file);

  /// Token ids of one line of text, from `dloco-data encode`. Throws InputError if the helper cannot run.
  std::vector<int32_t> encode(std::string_view text) const;
  /// Text of ids: the end-of-sentence id becomes a newline, byte pieces (<0xNN>) become bytes, "▁" a space;
  /// other control ids and ids outside the vocabulary are skipped.
  std::string decode(std::span<const int64_t> ids) const;
  int32_t eos_id() const { return eos_id_; }
  int64_t vocab_size() const { return static_cast<int64_t>(pieces_.size()); }
  uint64_t hash() const { return hash_; }

 private:
  std::filesystem::path model_file_;
  std::vector<std::string> pieces_;
  int32_t eos_id_ = -1;
  uint64_t hash_ = 0;
};

}  // namespace dloco
