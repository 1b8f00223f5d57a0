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

#include <spdlog/spdlog.h>

#include "core/decisions.h"
#include "core/slowdown.h"
#include "data/stream.h"
#include "learner/bootstrap.h"
#include "learner/gpt_inner_job.h"
#include "learner/group_inner_job.h"
#include "learner/group_ranks.h"
#include "learner/learner.h"
#include "learner/learner_setup.h"
#include "learner/outer_sync.h"
#include "monitor/monitor_server.h"
#include "monitor/prometheus_text.h"
#include "process/control_file.h"
#include "process/events.h"
#include "process/host.h"
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
// SIGTERM, SIGINT: leave cleanly; SIGUSR1: a learner group compares its replicas at its next step.
extern "C" void on_learner_signal(int sig) { sig == SIGUSR1 ? request_replica_check() : g_learner_signal.store(sig); }

// The training loop and what it keeps between steps. `phase` is training when it starts.
class LearnerLoop {
 public:
  // `log` holds the lock of the leased stream's log; `streams` is the syncer's S (≤ 0: the config's, as the bootstrap).
  LearnerLoop(const Config& config, int id, const fs::path& run_dir, int64_t step, int64_t stream, int64_t streams,
              int64_t budget, InnerJob& job, OuterSync& sync, LearnerLink& link, std::unique_ptr<StreamLog> log,
              EventLog& events, LearnerPhaseMachine& phase)
      : phase_(phase), config_(config), id_(id), run_dir_(run_dir), step_(step), stream_(stream),
        streams_(streams > 0 ? streams : (config.data.streams > 0 ? config.data.streams : config.diloco.learners)),
        budget_(budget), job_(job), sync_(sync), link_(link), log_(std::move(log)), events_(events),
        control_(run_dir / "control" / ("learner_" + std::to_string(id) + ".json")),
        slowdown_(slowdown_spec(config.run, id, config.diloco.learners), config.run.seed, id),
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
      if (std::isfinite(r.loss)) loss_.update(r.loss);
      // Heterogeneous hardware (run.slowdown) or a slow_learner fault: this learner is `factor` times slower.
      const double sleep_s =  // the emulated slower chip's extra time
          slowdown_.sleep_after(std::chrono::duration<double>(t1 - t0).count(), control_.slowdown());
      if (sleep_s > 0) {
        // In slices with a keep-alive between them: a learner group's ranks wait for commands with a deadline.
        const auto until = Clock::now() + std::chrono::microseconds(static_cast<int64_t>(sleep_s * 1e6));
        while (Clock::now() < until) {
          std::this_thread::sleep_for(std::min<Clock::duration>(until - Clock::now(), std::chrono::milliseconds(250)));
          job_.idle();
        }
      }
      // It reports the emulated chip's step time, compute + sleep: the syncer's windows follow it (protocol.md §5).
      step_time_.update(std::chrono::duration<double>(t1 - t0).count() + sleep_s);
      send_metadata();  // 4)
      boundary();       // 5), 6)
      save_state_if_due();
      if (config_.diloco.blocking) wait_for_sync();
      const double boundary_s = std::chrono::duration<double>(Clock::now() - t1).count();
      max_boundary_s_ = std::max(max_boundary_s_, boundary_s);
      events_.emit("step", {{"step", step_}, {"loss", r.loss}, {"step_s", std::chrono::duration<double>(t1 - t0).count()},
                            {"boundary_s", boundary_s}, {"sleep_s", sleep_s}, {"skipped", r.skipped},
                            {"tokens", job_.cursor().tokens_served}});
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
  void finish_run(int64_t peer_fragments_served) {
    // Asked to stop (SIGTERM: Ctrl-C of the launcher, a by-hand stop): its AdamW moments and step are saved, so the
    // resumed run continues with them (the data cursor is in the stream log already).
    if (leaving_ && config_.train.learner_state_interval > 0) {
      job_.save_state(run_dir_ / "learners" / ("learner_" + std::to_string(id_)), step_);
      events_.emit("state_saved", {{"step", step_}, {"reason", "stopping on a signal"}});
    }
    log_.reset();  // unlock the stream's log before the syncer hands the stream to a joiner
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
    if (out.offer && !out.stop) take_over(*out.offer);
  }

