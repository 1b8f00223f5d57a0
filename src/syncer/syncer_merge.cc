// The syncer's merge of one round of fragment p (docs/protocol.md §4 "Syncer loop", the paper's outer step), in the
// order the paper takes it. SyncerState's other transitions are syncer_state.cc (learners and answers) and
// syncer_rounds.cc (the clock, quorum and grace). Pure: no I/O, no clocks (now_s is given).
//
//   1. outer gradients  Δ_m = Θ_p − θ_m, anchored at the current Θ_p (a stale base re-anchored), with each answer's
//                       size per unit of inner lr for the screen
//   2. screening        refuse or clip answers far above the others (screening.h, §10)
//   3. weights          tokens² / steps per answer ("quantity × quality"), or uniform over learners that trained
//   4. merge + Nesterov Δ_p = RDA(Δ_m; weights) (plain weighted mean for the embedding, §6);
//                       v_p ← μ·v_p + Δ_p, Θ_p ← Θ_p − η·(Δ_p + μ·v_p)
//   5. downlink         with diloco.wire_down: U = Θ_p − Θ_p^prev encoded, Θ_p := Θ_p^prev + Û (downlink.h, §9)
//   6. publish          a non-finite Θ_p or v_p is dropped (§10); else version_p + 1, an anchor, the screen's
//                       reference norms, and the merged fragment to persist and then broadcast
#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/hash.h"
#include "syncer/downlink.h"
#include "syncer/screening.h"
#include "syncer/syncer_event.h"
#include "syncer/syncer_state.h"

