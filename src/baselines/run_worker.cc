// A worker of the synchronous baselines (docs/protocol.md §11), one process per learner slot (plus its group's
// ranks, below), the workers in one Gloo group (collective/process_group.h):
//   dp         every step: all-reduce the gradients (and the loss), then clip, guard and AdamW on every rank
//   diloco     H inner steps, then a blocking all-reduce of the whole model's outer gradients (P = 1, τ = 0)
//   streaming  fragment p's outer gradient is all-reduced from its due step u (u mod H = S_p) and applied at u + τ
// The outer loops (baselines/outer_loops.h, one implementation per mode) replicate the decoupled syncer's outer
// step on every rank: Δ_p = Σ w_m·(Θ_p − θ_{m,p}) / Σ w_m, then Nesterov (core/merge.h), then
// θ_p ← α·θ_p + (1 − α)·Θ_p. A run that spends its budget flushes every fragment once more, like the syncer's final
// flush, so a synchronously configured decoupled run and these modes match step for step.
// Rank 0 evaluates the model that matters (dp: the parameters; diloco/streaming: Θ), writes the status file the
// launcher reads and the checkpoints. Every worker writes events/worker_<slot>.jsonl. A worker is an inner job
// (learner/inner_job.h): one process holding the GPT, or a learner group of R ranks ([parallel], docs/parallel.md
// "Baselines over learner groups") whose other ranks it spawns. diloco and streaming merge the group's fragments among
// the workers (rank 0 of each group, the leader, takes part); dp averages every rank's gradients with the same rank of
// every other worker's group.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <csignal>
#include <optional>
#include <thread>

#include <spdlog/spdlog.h>

#include "baselines/dp.h"
#include "baselines/launcher.h"  // write_worker_report
#include "baselines/outer_loops.h"
#include "baselines/worker_state.h"
#include "baselines/worker.h"
#include "baselines/worker_group.h"
#include "baselines/worker_status.h"
#include "collective/flat_model.h"
#include "collective/process_group.h"
#include "core/json_read.h"
#include "core/slowdown.h"
#include "data/stream.h"
#include "data/tokenizer.h"
#include "learner/gpt_inner_job.h"
#include "learner/group_engine.h"
#include "learner/group_inner_job.h"
#include "learner/group_ranks.h"
#include "process/atomic_file.h"
#include "process/control_file.h"
#include "process/events.h"
#include "process/host.h"
#include "train/checkpoint.h"
#include "train/fragment_io.h"
#include "train/run.h"
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
  check_device(config.run.device);
  const auto started = Clock::now();
  try {
    const int code = run_worker_group(config, options);
    if (code == 0 && options.by_hand && options.rank == 0) {  // no launcher to write the report
      const int cores = config.run.threads > 0 ? static_cast<int>(config.run.threads) : machine_cores();
      write_worker_report(config, options.run_dir, static_cast<int>(group_slots(config, options).size()),
                          seconds_since(started), cores);
    }
    return code;
  } catch (const CollectiveError& e) {
    spdlog::warn("[worker {}] the group failed: {}", options.rank, e.what());
    return kPeerFailedExit;
  }
}

namespace {

// θ_m of the outer loops: the inner job's fragments.
class JobReplica final : public FragmentReplica {
 public:
  explicit JobReplica(InnerJob& job) : job_(job) {}
  void read_fragment(int p, std::span<float> out) override { job_.read_fragment(p, out); }
  void write_fragment(int p, std::span<const float> values) override { job_.write_fragment(p, values); }

 private:
  InnerJob& job_;
};

}  // namespace

namespace {

// The workers' Gloo group: the rendezvous the launcher (or the user, across hosts) named, with the run's security.
CollectiveOptions collective_options(const Config& config, const WorkerOptions& options, int rank, int world) {
  CollectiveOptions o{options.store, rank, world, options.hostname, config.run.collective_timeout_s};
  apply_run_security(o, config);
  return o;
}

std::vector<bool> slot_mask(const std::vector<int>& slots, int M) {
  std::vector<bool> seen(M, false);
  for (int s : slots) seen[s] = true;
  return seen;
}

// Where this group starts: every slot's data cursor and the tokens trained (from the checkpoint when resuming).
struct StartPoint {
  int64_t step = 0;
  std::vector<StreamCursor> cursors;  // one per slot
  int64_t tokens_total = 0;           // dp: tokens trained by the whole group since the run began (every generation)
};

// One rank of the group: the model, its data, the trainer, the outer loop and what rank 0 reports. Constructing
// it joins the group; the members are built in the order written, which is the order of the steps.
class Worker {
 public:
  /// `ranks`: this worker's learner group's other ranks (spawn_group_ranks), null for a one-process worker.
  Worker(const Config& config, const WorkerOptions& options, std::vector<int> slots, GroupRanks* ranks);
  void train();
  int finish();