  // Take-over under fixed shares (docs/protocol.md §7): the syncer offers a stream whose holder left to this
  // learner, which spent its own share. It trains the stream to the end of its share from its cursor (the log's when
  // newer, as a restarted holder would), with its own parameters and moments; the log's lock keeps it exclusive.
  // Declined (said in the next metadata) when the log is locked by a live process or the offer is not one it can
  // take.
  void take_over(const wire::StreamOffer& offer) {
    std::string why;
    bool busy = false;  // declined for now, not for good
    if (!phase_.is(LearnerPhase::kFinished) || config_.train.shared_budget) {
      busy = true;  // an offer that crossed the metadata of its last take-over
      why = "it is not waiting for a stream (phase " + std::string(to_string(phase_.state())) + ")";
    } else if (offer.stream < 0 || offer.stream >= streams_ || offer.tokens_budget <= 0) {
      why = "the offer names stream " + std::to_string(offer.stream) + " of S = " + std::to_string(streams_) +
            " with a share of " + std::to_string(offer.tokens_budget) + " tokens";
    }
    std::unique_ptr<StreamLog> log;
    std::optional<DataStream> stream;
    bool from_log = false;
    if (why.empty()) {
      try {
        log = std::make_unique<StreamLog>(stream_log_path(run_dir_, offer.stream));
        wire::JoinReply at;
        at.stream_index = offer.stream;
        at.streams = streams_;
        at.stream_cursor_json = offer.cursor_json;
        stream.emplace(resume_stream(config_, at, *log, &from_log));
      } catch (const StreamBusy& e) {  // its holder lives (a cut link or a pause outlived its lease)
        why = e.what();
        busy = true;
      } catch (const InputError& e) {  // an unreadable log or cursor: it will not do better next time
        why = e.what();
      }
    }
    if (!why.empty()) {
      declined_ = offer.stream;
      // Anything but a live holder's lock ends its asking: a stream it cannot read would be offered to it for ever.
      if (!busy) takes_over_ = false;
      events_.emit("stream_offer_declined", {{"step", step_}, {"stream", offer.stream}, {"reason", why},
                                             {"asks_again", takes_over_}});
      send_metadata();
      return;
    }
    const int64_t from = stream_;
    job_.replace_stream(std::move(*stream));
    log_ = std::move(log);  // the spent stream's log is unlocked
    stream_ = offer.stream;
    budget_ = offer.tokens_budget;
    link_.set_held_stream(stream_);
    row_tokens_ = job_.cursor().tokens_served;  // the console's tokens/s counts from the new stream's cursor
    phase_.to(LearnerPhase::kTraining);
    events_.emit("stream_taken_over", {{"step", step_}, {"stream", stream_}, {"from_stream", from},
                                       {"tokens", job_.cursor().tokens_served}, {"budget", budget_},
                                       {"from_log", from_log}});
    spdlog::info("[learner {}] takes over stream {} (its holder left) at {} of its {} tokens", id_,
                 static_cast<long long>(stream_), static_cast<long long>(job_.cursor().tokens_served),
                 static_cast<long long>(budget_));
    send_metadata();
  }

