// The learner process (spec decoupled-diloco.md §3): bootstrap from the syncer, then the loop
//   1) batch  2) inner step  3) counters  4) metadata  5) answer pulls at the step boundary  6) apply merges
// The loop never waits on the network: the link's queues are polled, never awaited.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <thread>

#include "core/atomic_file.h"
#include "core/bf16.h"
#include "core/control_file.h"
#include "core/decisions.h"
#include "core/events.h"
#include "core/fragments.h"
#include "core/hash.h"
#include "data/stream.h"
#include "data/stream_log.h"
#include "launcher/roles.h"
#include "learner/link.h"
#include "learner/peer.h"
#include "syncer/handshake.h"
#include "train/fragment_io.h"
#include "train/threads.h"
#include "train/trainer.h"
#include "transport/grpc_options.h"

namespace dloco {

namespace fs = std::filesystem;

namespace {

std::atomic<int> g_learner_signal{0};
extern "C" void on_learner_signal(int sig) { g_learner_signal.store(sig); }

std::string hostname() {
  char buf[256] = {};
  ::gethostname(buf, sizeof(buf) - 1);
  return buf;
}

// A merged fragment waiting for its apply step (spec §3 step 6).
struct PendingMerge {
  int fragment = 0;
  int64_t version = 0;
  int64_t apply_at = 0;  // first step boundary at which it may be applied
  bool participated = false;
  std::vector<float> theta;
};

// The learner's local copy of its inner optimizer state (spec §7, the chaos issue: "a restarted learner resumes
// its inner optimizer state from its own last local checkpoint"): dir/optimizer.pt, then dir/state.json = {"step",
// "bytes"} written after it, both atomically (tmp + rename), so a SIGKILL mid-save leaves the previous pair.
void save_learner_state(const fs::path& dir, int64_t step, torch::optim::Optimizer& optimizer) {
  fs::create_directories(dir);
  const fs::path tmp = dir / "optimizer.pt.tmp";
  torch::save(optimizer, tmp.string());
  const auto bytes = fs::file_size(tmp);
  fs::rename(tmp, dir / "optimizer.pt");
  write_file_atomically(dir / "state.json", nlohmann::json{{"step", step}, {"bytes", bytes}}.dump() + "\n");
}

// Loads the state saved by save_learner_state into `optimizer`; returns the step it was saved at, or -1 when there
// is none or it is unusable (`why` says which: another model, a torn file).
int64_t load_learner_state(const fs::path& dir, torch::optim::Optimizer& optimizer, std::string* why) {
  std::error_code ec;
  if (!fs::exists(dir / "state.json", ec)) return -1;
  try {
    const auto state = nlohmann::json::parse(std::ifstream(dir / "state.json"));
    if (fs::file_size(dir / "optimizer.pt") != state.at("bytes").get<uintmax_t>()) {
      *why = "optimizer.pt does not have the size state.json records";
      return -1;
    }
    torch::load(optimizer, (dir / "optimizer.pt").string());
    return state.at("step").get<int64_t>();
  } catch (const std::exception& e) {
    *why = e.what();
    return -1;
  }
}

}  // namespace

int run_learner(const Config& config, const LearnerOptions& options) {
  const int id = options.id;
  if (id < 0 || id >= kMaxLearnerId) {  // ids ≥ M: learners joining a running job (scavenging, spec §7)
    throw InputError("learner id " + std::to_string(id) + " is outside [0, " + std::to_string(kMaxLearnerId) + ")");
  }
  apply_thread_budget(thread_budget(static_cast<int>(config.run.threads)));
  fs::create_directories(options.run_dir / "events");
  EventLog events(options.run_dir / "events" / ("learner_" + std::to_string(id) + ".jsonl"), Role::kLearner, id);
  const torch::Device device(config.run.device);
  const fs::path data_dir(config.data.dir);
  auto train_split = std::make_shared<TokenSplit>(split_shards(data_dir, "train"));

  // Bootstrap: the same init as the syncer (so the layout hash matches), then Θ from the syncer.
  torch::manual_seed(config.run.seed + 1 + static_cast<uint64_t>(id));
  GPT model(config.model);
  model->to(device);
  const FragmentLayout layout = model_layout(model, config.diloco);
  const auto params = layout_parameters(model, layout);
  const int P = static_cast<int>(layout.fragments.size());
  // SIGTERM from the first moment: a learner asked to leave while it still bootstraps exits cleanly.
  std::signal(SIGTERM, on_learner_signal);
  std::signal(SIGINT, on_learner_signal);
  const v1::Handshake handshake = make_handshake(config, layout);
  LearnerLink link(options.syncer, handshake, id, hostname());
  // Θ_p at the version last applied: deltas are taken against it. Shared with the peer server (read-only).
  std::vector<std::shared_ptr<const std::vector<float>>> base(P);
  std::vector<int64_t> version(P, 0);
  FragmentBoard board(P);
  std::unique_ptr<PeerServer> peer_server;
  if (config.diloco.bootstrap == "peers") {  // serve our copy to joiners; advertised with every Join
    peer_server = std::make_unique<PeerServer>(config.run.peer_host, expected_handshake(config, layout), board);
    link.set_peer_address(peer_server->address());
  }
  // Bootstrap as a whole (join and lease a stream, then every fragment) until the deadline: a syncer that dies
  // halfway (chaos plans kill it) is retried, not fatal, and so is a stream whose log another live process holds
  // (the syncer leases another). A refused handshake is final.
  v1::JoinReply joined;
  std::unique_ptr<StreamLog> stream_log;  // holds the lock of the leased stream's log
  int64_t locked_stream = -1;
  FetchedFragments fetched;
  const auto bootstrap_deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(options.bootstrap_timeout_s);
  for (;;) {
    if (g_learner_signal.load() != 0) {  // asked to leave before it trained: nothing to hand back
      events.emit("stopped", {{"step", 0}, {"signal", g_learner_signal.load()}, {"leaving", true},
                              {"reason", "signal during bootstrap"}});
      return 0;
    }
    try {
      const double left = std::chrono::duration<double>(bootstrap_deadline - std::chrono::steady_clock::now()).count();
      joined = link.join(std::max(1.0, std::min(5.0, left)));  // in slices: a SIGTERM is seen within seconds
      if (!stream_log || locked_stream != joined.stream_index()) {
        stream_log.reset();
        try {
          stream_log = std::make_unique<StreamLog>(stream_log_path(options.run_dir, joined.stream_index()));
          locked_stream = joined.stream_index();
        } catch (const StreamBusy& e) {  // its previous holder still lives (e.g. a cut link outlived its lease)
          link.add_busy_stream(joined.stream_index());
          throw;
        }
      }
      // Each fragment from a live peer holding at least the syncer's version at this Join, else the syncer.
      std::vector<FragmentSource> sources;
      for (const auto& peer : joined.peers()) {
        sources.push_back(peer_source("peer " + std::to_string(peer.learner()) + " (" + peer.address() + ")",
                                      peer.address(), handshake, 15.0));
      }
      sources.push_back({"syncer", [&link](int p) { return link.fetch_fragment(p); }});
      const std::vector<int64_t> at_join(joined.fragment_versions().begin(), joined.fragment_versions().end());
      fetched = fetch_fragments(sources, at_join.size() == static_cast<size_t>(P) ? at_join : std::vector<int64_t>(P, 0));
      for (int p = 0; p < P; ++p) {
        auto values = std::make_shared<const std::vector<float>>(fragment_values(fetched.fragments[p]));
        version[p] = fetched.fragments[p].version();
        scatter_parameters(params, layout, p, *values);
        base[p] = std::move(values);
        board.publish(p, version[p], base[p]);
      }
      break;
    } catch (const HandshakeRefused&) {
      throw;
    } catch (const InputError& e) {
      if (std::chrono::steady_clock::now() >= bootstrap_deadline) throw;
      events.emit("bootstrap_retry", {{"reason", e.what()}});
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
  }
  link.set_held_stream(joined.stream_index());  // re-joins (after a syncer restart) keep this stream
  int64_t step = joined.global_step();  // adopt the global step: the lr schedule is global
  StreamCursor cursor{joined.stream_index(), 0, 0, 0};
  if (!joined.stream_cursor_json().empty()) {
    cursor = StreamCursor::from_json(nlohmann::json::parse(joined.stream_cursor_json()));
  }
  const int64_t budget = joined.tokens_budget();
  // Exact data: the stream's own log is at least as new as the syncer's copy of the cursor (which lags by up to a
  // second, or more after a syncer restart). Resume one step's batches after the last record: they were trained,
  // or lost when the previous incarnation died, but never retrained.
  const auto& taken = stream_log->last_taken();
  const bool from_log = taken && taken->stream == joined.stream_index() && taken->tokens_served >= cursor.tokens_served;
  if (from_log) cursor = *taken;
  // The data is cut into the syncer's S streams (it leases them), whatever this learner's config says.
  const int64_t S = joined.streams() > 0 ? joined.streams()
                                         : (config.data.streams > 0 ? config.data.streams : config.diloco.learners);
  if (joined.stream_index() < 0 || joined.stream_index() >= S) {
    throw InputError("the syncer leased stream " + std::to_string(joined.stream_index()) + " of S = " +
                     std::to_string(S) + " streams");
  }
  DataStream stream(train_split, joined.stream_index(), S, config.train.batch_size, config.model.seq_len, cursor);
  if (from_log) {
    for (int64_t i = 0; i < config.train.grad_accum; ++i) stream.skip();  // a step reads grad_accum batches
  }
  cursor = stream.cursor();
  InnerTrainer trainer(model, config.train, make_schedule(config), device);
  const fs::path state_dir = options.run_dir / "learners" / ("learner_" + std::to_string(id));
  if (config.train.learner_state_interval > 0) {  // a restart: resume the AdamW moments of the last incarnation
    std::string why;
    const int64_t saved_at = load_learner_state(state_dir, trainer.optimizer(), &why);
    if (saved_at >= 0) {
      events.emit("optimizer_restored", {{"saved_at_step", saved_at}, {"global_step", step}});
    } else if (!why.empty()) {
      events.emit("optimizer_not_restored", {{"reason", why}});
      std::printf("[learner %d] its saved AdamW state is unusable (%s): starting with fresh moments\n", id, why.c_str());
    }
  }
  int64_t steps_here = 0;  // steps of this incarnation
  std::map<std::string, int> from_source;
  for (const auto& name : fetched.source) ++from_source[name];
  events.emit("bootstrapped", {{"pid", ::getpid()}, {"global_step", step}, {"versions", version}, {"cursor", cursor.to_json()},
                               {"cursor_from_stream_log", from_log}, {"syncer_generation", joined.syncer_generation()},
                               {"stream", joined.stream_index()}, {"sources", from_source},
                               {"source_failures", fetched.failures},
                               {"peer_address", peer_server ? peer_server->address() : ""}});
  std::printf("[learner %d step %lld] joined %s: stream %lld, %lld/%lld tokens done\n", id,
              static_cast<long long>(step), options.syncer.c_str(), static_cast<long long>(joined.stream_index()),
              static_cast<long long>(cursor.tokens_served), static_cast<long long>(budget));
  std::fflush(stdout);
  link.start();

  std::vector<int64_t> steps_since(P, 0), tokens_since(P, 0);
  std::map<int, std::pair<int64_t, int64_t>> answered;  // fragment -> (round, captured step)
  // Goodput (spec §7): a trained step earns 1/P for each fragment p whose next answered pull was merged.
  std::vector<int64_t> unanswered(P, 0);                  // steps since the last answered pull of p
  std::map<int, std::pair<int64_t, int64_t>> in_flight;  // fragment -> (round, steps that answer carries)
  ControlFile control(options.run_dir / "control" / ("learner_" + std::to_string(id) + ".json"));
  std::vector<PendingMerge> pending;
  std::map<int, int64_t> awaiting_merge;  // blocking mode: fragment -> step by which its merge must be applied
  const int64_t tokens_per_step = config.train.tokens_per_step(config.model);
  const bool bf16_wire = config.diloco.wire_dtype == "bf16";
  const double slowdown = slowdown_factor(config.run, id, config.diloco.learners);
  Ema step_time(0.9), loss_ema(0.9);
  double boundary_s_max = 0;
  int64_t lost_steps = 0;
  bool stop = false, finished = false;
  bool leaving = false;  // stopped by a signal, not by the syncer: a graceful leave (the syncer frees our stream)
  auto last_meta = std::chrono::steady_clock::now();

  auto send_metadata = [&] {
    v1::LearnerMessage msg;
    auto* m = msg.mutable_metadata();
    m->set_step(step);
    for (int p = 0; p < P; ++p) {
      m->add_steps(steps_since[p]);
      m->add_tokens(tokens_since[p]);
    }
    m->set_step_time_s(step_time.value());
    m->set_tokens_trained(stream.cursor().tokens_served);
    m->set_cursor_json(stream.cursor().to_json().dump());
    m->set_tokens_per_s(step_time.value() > 0 ? tokens_per_step / step_time.value() : 0);
    m->set_loss(loss_ema.value());
    m->set_finished(finished);
    m->set_stream(joined.stream_index());
    m->set_leaving(leaving);
    link.post(std::move(msg));
    last_meta = std::chrono::steady_clock::now();
  };

  // Step boundary: 5) answer pulls, 6) apply merges. Only copies; never waits.
  auto step_boundary = [&] {
    v1::SyncerMessage in;
    while (link.poll(&in)) {
      if (in.has_stop()) {
        stop = true;
      } else if (in.has_budget_spent()) {  // train.shared_budget: the others trained the rest of the budget
        if (!finished) events.emit("budget_spent", {{"step", step}, {"tokens", stream.cursor().tokens_served},
                                                    {"reason", "the learners' tokens reached the shared budget"}});
        finished = true;
      } else if (in.has_pull()) {
        const int p = in.pull().fragment();
        if (p < 0 || p >= P) continue;
        v1::LearnerMessage msg;
        auto* a = msg.mutable_answer();
        a->set_fragment(p);
        a->set_round_step(in.pull().round_step());
        a->set_captured_step(step);
        a->set_steps(steps_since[p]);
        a->set_tokens(tokens_since[p]);
        std::vector<float> theta(static_cast<size_t>(layout.fragments[p].numel));
        gather_parameters(params, layout, p, theta);
        const bool reanchor = version[p] < in.pull().oldest_anchor();
        if (reanchor && config.diloco.stale_policy == "reanchor") {
          a->set_base_version(-1);  // raw θ in fp32: the syncer no longer holds our base (§4 stale anchors)
          a->set_dtype("fp32");
          a->set_delta(std::string(reinterpret_cast<const char*>(theta.data()), theta.size() * 4));
        } else {
          const std::vector<float>& anchor = *base[p];
          for (size_t i = 0; i < theta.size(); ++i) theta[i] = anchor[i] - theta[i];  // Δ = Θ^base − θ
          a->set_base_version(version[p]);
          if (bf16_wire) {
            std::vector<uint16_t> packed(theta.size());
            float_to_bf16(theta, packed);
            a->set_dtype("bf16");
            a->set_delta(std::string(reinterpret_cast<const char*>(packed.data()), packed.size() * 2));
          } else {
            a->set_dtype("fp32");
            a->set_delta(std::string(reinterpret_cast<const char*>(theta.data()), theta.size() * 4));
          }
        }
        answered[p] = {in.pull().round_step(), step};
        in_flight[p] = {in.pull().round_step(), unanswered[p]};
        unanswered[p] = 0;
        if (config.diloco.blocking) awaiting_merge[p] = step + config.diloco.overlap;
        link.post(std::move(msg));
      } else if (in.has_merged()) {
        const auto& f = in.merged().fragment();
        const int p = f.fragment();
        if (p < 0 || p >= P || f.version() <= version[p]) continue;  // stale or duplicate
        PendingMerge m{p, f.version(), step, false, fragment_values(f)};
        auto it = answered.find(p);
        if (it != answered.end() && it->second.first == in.merged().round_step()) {
          for (int who : in.merged().participants()) m.participated |= (who == id);
          if (m.participated) m.apply_at = it->second.second + config.diloco.overlap;  // s + τ
        }
        if (auto fl = in_flight.find(p); fl != in_flight.end() && fl->second.first == in.merged().round_step()) {
          events.emit(m.participated ? "kept" : "answer_not_merged",
                      {{"fragment", p}, {"round", fl->second.first}, {"steps", fl->second.second}, {"version", f.version()}});
          in_flight.erase(fl);
        }
        pending.push_back(std::move(m));
      }
    }
    for (auto it = pending.begin(); it != pending.end();) {
      if (it->apply_at > step && !finished) {  // once training is over, τ has nothing left to overlap with
        ++it;
        continue;
      }
      const int p = it->fragment;
      if (it->participated) awaiting_merge.erase(p);
      if (it->version > version[p]) {
        if (!it->participated && steps_since[p] > 0) {
          lost_steps += steps_since[p];
          events.emit("work_lost", {{"fragment", p}, {"steps", steps_since[p]}, {"version", it->version},
                                    {"reason", "merged without this learner's answer"}});
        }
        if (config.diloco.alpha > 0) {  // θ ← α·θ + (1 − α)·Θ
          std::vector<float> local(it->theta.size());
          gather_parameters(params, layout, p, local);
          for (size_t i = 0; i < local.size(); ++i) {
            local[i] = static_cast<float>(config.diloco.alpha * local[i] + (1 - config.diloco.alpha) * it->theta[i]);
          }
          scatter_parameters(params, layout, p, local);
        } else {
          scatter_parameters(params, layout, p, it->theta);
        }
        base[p] = std::make_shared<const std::vector<float>>(std::move(it->theta));
        version[p] = it->version;
        board.publish(p, version[p], base[p]);  // a pointer swap: joiners read it from the peer server
        steps_since[p] = tokens_since[p] = 0;
        events.emit("applied", {{"step", step}, {"fragment", p}, {"version", version[p]}});
      }
      it = pending.erase(it);
    }
  };

  // diloco.blocking (a synchronous configuration): wait at a due step u until the pull for u is answered, and at
  // s + τ until the merge of that round is applied. Deadline: run.collective_timeout_s.
  auto wait_for_sync = [&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(config.run.collective_timeout_s);
    auto blocked = [&] {
      for (int p = 0; p < P; ++p) {
        if (fragment_due(p, step, static_cast<int>(config.diloco.inner_steps), P) &&
            (answered.count(p) == 0 || answered[p].first != step)) {
          return true;  // the pull for this round has not arrived yet
        }
      }
      for (const auto& [p, apply_at] : awaiting_merge) {
        if (apply_at <= step) return true;  // its merge has not been applied yet
      }
      return false;
    };
    while (blocked() && !stop && g_learner_signal.load() == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        throw InputError("blocking sync: no pull or merge for step " + std::to_string(step) + " within " +
                         std::to_string(config.run.collective_timeout_s) + " s (run.collective_timeout_s)");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      step_boundary();
    }
  };

  // The loop: train until this slot's budget is spent, then keep answering the final flush until stopped.
  while (!stop && g_learner_signal.load() == 0) {
    if (const std::string fatal = link.fatal_error(); !fatal.empty()) throw InputError(fatal);
    if (!finished && stream.cursor().tokens_served + tokens_per_step > budget) {
      finished = true;
      events.emit("budget_spent", {{"step", step}, {"tokens", stream.cursor().tokens_served}});
    }
    if (finished) {
      step_boundary();
      if (std::chrono::steady_clock::now() - last_meta > std::chrono::milliseconds(200)) send_metadata();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      continue;
    }
    stream_log->take(stream.cursor(), id, step);  // exact data: recorded before the step trains the batch
    const auto t0 = std::chrono::steady_clock::now();
    const StepResult r = trainer.step(stream, step);  // 1) batch, 2) inner step
    const auto t1 = std::chrono::steady_clock::now();
    ++step;
    for (int p = 0; p < P; ++p) {  // 3) counters
      steps_since[p] += 1;
      tokens_since[p] += r.tokens;
      unanswered[p] += 1;
    }
    step_time.update(std::chrono::duration<double>(t1 - t0).count());
    if (std::isfinite(r.loss)) loss_ema.update(r.loss);
    // Heterogeneous hardware (run.slowdown) or a slow_learner fault: this learner is `factor` times slower.
    if (const double factor = std::max(slowdown, control.slowdown()); factor > 1.0) {
      std::this_thread::sleep_for((factor - 1.0) * (t1 - t0));
    }
    send_metadata();  // 4)
    step_boundary();  // 5), 6)
    if (config.train.learner_state_interval > 0 && ++steps_here % config.train.learner_state_interval == 0) {
      save_learner_state(state_dir, step, trainer.optimizer());
    }
    if (config.diloco.blocking) wait_for_sync();
    const double boundary_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    boundary_s_max = std::max(boundary_s_max, boundary_s);
    events.emit("step", {{"step", step}, {"loss", r.loss}, {"step_s", std::chrono::duration<double>(t1 - t0).count()},
                         {"boundary_s", boundary_s}, {"skipped", r.skipped}, {"tokens", stream.cursor().tokens_served}});
  }
  step_boundary();  // merges that arrived with the stop (the final flush) are applied before the copies are reported
  leaving = !stop;   // a signal, not the end of the run: leave gracefully (stream and quorum freed at once)
  stream_log.reset();  // unlock the stream's log before the syncer hands the stream to a joiner
  send_metadata();
  std::vector<std::string> hashes;
  for (int p = 0; p < P; ++p) hashes.push_back(fnv1a64_hex(*base[p]));
  int64_t unmerged = 0;  // steps whose work on some fragment never reached a merge: lost with the leave
  for (int p = 0; p < P; ++p) unmerged = std::max(unmerged, steps_since[p]);
  events.emit("stopped", {{"step", step}, {"signal", g_learner_signal.load()}, {"lost_steps", lost_steps},
                          {"leaving", leaving}, {"unmerged_steps", unmerged},
                          {"peer_fragments_served", peer_server ? peer_server->served() : 0},
                          {"reconnects", link.reconnects()}, {"max_boundary_s", boundary_s_max},
                          {"versions", version}, {"hashes", hashes}});
  link.drain(std::chrono::milliseconds(leaving ? 2000 : 500));  // the last metadata (a leave) must reach the syncer
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  link.stop();
  return 0;
}

}  // namespace dloco
