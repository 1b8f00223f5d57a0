// dloco-data: the corpus tool. Runs in its own process because it links SentencePiece (see data/spm.h);
// `dloco data ...` forwards here.
//   dloco-data prepare [INPUTS...] [--kjv] --out DIR   text -> BPE tokenizer + token shards (data/prepare.h)
//   dloco-data encode --model FILE --text TEXT        token ids of TEXT on stdout, space-separated
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "core/check.h"
#include "data/prepare.h"
#include "data/spm.h"
#include "process/log.h"

int main(int argc, char** argv) {
  using namespace dloco;
  init_logging();
  CLI::App app{"dloco-data: prepare corpora (SentencePiece BPE + token shards)"};
  app.require_subcommand(1);

  PrepareOptions opts;
  std::vector<std::string> inputs;
  auto* prepare = app.add_subcommand("prepare", "Text files/folders/JSONL (or --kjv) -> BPE tokenizer + shards");
  prepare->add_option("inputs", inputs, "Text files or folders (.txt, .md, .text, .jsonl with a \"text\" field)");
  prepare->add_flag("--kjv", opts.kjv, "Add Debian's KJV bible (bible-kjv), verse references stripped");
  prepare->add_option("--out", opts.out, "Output folder")->capture_default_str();
  prepare->add_option("--vocab-size", opts.vocab_size, "BPE vocabulary size")->capture_default_str();
  prepare->add_option("--val-fraction", opts.val_fraction, "Tail fraction held out for validation")
      ->capture_default_str();
  prepare->add_option("--shard-tokens", opts.shard_tokens, "Tokens per shard file")->capture_default_str();
  prepare->add_option("--threads", opts.threads, "Tokenizer training threads")->capture_default_str();
  prepare->add_flag("--force", opts.force, "Replace an existing prepared folder");
  prepare->callback([&] {
    for (const auto& i : inputs) opts.inputs.emplace_back(i);
    const auto meta = prepare_corpus(opts);
    spdlog::info("[data] {}: {} train + {} val tokens, vocabulary {}, unigram baseline {:.3f} nats/token "
                 "({:.1f} s)",
                 opts.out.string(), meta["train_tokens"].get<long long>(), meta["val_tokens"].get<long long>(),
                 meta["vocab_size"].get<long long>(), meta["unigram_val_nats_per_token"].get<double>(),
                 meta["seconds"].get<double>());
  });

  std::string model, text;
  auto* encode = app.add_subcommand("encode", "Print the token ids of a text");
  encode->add_option("--model", model, "tokenizer.model")->required();
  encode->add_option("--text", text, "Text to encode")->required();
  encode->callback([&] {
    SentencePieceTokenizer tok(model);
    const auto ids = tok.encode(text);
    for (size_t i = 0; i < ids.size(); ++i) std::printf(i ? " %d" : "%d", ids[i]);
    std::printf("\n");
  });

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help is an "error" of code 0; every other is a usage error: exit 2 (CLI11's own codes mean nothing to a
    // script), as the dloco command does.
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    std::fprintf(stderr, "dloco data: error: %s\nRun 'dloco data --help' (or 'dloco data COMMAND --help') for the options.\n",
                 e.what());
    return 2;
  } catch (const InputError& e) {
    std::fprintf(stderr, "dloco data: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dloco data: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