namespace dloco {

using syncer_detail::event;

namespace {


bool all_finite(const std::vector<float>& x) {
  return std::all_of(x.begin(), x.end(), [](float v) { return std::isfinite(v); });
}

}  // namespace

void SyncerState::merge_round(int p, Round& round, double now_s, SyncerActions& actions) {
  FragmentState& frag = fragments_[p];
  std::vector<MergeCandidate> answers = outer_gradients(p, round);            // 1
  const double largest_ratio = screen_round(p, round, answers, actions);       // 2
  std::vector<double> weights;                                                 // 3
  for (const MergeCandidate& a : answers) weights.push_back(a.weight);
  if (answers.empty() || !merge_has_weight(weights)) {
    actions.events.push_back(event("round_skipped", {{"fragment", p}, {"round", round.step},
                                                     {"reason", answers.empty() ? "no answers" :
                                                                                  "no answering learner trained on it"}}));
    return;
  }
  std::vector<std::span<const float>> views;                                   // 4
  for (const MergeCandidate& a : answers) views.emplace_back(a.grad);
  std::vector<float> delta(frag.theta.size());
  merge_fragment(layout_, p, views, weights, config_.diloco.merge, is_embedding_, delta);
  const std::vector<float> previous = frag.theta, previous_momentum = frag.momentum;
  const wire::ErrorFeedback previous_feedback = frag.down_feedback;
  nesterov_outer_step(frag.theta, frag.momentum, delta, static_cast<float>(config_.diloco.outer_lr),
                      static_cast<float>(config_.diloco.outer_momentum));
  std::vector<int> ids;
  for (const MergeCandidate& a : answers) ids.push_back(a.learner);
  MergedFragmentData merged{p, frag.version + 1, round.step, ids, {}, -1, 0, {}};
  const wire::Codec down = wire::parse_codec(to_string(config_.diloco.wire_down));   // 5
  Downlink downlink = encode_downlink(previous, frag.theta, down,
                                      config_.diloco.error_feedback ? &frag.down_feedback : nullptr,
                                      config_.diloco.error_feedback_decay, config_.diloco.topk_density);
  if (!downlink.whole) {
    merged.update = std::move(downlink.update);
    merged.base_version = frag.version;
    merged.base_hash = fnv1a64_floats(previous);
  } else if (!downlink.reason.empty()) {
    frag.down_feedback.reset();
    actions.events.push_back(event("downlink_whole", {{"fragment", p}, {"round", round.step},
                                                      {"reason", downlink.reason}}));
  }
  if (!all_finite(frag.theta) || !all_finite(frag.momentum)) {                 // 6
    // An overflow (finite answers can still sum past FLT_MAX) is dropped before anything is persisted or broadcast.
    frag.theta = previous;
    frag.momentum = previous_momentum;
    frag.down_feedback = previous_feedback;
    ++merges_dropped_;
    actions.events.push_back(event("merge_dropped", {{"fragment", p}, {"round", round.step}, {"participants", ids},
                                                     {"reason", "the outer step made Θ_p or its momentum non-finite "
                                                                "(outer gradient norm " +
                                                                    std::to_string(l2_norm(delta)) + ")"}}));
    return;
  }
  publish_merge(p, round, answers, now_s);
  actions.events.push_back(event("merged", {{"fragment", p}, {"round", round.step}, {"version", frag.version},
                                            {"participants", ids}, {"weights", normalise_weights(weights)},
                                            {"outer_grad_norm", l2_norm(delta)}, {"largest_ratio", largest_ratio}}));
  merged.theta = frag.theta;
  actions.merged.push_back(std::move(merged));
}

std::vector<SyncerState::MergeCandidate> SyncerState::outer_gradients(int p, Round& round) const {
  const FragmentState& frag = fragments_[p];
  const size_t n = frag.theta.size();
  std::vector<MergeCandidate> out;
  for (auto& [id, a] : round.answers) {
    MergeCandidate c;
    c.learner = id;
    // The size screened is the learner's own Δ against its base: an honest answer against the version before (its
    // merge came after s + τ, with the next pull) rebased onto Θ_p also carries the syncer's last outer step, and
    // was refused at ratios of 10–916 (found by the Python learner's test). A raw θ has no own Δ: its rebased one.
    const double sent_norm = a.base_version >= 0 ? l2_norm(a.delta) : -1;
    double own_norm = sent_norm;
    // A learner re-warming its lr after joining (core/lr_schedule.h) answers well below the others per unit of the
    // run's lr; in the reference it would lower the median the others are screened against.
    bool rewarming = false;
    // With error feedback a payload carries x = Δ + e_prev, what the codec dropped from this learner's last answer of
    // p: ‖Δ‖ ≥ ‖x̂‖ − ‖e_prev‖ − ‖e_now‖. A short answer after a long one (a learner that trained alone while the
    // quorum waited) carried the long one's residual and was refused at 13–25× (found by the Python learner's test,
    // C++ learner, q4 + error feedback). The allowance is e_prev's bound only, and only from an answer this syncer
    // merged (it passed the screen itself): an attacker can then gain at most 1/(1 − c) over the screen, c = e / ‖x̂‖
    // ≤ √B / (2·q_max) for the run's codec (2.3× for q4/64, 1.07× for q8/256; other codecs and blocks are refused).
    // topk drops most of every vector (its bound is mostly the dropped part, up to √(C/k − 1) ≈ 8× what it sends):
    // no allowance there; every learner's answer carries its own residual, so their sizes stay comparable.
    const bool allowance = config_.diloco.error_feedback && config_.diloco.wire_up != WireDtype::kTopK;
    if (auto rec = learners_.find(id); rec != learners_.end()) {
      rewarming = a.captured_step - a.steps < rec->second.rewarm_until;
      if (own_norm >= 0 && allowance) {
        const auto carried = rec->second.carried_error.find(p);
        if (carried != rec->second.carried_error.end()) own_norm = std::max(0.0, own_norm - carried->second);
      }
    }
    // Δ = Θ_p − θ_m with θ_m = Θ_p^base − delta (or raw θ_m when base < 0).
    if (a.base_version == frag.version) {
      c.grad = std::move(a.delta);
    } else {
      const std::vector<float>* base = nullptr;
      for (const auto& anchor : frag.anchors) {
        if (anchor.first == a.base_version) base = &anchor.second;
      }
      std::vector<float> local(n);
      for (size_t i = 0; i < n; ++i) local[i] = base ? (*base)[i] - a.delta[i] : a.delta[i];
      c.grad.resize(n);
      outer_gradient(frag.theta, local, c.grad);
    }
    c.weight = config_.diloco.weights == WeightRule::kTokens ? token_weight(a.tokens, a.steps)
                                                              : (a.steps > 0 ? 1.0 : 0.0);
    // Its size per unit of inner learning rate: ‖Δ‖ / Σ lr(t) over its steps (AdamW moves each value by about lr(t)
    // a step whatever the gradient's scale, so warmup and decay do not move the comparison: §10).
    double lr_sum = 0;
    for (int64_t t = std::max<int64_t>(0, a.captured_step - a.steps); t < a.captured_step; ++t) {
      lr_sum += schedule_.global_at(t);
    }
    lr_sum = std::max(lr_sum, schedule_.global_at(std::max<int64_t>(0, a.captured_step)));
    const double rebased = own_norm >= 0 ? 0 : l2_norm(c.grad);
    const double norm = lr_sum > 0 ? (own_norm >= 0 ? own_norm : rebased) / lr_sum : -1;  // −1: not comparable
                                                                                        // (lr 0: min_lr_ratio 0)
    const double unreduced = lr_sum > 0 ? (sent_norm >= 0 ? sent_norm : rebased) / lr_sum : -1;
    c.screen.steps = a.steps;
    c.screen.per_step = std::isfinite(norm) ? norm : -1;
    c.screen.reference = std::isfinite(unreduced) && !rewarming ? unreduced : -1;
    c.screen.raw = a.base_version < 0;
    c.codec_error = a.codec_error;
    c.tokens = a.tokens;
    out.push_back(std::move(c));
  }
  return out;
}

double SyncerState::screen_round(int p, const Round& round, std::vector<MergeCandidate>& answers,
                                 SyncerActions& actions) {
  std::vector<ScreenEntry> entries;
  for (const MergeCandidate& a : answers) entries.push_back(a.screen);
  const double screen = config_.diloco.screen_ratio, clip = config_.diloco.clip_ratio;
  // diloco.blocking: a learner waits for the merge of the round it answered, so screening there is off.
  const ScreenResult result = screen_answers(entries, fragments_[p].recent_norms, screen, clip,
                                             !config_.diloco.blocking);
  std::vector<MergeCandidate> kept;
  for (size_t i = 0; i < answers.size(); ++i) {
    const ScreenVerdict& v = result.verdicts[i];
    MergeCandidate& a = answers[i];
    a.screen = entries[i];  // a clipped answer's sizes are scaled
    if (v.action == ScreenAction::kRefuse) {
      refuse(a.learner, p, round.step, RefusalKind::kNorm, /*solicited=*/true);
      actions.events.push_back(event("answer_refused",
                                     {{"learner", a.learner}, {"fragment", p}, {"round", round.step},
                                      {"kind", to_string(RefusalKind::kNorm)}, {"ratio", v.ratio},
                                      {"reason", "outer gradient per step " + std::to_string(entries[i].per_step) +
                                                     " is " + std::to_string(v.ratio) + "× the median " +
                                                     std::to_string(v.median) + " (diloco.screen_ratio " +
                                                     std::to_string(screen) + ")"}}));
      continue;
    }
    if (v.action == ScreenAction::kClip) {
      const float scale = static_cast<float>(v.scale);
      for (float& g : a.grad) g *= scale;
      ++answers_clipped_;
      actions.events.push_back(event("answer_clipped", {{"learner", a.learner}, {"fragment", p},
                                                        {"round", round.step}, {"ratio", v.ratio},
                                                        {"to", v.clip_to}}));
    }
    kept.push_back(std::move(a));
  }
  answers = std::move(kept);
  return result.largest_ratio;
}

void SyncerState::publish_merge(int p, const Round& round, const std::vector<MergeCandidate>& answers,
                                double now_s) {
  FragmentState& frag = fragments_[p];
  for (const MergeCandidate& a : answers) {  // the screen's reference for the next rounds of p
    if (a.screen.steps > 0 && a.screen.reference >= 0 && !a.screen.raw) frag.recent_norms.push_back(a.screen.reference);
  }
  const size_t keep_norms = static_cast<size_t>(std::max<int64_t>(8, 2 * config_.diloco.learners));
  while (frag.recent_norms.size() > keep_norms) frag.recent_norms.pop_front();
  frag.version += 1;
  frag.anchors.emplace_back(frag.version, frag.theta);
  while (static_cast<int64_t>(frag.anchors.size()) > config_.diloco.anchor_versions) frag.anchors.pop_front();
  ++merges_;
  int64_t round_tokens = 0;  // the tokens the merged answers carry
  for (const MergeCandidate& a : answers) {  // a merged answer ends a run of refusals of p and sets its allowance
    round_tokens += a.tokens;
    auto rec = learners_.find(a.learner);
    if (rec == learners_.end()) continue;
    rec->second.refused_in_a_row.erase(p);
    rec->second.merged_unapplied[p] = a.tokens;
    if (a.screen.raw) {
      rec->second.carried_error.erase(p);  // a re-anchoring learner starts its error feedback again
    } else {
      rec->second.carried_error[p] = a.codec_error;
    }
  }
  tokens_merged_ += round_tokens;
  last_quorum_ = static_cast<int64_t>(answers.size());
  sync_ema_.update(now_s - round.pull_sent_s);
}

}  // namespace dloco
