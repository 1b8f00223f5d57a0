// The learner process (docs/protocol.md "Learner loop"): bootstrap (learner/bootstrap.h), then the loop
//   1) batch  2) inner step  3) counters  4) metadata  5) answer pulls at the step boundary  6) apply merges
// over an inner job (learner/gpt_inner_job.h) and the outer sync (learner/outer_sync.h). The loop never waits on
// the network: the link's queues are polled, never awaited (except in the opt-in blocking mode).
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <map>
#include <mutex>
#include <thread>

#include "core/control_file.h"
#include "core/decisions.h"
#include "core/events.h"
#include "core/prometheus.h"
#include "data/stream.h"
#include "learner/bootstrap.h"
#include "learner/gpt_inner_job.h"
#include "learner/group_inner_job.h"
#include "learner/group_ranks.h"
#include "learner/learner.h"
#include "learner/outer_sync.h"
#include "monitor/monitor_server.h"
#include "train/fragment_io.h"
#include "train/run.h"
#include "train/threads.h"
#include "transport/handshake.h"
#include "transport/local_address.h"

namespace dloco {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

std::atomic<int> g_learner_signal{0};
extern "C" void on_learner_signal(int sig) { g_learner_signal.store(sig); }

std::string hostname() {
  char buf[256] = {};
  ::gethostname(buf, sizeof(buf) - 1);
  return buf;
}

// Where the stream resumes (exact data): the stream's own log is at least as new as the syncer's copy of the
// cursor (which lags by up to a second, or more after a syncer restart). One step's batches after the last record
// are skipped: they were trained, or lost when the previous incarnation died, but never retrained.
DataStream resume_stream(const Config& config, const wire::JoinReply& joined, const StreamLog& log, bool* from_log) {
  StreamCursor cursor{joined.stream_index, 0, 0, 0};
  if (!joined.stream_cursor_json.empty()) cursor = StreamCursor::from_json(nlohmann::json::parse(joined.stream_cursor_json));
  const auto& taken = log.last_taken();
  *from_log = taken && taken->stream == joined.stream_index && taken->tokens_served >= cursor.tokens_served;
  if (*from_log) cursor = *taken;
  // The data is cut into the syncer's S streams (it leases them), whatever this learner's config says.
  const int64_t S = joined.streams > 0 ? joined.streams
                                       : (config.data.streams > 0 ? config.data.streams : config.diloco.learners);
  if (joined.stream_index < 0 || joined.stream_index >= S) {
    throw InputError("the syncer leased stream " + std::to_string(joined.stream_index) + " of S = " +
                     std::to_string(S) + " streams");
  }
  auto split = std::make_shared<TokenSplit>(split_shards(fs::path(config.data.dir), "train"));
  DataStream stream(split, joined.stream_index, S, config.train.batch_size, config.model.seq_len, cursor);
  for (int64_t i = 0; *from_log && i < config.train.grad_accum; ++i) stream.skip();  // a step reads accum batches
  return stream;
}

OuterSyncConfig outer_sync_config(const Config& config, int id, const FragmentLayout& layout) {
  OuterSyncConfig c;
  c.learner_id = id;
  c.fragments = static_cast<int>(layout.fragments.size());
  for (const auto& f : layout.fragments) c.fragment_numel.push_back(f.numel);
  c.inner_steps = config.diloco.inner_steps;
  c.overlap = config.diloco.overlap;
  c.alpha = config.diloco.alpha;
  c.reanchor = config.diloco.stale_policy == StalePolicy::kReanchor;
  c.blocking = config.diloco.blocking;
  c.codec = wire::parse_codec(to_string(config.diloco.wire_up));
  c.error_feedback = config.diloco.error_feedback;
  return c;
}

// What the learner's /metrics endpoint shows (docs/monitoring.md): written by the training thread after each step,
// read by the endpoint's threads.
struct LearnerGauges {
  std::mutex mu;
  int id = 0;
  int64_t step = 0, tokens = 0, merges_applied = 0, lost_steps = 0, reconnects = 0;
  double loss = NAN, tokens_per_s = 0, step_s = 0, boundary_s = 0;

