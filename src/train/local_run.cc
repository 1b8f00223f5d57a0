// The local run (one process, no syncer) and the checkpoint tools `dloco eval` / `dloco generate`.
// The loop reads top to bottom: batch -> step -> log -> evaluate -> checkpoint, until the token budget is spent.
#include <csignal>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <unistd.h>

#include "core/atomic_file.h"
#include "core/check.h"
#include "core/console.h"
#include "core/events.h"
#include "data/stream.h"
#include "data/tokenizer.h"
#include "train/checkpoint.h"
#include "train/run.h"
#include "train/threads.h"
#include "train/trainer.h"

namespace dloco {

namespace fs = std::filesystem;

namespace {

std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }

torch::Device parse_device(const std::string& name) {
  try {
    torch::Device device(name);
    if (device.is_cuda() && !torch::cuda::is_available()) {
      throw InputError("run.device = \"" + name + "\" but this LibTorch build has no usable CUDA device");
    }
    return device;
  } catch (const c10::Error&) {
    throw InputError("run.device = \"" + name + "\" is not a torch device (use \"cpu\", \"cuda\" or \"cuda:N\")");
  }
}

// The text sample of reports: a fixed prompt continued with a seeded generator.
std::string sample_text(GPT& model, const Tokenizer& tok, const std::vector<int32_t>& ids, int64_t tokens,
                        double temperature, int64_t top_k, uint64_t seed, torch::Device device) {
  std::vector<int64_t> prompt_ids(ids.begin(), ids.end());
  if (prompt_ids.empty()) prompt_ids.push_back(tok.eos_id());
  auto input = torch::tensor(prompt_ids, torch::kLong).view({1, -1}).to(device);
  auto gen = at::detail::createCPUGenerator(seed);
  model->eval();
  auto out = model->generate(input, tokens, temperature, top_k, device.is_cpu() ? &gen : nullptr).to(torch::kCPU);
  model->train();
  std::vector<int64_t> all(out.data_ptr<int64_t>(), out.data_ptr<int64_t>() + out.numel());
  return tok.decode(all);
}


constexpr const char* kSamplePrompt = "And God said";

// The shards must have been written with this tokenizer's vocabulary.
void check_split_vocab(const TokenSplit& split, const Tokenizer& tok, const std::string& data_dir) {
  if (split.vocab_size() != static_cast<uint32_t>(tok.vocab_size())) {
    throw InputError("the token shards in '" + data_dir + "' declare a vocabulary of " +
                     std::to_string(split.vocab_size()) + " but tokenizer.model has " +
                     std::to_string(tok.vocab_size()) + ": re-run `dloco data prepare`");
  }
}

// Model config with the tokenizer's vocabulary checked against it.
void check_vocab(const ModelConfig& m, const Tokenizer& tok, const std::string& data_dir) {
  if (tok.vocab_size() > m.vocab_size) {
    throw InputError("the tokenizer in '" + data_dir + "' has " + std::to_string(tok.vocab_size()) +
                     " tokens but model.vocab_size is " + std::to_string(m.vocab_size) +
                     ": set model.vocab_size ≥ the tokenizer's vocabulary");
  }
}

}  // namespace

