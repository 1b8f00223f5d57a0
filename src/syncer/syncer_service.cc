// Syncer service; see syncer_service.h.
#include "syncer/syncer_service.h"

#include "core/json_read.h"

#include "core/prometheus.h"
#include "transport/status_json.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <random>

#include "core/atomic_file.h"
#include "core/bf16.h"
#include "core/check.h"
#include "core/hash.h"
#include "core/safetensors.h"
#include "transport/codec.h"

namespace dloco {

namespace fs = std::filesystem;


SyncerService::SyncerService(const Config& config, std::unique_ptr<SyncerState> state, wire::Handshake expect,
                             fs::path run_dir, EventLog* events, CheckpointWriter write_checkpoint)
    : config_(config),
      expect_(std::move(expect)),
      checkpoint_writer_(std::move(write_checkpoint)),
      run_dir_(std::move(run_dir)),
      events_(events),
      generation_(std::random_device{}() * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(::time(nullptr))),
      t0_(std::chrono::steady_clock::now()),
      state_(std::move(state)),
      store_(run_dir_, expect_.layout_hash),
      streams_(config_.data.streams > 0 ? config_.data.streams : config_.diloco.learners) {
  restore();
  for (int p = 0; p < static_cast<int>(state_->layout().fragments.size()); ++p) {
    published_.push_back({state_->version(p), std::make_shared<const std::vector<float>>(state_->theta(p))});
  }
}

SyncerService::~SyncerService() { stop(); }

double SyncerService::now_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

void SyncerService::restore() {
  // Θ_p, v_p and versions of every fragment persisted before (a restarted syncer never hands out a version lower
  // than one a learner holds).
  std::vector<std::string> skipped;
  const auto fragments = store_.read_fragments(static_cast<int>(state_->layout().fragments.size()), &skipped);
  for (const auto& f : fragments) state_->restore_fragment(f.p, f.theta, f.momentum, f.version);
  for (const auto& why : skipped) emit("persisted_fragment_skipped", {{"reason", why}});
  std::string why;
  if (const auto state = store_.read_state(&why)) {
    try {
      const int64_t global_step = json_integer(state->at("global_step"), "state.json: global_step");
      if (global_step < 0) throw InputError("state.json: global_step " + std::to_string(global_step) + " is negative");
      state_->restore_clock(global_step);
      last_checkpoint_step_ = global_step;  // the next periodic checkpoint is an interval after the restored step
      merges_at_start_ = std::max<int64_t>(0, json_integer_or(*state, "merges", 0, "state.json"));
      state_->restore_merges(merges_at_start_);
      wall_before_s_ = std::max(0.0, state->value("wall_s", 0.0));
      for (int64_t s : streams_.restore(*state)) {  // data.streams shrank: that stream is dropped
        emit("persisted_stream_dropped", {{"stream", s}, {"streams", streams_.size()},
                                          {"reason", "data.streams is smaller than before the restart"}});
      }
      for (int64_t s = 0; s < streams_.size(); ++s) state_->restore_stream_tokens(s, streams_.tokens(s));
      if (state->value("finished", false)) {  // killed after its end: it stays finished (SyncerState::restore_finished)
        state_->restore_finished();
        finished_ = true;
        emit("restored_finished", {{"global_step", state_->global_step()}, {"merges", merges_at_start_}});
      }
    } catch (const std::exception& e) {
      emit("persisted_state_skipped", {{"reason", e.what()}});
    }
  } else if (!why.empty()) {
    emit("persisted_state_skipped", {{"reason", why}});
  }
  if (!fragments.empty()) {
    emit("restored", {{"fragments", fragments.size()}, {"global_step", state_->global_step()},
                      {"versions", state_->versions()}});
  }
}

void SyncerService::emit(const char* event, const nlohmann::json& fields) const {
  if (events_) events_->emit(event, fields);
}

bool SyncerService::session_valid(uint64_t session_id, int* learner) {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return false;
  if (learner) *learner = it->second;
  return true;
}

wire::Result<wire::JoinReply> SyncerService::join(const wire::JoinRequest& req) {
  const std::string mismatch = wire::check_handshake(req.handshake, expect_);
  const int id = req.learner_id;
  const std::string host = req.host.substr(0, 256);
  if (mismatch == wire::kNotAuthenticated) {  // nothing of an unauthenticated request is logged
    refused_call("Join", "unauthenticated");
    return wire::Status{wire::Code::kUnauthenticated, mismatch};
  }
  if (!mismatch.empty()) {
    if (events_) events_->emit("join_refused", {{"learner", id}, {"host", host}, {"reason", mismatch}});
    return wire::Status{wire::Code::kRefused, "refused by the syncer: " + mismatch};
  }
  if (id < -1 || id >= kMaxLearnerId) {
    return wire::Status{wire::Code::kInvalid,
                        "learner id " + std::to_string(id) + " is outside [0, " + std::to_string(kMaxLearnerId) + ")"};
  }
  std::lock_guard lock(mu_);
  LeaseDecision lease;
  if (id >= 0) {
    const double now = now_s();
    lease = streams_.decide(id, req.held_stream, {req.busy_streams.begin(), req.busy_streams.end()},
                            [&](int learner) { return state_->is_live(learner, now); });
    if (lease.stream < 0) {
      emit("join_refused", {{"learner", id}, {"host", host}, {"reason", lease.reason}});
      return wire::Status{lease.refusal, lease.reason};
    }
  }
  if (req.held_stream) {
    reattaching_.insert(id);
  } else {
    reattaching_.erase(id);
  }
  uint64_t session = std::random_device{}();
  session = (session << 32) ^ std::random_device{}() ^ static_cast<uint64_t>(id + 2);
  sessions_[session] = id;
  wire::JoinReply reply;
  reply.session_id = session;
  reply.syncer_generation = generation_;
  reply.global_step = state_->global_step();
  for (const auto& f : published_) reply.fragment_versions.push_back(f.version);  // durable versions only
  if (id < 0) return reply;
  const bool replacing = outboxes_.count(id) > 0;
  // Peers a joiner may bootstrap from: live learners serving their fragments, most recently heard from first.
  std::vector<std::pair<double, int>> live_peers;
  for (const auto& [peer, address] : peers_) {
    if (peer == id || !state_->is_live(peer, now_s())) continue;
    live_peers.emplace_back(-state_->learners().at(peer).state.last_seen_s, peer);
  }
  std::sort(live_peers.begin(), live_peers.end());
  for (const auto& [seen, peer] : live_peers) reply.peers.push_back({peer, peers_[peer]});
  if (req.peer_address.empty()) {
    peers_.erase(id);
  } else {
    peers_[id] = req.peer_address.substr(0, 256);
  }
  // Live (in quorums and pulls) only from its first metadata that names its stream, i.e. once it has
  // bootstrapped and trains: a joiner still fetching fragments must not hold rounds up.
  const int64_t stream = lease.stream;
  const int previous = streams_.grant(id, lease);
  const int64_t S = streams_.size();
  reply.stream_index = stream;
  reply.streams = S;
  reply.stream_cursor_json = streams_.at(stream).cursor;
  // Shared budget: the whole budget, or 0 once it is spent (a learner restarted at the very end trains nothing).
  reply.tokens_budget = config_.train.shared_budget ? (budget_spent_ ? 0 : config_.train.total_tokens)
                                                    : config_.train.total_tokens / S;
  if (events_) {
    events_->emit("learner_joined", {{"learner", id}, {"host", host}, {"certificate", req.certificate},
                                     {"global_step", state_->global_step()},
                                     {"replacing_session", replacing}, {"stream", stream},
                                     {"stream_previous_holder", previous}, {"peers_offered", reply.peers.size()},
                                     {"reason", lease.reason}});
  }
  return reply;
}

wire::Result<wire::Fragment> SyncerService::fragment(uint64_t session_id, int p) {
  std::lock_guard lock(mu_);
  int learner = -1;
  if (!session_valid(session_id, &learner)) return wire::Status{wire::Code::kUnauthenticated, "unknown session: join first"};
  if (p < 0 || p >= static_cast<int>(published_.size())) {
    return wire::Status{wire::Code::kInvalid, "fragment " + std::to_string(p) + " does not exist"};
  }
  wire::Fragment out{p, published_[p].version, wire::encode(*published_[p].theta, wire::Codec::kFp32)};
  const auto size = static_cast<int64_t>(out.payload.bytes.size());
  bytes_sent_ += size;  // a bootstrap's fetch is the learner's download too
  if (auto it = state_->learners().find(learner); it != state_->learners().end()) {
    it->second.bytes_sent += size;
  } else if (learner >= 0) {
    bootstrap_bytes_[learner] += size;  // before its first metadata the learner has no record yet
  }
  return out;
}

wire::Result<wire::Snapshot> SyncerService::snapshot(uint64_t session_id) {
  std::lock_guard lock(mu_);
  if (!session_valid(session_id, nullptr)) return wire::Status{wire::Code::kUnauthenticated, "unknown session: join first"};
  wire::Snapshot out;
  out.global_step = state_->global_step();
  out.tokens_merged = state_->tokens_trained();
  for (int p = 0; p < static_cast<int>(published_.size()); ++p) {
    out.fragments.push_back({p, published_[p].version, wire::encode(*published_[p].theta, wire::Codec::kFp32)});
    bytes_sent_ += static_cast<int64_t>(out.fragments.back().payload.bytes.size());
  }
  return out;
}

wire::StatusReply SyncerService::fill_status() {
  const double now = now_s();
  wire::StatusReply reply;
  reply.global_step = state_->global_step();
  reply.merges = state_->merges();
  reply.last_quorum = state_->last_quorum();
  for (const auto& [id, rec] : state_->learners()) {
    reply.learners.push_back({id, state_->is_live(id, now), rec.state.step, rec.last.tokens_trained,
                              rec.last.tokens_per_s, rec.last.loss, rec.bytes_received, rec.bytes_sent});
  }
  reply.last_val_loss = last_val_loss_;
  reply.last_eval_step = last_eval_step_;
  reply.tokens_trained = state_->tokens_trained();
  reply.tokens_budget = config_.train.total_tokens;
  reply.finished = state_->finished();
  reply.bytes_sent = bytes_sent_;
  reply.bytes_received = bytes_received_;
  reply.answers_dropped = state_->answers_dropped();
  reply.answers_refused = state_->answers_refused();
  reply.answers_refused_by_kind = state_->answers_refused_by_kind();
  reply.reports_refused = state_->reports_refused();
  reply.answers_clipped = state_->answers_clipped();
  reply.merges_dropped = state_->merges_dropped();
  return reply;
}

nlohmann::json SyncerService::monitor_status() {
  std::lock_guard lock(mu_);
  const double now = now_s();
  const wire::StatusReply r = fill_status();
  nlohmann::json learners = nlohmann::json::array();
  int live = 0;
  for (const auto& [id, rec] : state_->learners()) {
    const bool is_live = state_->is_live(id, now);
    live += is_live ? 1 : 0;
    const char* st = rec.last.finished ? "finished" : is_live ? "live" : rec.state.joined ? "absent" : "left";
    learners.push_back({{"id", id}, {"state", st}, {"step", rec.state.step}, {"loss", rec.last.loss},
                        {"tokens_per_s", rec.last.tokens_per_s}, {"tokens_trained", rec.last.tokens_trained},
                        {"heartbeat_age_s", now - rec.state.last_seen_s}, {"bytes_sent", rec.bytes_received},
                        {"bytes_received", rec.bytes_sent}});
  }
  nlohmann::json evals = nlohmann::json::array();
  for (const auto& [step, loss] : evals_) evals.push_back({{"global_step", step}, {"val_loss", loss}});
  const double P = static_cast<double>(state_->versions().size());
  const double trained = static_cast<double>(state_->tokens_trained());
  return {{"run", config_.run.name},
          {"phase", state_->finished() ? "finished" : "training"},
          {"global_step", r.global_step},
          {"merges", r.merges},
          {"quorum", r.last_quorum},
          {"live", live},
          {"learners", learners},
          {"tokens_trained", r.tokens_trained},
          {"tokens_budget", r.tokens_budget},
          {"val_loss", last_eval_step_ >= 0 ? nlohmann::json(last_val_loss_) : nlohmann::json(nullptr)},
          {"evals", evals},
          {"goodput", trained > 0 ? static_cast<double>(state_->tokens_merged()) / (P * trained) : 0.0},
          {"grace_wait_s", state_->grace_wait_s()},
          {"versions", state_->versions()},
          {"answers_dropped", r.answers_dropped},
          {"answers_refused", r.answers_refused},
          {"screening", [&] {
             nlohmann::json screening = wire::screening_json(r);
             screening["calls_refused"] = calls_refused_;
             screening["refetches"] = state_->refetches();
             return screening;
           }()},
          {"bytes_sent", r.bytes_sent},
          {"bytes_received", r.bytes_received},
          {"uptime_s", now}};
}

std::string SyncerService::metrics_text() {
  const nlohmann::json s = monitor_status();
  PrometheusText m;
  m.gauge("dloco_global_step", "Global step t of the run (the K-th largest live learner step).", s["global_step"]);
  m.counter("dloco_merges_total", "Fragment merges so far.", s["merges"]);
  m.gauge("dloco_quorum_size", "Learners in the last merge.", s["quorum"]);
  m.gauge("dloco_learners_live", "Learners live now (in quorums and pulls).", s["live"]);
  m.counter("dloco_tokens_trained_total", "Tokens trained over all data streams.", s["tokens_trained"]);
  m.gauge("dloco_tokens_budget", "train.total_tokens.", s["tokens_budget"]);
  m.gauge("dloco_goodput_ratio", "Share of the tokens trained that merges kept so far (tokens_merged / (P tokens)).",
          s["goodput"]);
  m.counter("dloco_grace_wait_seconds_total", "Seconds rounds waited in grace windows after reaching the quorum.",
            s["grace_wait_s"]);
  m.counter("dloco_answers_dropped_total", "Answers dropped (late: their round had merged).", s["answers_dropped"]);
  m.counter("dloco_answers_refused_total", "Answers refused (malformed or not mergeable).", s["answers_refused"]);
  for (const auto& [kind, n] : s["screening"]["answers_refused_by_kind"].items()) {
    m.counter("dloco_answers_refused_by_kind_total",
              "Answers refused, by kind: malformed, counters, stale, norm (docs/protocol.md §10).", n,
              {{"kind", kind}});
  }
  m.counter("dloco_reports_refused_total", "Learner metadata reports refused as impossible (docs/protocol.md §10).",
            s["screening"]["reports_refused"]);
  m.counter("dloco_answers_clipped_total", "Answers scaled down to diloco.clip_ratio times the median.",
            s["screening"]["answers_clipped"]);
  m.counter("dloco_refetches_total",
            "Times a learner refused diloco.refetch_after times in a row was sent Θ whole (docs/protocol.md §10).",
            s["screening"]["refetches"]);
  m.counter("dloco_merges_dropped_total", "Merges dropped because Θ_p came out non-finite.",
            s["screening"]["merges_dropped"]);
  for (const auto& [reason, n] : s["screening"]["calls_refused"].items()) {
    m.counter("dloco_calls_refused_total",
              "Calls refused before any handler ran, by reason: unauthenticated, oversized (docs/protocol.md §12).", n,
              {{"reason", reason}});
  }
  m.counter("dloco_bytes_sent_total", "Bytes the syncer sent, all learners.", s["bytes_sent"]);
  m.counter("dloco_bytes_received_total", "Bytes the syncer received, all learners.", s["bytes_received"]);
  if (s["val_loss"].is_number()) {
    m.gauge("dloco_validation_loss", "Validation loss of the global model at its last evaluation, nats/token.",
            s["val_loss"]);
  }
  m.gauge("dloco_finished", "1 once the run finished.", s["phase"] == "finished" ? 1 : 0);
  for (const auto& l : s["learners"]) {
    const PrometheusLabels who = {{"learner", std::to_string(l["id"].get<int>())}};
    m.gauge("dloco_learner_up", "1 while the learner is live.", l["state"] == "live" ? 1 : 0, who);
    m.gauge("dloco_learner_step", "The learner's last reported inner step.", l["step"], who);
    m.gauge("dloco_learner_loss", "The learner's training loss (EMA), nats/token.", l["loss"], who);
    m.gauge("dloco_learner_tokens_per_second", "The learner's training speed, tokens/s.", l["tokens_per_s"], who);
    m.counter("dloco_learner_tokens_trained_total", "Tokens the learner trained on its stream.", l["tokens_trained"],
              who);
    m.gauge("dloco_learner_heartbeat_age_seconds", "Seconds since the learner's last metadata.",
            l["heartbeat_age_s"], who);
    m.counter("dloco_learner_bytes_sent_total", "Bytes the learner sent to the syncer.", l["bytes_sent"], who);
    m.counter("dloco_learner_bytes_received_total", "Bytes the syncer sent to the learner.", l["bytes_received"], who);
  }
  const auto& versions = s["versions"];
  for (size_t p = 0; p < versions.size(); ++p) {
    m.gauge("dloco_fragment_version", "Version of Θ_p (merges of fragment p).", versions[p],
            {{"fragment", std::to_string(p)}});
  }
  return m.str();
}

wire::StatusReply SyncerService::status() {
  std::lock_guard lock(mu_);
  return fill_status();
}

wire::Result<wire::StatusReply> SyncerService::report_eval(const wire::EvalReport& req) {
  std::lock_guard lock(mu_);
  int learner = 0;
  if (!session_valid(req.session_id, &learner)) return wire::Status{wire::Code::kUnauthenticated, "unknown session: join first"};
  // A report pins the run's validation loss: only the evaluator's, and only what it can have measured.
  std::string bad;
  if (learner != -1) {
    bad = "only the evaluator reports evaluations (this session is learner " + std::to_string(learner) + "'s)";
  } else if (req.global_step < 0 || req.global_step > state_->global_step()) {
    bad = "global step " + std::to_string(req.global_step) + " is outside [0, " +
          std::to_string(state_->global_step()) + "]";
  } else if (req.val_loss < 0 || !std::isfinite(req.seconds) || req.seconds < 0) {  // a NaN loss is news (divergence)
    bad = "validation loss must be ≥ 0 (or NaN) and seconds finite and ≥ 0";
  } else if (req.fragment_versions.size() != state_->versions().size()) {
    bad = "versions name " + std::to_string(req.fragment_versions.size()) + " fragments, not " +
          std::to_string(state_->versions().size());
  } else {
    for (size_t p = 0; p < req.fragment_versions.size(); ++p) {
      if (req.fragment_versions[p] < 0 || req.fragment_versions[p] > state_->versions()[p]) {
        bad = "fragment " + std::to_string(p) + "'s version " + std::to_string(req.fragment_versions[p]) +
              " is not one the syncer has published";
        break;
      }
    }
  }
  if (!bad.empty()) {
    state_->count_report_refused();
    emit("eval_refused", {{"learner", learner}, {"reason", bad}});
    return wire::Status{wire::Code::kInvalid, "evaluation report refused: " + bad};
  }
  if (req.global_step >= last_eval_step_) {
    last_val_loss_ = req.val_loss;
    last_eval_step_ = req.global_step;
    if (evals_.size() < 100000) evals_.emplace_back(req.global_step, req.val_loss);
  }
  if (events_) {
    events_->emit("eval", {{"global_step", req.global_step}, {"val_loss", req.val_loss},
                           {"versions", req.fragment_versions}, {"seconds", req.seconds}});
  }
  return fill_status();
}

void SyncerService::refused_call(const char* rpc, const char* reason) {
  std::lock_guard lock(mu_);
  const int64_t n = ++calls_refused_[reason];
  if (n == 1 || n == 10 || n == 100 || n == 1000 || n == 10000 || n % 100000 == 0) {
    emit("call_refused", {{"rpc", rpc}, {"reason", reason}, {"count", n}});
  }
}

void SyncerService::persist_state() {
  nlohmann::json j = streams_.to_json();
  j["global_step"] = state_->global_step();
  j["versions"] = state_->versions();
  j["tokens_trained"] = state_->tokens_trained();
  j["merges"] = state_->merges();
  j["wall_s"] = wall_before_s_ + now_s();
  j["finished"] = state_->finished();
  store_.write_state(std::move(j));
}

void SyncerService::persist_final_state() {
  std::lock_guard lock(mu_);
  persist_state();
}

bool SyncerService::merged_since_start() {
  std::lock_guard lock(mu_);
  return state_->merges() > merges_at_start_;
}

std::vector<int64_t> SyncerService::published_versions() {
  std::lock_guard lock(mu_);
  std::vector<int64_t> versions;
  for (const auto& f : published_) versions.push_back(f.version);
  return versions;
}

fs::path SyncerService::write_checkpoint() {
  std::unique_lock lock(mu_);
  const auto& layout = state_->layout();
  std::vector<std::vector<float>> tensors;
  for (const auto& t : layout.tensors) tensors.emplace_back(static_cast<size_t>(t.numel()));
  std::vector<std::span<float>> views(tensors.begin(), tensors.end());
  std::vector<int64_t> versions;
  for (int p = 0; p < static_cast<int>(layout.fragments.size()); ++p) {  // durable Θ only
    scatter_fragment(layout, p, *published_[p].theta, views);
    versions.push_back(published_[p].version);
  }
  nlohmann::json manifest;
  manifest["config"] = to_json(config_);
  manifest["global_step"] = state_->global_step();
  manifest["fragment_versions"] = versions;
  manifest["tokens_trained"] = state_->tokens_trained();
  manifest["tokenizer"] = {{"path", (fs::path(config_.data.dir) / "tokenizer.model").string()},
                           {"hash", expect_.tokenizer_hash}};
  manifest["layout_hash"] = expect_.layout_hash;
  nlohmann::json cursors = nlohmann::json::array();
  for (int64_t s = 0; s < streams_.size(); ++s) {
    if (!streams_.at(s).cursor.empty()) cursors.push_back({{"stream", s}, {"cursor", streams_.at(s).cursor}});
  }
  manifest["cursors"] = cursors;
  const int64_t step = state_->global_step();
  lock.unlock();
  std::vector<SafetensorsEntry> entries;
  for (size_t i = 0; i < layout.tensors.size(); ++i) {
    entries.push_back(f32_entry(layout.tensors[i].name, layout.tensors[i].shape, tensors[i]));
  }
  return checkpoint_writer_(entries, manifest, step);
}

void SyncerService::start() {
  running_ = true;
  merger_ = std::thread([this] { merger_loop(); });
}

void SyncerService::stop() {
  running_ = false;
  if (merger_.joinable()) merger_.join();
  std::lock_guard lock(mu_);
  for (auto& [id, box] : outboxes_) {
    std::lock_guard blk(box->mu);
    box->closed = true;
    box->cv.notify_all();
  }
}

void SyncerService::merger_loop() {
  double last_persist = 0, last_budget_notice = 0;
  while (running_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    SyncerActions actions;
    std::vector<std::vector<float>> momenta;
    bool checkpoint_due = false;
    {
      std::lock_guard lock(mu_);
      actions = state_->tick(now_s());
      for (const auto& m : actions.merged) momenta.push_back(state_->momentum(m.fragment));
      // pulls go out at once (docs/protocol.md §4 step 3)
      for (const auto& pull : actions.pulls) {
        const wire::SyncerMessage msg = wire::PullRequest{
            pull.fragment, pull.round_step,
            std::max<int64_t>(0, state_->version(pull.fragment) - (config_.diloco.anchor_versions - 1)),
            state_->version(pull.fragment)};
        for (int id : pull.learners) send(id, msg);
      }
      // A learner refused diloco.refetch_after times in a row on fragment p gets Θ_p whole, as published (§10):
      // queued before this tick's merges are broadcast, so a merge that follows applies on top of it.
      for (const auto& due : actions.refetch) {
        const auto box = outboxes_.find(due.learner);
        const auto p = static_cast<size_t>(due.fragment);
        if (box == outboxes_.end() || p >= published_.size()) continue;  // not connected: it takes Θ when it re-joins
        send(due.learner, wire::MergedFragment{{due.fragment, published_[p].version,
                                                wire::encode(*published_[p].theta, wire::Codec::kFp32)},
                                               -1, {}, -1, 0, /*refetch=*/true});
        if (box->second->carried.size() <= p) box->second->carried.resize(p + 1, false);
        box->second->carried[p] = true;
      }
      if (config_.train.checkpoint_interval > 0 &&
          state_->global_step() >= last_checkpoint_step_ + config_.train.checkpoint_interval) {
        last_checkpoint_step_ = state_->global_step();
        checkpoint_due = true;
      }
    }
    if (events_) {
      for (const auto& e : actions.events) {
        nlohmann::json fields = e;
        const std::string name = fields["event"];
        fields.erase("event");
        events_->emit(name, fields);
      }
    }
    // Step 8: persist (Θ_p, v_p, version_p) durably; only then is the version published (fragment, snapshot,
    // join, checkpoint) and broadcast. A syncer killed in between restarts from the previous version, which is
    // all anyone was handed (docs/protocol.md "Durability").
    for (size_t i = 0; i < actions.merged.size(); ++i) {
      auto& m = actions.merged[i];
      if (before_persist_ && !before_persist_(m.fragment, m.version)) {
        running_ = false;  // died between merge and persist
        return;
      }
      store_.write_fragment(m.fragment, m.version, m.theta, momenta[i]);
      const wire::SyncerMessage update = wire::MergedFragment{
          {m.fragment, m.version, std::move(m.update)}, m.round_step, m.participants, m.base_version, m.base_hash};
      std::optional<wire::SyncerMessage> whole;  // encoded only if a session needs it
      std::lock_guard lock(mu_);
      published_[m.fragment] = {m.version, std::make_shared<const std::vector<float>>(std::move(m.theta))};
      const auto p = static_cast<size_t>(m.fragment);
      for (const auto& [id, box] : outboxes_) {
        if (box->carried.size() <= p) box->carried.resize(p + 1, false);
        if (m.base_version >= 0 && box->carried[p]) {
          send(id, update);
        } else {
          if (!whole) {
            whole = wire::MergedFragment{{m.fragment, m.version, wire::encode(*published_[p].theta, wire::Codec::kFp32)},
                                         m.round_step, m.participants};
          }
          send(id, *whole);
        }
        box->carried[p] = true;
      }
    }
    if (checkpoint_due) write_checkpoint();
    const double now = now_s();
    // train.shared_budget: once the learners' tokens reach the budget, every learner stops training; repeated
    // every second for learners that (re)join later. The final flush follows when they all report finished.
    if (config_.train.shared_budget) {
      std::lock_guard lock(mu_);
      bool notify = budget_spent_ && now - last_budget_notice > 1.0;
      if (!budget_spent_ && state_->tokens_trained() >= config_.train.total_tokens) {
        budget_spent_ = notify = true;
        if (events_) events_->emit("budget_spent", {{"tokens", state_->tokens_trained()}, {"global_step", state_->global_step()}});
      }
      if (notify) {
        for (const auto& [id, rec] : state_->learners()) {
          if (!rec.last.finished) send(id, wire::BudgetSpent{});
        }
        last_budget_notice = now;
      }
    }
    if (now - last_persist > 1.0 || actions.finished_now) {
      std::lock_guard lock(mu_);
      persist_state();
      last_persist = now;
    }
    if (actions.finished_now) {  // run_syncer writes the final checkpoint after the merger stops
      std::lock_guard lock(mu_);
      if (events_) {  // what every learner's copy must equal at the end (chaos consistency check)
        std::vector<std::string> hashes;
        for (int p = 0; p < static_cast<int>(state_->layout().fragments.size()); ++p) {
          hashes.push_back(fnv1a64_hex(state_->theta(p)));
        }
        events_->emit("final_state", {{"versions", state_->versions()}, {"hashes", hashes},
                                      {"global_step", state_->global_step()}});
      }
      for (const auto& [id, box] : outboxes_) send(id, wire::Stop{});
      finished_ = true;
    }
  }
}

}  // namespace dloco
