// The learner's outer sync; see outer_sync.h. Step numbers follow docs/protocol.md "Learner loop".
#include "learner/outer_sync.h"

#include <algorithm>
#include <cmath>

#include "core/fragments.h"
#include "core/hash.h"

namespace dloco {

OuterSync::OuterSync(OuterSyncConfig config, InnerJob& job, LearnerLink& link, EventLog* events, FragmentBoard* board)
    : config_(std::move(config)),
      job_(job),
      link_(link),
      events_(events),
      board_(board),
      base_(static_cast<size_t>(config_.fragments)),
      version_(static_cast<size_t>(config_.fragments), 0),
      newest_(static_cast<size_t>(config_.fragments)),
      newest_version_(static_cast<size_t>(config_.fragments), 0),
      newest_hash_(static_cast<size_t>(config_.fragments), 0),
      resync_asked_(static_cast<size_t>(config_.fragments), false),
      steps_since_(static_cast<size_t>(config_.fragments), 0),
      tokens_since_(static_cast<size_t>(config_.fragments), 0),
      feedback_(static_cast<size_t>(config_.fragments)) {
  DLOCO_CHECK_EQ(config_.fragment_numel.size(), static_cast<size_t>(config_.fragments));
}

void OuterSync::emit(const char* event, const nlohmann::json& fields) const {
  if (events_) events_->emit(event, fields);
}

void OuterSync::adopt(int p, int64_t version, std::shared_ptr<const std::vector<float>> theta) {
  job_.write_fragment(p, *theta);
  version_[p] = newest_version_[p] = version;
  newest_hash_[p] = 0;
  newest_[p] = theta;
  base_[p] = std::move(theta);
  if (board_) board_->publish(p, version, base_[p]);
}

// Hashed on the first update against this copy only: an fp32 downlink (whole copies) never pays for it on the
// training thread. 0 marks "not computed yet" (a true FNV-1a 64 of 0 is a 2^-64 chance: one extra hash).
uint64_t OuterSync::newest_hash(int p) {
  if (newest_hash_[p] == 0) newest_hash_[p] = fnv1a64_floats(*newest_[p]);
  return newest_hash_[p];
}

void OuterSync::count_step(int64_t tokens) {
  for (int p = 0; p < config_.fragments; ++p) {
    steps_since_[p] += 1;
    tokens_since_[p] += tokens;
  }
}

void OuterSync::fill_counters(wire::Metadata& metadata) const {
  metadata.steps = steps_since_;
  metadata.tokens = tokens_since_;
  metadata.versions = newest_version_;
  for (int p = 0; p < config_.fragments; ++p) {
    if (resync_asked_[p]) metadata.versions[p] = -1;  // it wants p whole: its copy may not be the one it numbers
  }
}

BoundaryOutcome OuterSync::boundary(int64_t step, bool finished) {
  BoundaryOutcome out;
  wire::SyncerMessage in;
  while (link_.poll(&in)) {
    if (std::holds_alternative<wire::Stop>(in)) {
      out.stop = true;
    } else if (std::holds_alternative<wire::BudgetSpent>(in)) {  // the others trained the rest of the shared budget
      out.budget_spent = true;
    } else if (auto* offer = std::get_if<wire::StreamOffer>(&in)) {  // the learner loop takes it or declines it
      out.offer = std::move(*offer);
    } else if (const auto* pull = std::get_if<wire::PullRequest>(&in)) {
      answer(*pull, step);  // 5)
    } else if (auto* merged = std::get_if<wire::MergedFragment>(&in)) {
      receive(std::move(*merged), step);
    }
  }
  finished = finished || out.budget_spent;
  for (auto it = pending_.begin(); it != pending_.end();) {  // 6) apply the merges whose step has come
    if (it->apply_at > step && !finished) {
      ++it;
      continue;
    }
    apply(*it, step);
    it = pending_.erase(it);
  }
  return out;
}

// 5) Δ_p = Θ_p^base − θ_p against the version last applied, or raw θ_p when the syncer no longer holds that base.
void OuterSync::answer(const wire::PullRequest& pull, int64_t step) {
  const int p = pull.fragment;
  if (p < 0 || p >= config_.fragments) return;
  wire::PullAnswer a{p, pull.round_step, step, version_[p], steps_since_[p], tokens_since_[p], {}};
  std::vector<float> theta(static_cast<size_t>(config_.fragment_numel[p]));
  job_.read_fragment(p, theta);
  // The syncer no longer holds the base (it is older than the oldest anchor), or never held it (the syncer came
  // back with an older history: this learner's version is above the syncer's).
  const bool ahead = pull.version >= 0 && version_[p] > pull.version;
  if ((version_[p] < pull.oldest_anchor || ahead) && config_.reanchor) {
    a.base_version = -1;  // re-anchoring: raw θ in fp32
    a.delta = wire::encode(theta, wire::Codec::kFp32);
    feedback_[static_cast<size_t>(p)].reset();  // what it held was relative to the old base
  } else {
    const std::vector<float>& anchor = *base_[p];
    for (size_t i = 0; i < theta.size(); ++i) theta[i] = anchor[i] - theta[i];
    a.delta = encode_delta(p, theta);
  }
  answered_[p] = {pull.round_step, step, steps_since_[p], true};
  if (config_.blocking) awaiting_merge_[p] = step + config_.overlap;
  emit("answered", {{"fragment", p}, {"round", pull.round_step}, {"step", step}, {"base_version", a.base_version},
                    {"steps", a.steps}});
  link_.post(std::move(a));
}

wire::Payload OuterSync::encode_delta(int p, std::vector<float>& delta) {
  const bool integer = config_.codec == wire::Codec::kQ8 || config_.codec == wire::Codec::kQ4 ||
                       config_.codec == wire::Codec::kTopK;
  try {
    if (config_.error_feedback && config_.codec != wire::Codec::kFp32) {
      return feedback_[static_cast<size_t>(p)].encode(delta, config_.codec, 0, nullptr, config_.error_feedback_decay,
                                                      config_.topk_density);
    }
    return wire::encode(delta, config_.codec, 0, config_.topk_density);
  } catch (const InputError& e) {  // a non-finite Δ: the integer codecs cannot carry it
    DLOCO_CHECK(integer);
    emit("delta_not_finite", {{"fragment", p}, {"codec", wire::to_string(config_.codec)}, {"reason", e.what()}});
    return wire::encode(delta, wire::Codec::kFp32);
  }
}

// A merged fragment: held back until τ steps after the capture of this learner's answer to that round (s + τ),
// or applied at the next boundary when this learner was not part of it.
void OuterSync::receive(wire::MergedFragment merged, int64_t step) {
  const int p = merged.fragment.fragment;
  if (p < 0 || p >= config_.fragments) return;
  const bool whole = merged.base_version == -1;
  // A whole copy asked for (after a gap) replaces this learner's copy even at a lower version: the syncer may have
  // come back with an older history (a persisted fragment it could not read), and its word is Θ.
  // A whole copy at a lower version than this learner's can only come from a syncer whose history went back (within
  // one syncer, versions only grow and none is handed out before it is persisted).
  // A re-fetch (this learner's answers were refused diloco.refetch_after times in a row, §10) replaces the copy and
  // the parameters even at the version held: they may be what went bad.
  // A re-fetch while a merge of p at that version or later waits to be applied changes nothing (that apply writes
  // Θ_p into the parameters anyway) and must not take the place of that merge (which may be this learner's own,
  // held back until s + τ).
  if (merged.refetch && std::any_of(pending_.begin(), pending_.end(), [&](const Pending& q) {
        return q.fragment == p && q.version >= merged.fragment.version;
      })) {
    emit("refetch_skipped", {{"fragment", p}, {"version", merged.fragment.version},
                             {"reason", "a merge of the fragment at that version or later waits to be applied"}});
    return;
  }
  const bool replaces = whole && (merged.refetch || resync_asked_[p] || merged.fragment.version < newest_version_[p]);
  if (merged.fragment.version <= newest_version_[p] && !replaces) return;  // stale or duplicate
  Pending m{p, merged.fragment.version, step, false, {}, whole, replaces};
  std::vector<float> theta;
  std::string bad;
  if (whole) {  // Θ_p whole
    try {
      theta = wire::fragment_values(merged.fragment);
      if (static_cast<int64_t>(theta.size()) != config_.fragment_numel[p]) bad = "wrong size";
    } catch (const InputError& e) {
      bad = e.what();
    }
  } else if (merged.base_version < 0 || merged.fragment.version != merged.base_version + 1) {
    bad = "an update from version " + std::to_string(merged.base_version) + " to " +
          std::to_string(merged.fragment.version) + ": an update moves one version from a version ≥ 0";
  } else if (merged.base_version != newest_version_[p] || merged.base_hash != newest_hash(p)) {
    // An update against a version this learner lacks (a merge lost on the way), or against other contents under
    // the same number (a syncer restarted with an older history): refuse to guess, ask for a whole copy.
    emit("merged_gap", {{"fragment", p}, {"version", m.version}, {"base_version", merged.base_version},
                        {"holds", newest_version_[p]},
                        {"reason", std::string(merged.base_version == newest_version_[p] ? "same version, other contents"
                                                                                         : "a version it lacks") +
                                       (resync_asked_[p] ? ": waiting for the whole copy asked for"
                                                         : ": asking for a whole copy (re-opening the session)")}});
    if (!resync_asked_[p]) link_.resync();
    resync_asked_[p] = true;
    return;
  } else {  // the compressed downlink: Θ_p = Θ_p^prev + Û, exactly as the syncer built it
    bad = wire::apply_update(*newest_[p], merged.fragment.payload, theta);
  }
  if (!bad.empty()) {
    emit("merged_refused", {{"fragment", p}, {"version", m.version}, {"reason", bad}});
    if (!resync_asked_[p]) link_.resync();  // the next merges would be updates against a copy it does not have
    resync_asked_[p] = true;
    return;
  }
  if (whole) resync_asked_[p] = false;
  if (merged.refetch) {
    feedback_[static_cast<size_t>(p)].reset();  // what it held belongs to answers that were refused
    emit("refetch", {{"fragment", p}, {"version", m.version},
                     {"reason", "the syncer refused this learner's answers diloco.refetch_after times in a row: its "
                                "parameters of the fragment are replaced by Θ_p"}});
  }
  m.theta = newest_[p] = std::make_shared<const std::vector<float>>(std::move(theta));
  newest_version_[p] = m.version;
  newest_hash_[p] = 0;
  if (replaces) {  // nothing older may be applied after it
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [p](const Pending& q) { return q.fragment == p; }),
                   pending_.end());
  }
  if (auto it = answered_.find(p); it != answered_.end() && it->second.round == merged.round_step) {
    m.participated = std::find(merged.participants.begin(), merged.participants.end(), config_.learner_id) !=
                     merged.participants.end();
    if (m.participated) m.apply_at = it->second.captured_step + config_.overlap;
    if (it->second.open) {  // goodput: the work that answer carried was kept, or not
      emit(m.participated ? "kept" : "answer_not_merged",
           {{"fragment", p}, {"round", merged.round_step}, {"steps", it->second.steps}, {"version", m.version},
            {"captured_step", it->second.captured_step}});
      it->second.open = false;
    }
  }
  pending_.push_back(std::move(m));
}