  std::string text() {
    std::lock_guard lock(mu);
    PrometheusText m;
    const PrometheusLabels who = {{"learner", std::to_string(id)}};
    m.gauge("dloco_learner_step", "Inner steps this learner has trained (its step counter).", double(step), who);
    m.counter("dloco_learner_tokens_trained_total", "Tokens this learner served from its stream.", double(tokens), who);
    m.gauge("dloco_learner_loss", "Training loss (EMA), nats/token.", loss, who);
    m.gauge("dloco_learner_tokens_per_second", "Training speed (EMA of the step time), tokens/s.", tokens_per_s, who);
    m.gauge("dloco_learner_step_seconds", "Compute time of the last inner step, s.", step_s, who);
    m.gauge("dloco_learner_boundary_seconds", "Time outside compute after the last step (sync, metadata), s.",
            boundary_s, who);
    m.counter("dloco_learner_merges_applied_total", "Merged fragments applied to this learner's copy.",
              double(merges_applied), who);
    m.counter("dloco_learner_lost_steps_total", "Steps whose work a merge without this learner dropped.",
              double(lost_steps), who);
    m.counter("dloco_learner_reconnects_total", "Sessions re-opened to the syncer.", double(reconnects), who);
    return m.str();
  }
};

// The training loop and what it keeps between steps. `phase` is training when it starts.
class LearnerLoop {
 public:
  LearnerLoop(const Config& config, int id, const fs::path& run_dir, int64_t step, int64_t stream, int64_t budget,
              InnerJob& job, OuterSync& sync, LearnerLink& link, StreamLog& log, EventLog& events,
              LearnerPhaseMachine& phase)
      : phase_(phase), config_(config), id_(id), run_dir_(run_dir), step_(step), stream_(stream), budget_(budget), job_(job),
        sync_(sync), link_(link), log_(&log), events_(events),
        control_(run_dir / "control" / ("learner_" + std::to_string(id) + ".json")),
        slowdown_(slowdown_factor(config.run, id, config.diloco.learners)),
        tokens_per_step_(config.train.tokens_per_step(config.model)) {}

  // Trains until this stream's budget is spent, then keeps answering the final flush until the syncer stops the
  // run or a signal asks the learner to leave.
  void run() {
    row_tokens_ = job_.cursor().tokens_served;
    last_row_ = Clock::now();
    while (!phase_.is(LearnerPhase::kStopped) && g_learner_signal.load() == 0) {
      if (const std::string fatal = link_.fatal_error(); !fatal.empty()) throw InputError(fatal);
      if (job_.cursor().tokens_served + tokens_per_step_ > budget_) finish("its token budget is spent");
      if (phase_.is(LearnerPhase::kFinished)) {
        job_.idle();
        boundary();
        if (Clock::now() - last_metadata_ > std::chrono::milliseconds(200)) send_metadata();
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        continue;
      }
      log_->take(job_.cursor(), id_, step_);  // exact data: recorded before the step trains the batch
      const auto t0 = Clock::now();
      const InnerStep r = job_.step(step_);  // 1) batch, 2) inner step
      const auto t1 = Clock::now();
      ++step_;
      sync_.count_step(r.tokens);  // 3) counters
      step_time_.update(std::chrono::duration<double>(t1 - t0).count());
      if (std::isfinite(r.loss)) loss_.update(r.loss);
      // Heterogeneous hardware (run.slowdown) or a slow_learner fault: this learner is `factor` times slower.
      if (const double factor = std::max(slowdown_, control_.slowdown()); factor > 1.0) {
        // In slices with a keep-alive between them: a learner group's ranks wait for commands with a deadline.
        const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>((factor - 1.0) * (t1 - t0));
        while (Clock::now() < until) {
          std::this_thread::sleep_for(std::min<Clock::duration>(until - Clock::now(), std::chrono::milliseconds(250)));
          job_.idle();
        }
      }
      send_metadata();  // 4)
      boundary();       // 5), 6)
      save_state_if_due();
      if (config_.diloco.blocking) wait_for_sync();
      const double boundary_s = std::chrono::duration<double>(Clock::now() - t1).count();
      max_boundary_s_ = std::max(max_boundary_s_, boundary_s);
      events_.emit("step", {{"step", step_}, {"loss", r.loss}, {"step_s", std::chrono::duration<double>(t1 - t0).count()},
                            {"boundary_s", boundary_s}, {"skipped", r.skipped}, {"tokens", job_.cursor().tokens_served}});
      if (Clock::now() - last_row_ >= std::chrono::duration<double>(config_.run.report_interval_s)) print_row();
      if (gauges_) {
        std::lock_guard lock(gauges_->mu);
        gauges_->step = step_;
        gauges_->tokens = job_.cursor().tokens_served;
        gauges_->loss = loss_.value();
        gauges_->tokens_per_s = step_time_.value() > 0 ? tokens_per_step_ / step_time_.value() : 0;
        gauges_->step_s = std::chrono::duration<double>(t1 - t0).count();
        gauges_->boundary_s = boundary_s;
        gauges_->merges_applied = sync_.merges_applied();
        gauges_->lost_steps = sync_.lost_steps();
        gauges_->reconnects = link_.reconnects();
      }
    }
    boundary();  // merges that arrived with the stop (the final flush) are applied before the copies are reported
    leaving_ = !phase_.is(LearnerPhase::kStopped);  // a signal, not the end of the run: a graceful leave
    if (leaving_) phase_.to(LearnerPhase::kStopped);
  }