 private:
  GPT initial_model();
  StartPoint join_group();
  std::unique_ptr<InnerJob> make_job();
  void restore_optimizer();
  void restore_worker_state();
  void save_worker_state_at(int64_t step);
  void refresh_model();
  torch::optim::Optimizer* checkpointed_optimizer();
  void save(int64_t step);
  nlohmann::json cursors_at(int64_t step);
  int64_t tokens_trained() const { return outer_ ? job_->cursor().tokens_served * M_ : tokens_total_; }
  std::vector<int64_t> versions() const { return outer_ ? outer_sync_->versions() : std::vector<int64_t>{}; }
  GPT& evaluated_model();
  nlohmann::json manifest(int64_t step);
  void write_status(int64_t step, bool finished);
  bool more() const;
  void train_step();
  InnerStep job_step();
  void evaluate_and_checkpoint();

  const Config& config_;
  const WorkerOptions& options_;
  const Mode mode_;
  const bool outer_;
  const std::vector<int> slots_;
  const std::vector<bool> seen_;
  const int M_, W_, rank_, slot_;
  EventLog events_;
  std::optional<CheckpointInfo> resumed_;
  std::optional<WorkerState> saved_;  // diloco/streaming resuming: this worker's own state at the resumed step
  int64_t last_state_step_ = -1;      // diloco/streaming: the step of the worker state saved last
  const torch::Device device_;
  const fs::path data_dir_;
  std::shared_ptr<TokenSplit> train_split_;
  std::unique_ptr<TokenSplit> val_split_;  // rank 0 only
  const ParallelConfig parallel_;  // this worker's group (R = 1: one process)
  GroupRanks* const ranks_;        // a learner group: ranks 1 … R − 1 (owned by run_worker_group); else null
  GPT model_;  // Θ0; then θ: the one-process job's model, or a group's mirror (refresh_model before reading it)
  Collective group_;
  const int64_t S_;
  const StartPoint start_;
  const FragmentLayout layout_;
  GptInnerJob* gpt_job_ = nullptr;  // the one-process job (dp's gradient hook, the checkpointed AdamW); set by
                                    // make_job, so declared before job_
  std::unique_ptr<InnerJob> job_;
  JobReplica replica_;
  int64_t tokens_total_;  // dp: tokens trained by the whole group since the run began (every generation)
  const int64_t tokens_per_step_, budget_;
  StepSlowdown slowdown_;  // run.slowdown: this worker's step-time multipliers (of its steady compute)
  ControlFile control_;
  double wait_s_ = 0;  // time this rank spent blocked in collectives
  int64_t syncs_ = 0;
  double stop_votes_ = 0;  // dp: this rank's vote to stop after the current step, then the group's sum
  // diloco/streaming: the outer loop, Θ replicated on every rank (baselines/outer_loops.h)
  std::unique_ptr<OuterSync> outer_sync_;
  GPT global_model_{nullptr};  // rank 0 of diloco/streaming: Θ, the evaluated model
  Clock::time_point started_;
  double last_val_ = NAN, loss_ema_ = NAN, eval_s_ = 0;
  int64_t last_eval_step_ = -1;
  int64_t step_;
  Clock::time_point last_status_;
  bool voted_stop_ = false;  // dp: the group agreed to stop after this step
};

Worker::Worker(const Config& config, const WorkerOptions& options, std::vector<int> slots, GroupRanks* ranks)
    : config_(config),
      options_(options),
      mode_(config.diloco.mode),
      outer_(mode_ != Mode::kDp),
      slots_(std::move(slots)),
      seen_(slot_mask(slots_, static_cast<int>(config.diloco.learners))),
      M_(static_cast<int>(config.diloco.learners)),
      W_(static_cast<int>(slots_.size())),
      rank_(options.rank),
      slot_(slots_[rank_]),
      events_(options.run_dir / "events" / ("worker_" + std::to_string(slot_) + ".jsonl"), Role::kLearner, slot_),
      resumed_([&]() -> std::optional<CheckpointInfo> {
        if (options.resume_from.empty()) return std::nullopt;
        return resolve_checkpoint(options.resume_from);
      }()),
      saved_(resumed_ && outer_ ? std::optional(load_worker_state(options.run_dir, resumed_->step, slot_))
                                : std::nullopt),
      last_state_step_(resumed_ ? resumed_->step : -1),
      device_(config.run.device),
      data_dir_(config.data.dir),
      train_split_(std::make_shared<TokenSplit>(split_shards(data_dir_, "train"))),
      val_split_(rank_ == 0 ? std::make_unique<TokenSplit>(split_shards(data_dir_, "val")) : nullptr),
      parallel_(config.parallel_for(slot_)),
      ranks_(ranks),
      model_(initial_model()),
      group_(collective_options(config, options, rank_, W_)),
      S_(config.data.streams > 0 ? config.data.streams : M_),
      start_(join_group()),
      layout_(model_layout(model_, config.diloco)),
      job_(make_job()),
      replica_(*job_),
      tokens_total_(start_.tokens_total),
      tokens_per_step_(config.train.tokens_per_step(config.model)),
      budget_(config.train.total_tokens / M_),
      slowdown_(slowdown_spec(config.run, slot_, M_), config.run.seed, slot_),
      control_(options.run_dir / "control" / ("learner_" + std::to_string(slot_) + ".json")) {
  if (resumed_ && !outer_) restore_optimizer();
  if (mode_ == Mode::kDp && gpt_job_) {
    gpt_job_->trainer().set_gradient_hook(dp_gradient_hook(model_, group_, &wait_s_, &syncs_, &stop_votes_));
  }
  if (outer_) outer_sync_ = make_outer_sync(config_, replica_, layout_, group_, events_, wait_s_, syncs_);
  if (saved_) restore_worker_state();
  if (rank_ == 0 && outer_) {
    torch::manual_seed(config_.run.seed);
    global_model_ = GPT(config_.model);
    global_model_->to(device_);
  }
  if (resumed_ && options_.generation == 0) {  // `dloco train --resume` (not a recovery's re-formed group): the
    const auto& m = resumed_->manifest;        // run's counters go on from the checkpoint's
    syncs_ = json_integer_or(m, "syncs", 0, "checkpoint manifest");
    if (const auto w = m.find("wait_s"); w != m.end() && w->is_number()) wait_s_ = w->get<double>();
  }
  started_ = Clock::now();
  step_ = start_.step;
  last_status_ = Clock::now();
}

// Θ0: the syncer's initialisation (same seed); join_group makes it identical everywhere.
GPT Worker::initial_model() {
  torch::manual_seed(config_.run.seed);
  GPT model(config_.model);
  model->to(device_);
  if (resumed_) load_model_weights(*resumed_, model);  // every rank reads the same file: no broadcast needed
  return model;
}

// The inner job at the start step: the one-process GPT job over model_, or the group (rank 0 here) with Θ0 (or
// the resumed weights) written onto every rank.
std::unique_ptr<InnerJob> Worker::make_job() {
  DataStream stream = config_stream(train_split_, slot_, S_, config_, start_.cursors[slot_]);
  if (!ranks_) {
    auto job = std::make_unique<GptInnerJob>(model_, layout_, config_.train, make_schedule(config_), device_,
                                             std::move(stream));
    job->trainer().set_skip(config_.skippipe, skip_path_seed(config_.run.seed, slot_));
    gpt_job_ = job.get();
    return job;
  }
  auto group = ranks_->join();
  auto engine = make_group_engine(config_.model, config_.run.seed + 1 + static_cast<uint64_t>(slot_),
                                  parallel_, config_.train, *group,
                                  options_.run_dir / "offload" / ("learner_" + std::to_string(slot_) + "_rank_0"));
  if (mode_ == Mode::kDp) engine->set_replicas(&group_);  // the leaders are rank 0 of every group
  events_.emit("group_formed", {{"ranks", parallel_.ranks()}, {"group", engine->describe()},
                                {"store", ranks_->store()}, {"pids", ranks_->pids()}});
  spdlog::info("[worker {}] a group of {} ranks: {}", rank_, static_cast<long long>(parallel_.ranks()),
               engine->describe());
  auto job = std::make_unique<GroupInnerJob>(model_, layout_, config_.train, make_schedule(config_), std::move(stream),
                                             std::move(engine), std::move(group), group_timeout_s(config_, slot_));
  // Every fragment read before the first write: a write gathers the tensors it covers in part into the mirror
  // (model_), which would overwrite the other parts' Θ0 before they are read.
  const auto params = layout_parameters(model_, layout_);
  const int P = static_cast<int>(layout_.fragments.size());
  std::vector<std::vector<float>> theta0(static_cast<size_t>(P));
  for (int p = 0; p < P; ++p) {
    theta0[p].resize(static_cast<size_t>(layout_.fragments[p].numel));
    gather_parameters(params, layout_, p, theta0[p]);
  }
  for (int p = 0; p < P; ++p) job->write_fragment(p, theta0[p]);
  return job;
}

// dp resuming: the AdamW state saved with the checkpoint (a group's: its folder group_state, rank by rank).
void Worker::restore_optimizer() {
  if (gpt_job_) {
    if (!load_optimizer_state(*resumed_, gpt_job_->trainer().optimizer())) {
      throw InputError("checkpoint " + resumed_->dir.string() + " has no optimizer state: dp cannot resume from it");
    }
    events_.emit("optimizer_restored", {{"step", resumed_->step}, {"from", resumed_->dir.string()}});
    return;
  }
  std::string why = "it has none";
  if (job_->restore_state(resumed_->dir / "group_state", &why) != resumed_->step) {
    throw InputError("checkpoint " + resumed_->dir.string() + " has no usable optimizer state of this learner group (" +
                     why + "): dp cannot resume from it");
  }
  events_.emit("optimizer_restored", {{"step", resumed_->step}, {"from", (resumed_->dir / "group_state").string()}});
}

// diloco/streaming resuming: θ_m, the inner optimizer and the outer loop as this worker saved them at the resumed
// step (its cursor is already in start_), so that it goes on exactly as if it had not stopped.
void Worker::restore_worker_state() {
  write_theta_m(*saved_, layout_, replica_);
  restore_inner_state(options_.run_dir, resumed_->step, slot_, *job_);
  outer_sync_->restore(std::move(saved_->outer));
  events_.emit("worker_state_restored", {{"step", resumed_->step},
                                         {"from", worker_state_dir(options_.run_dir, resumed_->step, slot_).string()}});
  saved_.reset();
}

// diloco/streaming: this worker's own state at `step` (every worker, at the same steps: the checkpoints' and the
// agreed stop), beside rank 0's checkpoint of Θ.
void Worker::save_worker_state_at(int64_t step) {
  if (step == last_state_step_) return;  // a resumed worker that trained no step leaves its state alone
  const WorkerState state = capture_worker_state(step, job_->cursor(), layout_, replica_, *outer_sync_);
  save_worker_state(options_.run_dir, slot_, state, *job_, M_);
  last_state_step_ = step;
  events_.emit("worker_state_saved", {{"step", step}});
}

// A group's mirror takes the ranks' current parameters (every fragment gathered); one process: model_ is θ.
void Worker::refresh_model() {
  if (gpt_job_) return;
  for (int p = 0; p < static_cast<int>(layout_.fragments.size()); ++p) {
    std::vector<float> values(static_cast<size_t>(layout_.fragments[p].numel));
    job_->read_fragment(p, values);
  }
}

torch::optim::Optimizer* Worker::checkpointed_optimizer() {
  return !outer_ && gpt_job_ ? &gpt_job_->trainer().optimizer() : nullptr;
}

// Rank 0's checkpoint at `step`: the evaluated model; dp also the AdamW state (a group's in group_state).
void Worker::save(int64_t step) {
  GPT& model = evaluated_model();
  std::function<void(const fs::path&, nlohmann::json&)> group_state;
  if (!outer_ && !gpt_job_) {
    group_state = [this, step](const fs::path& dir, nlohmann::json& m) {
      job_->save_state(dir / "group_state", step);
      m["group_state"] = "group_state";
    };
  }
  // diloco/streaming: rank 0 may be up to H + τ steps ahead of the slowest worker, whose state at a step rank 0
  // already checkpointed may still be on its way: keep every checkpoint of that window, so one with every worker's
  // state stays (baselines/worker_state.h).
  const int64_t interval = config_.train.checkpoint_interval;
  const int keep = outer_ && interval > 0
                       ? 2 + static_cast<int>((config_.diloco.inner_steps + config_.diloco.overlap + interval - 1) / interval)
                       : 2;
  save_checkpoint(options_.run_dir, step, model, checkpointed_optimizer(), manifest(step), keep, group_state);
}

// Θ0 broadcast from rank 0 (unless resuming), the "joined" event, and every slot's data cursor at the start
// step: rank 0 writes them all into its checkpoints, each slot of the group advanced by the steps trained since
// (all ranks step together).
StartPoint Worker::join_group() {
  if (!resumed_) {
    auto flat = flatten_parameters(model_, /*grads=*/false);
    group_.broadcast(flat, 0);
    unflatten_into(model_, flat, /*grads=*/false);
  }
  StartPoint start;
  start.step = resumed_ ? resumed_->step : 0;
  events_.emit("joined", {{"pid", ::getpid()}, {"mode", mode_}, {"world", W_}, {"rank", rank_}, {"slots", slots_},
                          {"generation", options_.generation}, {"from_step", start.step},
                          {"checkpoint", resumed_ ? resumed_->dir.string() : std::string()}, {"host", hostname()}});
  spdlog::info("[worker {}] {}: joined the Gloo group of {} (slot {}, generation {}, from step {})", rank_,
               to_string(mode_), W_, slot_, static_cast<long long>(options_.generation),
               static_cast<long long>(start.step));
  for (int s = 0; s < M_; ++s) start.cursors.push_back(StreamCursor{s, 0, 0, 0});
  if (saved_) {  // diloco/streaming: each worker its own cursor
    start.cursors[slot_] = saved_->cursor;
    start.tokens_total = resumed_->manifest.value("tokens_trained", int64_t{0});
  } else if (resumed_) {
    const auto& m = resumed_->manifest;
    if (!m.contains("cursors") || !m["cursors"].is_array() || static_cast<int>(m["cursors"].size()) != M_) {
      throw InputError("checkpoint " + resumed_->dir.string() + " has no data cursor per slot (written by another mode?)");
    }
    for (int s = 0; s < M_; ++s) start.cursors[s] = StreamCursor::from_json(m["cursors"][s]);
    start.tokens_total = m.value("tokens_trained", int64_t{0});
  }
  return start;
}

// Every slot's cursor after `step` (slots outside the group stand still).
nlohmann::json Worker::cursors_at(int64_t step) {
  nlohmann::json out = nlohmann::json::array();
  for (int s = 0; s < M_; ++s) {
    StreamCursor c = start_.cursors[s];
    if (seen_[s]) {
      DataStream shadow = config_stream(train_split_, s, S_, config_, c);
      for (int64_t i = 0; i < (step - start_.step) * config_.train.grad_accum; ++i) shadow.skip();
      c = shadow.cursor();
    }
    out.push_back(c.to_json());
  }
  return out;
}

// Rank 0's evaluated model: dp, the parameters; diloco/streaming, Θ.
GPT& Worker::evaluated_model() {
  if (!outer_) {
    refresh_model();
    return model_;
  }
  outer_sync_->write_global(global_model_);
  return global_model_;
}

nlohmann::json Worker::manifest(int64_t step) {
  nlohmann::json m;
  m["config"] = to_json(config_);
  m["mode"] = mode_;
  m["global_step"] = step;
  m["fragment_versions"] = versions();
  m["tokens_trained"] = tokens_trained();
  if (!outer_) {
    m["cursors"] = cursors_at(step);
    m["slots"] = slots_;
    m["generation"] = options_.generation;
  }
  m["tokenizer"] = {{"path", (data_dir_ / "tokenizer.model").string()},
                    {"hash", tokenizer_file_hash(data_dir_ / "tokenizer.model")}};
  m["wall_seconds"] = seconds_since(started_);
  m["syncs"] = syncs_;  // since the run began: a resumed run's report counts them from here
  m["wait_s"] = wait_s_;
  if (std::isfinite(last_val_)) m["val_loss"] = last_val_;
  return m;
}

void Worker::write_status(int64_t step, bool finished) {
  const double secs = seconds_since(started_);
  const nlohmann::json status = stamp_worker_status({
      {"mode", mode_}, {"global_step", step}, {"tokens_trained", tokens_trained()}, {"world", W_},
      {"generation", options_.generation},
      {"tokens_budget", budget_ * M_}, {"val_loss", std::isfinite(last_val_) ? nlohmann::json(last_val_) : nlohmann::json()},
      {"last_eval_step", last_eval_step_}, {"loss", std::isfinite(loss_ema_) ? nlohmann::json(loss_ema_) : nlohmann::json()},
      {"syncs", syncs_}, {"tokens_per_s", (job_->cursor().tokens_served - start_.cursors[slot_].tokens_served) / std::max(secs, 1e-9)},
      {"wait_s", wait_s_}, {"eval_s", eval_s_}, {"bytes_sent", group_.bytes_sent()}, {"finished", finished}});
  write_file_atomically(options_.run_dir / "status.json", status.dump() + "\n");
}

bool Worker::more() const {
  // diloco/streaming: a signal is voted in the next merge, and every worker stops after the one that carried it
  if (outer_) return job_->cursor().tokens_served + tokens_per_step_ <= budget_ && !outer_sync_->stop_agreed();
  return !voted_stop_ && tokens_total_ + W_ * tokens_per_step_ <= config_.train.total_tokens;
}

void Worker::train() {
  while (more()) {
    train_step();
    if (rank_ == 0) evaluate_and_checkpoint();
    if (outer_ && config_.train.checkpoint_interval > 0 && step_ % config_.train.checkpoint_interval == 0) {
      save_worker_state_at(step_);
    }
  }
}

void Worker::train_step() {
  const auto t0 = Clock::now();
  const double wait_before = wait_s_;
  stop_votes_ = g_worker_signal.load() != 0 ? 1.0 : 0.0;
  const InnerStep r = job_step();  // dp: the all-reduce runs inside (the hook, or the group's engines)
  const double step_s = seconds_since(t0);
  // Heterogeneous hardware (run.slowdown) or a slow_learner fault: `factor` times slower. In slices with a
  // keep-alive between them: a learner group's ranks wait for commands with a deadline.
  const double sleep_s = slowdown_.sleep_after(step_s - (wait_s_ - wait_before), control_.slowdown());
  if (sleep_s > 0) {
    const auto until = Clock::now() + std::chrono::microseconds(static_cast<int64_t>(sleep_s * 1e6));
    while (Clock::now() < until) {
      std::this_thread::sleep_for(std::min<Clock::duration>(until - Clock::now(), std::chrono::milliseconds(250)));
      job_->idle();
    }
  }
  ++step_;
  if (!outer_) {
    tokens_total_ += W_ * r.tokens;
    voted_stop_ = stop_votes_ > 0;
  }
  if (std::isfinite(r.loss)) loss_ema_ = std::isnan(loss_ema_) ? r.loss : 0.9 * loss_ema_ + 0.1 * r.loss;
  if (outer_) outer_sync_->after_step(step_, r.tokens, g_worker_signal.load() != 0);
  events_.emit("step", {{"step", step_}, {"loss", r.loss}, {"step_s", step_s}, {"wait_s", wait_s_ - wait_before},
                        {"sleep_s", sleep_s}, {"skipped", r.skipped}, {"tokens", job_->cursor().tokens_served}});
}

// The inner step; a group in dp then votes on stopping over the workers (one process: inside the dp hook).
InnerStep Worker::job_step() {
  const double replica_wait0 = group_.traffic().all_reduce.wait_s;
  const InnerStep r = job_->step(step_);
  if (mode_ == Mode::kDp && !gpt_job_) {
    // the engines' gradient all-reduces over the workers are time outside this group's compute
    wait_s_ += group_.traffic().all_reduce.wait_s - replica_wait0;
    const auto v0 = Clock::now();
    auto votes = torch::full({1}, stop_votes_, torch::kFloat);
    group_.allreduce_sum(votes);
    stop_votes_ = votes.item<double>();
    wait_s_ += seconds_since(v0);
    ++syncs_;
  }
  return r;
}

// Rank 0, after each step: the evaluation, the checkpoint and the status file when they are due.
void Worker::evaluate_and_checkpoint() {
  const int64_t step = step_;
  if (config_.train.eval_interval > 0 && step % config_.train.eval_interval == 0) {
    const auto e0 = Clock::now();
    last_val_ = evaluate_loss(evaluated_model(), *val_split_, config_.train.eval_tokens, config_.train.batch_size, device_);
    eval_s_ += seconds_since(e0);
    last_eval_step_ = step;
    events_.emit("eval", {{"step", step}, {"val_loss", last_val_}, {"tokens", tokens_trained()}});
  }
  if (config_.train.checkpoint_interval > 0 && step % config_.train.checkpoint_interval == 0) {
    const auto c0 = Clock::now();
    save(step);
    events_.emit("checkpoint", {{"step", step}, {"seconds", seconds_since(c0)}});
  }
  if (seconds_since(last_status_) > 0.5 || last_eval_step_ == step) {
    write_status(step, false);
    last_status_ = Clock::now();
  }
}

// The final flush (diloco/streaming), the "stopped" event, rank 0's last checkpoint and status. Returns 0.
int Worker::finish() {
  const int64_t step = step_;
  // dp: the budget is spent when no further step of this group fits, also if the stop vote fell on the last step
  // diloco/streaming: interrupted only by a stop the group agreed on (a signal after the last merge is too late)
  const bool budget_spent = outer_ ? job_->cursor().tokens_served + tokens_per_step_ > budget_
                                   : tokens_total_ + W_ * tokens_per_step_ > config_.train.total_tokens;
  const bool interrupted =
      (outer_ ? outer_sync_->stop_agreed() : g_worker_signal.load() != 0 || voted_stop_) && !budget_spent;
  if (outer_ && !interrupted) outer_sync_->flush(step);  // land what is in flight, then the final flush
  if (outer_ && interrupted) save_worker_state_at(step);  // every worker at the same step: resumable
  events_.emit("stopped", {{"step", step}, {"signal", g_worker_signal.load()}, {"syncs", syncs_}, {"wait_s", wait_s_},
                           {"bytes_sent", group_.bytes_sent()}, {"versions", versions()}});
  if (options_.by_hand) group_.barrier();  // every worker's "stopped" is written before rank 0's report reads them
  if (rank_ == 0) {
    // also when interrupted; dp: with the AdamW state and every cursor, so a re-formed group continues from here.
    // A resumed group that trained no step leaves its checkpoint alone (the other ranks may still be reading it).
    if (!(resumed_ && step == start_.step)) {
      save(step);
      events_.emit("checkpoint", {{"step", step}, {"final", !interrupted}});
    }
    write_status(step, !interrupted);
  }
  spdlog::info("[worker {}] {} at step {}: {} syncs, {:.1f} s waiting in collectives", rank_,
               interrupted ? "stopped" : "finished", static_cast<long long>(step), static_cast<long long>(syncs_), wait_s_);
  return 0;
}

int run_worker_group(const Config& config, const WorkerOptions& options) {
  std::vector<int> slots = group_slots(config, options);
  // From the start: a SIGTERM during the rendezvous or the checkpoint load is a stop vote at the first step.
  std::signal(SIGTERM, on_worker_signal);
  std::signal(SIGINT, on_worker_signal);
  apply_thread_budget(thread_budget(static_cast<int>(config.run.threads)));
  fs::create_directories(options.run_dir / "events");
  const std::unique_ptr<GroupRanks> ranks = spawn_group_ranks(config, options, slots);
  const int slot = slots[options.rank];
  try {
    Worker worker(config, options, std::move(slots), ranks.get());
    worker.train();
    return worker.finish();
  } catch (const CollectiveError& e) {
    // At any point (start-up, a step, a checkpoint, the outer sync): this worker's own failure when one of its
    // ranks was killed or failed by itself, else a casualty of a peer (run_worker returns kPeerFailedExit).
    for (int i = 0; ranks && i < 50; ++i) {  // a rank that was killed is reaped within a few ms
      if (const std::string dead = ranks->failed_rank(); !dead.empty()) {
        spdlog::warn("[worker {}] its learner group failed: {} ({}; see logs/learner_{}_rank_*.log)",
                     options.rank, dead, e.what(), slot);
        return kOwnGroupFailedExit;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    throw;
  }
}

}  // namespace

}  // namespace dloco
