// Syncer service; see syncer_service.h.
#include "syncer/syncer_service.h"

#include "core/json_read.h"

#include "monitor/prometheus_text.h"
#include "transport/status_json.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <random>

#include "core/bf16.h"
#include "core/check.h"
#include "core/hash.h"
#include "core/safetensors.h"
#include "process/atomic_file.h"
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
      state_->restore_merges(merges_at_start_,
                             std::max<int64_t>(0, json_integer_or(*state, "tokens_merged", 0, "state.json")),
                             std::max<int64_t>(0, json_integer_or(*state, "tokens_lost", 0, "state.json")));
      wall_before_s_ = std::max(0.0, state->value("wall_s", 0.0));
      for (int64_t s : streams_.restore(*state)) {  // data.streams shrank: that stream is dropped
        emit("persisted_stream_dropped", {{"stream", s}, {"streams", streams_.size()},
                                          {"reason", "data.streams is smaller than before the restart"}});
      }
      for (int64_t s = 0; s < streams_.size(); ++s) state_->restore_stream_tokens(s, streams_.tokens(s));
      restore_carried_errors(*state);
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

// The error-feedback allowances (§10), apart: a bad entry costs only them (the learners' next answers are screened
// without, as after a refused one), never the clock and the streams.
void SyncerService::restore_carried_errors(const nlohmann::json& state) {
  if (!state.contains("carried_error")) return;  // written before they were persisted
  try {
    state_->restore_carried_errors(state.at("carried_error"));
  } catch (const InputError& e) {
    emit("persisted_allowance_skipped", {{"reason", e.what()}});
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
    if (id >= 0) state_->on_new_process(id);  // goodput: what its predecessor held and no merge took is lost
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

}  // namespace dloco
