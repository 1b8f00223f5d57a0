// The syncer service's merger thread (docs/protocol.md §4 "Syncer loop", "Durability"): every 5 ms it ticks the
// state machine, sends the pulls and re-fetches it asks for, persists each merged fragment and only then publishes
// and broadcasts it, writes periodic checkpoints, tells learners the shared budget is spent, and ends the run. The
// service's calls are syncer_service.cc and syncer_sessions.cc; its status and metrics, syncer_status.cc.
#include <chrono>
#include <optional>
#include <thread>

#include "core/check.h"
#include "core/hash.h"
#include "core/safetensors.h"
#include "syncer/syncer_service.h"
#include "transport/codec.h"

namespace dloco {

namespace fs = std::filesystem;

void SyncerService::merger_loop() {
  double last_persist = 0, last_budget_notice = 0;
  while (running_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    Tick tick = tick_and_pull();
    emit_decisions(tick.actions);
    if (!persist_and_broadcast(tick)) return;
    if (tick.checkpoint_due) write_checkpoint();
    const double now = now_s();
    if (config_.train.shared_budget) notify_budget_spent(now, last_budget_notice);
    if (now - last_persist > 1.0 || tick.actions.finished_now) {
      std::lock_guard lock(mu_);
      persist_state();
      sample_history(now);
      last_persist = now;
    }
    if (tick.actions.finished_now) finish();
  }
}

SyncerService::Tick SyncerService::tick_and_pull() {
  Tick tick;
  std::lock_guard lock(mu_);
  const double now = now_s();  // one instant for both: a holder's lease must not run out between them
  offer_orphaned_streams(now);  // first: an open offer holds the end this tick may decide
  tick.actions = state_->tick(now);
  for (const auto& m : tick.actions.merged) tick.momenta.push_back(state_->momentum(m.fragment));
  // pulls go out at once (docs/protocol.md §4 step 3)
  for (const auto& pull : tick.actions.pulls) {
    const wire::SyncerMessage msg = wire::PullRequest{
        pull.fragment, pull.round_step, state_->oldest_anchor(pull.fragment), state_->version(pull.fragment)};
    for (int id : pull.learners) send(id, msg);
  }
  // A learner refused diloco.refetch_after times in a row on fragment p gets Θ_p whole, as published (§10):
  // queued before this tick's merges are broadcast, so a merge that follows applies on top of it.
  for (const auto& due : tick.actions.refetch) {
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
    tick.checkpoint_due = true;
  }
  return tick;
}

void SyncerService::emit_decisions(const SyncerActions& actions) {
  if (!events_) return;
  for (const auto& e : actions.events) {
    nlohmann::json fields = e;
    const std::string name = fields["event"];
    fields.erase("event");
    events_->emit(name, fields);
  }
}

bool SyncerService::persist_and_broadcast(Tick& tick) {
  // Step 8: persist (Θ_p, v_p, version_p) durably; only then is the version published (fragment, snapshot,
  // join, checkpoint) and broadcast. A syncer killed in between restarts from the previous version, which is
  // all anyone was handed (docs/protocol.md "Durability").
  for (size_t i = 0; i < tick.actions.merged.size(); ++i) {
    auto& m = tick.actions.merged[i];
    if (before_persist_ && !before_persist_(m.fragment, m.version)) {
      running_ = false;  // died between merge and persist
      return false;
    }
    store_.write_fragment(m.fragment, m.version, m.theta, tick.momenta[i]);
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
  return true;
}

void SyncerService::notify_budget_spent(double now, double& last_notice) {
  // train.shared_budget: once the learners' tokens reach the budget, every learner stops training; repeated
  // every second for learners that (re)join later. The final flush follows when they all report finished.
  std::lock_guard lock(mu_);
  bool notify = budget_spent_ && now - last_notice > 1.0;
  if (!budget_spent_ && state_->tokens_trained() >= config_.train.total_tokens) {
    budget_spent_ = notify = true;
    if (events_) events_->emit("budget_spent", {{"tokens", state_->tokens_trained()}, {"global_step", state_->global_step()}});
  }
  if (notify) {
    for (const auto& [id, rec] : state_->learners()) {
      if (!rec.last.finished) send(id, wire::BudgetSpent{});
    }
    last_notice = now;
  }
}

void SyncerService::offer_orphaned_streams(double now) {
  // A shared budget ends when its sum is spent, whichever streams trained it; nothing is offered after the training
  // (an offer taken during the final flush would train past it) or while the learners re-attach to a restarted
  // syncer (a holder still in its reconnect backoff is alive).
  if (config_.train.shared_budget || !state_->training() || state_->awaiting_reattach(now)) {
    state_->hold_end(false);
    return;
  }
  if (takes_over_.empty() && offers_.empty() && declined_until_.empty()) {  // the common case, every tick
    state_->hold_end(false);
    return;
  }
  for (auto it = offers_.begin(); it != offers_.end();) {
    if (now - it->second.sent_s <= kOfferTimeout_s) {
      ++it;
      continue;
    }
    streams_.decline(it->first, it->second.stream);
    declined_until_[it->second.stream] = now + kDeclinedFor_s;  // as a decline: not offered again at once
    emit("stream_offer_withdrawn", {{"learner", it->first}, {"stream", it->second.stream},
                                    {"reason", "no answer within 10 s"}});
    it = offers_.erase(it);
  }
  const int64_t share = config_.train.total_tokens / streams_.size();
  const int64_t per_step = config_.train.tokens_per_step(config_.model);
  std::set<int64_t> excluded;
  for (const auto& [id, offer] : offers_) excluded.insert(offer.stream);
  for (const auto& [stream, until] : declined_until_) {
    if (until > now) excluded.insert(stream);
  }
  // A stream nobody has trained yet stays its slot's for the syncer's first kNeverStartedGrace_s: a learner slow to
  // start (a Python learner importing torch on a loaded machine) must not find its stream taken by one that spent
  // its own share meanwhile (seen: a tiny model's 150 steps in under a second; the Python learner trained nothing).
  if (now < kNeverStartedGrace_s) {
    for (int64_t s = 0; s < streams_.size(); ++s) {
      if (streams_.tokens(s) == 0) excluded.insert(s);
    }
  }
  const auto is_live = [&](int who) { return state_->is_live(who, now); };
  for (int id : takes_over_) {
    const auto rec = state_->learners().find(id);
    if (offers_.count(id) || !is_live(id) || rec == state_->learners().end() || !rec->second.last.finished) continue;
    const auto stream = streams_.orphan(share, per_step, excluded, is_live);
    if (!stream) break;
    const int previous = streams_.offer(id, *stream);
    offers_[id] = {*stream, now};
    excluded.insert(*stream);
    send(id, wire::StreamOffer{*stream, streams_.at(*stream).cursor, share});
    emit("stream_offered", {{"learner", id}, {"stream", *stream}, {"previous_holder", previous},
                            {"tokens_served", streams_.tokens(*stream)}, {"share", share},
                            {"reason", previous < 0 ? "its holder left and its share is unspent"
                                                    : "its holder is not live (its lease ran out) and its share is "
                                                      "unspent; learner " + std::to_string(id) + " spent its own"}});
  }
  // A declined stream's holder is alive (it holds the log's lock: paused, or its link cut past its lease): while its
  // share is unspent and it is not back, the end waits for it as for a slow learner, and it is offered again
  // every kDeclinedFor_s in case it died. The hold lapses kDeclinedFor_s after the last decline: with nobody left to
  // offer it to (the asker gone, only learners that never ask), the run ends as it did before take-over.
  bool held_elsewhere = false;
  for (auto it = declined_until_.begin(); it != declined_until_.end();) {
    if (!streams_.is_orphan(it->first, share, per_step, is_live)) {  // its holder is back, or it is spent
      it = declined_until_.erase(it);
      continue;
    }
    held_elsewhere = held_elsewhere || it->second > now;
    ++it;
  }
  state_->hold_end(!offers_.empty() || held_elsewhere);
}

void SyncerService::finish() {  // run_syncer writes the final checkpoint after the merger stops
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

void SyncerService::persist_state() {
  nlohmann::json j = streams_.to_json();
  j["global_step"] = state_->global_step();
  j["versions"] = state_->versions();
  j["tokens_trained"] = state_->tokens_trained();
  j["merges"] = state_->merges();
  j["tokens_merged"] = state_->tokens_merged();
  j["tokens_lost"] = state_->tokens_lost();
  j["wall_s"] = wall_before_s_ + now_s();
  j["finished"] = state_->finished();
  j["carried_error"] = state_->carried_errors_json();
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

}  // namespace dloco