  /// The endpoint's gauges, updated after every step (null: no endpoint).
  void set_gauges(LearnerGauges* gauges) { gauges_ = gauges; }

  // After a signal the learner leaves gracefully (stream and quorum freed at once). Reports the final copies
  // (hashes of the job's own parameters) and hands the last words to the link.
  void finish_run(int64_t peer_fragments_served, std::unique_ptr<StreamLog>& log_owner) {
    // Asked to stop (SIGTERM: Ctrl-C of the launcher, a by-hand stop): its AdamW moments and step are saved, so the
    // resumed run continues with them (the data cursor is in the stream log already).
    if (leaving_ && config_.train.learner_state_interval > 0) {
      job_.save_state(run_dir_ / "learners" / ("learner_" + std::to_string(id_)), step_);
      events_.emit("state_saved", {{"step", step_}, {"reason", "stopping on a signal"}});
    }
    log_owner.reset();  // unlock the stream's log before the syncer hands the stream to a joiner
    log_ = nullptr;
    send_metadata();
    events_.emit("stopped", {{"step", step_}, {"signal", g_learner_signal.load()}, {"lost_steps", sync_.lost_steps()},
                             {"leaving", leaving_}, {"unmerged_steps", sync_.unmerged_steps()},
                             {"peer_fragments_served", peer_fragments_served}, {"reconnects", link_.reconnects()},
                             {"max_boundary_s", max_boundary_s_}, {"versions", sync_.versions()},
                             {"hashes", sync_.parameter_hashes()}});
    link_.drain(std::chrono::milliseconds(leaving_ ? 2000 : 500));  // the last metadata (a leave) must arrive
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    link_.stop();
  }

 private:
  void finish(const char* reason) {
    if (!phase_.is(LearnerPhase::kTraining)) return;
    phase_.to(LearnerPhase::kFinished);
    events_.emit("budget_spent", {{"step", step_}, {"tokens", job_.cursor().tokens_served}, {"reason", reason}});
  }

  void boundary() {
    const BoundaryOutcome out = sync_.boundary(step_, !phase_.is(LearnerPhase::kTraining));
    if (out.budget_spent) finish("the learners' tokens reached the shared budget");
    if (out.stop && !phase_.is(LearnerPhase::kStopped)) phase_.to(LearnerPhase::kStopped);
  }

  // One console row per run.report_interval_s: what a learner started by hand (or its log) shows.
  void print_row() {
    const double elapsed = std::chrono::duration<double>(Clock::now() - last_row_).count();
    const int64_t tokens = job_.cursor().tokens_served;
    std::printf("[learner %d step %lld] loss %.4f | %.0f tokens/s | merges applied %lld | %.0f%% of %s\n", id_,
                static_cast<long long>(step_), loss_.value(),
                elapsed > 0 ? (tokens - row_tokens_) / elapsed : 0.0,
                static_cast<long long>(sync_.merges_applied()), 100.0 * tokens / std::max<int64_t>(1, budget_),
                config_.train.shared_budget ? "the shared budget" : "its stream's budget");
    std::fflush(stdout);
    last_row_ = Clock::now();
    row_tokens_ = tokens;
  }

