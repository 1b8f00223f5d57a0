// A worker of the synchronous baselines (docs/protocol.md §11), one process per rank, all ranks in one
// Gloo group (collective/process_group.h):
//   dp         every step: all-reduce the gradients (and the loss), then clip, guard and AdamW on every rank
//   diloco     H inner steps, then a blocking all-reduce of the whole model's outer gradients (P = 1, τ = 0)
//   streaming  fragment p's outer gradient is all-reduced from its due step u (u mod H = S_p) and applied at u + τ
// The outer loops (collective/outer_sync.h, one implementation per mode) replicate the decoupled syncer's outer
// step on every rank: Δ_p = Σ w_m·(Θ_p − θ_{m,p}) / Σ w_m, then Nesterov (core/merge.h), then
// θ_p ← α·θ_p + (1 − α)·Θ_p. A run that spends its budget flushes every fragment once more, like the syncer's final
// flush, so a synchronously configured decoupled run and these modes match step for step.
// Rank 0 evaluates the model that matters (dp: the parameters; diloco/streaming: Θ), writes the status file the
// launcher reads and the checkpoints. Every rank writes events/worker_<rank>.jsonl.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <optional>
#include <thread>

#include "collective/dp.h"
#include "collective/flat_model.h"
#include "collective/outer_sync.h"
#include "collective/process_group.h"
#include "collective/worker_status.h"
#include "core/atomic_file.h"
#include "core/control_file.h"
#include "core/events.h"
#include "data/stream.h"
#include "data/tokenizer.h"
#include "collective/worker.h"
#include "train/checkpoint.h"
#include "train/threads.h"
#include "train/trainer.h"

namespace dloco {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

std::atomic<int> g_worker_signal{0};
extern "C" void on_worker_signal(int sig) { g_worker_signal.store(sig); }

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

int run_worker_group(const Config& config, const WorkerOptions& options);

}  // namespace

int run_worker(const Config& config, const WorkerOptions& options) {
  try {
    return run_worker_group(config, options);
  } catch (const CollectiveError& e) {
    std::fprintf(stderr, "[worker %d] the group failed: %s\n", options.rank, e.what());
    return kPeerFailedExit;
  }
}

