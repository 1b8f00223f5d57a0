// SentencePiece wrapper; see spm.h.
#include "data/spm.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <fstream>
#include <sstream>

#include "core/check.h"

namespace dloco {

SentencePieceTokenizer::SentencePieceTokenizer(const std::filesystem::path& model_file)
    : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  std::ifstream in(model_file, std::ios::binary);
  if (!in) {
    throw InputError("cannot read tokenizer '" + model_file.string() +
                     "': prepare the corpus first (`dloco data prepare --kjv --out DIR`)");
  }
  std::stringstream bytes;
  bytes << in.rdbuf();
  const std::string blob = bytes.str();
  const auto status = sp_->LoadFromSerializedProto(blob);
  if (!status.ok()) {
    throw InputError("'" + model_file.string() + "' is not a SentencePiece model: " + status.ToString());
  }
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<int32_t> SentencePieceTokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  const auto status = sp_->Encode(text, &ids);
  DLOCO_CHECK(status.ok());
  return {ids.begin(), ids.end()};
}

int32_t SentencePieceTokenizer::eos_id() const { return sp_->eos_id(); }
int64_t SentencePieceTokenizer::vocab_size() const { return sp_->GetPieceSize(); }

void SentencePieceTokenizer::train_bpe(const std::filesystem::path& corpus, const std::filesystem::path& prefix,
                          int64_t vocab_size, int threads) {
  std::ostringstream args;
  args << "--input=" << corpus.string() << " --model_prefix=" << prefix.string() << " --vocab_size=" << vocab_size
       << " --model_type=bpe --character_coverage=1.0 --byte_fallback=true --max_sentence_length=16384"
       << " --input_sentence_size=2000000 --shuffle_input_sentence=false --num_threads=" << threads
       << " --minloglevel=2";
  const auto status = sentencepiece::SentencePieceTrainer::Train(args.str());
  if (!status.ok()) {
    throw InputError("training the SentencePiece tokenizer on '" + corpus.string() + "' failed: " + status.ToString());
  }
}

}  // namespace dloco
