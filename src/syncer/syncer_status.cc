// The syncer service's status: the Status call's reply, /status.json and /metrics of its monitoring endpoint
// (docs/monitoring.md).
#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "core/check.h"
#include "monitor/prometheus_text.h"
#include "syncer/syncer_service.h"
#include "transport/status_json.h"

namespace dloco {

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
  const double kept = goodput(now);
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
          {"goodput", std::isfinite(kept) ? nlohmann::json(kept) : nlohmann::json(nullptr)},
          {"tokens_merged", state_->tokens_merged()},
          {"tokens_lost", state_->tokens_lost()},
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
          {"uptime_s", now},
          {"history", history_.to_json()}};
}

double SyncerService::goodput(double now) const {
  // Goodput as docs/guide-chaos.md and the simulator count it (steps whose result is kept / steps trained), live:
  // work is lost when a learner throws it away (SyncerState::tokens_lost) or holds it while it is not live (gone
  // with its work in flight; it returns to "in flight" if the learner comes back with it).
  const double P = static_cast<double>(state_->versions().size());
  double lost = static_cast<double>(state_->tokens_lost());
  for (const auto& [id, rec] : state_->learners()) {
    if (state_->is_live(id, now) || rec.last.finished) continue;
    for (size_t p = 0; p < rec.last.tokens.size(); ++p) {
      lost += static_cast<double>(SyncerState::unmerged_tokens(rec, p));
    }
  }
  const double trained = P * static_cast<double>(state_->tokens_trained());
  if (trained <= 0) return NAN;
  return std::clamp(1.0 - lost / trained, 0.0, 1.0);
}

void SyncerService::sample_history(double now) {
  std::map<std::string, double> values = {
      {"global_step", static_cast<double>(state_->global_step())},
      {"merges", static_cast<double>(state_->merges())},
      {"answers_refused", static_cast<double>(state_->answers_refused())},
      {"answers_dropped", static_cast<double>(state_->answers_dropped())},
      {"bytes_sent", static_cast<double>(bytes_sent_)},
      {"bytes_received", static_cast<double>(bytes_received_)},
      {"tokens_trained", static_cast<double>(state_->tokens_trained())},
      {"goodput", goodput(now)}};
  for (const auto& [id, rec] : state_->learners()) {
    if (!state_->is_live(id, now) || rec.last.finished) continue;
    const std::string who = "learner/" + std::to_string(id) + "/";
    values[who + "loss"] = rec.last.loss;
    values[who + "tokens_per_s"] = rec.last.tokens_per_s;
  }
  history_.add(now, values);
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
  if (s["goodput"].is_number()) {
    m.gauge("dloco_goodput_ratio",
            "Share of the work trained that was not thrown away: 1 - (tokens lost) / (P tokens trained); 1 = "
            "nothing lost (docs/monitoring.md).",
            s["goodput"]);
  }
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

}  // namespace dloco