// 6) θ_p ← Θ_p (or α·θ_p + (1 − α)·Θ_p); Θ_p becomes the base of the next Δ_p.
void OuterSync::apply(Pending& m, int64_t step) {
  const int p = m.fragment;
  if (m.participated) awaiting_merge_.erase(p);
  if (m.version <= version_[p] && !m.replaces) return;
  if (!m.participated && steps_since_[p] > 0) {
    lost_steps_ += steps_since_[p];
    emit("work_lost", {{"fragment", p}, {"steps", steps_since_[p]}, {"version", m.version},
                       {"reason", "merged without this learner's answer"}});
  }
  const std::vector<float>& theta = *m.theta;
  if (config_.alpha > 0) {
    std::vector<float> local(theta.size());
    job_.read_fragment(p, local);
    for (size_t i = 0; i < local.size(); ++i) {
      local[i] = static_cast<float>(config_.alpha * local[i] + (1 - config_.alpha) * theta[i]);
    }
    job_.write_fragment(p, local);
  } else {
    job_.write_fragment(p, theta);
  }
  base_[p] = std::move(m.theta);
  version_[p] = m.version;
  if (board_) board_->publish(p, version_[p], base_[p]);  // a pointer swap: joiners read it from the peer server
  steps_since_[p] = tokens_since_[p] = 0;
  ++merges_applied_;
  emit("applied", {{"step", step}, {"fragment", p}, {"version", version_[p]}, {"from", m.whole ? "whole" : "update"}});
}

bool OuterSync::blocked(int64_t step) const {
  for (int p = 0; p < config_.fragments; ++p) {
    if (!fragment_due(p, step, static_cast<int>(config_.inner_steps), config_.fragments)) continue;
    const auto it = answered_.find(p);
    if (it == answered_.end() || it->second.round != step) return true;  // the pull of this round has not come
  }
  for (const auto& [p, apply_at] : awaiting_merge_) {
    if (apply_at <= step) return true;  // its merge has not been applied yet
  }
  return false;
}

int64_t OuterSync::unmerged_steps() const { return *std::max_element(steps_since_.begin(), steps_since_.end()); }

std::vector<std::string> OuterSync::parameter_hashes() const {
  std::vector<std::string> out;
  for (int p = 0; p < config_.fragments; ++p) {
    std::vector<float> theta(static_cast<size_t>(config_.fragment_numel[p]));
    job_.read_fragment(p, theta);
    out.push_back(fnv1a64_hex(theta));
  }
  return out;
}

}  // namespace dloco
