// The local run (one process, no syncer) and the checkpoint tools `dloco eval` / `dloco generate`.
// The loop reads top to bottom: batch -> step -> log -> evaluate -> checkpoint, until the token budget is spent.
#include <csignal>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <unistd.h>
#include <spdlog/spdlog.h>

#include "core/check.h"
#include "core/stages_per_path.h"
#include "data/stream.h"
#include "data/tokenizer.h"
#include "model/stages.h"
#include "process/atomic_file.h"
#include "process/console.h"
#include "process/events.h"
#include "process/private_file.h"
#include "process/stop_signals.h"
#include "train/checkpoint.h"
#include "train/run.h"
#include "train/threads.h"
#include "train/trainer.h"

namespace dloco {

namespace fs = std::filesystem;

namespace {

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

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// What the steps of a local run share: the objects run_local sets up (by reference) and the loop's counters.
struct LocalRun {
  const Config& config;
  const RunOptions& options;
  const fs::path& run_dir;
  const fs::path& data_dir;
  const Clock::time_point started;
  const torch::Device device;
  const Tokenizer& tok;
  TokenSplit& val_split;
  GPT& model;
  InnerTrainer& trainer;
  EventLog& events;
  DataStream* stream = nullptr;  // set once the cursor is known (resume)
  int64_t step = 0, tokens = 0, skipped = 0;
  double previous_wall = 0;  // wall time of earlier sessions of this run (resume)
  StreamCursor cursor{};     // where the data stream starts
  double last_val = NAN, loss_ema = NAN;
  Clock::time_point window_start{};  // of the tokens/s shown in the next row
  int64_t window_tokens = 0;
  int64_t first_step = 0;
};

void check_run_folder(const fs::path& run_dir, bool resume) {
  const bool has_checkpoint = latest_checkpoint(run_dir).has_value();
  if (resume && !has_checkpoint) {
    throw InputError("cannot resume: '" + run_dir.string() + "' has no valid checkpoint");
  }
  if (!resume && has_checkpoint) {
    throw InputError("run folder '" + run_dir.string() + "' already holds a trained run: continue it with --resume " +
                     run_dir.string() + ", or pick another run.name");
  }
}

// Weights, optimizer moments, data cursor and step counters from the newest checkpoint. Returns the earlier
// report when that run already spent its budget (nothing to do).
std::optional<nlohmann::json> resume(LocalRun& run) {
  const Config& config = run.config;
  const auto ckpt = *latest_checkpoint(run.run_dir);
  load_model_weights(ckpt, run.model);
  load_optimizer_state(ckpt, run.trainer.optimizer());
  run.step = ckpt.step;
  run.tokens = ckpt.manifest.at("tokens_trained").get<int64_t>();
  run.cursor = StreamCursor::from_json(ckpt.manifest.at("cursors").at(0));
  run.previous_wall = ckpt.manifest.value("wall_seconds", 0.0);
  if (run.tokens + config.train.tokens_per_step(config.model) > config.train.total_tokens) {
    std::ifstream in(run.run_dir / "report.json");
    if (in) {
      spdlog::info("[local] run {} already finished its {}-token budget: nothing to do",
                   config.run.name, static_cast<long long>(config.train.total_tokens));
      return nlohmann::json::parse(in);
    }
  }
  spdlog::info("[local] resumed from {} at step {} ({} tokens)", ckpt.dir.string(),
               static_cast<long long>(run.step), static_cast<long long>(run.tokens));
  run.events.emit("resumed", {{"step", run.step}, {"tokens", run.tokens}, {"checkpoint", ckpt.dir.string()}});
  return std::nullopt;
}

nlohmann::json manifest(const LocalRun& run, double val_loss) {
  nlohmann::json m;
  m["config"] = to_json(run.config);
  m["global_step"] = run.step;
  m["tokens_trained"] = run.tokens;
  m["cursors"] = nlohmann::json::array({run.stream->cursor().to_json()});
  m["fragment_versions"] = nlohmann::json::array();
  m["tokenizer"] = {{"path", (run.data_dir / "tokenizer.model").string()}, {"hash", run.tok.hash()}};
  m["parameters"] = count_parameters(*run.model);
  m["wall_seconds"] = run.previous_wall + seconds_since(run.started);
  if (std::isfinite(val_loss)) m["val_loss"] = val_loss;
  return m;
}

bool more(const LocalRun& run) {
  const bool stop_requested = StopSignals::first() != 0 || (run.options.stop_after_steps > 0 &&
                                                            run.step - run.first_step >= run.options.stop_after_steps);
  return run.tokens + run.config.train.tokens_per_step(run.config.model) <= run.config.train.total_tokens &&
         !stop_requested;
}

// One console row and one progress event; the tokens/s window starts again.
void progress_row(LocalRun& run, const StepResult& r) {
  const double secs = seconds_since(run.window_start);
  const double tps = run.window_tokens / std::max(secs, 1e-9);
  const double elapsed = seconds_since(run.started);
  const int64_t total_steps = run.config.train.total_tokens / run.config.train.tokens_per_step(run.config.model);
  const double frac = static_cast<double>(run.step) / std::max<int64_t>(total_steps, 1);
  spdlog::info("{} {:3.0f}% step {:6} | loss {:.3f} | val {} | lr {:.2e} | {:7.0f} tok/s | {:5.0f}s elapsed",
               progress_bar(frac), 100 * frac, static_cast<long long>(run.step), run.loss_ema,
               std::isnan(run.last_val) ? "  -  " : (std::to_string(run.last_val).substr(0, 5)), r.lr, tps,
               elapsed);
  run.events.emit("progress", {{"step", run.step}, {"tokens", run.tokens}, {"loss", run.loss_ema}, {"tokens_per_s", tps}});
  run.window_start = Clock::now();
  run.window_tokens = 0;
}

// batch -> step -> log -> evaluate -> checkpoint.
void train_step(LocalRun& run) {
  const TrainConfig& train = run.config.train;
  const StepResult r = run.trainer.step(*run.stream, run.step);
  ++run.step;
  run.tokens += r.tokens;
  run.window_tokens += r.tokens;
  if (r.skipped) {
    ++run.skipped;
    run.events.emit("step_skipped", {{"step", run.step}, {"loss", r.loss}, {"grad_norm", r.grad_norm}});
  }
  if (std::isfinite(r.loss)) run.loss_ema = std::isnan(run.loss_ema) ? r.loss : 0.9 * run.loss_ema + 0.1 * r.loss;

  const bool eval_now = train.eval_interval > 0 && run.step % train.eval_interval == 0;
  if (eval_now) {
    run.last_val = evaluate_loss(run.model, run.val_split, train.eval_tokens, train.batch_size, run.device);
    run.events.emit("eval", {{"step", run.step}, {"tokens", run.tokens}, {"val_loss", run.last_val}});
  }
  if (run.step % train.log_interval == 0 || eval_now) progress_row(run, r);
  if (train.checkpoint_interval > 0 && run.step % train.checkpoint_interval == 0) {
    save_checkpoint(run.run_dir, run.step, run.model, &run.trainer.optimizer(), manifest(run, run.last_val));
  }
}

// Until the token budget is spent, a signal or --stop-after-steps. Returns whether it was interrupted.
bool train(LocalRun& run) {
  const StopSignals signals;  // SIGINT, SIGTERM, SIGHUP, SIGPIPE: stop after this step with a checkpoint
  run.window_start = Clock::now();
  run.first_step = run.step;
  while (more(run)) train_step(run);
  const bool interrupted = run.tokens + run.config.train.tokens_per_step(run.config.model) <= run.config.train.total_tokens;
  if (StopSignals::first() != 0) {
    spdlog::info("[local] signal {}: stopping after step {} with a checkpoint (resume with --resume {})",
                 StopSignals::first(), static_cast<long long>(run.step), run.run_dir.string());
  }
  return interrupted;
}

// The final evaluation, checkpoint, sample and run_dir/report.json.
nlohmann::json finish(LocalRun& run, const std::vector<int32_t>& prompt_ids, bool interrupted) {
  const Config& config = run.config;
  const double final_val = evaluate_loss(run.model, run.val_split, 0, config.train.batch_size, run.device);
  const auto ckpt_dir = save_checkpoint(run.run_dir, run.step, run.model, &run.trainer.optimizer(), manifest(run, final_val));
  const std::string sample = sample_text(run.model, run.tok, prompt_ids, 48, 0.8, 40, config.run.seed, run.device);
  const double wall = run.previous_wall + seconds_since(run.started);
  nlohmann::json report = {
      {"run", config.run.name},
      {"mode", "local"},
      {"status", interrupted ? "stopped" : "finished"},
      {"final_val_loss", final_val},
      {"final_val_perplexity", std::exp(final_val)},
      {"steps", run.step},
      {"steps_skipped", run.skipped},
      {"tokens_trained", run.tokens},
      {"wall_seconds", wall},
      {"tokens_per_second", run.tokens / std::max(wall, 1e-9)},
      {"parameters", count_parameters(*run.model)},
      {"checkpoint", ckpt_dir.string()},
      {"sample", sample},
      {"bytes", {{"learner", {{"sent", 0}, {"received", 0}}}}},
      {"signal", StopSignals::first()},
  };
  write_file_atomically(run.run_dir / "report.json", report.dump(2) + "\n");
  run.events.emit("finished", {{"status", report["status"]}, {"val_loss", final_val}, {"tokens", run.tokens}});
  return report;
}

}  // namespace

void check_device(const std::string& name) { (void)parse_device(name); }

nlohmann::json run_local(const Config& config, const RunOptions& options) {
  const auto started = Clock::now();
  const fs::path run_dir = config.run_dir();
  check_run_folder(run_dir, options.resume);

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
  write_private_file_atomically(run_dir / "config.toml", to_toml(config));
  copy_tokenizer_into_run(config);
  torch::manual_seed(config.run.seed);
  GPT model(config.model);
  model->to(device);
  Config single = config;
  single.diloco.learners = 1;
  InnerTrainer trainer(model, config.train, make_schedule(single), device);
  trainer.set_skip(config.skippipe, skip_path_seed(config.run.seed, 0));

  EventLog events(run_dir / "events.jsonl", Role::kLearner, 0);
  spdlog::info("[local] run {}: {} parameters (formula {}), {}, {}, device {}, threads torch {} + BLAS {}",
               config.run.name, static_cast<long long>(count_parameters(*model)),
               static_cast<long long>(gpt_parameter_count(config.model)), blas_description(),
               allocator_description(),
               config.run.device, budget.torch_threads, budget.blas_threads);
  if (config.skippipe.stages > 0) {
    const auto& k = config.skippipe;
    spdlog::info("[local] skippipe: {} stages, skip {:.2f} (paths of {} stages), full depth every {} steps{}",
                 static_cast<long long>(k.stages), k.skip, static_cast<long long>(stages_per_path(k.stages, k.skip)),
                 static_cast<long long>(k.full_depth_every), k.full_depth_every == 0 ? " (never)" : "");
  }
  LocalRun run{.config = config, .options = options, .run_dir = run_dir, .data_dir = data_dir, .started = started,
               .device = device, .tok = tok, .val_split = val_split, .model = model, .trainer = trainer,
               .events = events};

  // 2) resume: weights, optimizer moments, data cursor and step counters
  if (options.resume) {
    if (auto finished = resume(run)) return *finished;
  }
  DataStream stream = config_stream(train_split, 0, 1, config, run.cursor);
  run.stream = &stream;

  // 3) the loop
  const bool interrupted = train(run);

  // 4) final evaluation, checkpoint, sample, report
  return finish(run, prompt_ids, interrupted);
}

namespace {

// The active-block mask of a fixed selection (empty: every block); throws InputError.
std::vector<bool> fixed_stage_mask(const ModelConfig& m, const StageSelection& sel) {
  const int64_t S = sel.count > 0 ? sel.count : m.n_layer;
  if (sel.stages.empty()) return stage_blocks(m.n_layer, S, [&] {
      std::vector<int64_t> all(static_cast<size_t>(S));
      std::iota(all.begin(), all.end(), 0);
      return all;
    }());
  return stage_blocks(m.n_layer, S, sel.stages);
}

// Mean token NLL of every validation sequence of T tokens (up to max_tokens) with the selected stages: (sequences).
// A random selection draws its subset per batch of B sequences.
nlohmann::json evaluate_stages(GPT& model, const TokenSplit& split, int64_t max_tokens, int64_t B,
                               const StageSelection& sel) {
  torch::NoGradGuard no_grad;
  model->eval();
  const ModelConfig& m = model->config();
  const int64_t S = sel.count > 0 ? sel.count : m.n_layer, T = m.seq_len;
  std::mt19937_64 rng(sel.seed);
  if (sel.skip_random <= 0) model->set_active_blocks(fixed_stage_mask(m, sel));
  int64_t usable = split.size() - 1;
  if (max_tokens > 0) usable = std::min(usable, max_tokens);
  const int64_t sequences = usable / T;
  DLOCO_CHECK_GT(sequences, 0);
  double nll_sum = 0, ppl_sum = 0;
  std::map<std::string, int64_t> drawn;  // random subsets: how often each was drawn
  for (int64_t first = 0; first < sequences; first += B) {
    if (sel.skip_random > 0) {
      const auto subset = random_stage_subset(S, sel.skip_random, rng);
      model->set_active_blocks(stage_blocks(m.n_layer, S, subset));
      std::string key;
      for (int64_t s : subset) key += (key.empty() ? "" : ",") + std::to_string(s);
      ++drawn[key];
    }
    const int64_t b = std::min(B, sequences - first);
    auto window = torch::empty({b * T + 1}, torch::kLong);
    split.copy(first * T, std::span<int64_t>(window.data_ptr<int64_t>(), static_cast<size_t>(window.numel())));
    const auto x = window.narrow(0, 0, b * T).view({b, T}), y = window.narrow(0, 1, b * T).view({b, T});
    const auto logp = torch::log_softmax(model->forward(x).to(torch::kFloat), -1);     // (b, T, V)
    const auto nll = -logp.gather(2, y.unsqueeze(2)).squeeze(2).to(torch::kDouble).mean(1);  // (b)
    nll_sum += nll.sum().item<double>();
    ppl_sum += nll.exp().sum().item<double>();
  }
  model->set_active_blocks({});
  const double loss = nll_sum / static_cast<double>(sequences);  // sequences of equal length: the mean token NLL
  nlohmann::json out = {{"val_loss", loss}, {"val_perplexity", std::exp(loss)},
                        {"val_perplexity_per_sequence", ppl_sum / static_cast<double>(sequences)},
                        {"stage_count", S}, {"sequences", sequences}};
  if (sel.skip_random > 0) {
    out["skip_random"] = sel.skip_random;
    out["subsets_drawn"] = drawn;
  } else {
    out["stages"] = sel.stages.empty() ? nlohmann::json("all") : nlohmann::json(sel.stages);
  }
  return out;
}

}  // namespace

void check_data_fits_model(const Config& config) {
  const fs::path data_dir(config.data.dir);
  Tokenizer tok(data_dir / "tokenizer.model");
  check_vocab(config.model, tok, config.data.dir);
  check_split_vocab(TokenSplit(split_shards(data_dir, "train")), tok, config.data.dir);
}

nlohmann::json evaluate_checkpoint(const fs::path& checkpoint, const std::optional<std::string>& data_dir,
                                   int64_t max_tokens, int threads, const StageSelection* stages) {
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
  nlohmann::json out = {{"checkpoint", ckpt.dir.string()}, {"step", ckpt.step}, {"data", dir.string()}};
  if (stages) {
    (void)fixed_stage_mask(c.model, *stages);  // a bad selection fails before the evaluation
    out.update(evaluate_stages(model, val, max_tokens, c.train.batch_size, *stages));
    return out;
  }
  const double loss = evaluate_loss(model, val, max_tokens, c.train.batch_size, torch::kCPU);
  out["val_loss"] = loss;
  out["val_perplexity"] = std::exp(loss);
  return out;
}

fs::path checkpoint_tokenizer(const fs::path& checkpoint_dir, const Config& config) {
  const fs::path own = checkpoint_dir.parent_path().parent_path() / "tokenizer.model";  // run/checkpoints/step_N
  if (fs::exists(own)) return own;
  const fs::path data = fs::path(config.data.dir) / "tokenizer.model";
  if (fs::exists(data)) return data;
  throw InputError("no tokenizer for checkpoint '" + checkpoint_dir.string() + "': neither its run folder (" +
                   own.string() + ") nor its data.dir (" + data.string() + ") has tokenizer.model; give --tokenizer");
}

void copy_tokenizer_into_run(const Config& config) {
  std::error_code ec;
  fs::create_directories(config.run_dir(), ec);
  for (const char* file : {"tokenizer.model", "tokenizer.vocab"}) {  // the model and the vocabulary it reads
    const fs::path from = fs::path(config.data.dir) / file, to = config.run_dir() / file;
    if (fs::exists(to)) continue;
    fs::copy_file(from, to, ec);
    if (ec) throw InputError("cannot copy " + from.string() + " into the run folder: " + ec.message());
  }
}

std::string generate_from_checkpoint(const fs::path& checkpoint, const std::string& prompt, int64_t tokens,
                                     double temperature, int64_t top_k, uint64_t seed, int threads,
                                     const StageSelection* stages, const fs::path& tokenizer) {
  // The text comes out at the end: a count that would run for hours looks like a hang (one was left 15 minutes).
  constexpr int64_t kMaxGenerateTokens = 100000;
  if (tokens < 1 || tokens > kMaxGenerateTokens) {
    throw InputError("--tokens must be in [1, " + std::to_string(kMaxGenerateTokens) + "] (got " +
                     std::to_string(tokens) + ")");
  }
  if (!(std::isfinite(temperature) && temperature >= 0)) {  // inf sampled uniformly, nan failed inside LibTorch
    throw InputError("--temperature must be a finite number ≥ 0 (0 = greedy), got " + std::to_string(temperature));
  }
  if (top_k < 0) throw InputError("--top-k must be ≥ 0 (0 = off)");
  apply_thread_budget(thread_budget(threads));
  const auto ckpt = resolve_checkpoint(checkpoint);
  const Config c = checkpoint_config(ckpt);
  const fs::path tokenizer_file = tokenizer.empty() ? checkpoint_tokenizer(ckpt.dir, c) : tokenizer;
  Tokenizer tok(tokenizer_file);
  if (ckpt.manifest.contains("tokenizer") && ckpt.manifest["tokenizer"].value("hash", uint64_t{0}) != tok.hash()) {
    throw InputError("the tokenizer '" + tokenizer_file.string() + "' is not the one this checkpoint was trained with");
  }
  GPT model(c.model);
  load_model_weights(ckpt, model);
  if (stages) {
    if (stages->skip_random > 0) throw InputError("generate takes a fixed --stages subset, not --skip-random");
    model->set_active_blocks(fixed_stage_mask(c.model, *stages));
  }
  return sample_text(model, tok, tok.encode(prompt), tokens, temperature, top_k, seed, torch::kCPU);
}

}  // namespace dloco