  void send_metadata() {
    wire::Metadata m;
    m.step = step_;
    sync_.fill_counters(m);
    m.step_time_s = step_time_.value();
    m.tokens_trained = job_.cursor().tokens_served;
    m.cursor_json = job_.cursor().to_json().dump();
    m.tokens_per_s = step_time_.value() > 0 ? tokens_per_step_ / step_time_.value() : 0;
    m.loss = loss_.value();
    m.finished = phase_.is(LearnerPhase::kFinished);
    m.stream = stream_;
    m.leaving = leaving_;
    link_.post(std::move(m));
    last_metadata_ = Clock::now();
  }

  void save_state_if_due() {
    if (config_.train.learner_state_interval > 0 && ++steps_here_ % config_.train.learner_state_interval == 0) {
      job_.save_state(run_dir_ / "learners" / ("learner_" + std::to_string(id_)), step_);
    }
  }

  // diloco.blocking (a synchronous configuration): wait at a due step u until the pull for u is answered, and at
  // s + τ until the merge of that round is applied. Deadline: run.collective_timeout_s.
  void wait_for_sync() {
    const auto deadline = Clock::now() + std::chrono::duration<double>(config_.run.collective_timeout_s);
    while (sync_.blocked(step_) && !phase_.is(LearnerPhase::kStopped) && g_learner_signal.load() == 0) {
      if (Clock::now() > deadline) {
        throw InputError("blocking sync: no pull or merge for step " + std::to_string(step_) + " within " +
                         std::to_string(config_.run.collective_timeout_s) + " s (run.collective_timeout_s)");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      job_.idle();
      boundary();
    }
  }

  LearnerPhaseMachine& phase_;
  const Config& config_;
  const int id_;
  const fs::path run_dir_;
  int64_t step_;
  const int64_t stream_, budget_;
  InnerJob& job_;
  OuterSync& sync_;
  LearnerLink& link_;
  StreamLog* log_;
  EventLog& events_;
  ControlFile control_;
  const double slowdown_;
  const int64_t tokens_per_step_;
  Ema step_time_{0.9}, loss_{0.9};
  double max_boundary_s_ = 0;
  int64_t steps_here_ = 0;  // steps of this incarnation
  bool leaving_ = false;
  Clock::time_point last_metadata_ = Clock::now();
  Clock::time_point last_row_ = Clock::now();
  int64_t row_tokens_ = 0;  // tokens at the last row (or at the start)
  LearnerGauges* gauges_ = nullptr;
};

// The inner job: a group of ranks (rank 0 here; `ranks` started the others) or the one-process GPT job.
std::unique_ptr<InnerJob> make_inner_job(const Config& config, int id, const fs::path& run_dir, GroupRanks* ranks,
                                         GPT model, const FragmentLayout& layout, torch::Device device,
                                         DataStream stream, EventLog& events) {
  if (!ranks) {
    auto job =
        std::make_unique<GptInnerJob>(model, layout, config.train, make_schedule(config), device, std::move(stream));
    job->trainer().set_skip(config.skippipe, skip_path_seed(config.run.seed, id));
    return job;
  }
  const ParallelConfig& parallel = config.parallel_for(id);
  auto group = ranks->join();
  torch::manual_seed(config.run.seed + 1 + static_cast<uint64_t>(id));  // the ranks' initial GPT
  auto engine = make_rank_engine(GPT(config.model), parallel, config.train, *group,
                                 run_dir / "offload" / ("learner_" + std::to_string(id) + "_rank_0"));
  events.emit("group_formed", {{"ranks", parallel.ranks()}, {"group", engine->describe()},
                               {"store", ranks->store().string()}, {"pids", ranks->pids()}});
  std::printf("[learner %d] a group of %lld ranks: %s\n", id, static_cast<long long>(parallel.ranks()),
              engine->describe().c_str());
  return std::make_unique<GroupInnerJob>(model, layout, config.train, make_schedule(config), std::move(stream),
                                         std::move(engine), std::move(group), group_timeout_s(config, id));
}

// A restart: resume the AdamW moments of the last incarnation, or say why they are unusable. Returns whether they
// were restored.
bool restore_inner_state(InnerJob& job, const fs::path& run_dir, int id, int64_t global_step, EventLog& events) {
  std::string why;
  const int64_t saved_at = job.restore_state(run_dir / "learners" / ("learner_" + std::to_string(id)), &why);
  if (saved_at >= 0) {
    events.emit("optimizer_restored", {{"saved_at_step", saved_at}, {"global_step", global_step}});
    return true;
  }
  if (!why.empty()) {
    events.emit("optimizer_not_restored", {{"reason", why}});
    std::printf("[learner %d] its saved AdamW state is unusable (%s): starting with fresh moments\n", id, why.c_str());
  }
  return false;
}

}  // namespace

const char* to_string(LearnerPhase phase) {
  switch (phase) {
    case LearnerPhase::kBootstrapping: return "bootstrapping";
    case LearnerPhase::kTraining: return "training";
    case LearnerPhase::kFinished: return "finished";
    case LearnerPhase::kStopped: return "stopped";
  }
  return "?";
}

int run_learner(const Config& config, const LearnerOptions& options, wire::Transport& transport) {
  const int id = options.id;
  if (id < 0 || id >= kMaxLearnerId) {  // ids ≥ M: learners joining a running job (scavenging)
    throw InputError("learner id " + std::to_string(id) + " is outside [0, " + std::to_string(kMaxLearnerId) + ")");
  }
  // A learner group of R ranks (docs/parallel.md): this process is rank 0; the others get equal shares of its cores.
  const ParallelConfig& parallel = config.parallel_for(id);
  const int R = static_cast<int>(parallel.ranks());
  const int cores = config.run.threads > 0 ? static_cast<int>(config.run.threads) : machine_cores();
  const int rank_threads = std::max(1, cores / R);
  apply_thread_budget(thread_budget(R > 1 ? rank_threads : static_cast<int>(config.run.threads)));
  fs::create_directories(options.run_dir / "events");
  EventLog events(options.run_dir / "events" / ("learner_" + std::to_string(id) + ".jsonl"), Role::kLearner, id);
  check_device(config.run.device);
  const torch::Device device(config.run.device);
  // A group job also for R = 1 in bf16 (the bf16 engine; a group of one rank, nothing spawned).
  const bool group_job = R > 1 || parallel.precision != Precision::kFp32;
  std::unique_ptr<GroupRanks> ranks;  // started first: they build their models while this rank bootstraps
  if (group_job) {
    ranks = std::make_unique<GroupRanks>(config, id, options.run_dir, options.group, rank_threads,
                                         options.bootstrap_timeout_s);
  }

  // The same init as the syncer (so the layout hash matches); Θ comes from the bootstrap.
  torch::manual_seed(config.run.seed + 1 + static_cast<uint64_t>(id));
  GPT model(config.model);
  model->to(device);
  const FragmentLayout layout = model_layout(model, config.diloco);
  const int P = static_cast<int>(layout.fragments.size());
  // SIGTERM from the first moment: a learner asked to leave while it still bootstraps exits cleanly.
  std::signal(SIGTERM, on_learner_signal);
  std::signal(SIGINT, on_learner_signal);
  const wire::Handshake handshake = make_handshake(config, layout);
  LearnerLink link(transport.connect_syncer(options.syncer), options.syncer, handshake, id, hostname(),
                   config.run.seed * 1000003u + static_cast<uint64_t>(id) + 1);
  FragmentBoard board(P);  // Θ_p at the version last applied, shared with the peer server (read-only)
  std::unique_ptr<PeerServer> peer_server;
  if (config.diloco.bootstrap == Bootstrap::kPeers) {  // serve our copy to joiners; advertised with every join
    // Listen where the syncer is reached from (or where run.peer_host says) and advertise an address other
    // machines can dial: never a wildcard, never loopback unless the syncer is on loopback too.
    const std::string towards = local_address_towards(options.syncer);
    const std::string listen = config.run.peer_host.empty() ? (towards.empty() ? "127.0.0.1" : towards)
                                                            : config.run.peer_host;
    std::string advertise = config.run.peer_advertise;
    if (advertise.empty()) advertise = is_wildcard_host(listen) ? (towards.empty() ? "127.0.0.1" : towards) : listen;
    peer_server = std::make_unique<PeerServer>(transport, listen, handshake, board);
    const std::string& bound = peer_server->address();
    const std::string advertised = advertise + bound.substr(bound.rfind(':'));
    link.set_peer_address(advertised);
    events.emit("peer_server", {{"listening", peer_server->listen_address()}, {"advertised", advertised}});
  }
  LearnerPhaseMachine phase(LearnerPhase::kBootstrapping, kLearnerMoves);
  auto boot = bootstrap(link, transport, handshake, options.run_dir, P, options.bootstrap_timeout_s, events,
                        g_learner_signal, "[learner " + std::to_string(id) + "]");
  if (!boot) {  // asked to leave before it trained: nothing to hand back
    phase.to(LearnerPhase::kStopped);
    events.emit("stopped", {{"step", 0}, {"signal", g_learner_signal.load()}, {"leaving", true},
                            {"reason", "signal during bootstrap"}});
    return 0;
  }
  const wire::JoinReply& joined = boot->joined;
  link.set_held_stream(joined.stream_index);  // re-joins (after a syncer restart) keep this stream
  bool from_log = false;
  DataStream stream = resume_stream(config, joined, *boot->stream_log, &from_log);
  std::unique_ptr<InnerJob> job_owner =
      make_inner_job(config, id, options.run_dir, ranks.get(), model, layout, device, std::move(stream), events);
  InnerJob& job = *job_owner;
  const bool warm = config.train.learner_state_interval > 0 &&
                    restore_inner_state(job, options.run_dir, id, joined.global_step, events);
  if (!warm && joined.global_step > 0 && config.train.warmup_steps > 0) {  // fresh moments in a warm run
    job.rewarm(joined.global_step);
    events.emit("lr_rewarmed", {{"from_step", joined.global_step}, {"steps", config.train.warmup_steps}});
  }
  OuterSync sync(outer_sync_config(config, id, layout), job, link, &events, &board);
  for (int p = 0; p < P; ++p) {
    const auto& f = boot->fetched.fragments[p];
    sync.adopt(p, f.version, std::make_shared<const std::vector<float>>(wire::fragment_values(f)));
  }
  std::map<std::string, int> from_source;
  for (const auto& name : boot->fetched.source) ++from_source[name];
  events.emit("bootstrapped", {{"pid", ::getpid()}, {"global_step", joined.global_step}, {"versions", sync.versions()},
                               {"cursor", job.cursor().to_json()}, {"cursor_from_stream_log", from_log},
                               {"syncer_generation", joined.syncer_generation}, {"stream", joined.stream_index},
                               {"sources", from_source}, {"source_failures", boot->fetched.failures},
                               {"peer_address", peer_server ? peer_server->address() : ""}});
  std::printf("[learner %d step %lld] joined %s: stream %lld, %lld/%lld tokens done\n", id,
              static_cast<long long>(joined.global_step), options.syncer.c_str(),
              static_cast<long long>(joined.stream_index), static_cast<long long>(job.cursor().tokens_served),
              static_cast<long long>(joined.tokens_budget));
  std::fflush(stdout);
  link.start();
  phase.to(LearnerPhase::kTraining);
  // Adopt the global step: the lr schedule is global (re-warmed above when the moments are fresh).
  LearnerLoop loop(config, id, options.run_dir, joined.global_step, joined.stream_index, joined.tokens_budget, job,
                   sync, link, *boot->stream_log, events, phase);
  // Its /metrics endpoint (docs/monitoring.md), on a free port unless the config names one.
  LearnerGauges gauges;
  gauges.id = id;
  std::unique_ptr<MonitorServer> monitor;
  if (!config.run.learner_monitor.empty()) {
    monitor = std::make_unique<MonitorServer>(config.run.learner_monitor,
                                              MonitorServer::Routes{[&gauges] { return gauges.text(); }, {}, ""},
                                              transport_security(config));
    loop.set_gauges(&gauges);
    events.emit("monitor", {{"url", monitor->url()}, {"address", monitor->address()}});
    std::printf("[learner %d] metrics %smetrics\n", id, monitor->url().c_str());
    std::fflush(stdout);
  }
  try {
    loop.run();
  } catch (const CollectiveError& e) {  // a rank of this learner's group died or missed its deadline
    events.emit("group_failed", {{"step", joined.global_step}, {"error", e.what()},
                                 {"rank_logs", (options.run_dir / "logs").string()}});
    throw;
  }
  loop.finish_run(peer_server ? peer_server->served() : 0, boot->stream_log);
  return 0;
}

}  // namespace dloco
