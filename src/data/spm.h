// SentencePiece inside the `dloco-data` process only. Debian's libsentencepiece carries its own copy of
// protobuf-lite and crashes at load time in any process that also loads libprotobuf (LibTorch and gRPC both
// do), so the `dloco` binary never links it: it talks to `dloco-data` (data/tokenizer.h) instead.
// Text is encoded line by line with the end-of-sentence id between lines.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace dloco {

class SentencePieceTokenizer {
 public:
  /// Loads `model_file` (tokenizer.model). Throws InputError if it is missing or not a SentencePiece model.
  explicit SentencePieceTokenizer(const std::filesystem::path& model_file);
  ~SentencePieceTokenizer();

  /// Token ids of one line of text (no end-of-sentence id).
  std::vector<int32_t> encode(std::string_view text) const;
  int32_t eos_id() const;
  int64_t vocab_size() const;

  /// Trains a BPE model on `corpus` (one sentence per line) and writes `<prefix>.model` and `<prefix>.vocab`.
  /// Throws InputError with SentencePiece's message on failure.
  static void train_bpe(const std::filesystem::path& corpus, const std::filesystem::path& prefix,
                        int64_t vocab_size, int threads);

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

}  // namespace dloco