nlohmann::json run_local(const Config& config, const RunOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  const fs::path run_dir = config.run_dir();
  const bool has_checkpoint = latest_checkpoint(run_dir).has_value();
  if (options.resume && !has_checkpoint) {
    throw InputError("cannot resume: '" + run_dir.string() + "' has no valid checkpoint");
  }
  if (!options.resume && has_checkpoint) {
    throw InputError("run folder '" + run_dir.string() + "' already holds a trained run: continue it with --resume " +
                     run_dir.string() + ", or pick another run.name");
  }

  // 1) threads, device, data, model
  const ThreadBudget budget = thread_budget(static_cast<int>(config.run.threads));
  apply_thread_budget(budget);
  const torch::Device device = parse_device(config.run.device);
  const fs::path data_dir(config.data.dir);
  Tokenizer tok(data_dir / "tokenizer.model");
  check_vocab(config.model, tok, config.data.dir);
  auto train_split = std::make_shared<TokenSplit>(split_shards(data_dir, "train"));
  TokenSplit val_split(split_shards(data_dir, "val"));
  check_split_vocab(*train_split, tok, config.data.dir);
  const auto prompt_ids = tok.encode(kSamplePrompt);  // fails now, not after training, if the tokenizer is broken
  // Everything is in place: only now does the run folder appear (a failed start leaves nothing to clean up).
  fs::create_directories(run_dir);
  write_file_atomically(run_dir / "config.toml", to_toml(config));
  torch::manual_seed(config.run.seed);
  GPT model(config.model);
  model->to(device);
  Config single = config;
  single.diloco.learners = 1;
  InnerTrainer trainer(model, config.train, make_schedule(single), device);

  EventLog events(run_dir / "events.jsonl", Role::kLearner, 0);
  std::printf("[local] run %s: %lld parameters (formula %lld), %s, %s, device %s, threads torch %d + BLAS %d\n",
              config.run.name.c_str(), static_cast<long long>(count_parameters(*model)),
              static_cast<long long>(gpt_parameter_count(config.model)), blas_description().c_str(),
              allocator_description().c_str(),
              config.run.device.c_str(), budget.torch_threads, budget.blas_threads);

  // 2) resume: weights, optimizer moments, data cursor and step counters
  int64_t step = 0, tokens = 0, skipped = 0;
  double previous_wall = 0;  // wall time of earlier sessions of this run (resume)
  StreamCursor cursor;
  if (options.resume) {
    const auto ckpt = *latest_checkpoint(run_dir);
    load_model_weights(ckpt, model);
    load_optimizer_state(ckpt, trainer.optimizer());
    step = ckpt.step;
    tokens = ckpt.manifest.at("tokens_trained").get<int64_t>();
    cursor = StreamCursor::from_json(ckpt.manifest.at("cursors").at(0));
    previous_wall = ckpt.manifest.value("wall_seconds", 0.0);
    if (tokens + config.train.tokens_per_step(config.model) > config.train.total_tokens) {
      std::ifstream in(run_dir / "report.json");
      if (in) {
        std::printf("[local] run %s already finished its %lld-token budget: nothing to do\n",
                    config.run.name.c_str(), static_cast<long long>(config.train.total_tokens));
        return nlohmann::json::parse(in);
      }
    }
    std::printf("[local] resumed from %s at step %lld (%lld tokens)\n", ckpt.dir.c_str(),
                static_cast<long long>(step), static_cast<long long>(tokens));
    events.emit("resumed", {{"step", step}, {"tokens", tokens}, {"checkpoint", ckpt.dir.string()}});
  }
  DataStream stream(train_split, 0, 1, config.train.batch_size, config.model.seq_len, cursor);

  auto manifest = [&](double val_loss) {
    nlohmann::json m;
    m["config"] = to_json(config);
    m["global_step"] = step;
    m["tokens_trained"] = tokens;
    m["cursors"] = nlohmann::json::array({stream.cursor().to_json()});
    m["fragment_versions"] = nlohmann::json::array();
    m["tokenizer"] = {{"path", (data_dir / "tokenizer.model").string()}, {"hash", tok.hash()}};
    m["parameters"] = count_parameters(*model);
    m["wall_seconds"] = previous_wall + std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (std::isfinite(val_loss)) m["val_loss"] = val_loss;
    return m;
  };

  // 3) the loop
  g_stop_signal.store(0);
  auto old_int = std::signal(SIGINT, on_stop_signal);
  auto old_term = std::signal(SIGTERM, on_stop_signal);
  const int64_t budget_tokens = config.train.total_tokens;
  const int64_t total_steps = budget_tokens / config.train.tokens_per_step(config.model);
  double last_val = NAN, loss_ema = NAN;
  auto window_start = std::chrono::steady_clock::now();
  int64_t window_tokens = 0;
  const int64_t first_step = step;
  auto stop_requested = [&] {
    return g_stop_signal.load() != 0 ||
           (options.stop_after_steps > 0 && step - first_step >= options.stop_after_steps);
  };
  while (tokens + config.train.tokens_per_step(config.model) <= budget_tokens && !stop_requested()) {
    const StepResult r = trainer.step(stream, step);
    ++step;
    tokens += r.tokens;
    window_tokens += r.tokens;
    if (r.skipped) {
      ++skipped;
      events.emit("step_skipped", {{"step", step}, {"loss", r.loss}, {"grad_norm", r.grad_norm}});
    }
    if (std::isfinite(r.loss)) loss_ema = std::isnan(loss_ema) ? r.loss : 0.9 * loss_ema + 0.1 * r.loss;

    const bool eval_now = config.train.eval_interval > 0 && step % config.train.eval_interval == 0;
    if (eval_now) {
      last_val = evaluate_loss(model, val_split, config.train.eval_tokens, config.train.batch_size, device);
      events.emit("eval", {{"step", step}, {"tokens", tokens}, {"val_loss", last_val}});
    }
    if (step % config.train.log_interval == 0 || eval_now) {
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - window_start).count();
      const double tps = window_tokens / std::max(secs, 1e-9);
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      const double frac = static_cast<double>(step) / std::max<int64_t>(total_steps, 1);
      std::printf("%s %3.0f%% step %6lld | loss %.3f | val %s | lr %.2e | %7.0f tok/s | %5.0fs elapsed\n",
                  progress_bar(frac).c_str(), 100 * frac, static_cast<long long>(step), loss_ema,
                  std::isnan(last_val) ? "  -  " : (std::to_string(last_val).substr(0, 5)).c_str(), r.lr, tps,
                  elapsed);
      std::fflush(stdout);
      events.emit("progress", {{"step", step}, {"tokens", tokens}, {"loss", loss_ema}, {"tokens_per_s", tps}});
      window_start = std::chrono::steady_clock::now();
      window_tokens = 0;
    }
    if (config.train.checkpoint_interval > 0 && step % config.train.checkpoint_interval == 0) {
      save_checkpoint(run_dir, step, model, &trainer.optimizer(), manifest(last_val));
    }
  }
  const bool interrupted = tokens + config.train.tokens_per_step(config.model) <= budget_tokens;
  if (g_stop_signal.load() != 0) {
    std::printf("[local] signal %d: stopping after step %lld with a checkpoint (resume with --resume %s)\n",
                g_stop_signal.load(), static_cast<long long>(step), run_dir.c_str());
  }
  std::signal(SIGINT, old_int);
  std::signal(SIGTERM, old_term);

  // 4) final evaluation, checkpoint, sample, report
  const double final_val = evaluate_loss(model, val_split, 0, config.train.batch_size, device);
  const auto ckpt_dir = save_checkpoint(run_dir, step, model, &trainer.optimizer(), manifest(final_val));
  const std::string sample = sample_text(model, tok, prompt_ids, 48, 0.8, 40, config.run.seed, device);
  const double wall =
      previous_wall + std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  nlohmann::json report = {
      {"run", config.run.name},
      {"mode", "local"},
      {"status", interrupted ? "stopped" : "finished"},
      {"final_val_loss", final_val},
      {"final_val_perplexity", std::exp(final_val)},
      {"steps", step},
      {"steps_skipped", skipped},
      {"tokens_trained", tokens},
      {"wall_seconds", wall},
      {"tokens_per_second", tokens / std::max(wall, 1e-9)},
      {"parameters", count_parameters(*model)},
      {"checkpoint", ckpt_dir.string()},
      {"sample", sample},
      {"bytes", {{"learner", {{"sent", 0}, {"received", 0}}}}},
      {"signal", g_stop_signal.load()},
  };
  write_file_atomically(run_dir / "report.json", report.dump(2) + "\n");
  events.emit("finished", {{"status", report["status"]}, {"val_loss", final_val}, {"tokens", tokens}});
  return report;
}