  // One console row per run.report_interval_s: what a learner started by hand (or its log) shows.
  void print_row() {
    const double elapsed = std::chrono::duration<double>(Clock::now() - last_row_).count();
    const int64_t tokens = job_.cursor().tokens_served;
    spdlog::info("[learner {} step {}] loss {:.4f} | {:.0f} tokens/s | merges applied {} | {:.0f}% of {}", id_,
                 static_cast<long long>(step_), loss_.value(),
                 elapsed > 0 ? (tokens - row_tokens_) / elapsed : 0.0,
                 static_cast<long long>(sync_.merges_applied()), 100.0 * tokens / std::max<int64_t>(1, budget_),
                 config_.train.shared_budget ? "the shared budget" : "its stream's budget");
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
    m.takes_over = m.finished && !leaving_ && !config_.train.shared_budget && takes_over_;
    m.declined_stream = declined_;
    declined_.reset();  // said once: a later offer of the same stream is answered afresh
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
  int64_t stream_;  // the stream it trains: the one leased at its join, or one it took over
  const int64_t streams_;
  int64_t budget_;
  InnerJob& job_;
  OuterSync& sync_;
  LearnerLink& link_;
  std::unique_ptr<StreamLog> log_;
  EventLog& events_;
  ControlFile control_;
  StepSlowdown slowdown_;  // run.slowdown: this learner's step-time multipliers (of its steady compute)
  const int64_t tokens_per_step_;
  Ema step_time_{0.9}, loss_{0.9};
  double max_boundary_s_ = 0;
  int64_t steps_here_ = 0;  // steps of this incarnation
  bool leaving_ = false;
  std::optional<int64_t> declined_;  // an offered stream it could not take, said in its next metadata
  bool takes_over_ = true;           // it asks for streams whose learner left (until one could not be read)
  Clock::time_point last_metadata_ = Clock::now();
  Clock::time_point last_row_ = Clock::now();
  int64_t row_tokens_ = 0;  // tokens at the last row (or at the start)
  LearnerGauges* gauges_ = nullptr;
};



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
  for (int sig : {SIGTERM, SIGINT, SIGUSR1}) std::signal(sig, on_learner_signal);
  const wire::Handshake handshake = make_handshake(config, layout);
  LearnerLink link(transport.connect_syncer(options.syncer), options.syncer, handshake, id, hostname(),
                   config.run.seed * 1000003u + static_cast<uint64_t>(id) + 1);
  FragmentBoard board(P);  // Θ_p at the version last applied, shared with the peer server (read-only)
  // diloco.bootstrap = "peers": serve our copy to joiners; advertised with every join
  const auto peer_server = start_peer_server(config, options.syncer, transport, handshake, board, link, events);
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
  restore_or_rewarm(config, job, options.run_dir, id, joined.global_step, events);
  OuterSync sync(outer_sync_config(config, id, layout), job, link, &events, &board);
  for (int p = 0; p < P; ++p) {
    const auto& f = boot->fetched.fragments[p];
    sync.adopt(p, f.version, std::make_shared<const std::vector<float>>(wire::fragment_values(f)));
  }
  announce_bootstrapped(id, options.syncer, *boot, from_log, sync, job, peer_server.get(), events);
  link.start();
  phase.to(LearnerPhase::kTraining);
  // Adopt the global step: the lr schedule is global (re-warmed above when the moments are fresh).
  LearnerLoop loop(config, id, options.run_dir, joined.global_step, joined.stream_index, joined.streams,
                   joined.tokens_budget, job, sync, link, std::move(boot->stream_log), events, phase);
  LearnerGauges gauges;  // its /metrics endpoint (docs/monitoring.md), on a free port unless the config names one
  gauges.id = id;
  const auto monitor = start_learner_monitor(config, id, gauges, events);
  if (monitor) loop.set_gauges(&gauges);
  try {
    loop.run();
  } catch (const CollectiveError& e) {  // a rank of this learner's group died or missed its deadline
    events.emit("group_failed", {{"step", joined.global_step}, {"error", e.what()},
                                 {"rank_logs", (options.run_dir / "logs").string()}});
    if (ranks) ranks->kill();  // now: a collective stuck on a hung rank then fails, and this process can exit
    throw;
  }
  loop.finish_run(peer_server ? peer_server->served() : 0);
  return 0;
}

}  // namespace dloco