namespace {

int run_worker_group(const Config& config, const WorkerOptions& options) {
  const Mode mode = config.diloco.mode;
  if (!is_collective_mode(mode)) {
    throw InputError(std::string("dloco worker runs the baselines (diloco.mode = dp, diloco or streaming), not \"") + to_string(mode) + "\"");
  }
  const int M = static_cast<int>(config.diloco.learners), rank = options.rank;
  const bool outer = mode != Mode::kDp;
  std::vector<int> slots = options.slots;  // learner slot (data stream) of each rank of this group
  if (slots.empty()) {
    for (int s = 0; s < M; ++s) slots.push_back(s);
  } else if (outer) {
    throw InputError("--slots (a group without every worker) applies to diloco.mode = \"dp\" only");
  }
  const int W = static_cast<int>(slots.size());
  if (rank < 0 || rank >= W) {
    throw InputError("worker rank " + std::to_string(rank) + " is outside [0, world = " + std::to_string(W) + ")");
  }
  std::vector<bool> seen(M, false);
  for (int s : slots) {
    if (s < 0 || s >= M || seen[s]) {
      throw InputError("--slots: slot " + std::to_string(s) + " is outside [0, M = " + std::to_string(M) +
                       ") or listed twice");
    }
    seen[s] = true;
  }
  const int slot = slots[rank];
  // From the start: a SIGTERM during the rendezvous or the checkpoint load is a stop vote at the first step.
  std::signal(SIGTERM, on_worker_signal);
  std::signal(SIGINT, on_worker_signal);
  apply_thread_budget(thread_budget(static_cast<int>(config.run.threads)));
  fs::create_directories(options.run_dir / "events");
  EventLog events(options.run_dir / "events" / ("worker_" + std::to_string(slot) + ".jsonl"), Role::kLearner, slot);
  std::optional<CheckpointInfo> resumed;
  if (!options.resume_from.empty()) {
    if (outer) throw InputError("--resume-from applies to diloco.mode = \"dp\" only");
    resumed = resolve_checkpoint(options.resume_from);
  }
  const torch::Device device(config.run.device);
  const fs::path data_dir(config.data.dir);
  auto train_split = std::make_shared<TokenSplit>(split_shards(data_dir, "train"));
  std::unique_ptr<TokenSplit> val_split;
  if (rank == 0) val_split = std::make_unique<TokenSplit>(split_shards(data_dir, "val"));

  // Θ0: the syncer's initialisation (same seed), made identical everywhere by a broadcast from rank 0.
  torch::manual_seed(config.run.seed);
  GPT model(config.model);
  model->to(device);
  if (resumed) load_model_weights(*resumed, model);  // every rank reads the same file: no broadcast needed
  Collective group({options.store_file, rank, W, options.hostname, config.run.collective_timeout_s});
  if (!resumed) {
    auto flat = flatten_parameters(model, /*grads=*/false);
    group.broadcast(flat, 0);
    unflatten_into(model, flat, /*grads=*/false);
  }
  const int64_t start_step = resumed ? resumed->step : 0;
  events.emit("joined", {{"pid", ::getpid()}, {"mode", mode}, {"world", W}, {"rank", rank}, {"slots", slots},
                         {"generation", options.generation}, {"from_step", start_step},
                         {"checkpoint", resumed ? resumed->dir.string() : std::string()}});
  std::printf("[worker %d] %s: joined the Gloo group of %d (slot %d, generation %lld, from step %lld)\n", rank,
              to_string(mode), W, slot, static_cast<long long>(options.generation), static_cast<long long>(start_step));
  std::fflush(stdout);

  // Every slot's data cursor at start_step (from the checkpoint when resuming): rank 0 writes them all into its
  // checkpoints, each slot of the group advanced by the steps trained since (all ranks step together).
  const int64_t S = config.data.streams > 0 ? config.data.streams : M;
  std::vector<StreamCursor> start_cursors;
  for (int s = 0; s < M; ++s) start_cursors.push_back(StreamCursor{s, 0, 0, 0});
  int64_t tokens_total = 0;  // dp: tokens trained by the whole group since the run began (every generation)
  if (resumed) {
    const auto& m = resumed->manifest;
    if (!m.contains("cursors") || !m["cursors"].is_array() || static_cast<int>(m["cursors"].size()) != M) {
      throw InputError("checkpoint " + resumed->dir.string() + " has no data cursor per slot (written by another mode?)");
    }
    for (int s = 0; s < M; ++s) start_cursors[s] = StreamCursor::from_json(m["cursors"][s]);
    tokens_total = m.value("tokens_trained", int64_t{0});
  }
  DataStream stream(train_split, slot, S, config.train.batch_size, config.model.seq_len, start_cursors[slot]);
  InnerTrainer trainer(model, config.train, make_schedule(config), device);
  if (resumed && !load_optimizer_state(*resumed, trainer.optimizer())) {
    throw InputError("checkpoint " + resumed->dir.string() + " has no optimizer state: dp cannot resume from it");
  }
  const int64_t tokens_per_step = config.train.tokens_per_step(config.model);
  const int64_t budget = config.train.total_tokens / M;
  const double slowdown = slowdown_factor(config.run, slot, M);
  ControlFile control(options.run_dir / "control" / ("learner_" + std::to_string(slot) + ".json"));
  double wait_s = 0;  // time this rank spent blocked in collectives
  int64_t syncs = 0;
  double stop_votes = 0;  // dp: this rank's vote to stop after the current step, then the group's sum

  if (mode == Mode::kDp) trainer.set_gradient_hook(dp_gradient_hook(model, group, &wait_s, &syncs, &stop_votes));
  auto cursors_at = [&](int64_t step) {  // every slot's cursor after `step` (slots outside the group stand still)
    nlohmann::json out = nlohmann::json::array();
    for (int s = 0; s < M; ++s) {
      StreamCursor c = start_cursors[s];
      if (seen[s]) {
        DataStream shadow(train_split, s, S, config.train.batch_size, config.model.seq_len, c);
        for (int64_t i = 0; i < (step - start_step) * config.train.grad_accum; ++i) shadow.skip();
        c = shadow.cursor();
      }
      out.push_back(c.to_json());
    }
    return out;
  };
  auto tokens_trained = [&] { return outer ? stream.cursor().tokens_served * M : tokens_total; };

  // diloco/streaming: the outer loop, Θ replicated on every rank (collective/outer_sync.h)
  std::unique_ptr<OuterSync> outer_sync = outer ? make_outer_sync(config, model, group, events, wait_s, syncs) : nullptr;
  auto versions = [&] { return outer ? outer_sync->versions() : std::vector<int64_t>{}; };

  // Rank 0: the evaluated model (dp: the parameters; diloco/streaming: Θ), status and checkpoints.
  GPT global_model(nullptr);
  if (rank == 0 && outer) {
    torch::manual_seed(config.run.seed);
    global_model = GPT(config.model);
    global_model->to(device);
  }
  auto evaluated_model = [&]() -> GPT& {
    if (!outer) return model;
    outer_sync->write_global(global_model);
    return global_model;
  };
  const auto started = Clock::now();
  double last_val = NAN, loss_ema = NAN, eval_s = 0;
  int64_t last_eval_step = -1;
  auto manifest = [&](int64_t step) {
    nlohmann::json m;
    m["config"] = to_json(config);
    m["mode"] = mode;
    m["global_step"] = step;
    m["fragment_versions"] = versions();
    m["tokens_trained"] = tokens_trained();
    if (!outer) {
      m["cursors"] = cursors_at(step);
      m["slots"] = slots;
      m["generation"] = options.generation;
    }
    m["tokenizer"] = {{"path", (data_dir / "tokenizer.model").string()},
                      {"hash", tokenizer_file_hash(data_dir / "tokenizer.model")}};
    m["wall_seconds"] = seconds_since(started);
    if (std::isfinite(last_val)) m["val_loss"] = last_val;
    return m;
  };
  auto write_status = [&](int64_t step, bool finished) {
    const double secs = seconds_since(started);
    const nlohmann::json status = stamp_worker_status({
        {"mode", mode}, {"global_step", step}, {"tokens_trained", tokens_trained()}, {"world", W},
        {"generation", options.generation},
        {"tokens_budget", budget * M}, {"val_loss", std::isfinite(last_val) ? nlohmann::json(last_val) : nlohmann::json()},
        {"last_eval_step", last_eval_step}, {"loss", std::isfinite(loss_ema) ? nlohmann::json(loss_ema) : nlohmann::json()},
        {"syncs", syncs}, {"tokens_per_s", (stream.cursor().tokens_served - start_cursors[slot].tokens_served) / std::max(secs, 1e-9)},
        {"wait_s", wait_s}, {"eval_s", eval_s}, {"bytes_sent", group.bytes_sent()}, {"finished", finished}});
    write_file_atomically(options.run_dir / "status.json", status.dump() + "\n");
  };

  int64_t step = start_step;
  auto last_status = Clock::now();
  bool voted_stop = false;  // dp: the group agreed to stop after this step
  auto more = [&] {
    if (outer) return stream.cursor().tokens_served + tokens_per_step <= budget && g_worker_signal.load() == 0;
    return !voted_stop && tokens_total + W * tokens_per_step <= config.train.total_tokens;
  };
  while (more()) {
    const auto t0 = Clock::now();
    const double wait_before = wait_s;
    stop_votes = g_worker_signal.load() != 0 ? 1.0 : 0.0;
    const StepResult r = trainer.step(stream, step);  // dp: the all-reduce runs inside, through the hook
    const double step_s = seconds_since(t0);
    // heterogeneous hardware (run.slowdown) or a fault plan's slow_learner: this worker is `factor` times slower
    if (const double factor = std::max(slowdown, control.slowdown()); factor > 1.0) {
      std::this_thread::sleep_for(std::chrono::duration<double>((factor - 1.0) * (step_s - (wait_s - wait_before))));
    }
    ++step;
    if (!outer) {
      tokens_total += W * r.tokens;
      voted_stop = stop_votes > 0;
    }
    if (std::isfinite(r.loss)) loss_ema = std::isnan(loss_ema) ? r.loss : 0.9 * loss_ema + 0.1 * r.loss;
    if (outer) outer_sync->after_step(step, r.tokens);
    events.emit("step", {{"step", step}, {"loss", r.loss}, {"step_s", step_s}, {"wait_s", wait_s - wait_before},
                         {"skipped", r.skipped}, {"tokens", stream.cursor().tokens_served}});
    if (rank != 0) continue;
    if (config.train.eval_interval > 0 && step % config.train.eval_interval == 0) {
      const auto e0 = Clock::now();
      last_val = evaluate_loss(evaluated_model(), *val_split, config.train.eval_tokens, config.train.batch_size, device);
      eval_s += seconds_since(e0);
      last_eval_step = step;
      events.emit("eval", {{"step", step}, {"val_loss", last_val}, {"tokens", tokens_trained()}});
    }
    if (config.train.checkpoint_interval > 0 && step % config.train.checkpoint_interval == 0) {
      const auto c0 = Clock::now();
      save_checkpoint(options.run_dir, step, evaluated_model(), outer ? nullptr : &trainer.optimizer(), manifest(step));
      events.emit("checkpoint", {{"step", step}, {"seconds", seconds_since(c0)}});
    }
    if (seconds_since(last_status) > 0.5 || last_eval_step == step) {
      write_status(step, false);
      last_status = Clock::now();
    }
  }
  // dp: the budget is spent when no further step of this group fits, also if the stop vote fell on the last step
  const bool budget_spent = !outer && tokens_total + W * tokens_per_step > config.train.total_tokens;
  const bool interrupted = (g_worker_signal.load() != 0 || voted_stop) && !budget_spent;
  if (outer && !interrupted) outer_sync->flush(step);  // land what is in flight, then the final flush
  events.emit("stopped", {{"step", step}, {"signal", g_worker_signal.load()}, {"syncs", syncs}, {"wait_s", wait_s},
                          {"bytes_sent", group.bytes_sent()}, {"versions", versions()}});
  if (rank == 0) {
    // also when interrupted; dp: with the AdamW state and every cursor, so a re-formed group continues from here.
    // A resumed group that trained no step leaves its checkpoint alone (the other ranks may still be reading it).
    if (!(resumed && step == start_step)) {
      save_checkpoint(options.run_dir, step, evaluated_model(), outer ? nullptr : &trainer.optimizer(), manifest(step));
      events.emit("checkpoint", {{"step", step}, {"final", !interrupted}});
    }
    write_status(step, !interrupted);
  }
  std::printf("[worker %d] %s at step %lld: %lld syncs, %.1f s waiting in collectives\n", rank,
              interrupted ? "stopped" : "finished", static_cast<long long>(step), static_cast<long long>(syncs), wait_s);
  std::fflush(stdout);
  return 0;
}

}  // namespace

}  // namespace dloco