nlohmann::json evaluate_checkpoint(const fs::path& checkpoint, const std::optional<std::string>& data_dir,
                                   int64_t max_tokens, int threads) {
  apply_thread_budget(thread_budget(threads));
  const auto ckpt = resolve_checkpoint(checkpoint);
  const Config c = checkpoint_config(ckpt);
  const fs::path dir(data_dir.value_or(c.data.dir));
  TokenSplit val(split_shards(dir, "val"));
  if (max_tokens < 0 || (max_tokens > 0 && max_tokens < c.model.seq_len + 1)) {
    throw InputError("--tokens must be 0 (all) or at least seq_len + 1 = " + std::to_string(c.model.seq_len + 1));
  }
  GPT model(c.model);
  load_model_weights(ckpt, model);
  const double loss = evaluate_loss(model, val, max_tokens, c.train.batch_size, torch::kCPU);
  return {{"checkpoint", ckpt.dir.string()}, {"step", ckpt.step}, {"val_loss", loss},
          {"val_perplexity", std::exp(loss)}, {"data", dir.string()}};
}

std::string generate_from_checkpoint(const fs::path& checkpoint, const std::string& prompt, int64_t tokens,
                                     double temperature, int64_t top_k, uint64_t seed, int threads) {
  apply_thread_budget(thread_budget(threads));
  const auto ckpt = resolve_checkpoint(checkpoint);
  const Config c = checkpoint_config(ckpt);
  Tokenizer tok(fs::path(c.data.dir) / "tokenizer.model");
  if (ckpt.manifest.contains("tokenizer") && ckpt.manifest["tokenizer"].value("hash", uint64_t{0}) != tok.hash()) {
    throw InputError("the tokenizer in '" + c.data.dir + "' is not the one this checkpoint was trained with");
  }
  GPT model(c.model);
  load_model_weights(ckpt, model);
  if (tokens < 1) throw InputError("--tokens must be ≥ 1");
  if (!(temperature > 0)) throw InputError("--temperature must be > 0");
  if (top_k < 0) throw InputError("--top-k must be ≥ 0 (0 = off)");
  return sample_text(model, tok, tok.encode(prompt), tokens, temperature, top_k, seed, torch::kCPU);
}

}  // namespace dloco
