// The syncer service's sessions (docs/protocol.md §3–§4): one per learner, a reader (this handler thread:
// metadata and pull answers into the state) and a writer thread draining the learner's outbox; see syncer_service.h.
#include <thread>

#include "syncer/syncer_service.h"
#include "transport/codec.h"
#include "transport/sparse_codec.h"

namespace dloco {

wire::Status SyncerService::session(uint64_t session_id, wire::SessionPeer& peer) {
  int learner = -1;
  auto outbox = std::make_shared<Outbox>();
  {
    std::lock_guard lock(mu_);
    if (!session_valid(session_id, &learner) || learner < 0) {
      return {wire::Code::kUnauthenticated, "unknown session: join first"};
    }
    outbox->session_id = session_id;
    if (auto old = outboxes_.find(learner); old != outboxes_.end()) {  // a restarted learner replaces its slot
      std::lock_guard olock(old->second->mu);
      old->second->closed = true;
      old->second->cv.notify_all();
    }
    outboxes_[learner] = outbox;
    // A learner re-attaching after the run finished (its link was down during the final flush) gets Θ whole, so it
    // ends on Θ even if it lost the final merges, and is told at once.
    if (finished_.load()) {
      for (int p = 0; p < static_cast<int>(published_.size()); ++p) {
        outbox->queue.push_back(wire::MergedFragment{
            {p, published_[p].version, wire::encode(*published_[p].theta, wire::Codec::kFp32)}, -2, {}});
      }
      outbox->queue.push_back(wire::Stop{});
    }
  }
  // The writer: drains this session's outbox onto the session.
  std::thread writer([this, &peer, outbox, learner] {
    for (;;) {
      wire::SyncerMessage out;
      {
        std::unique_lock lock(outbox->mu);
        outbox->cv.wait(lock, [&] { return outbox->closed || !outbox->queue.empty(); });
        if (outbox->queue.empty()) return;
        out = std::move(outbox->queue.front());
        outbox->queue.pop_front();
      }
      const int64_t size = wire::approximate_bytes(out);
      if (!peer.write(out)) return;
      std::lock_guard lock(mu_);
      bytes_sent_ += size;
      if (auto it = state_->learners().find(learner); it != state_->learners().end()) it->second.bytes_sent += size;
    }
  });
  // The reader: metadata and answers, in this handler thread.
  wire::LearnerMessage msg;
  while (peer.read(&msg)) {
    const int64_t size = wire::approximate_bytes(msg);
    std::lock_guard lock(mu_);
    if (outbox->closed) break;
    bytes_received_ += size;
    if (auto it = state_->learners().find(learner); it != state_->learners().end()) it->second.bytes_received += size;
    if (const auto* m = std::get_if<wire::Metadata>(&msg)) {
      if (!outbox->greeted) {  // the session's first metadata: fragments it already holds at the latest version
        outbox->greeted = true;  // get their next merge as an update (docs/protocol.md §9)
        if (m->versions.size() == published_.size()) {
          outbox->carried.resize(published_.size(), false);
          for (size_t p = 0; p < published_.size(); ++p) {
            if (!outbox->carried[p] && m->versions[p] == published_[p].version) outbox->carried[p] = true;
          }
        }
      }
      on_metadata(learner, *m);
    } else {
      on_answer(learner, std::get<wire::PullAnswer>(msg));
    }
  }
  {
    std::lock_guard lock(outbox->mu);
    outbox->closed = true;
    outbox->cv.notify_all();
  }
  writer.join();
  std::lock_guard lock(mu_);
  if (auto it = outboxes_.find(learner); it != outboxes_.end() && it->second == outbox) outboxes_.erase(it);
  return {};
}

// Under mu_.
void SyncerService::on_metadata(int learner, const wire::Metadata& m) {
  LearnerReport r;
  r.step = m.step;
  r.steps = m.steps;
  r.tokens = m.tokens;
  r.step_time_s = m.step_time_s;
  r.tokens_trained = m.tokens_trained;
  r.cursor_json = m.cursor_json;
  r.tokens_per_s = m.tokens_per_s;
  r.loss = m.loss;
  r.finished = m.finished;
  // A session's empty hello (a re-opened session with no metadata queued: no stream, no counters) keeps the step the
  // learner last reported: set to 0, its next answer's capture would look impossible (docs/protocol.md §10). The rest
  // is as before: until its next metadata it holds no stream and has not finished (the end waits for that metadata).
  if (!m.stream && m.steps.empty() && !m.leaving) {
    if (auto it = state_->learners().find(learner); it != state_->learners().end()) r.step = it->second.state.step;
  }
  // Screening (docs/protocol.md §10): an impossible report is ignored whole (no join, no clock, no lease change) and
  // counted; logged at the 1st, 10th, 100th … refusal of each learner, so a flood does not flood the event log.
  if (const std::string bad = state_->screen_report(r); !bad.empty()) {
    state_->count_report_refused();
    const int64_t n = ++reports_refused_by_learner_[learner];
    if (events_ && (n == 1 || n == 10 || n == 100 || n == 1000 || n % 10000 == 0)) {
      events_->emit("report_refused", {{"learner", learner}, {"refusals", n}, {"reason", bad}});
    }
    return;
  }
  answer_offer(learner, m, now_s());  // before the claim: a learner that took its offer holds that stream alone
  if (m.takes_over && m.finished && !m.leaving) {
    takes_over_.insert(learner);
  } else {
    takes_over_.erase(learner);
  }
  const int64_t stream = m.stream.value_or(-1);  // unset: an empty hello before its first step
  const bool holds = streams_.claim(learner, stream, m.leaving);
  r.stream = holds ? stream : -2;  // a learner that lost its lease (it re-joins and gets it back) counts nothing
  if (holds && !r.cursor_json.empty()) streams_.set_cursor(stream, r.cursor_json);
  const auto rec = state_->learners().find(learner);
  if (holds && !m.leaving && (rec == state_->learners().end() || !rec->second.state.joined)) {
    state_->on_join(learner, now_s(), !reattaching_.count(learner));  // bootstrapped and training: live from now on
  }
  if (auto b = bootstrap_bytes_.find(learner); b != bootstrap_bytes_.end()) {  // its bootstrap's download
    if (auto it = state_->learners().find(learner); it != state_->learners().end()) it->second.bytes_sent += b->second;
    bootstrap_bytes_.erase(b);
  }
  state_->on_report(learner, r, now_s());
  if (m.leaving) {  // scavenging: a graceful leave frees the stream and the quorum at once
    state_->on_leave(learner);
    if (holds) streams_.release(stream);
    peers_.erase(learner);
    if (events_) {
      events_->emit("learner_left", {{"learner", learner}, {"stream", stream}, {"step", m.step},
                                     {"tokens_served", m.tokens_trained}});
    }
  }
}

// Under mu_.
void SyncerService::answer_offer(int learner, const wire::Metadata& m, double now) {
  const auto offer = offers_.find(learner);
  if (offer == offers_.end()) return;
  const int64_t stream = offer->second.stream;
  if (m.stream == stream && !m.leaving) {
    streams_.accept(learner, stream);
    emit("stream_taken_over", {{"learner", learner}, {"stream", stream}, {"tokens_served", m.tokens_trained}});
  } else if (m.declined_stream == stream || m.leaving) {
    streams_.decline(learner, stream);
    declined_until_[stream] = now + kDeclinedFor_s;
    emit("stream_offer_declined", {{"learner", learner}, {"stream", stream},
                                   {"reason", m.leaving ? "it leaves" : "its log is locked by a live process"}});
  } else {
    return;  // metadata sent before the offer arrived
  }
  offers_.erase(offer);
}

// Under mu_.
void SyncerService::on_answer(int learner, const wire::PullAnswer& a) {
  PullAnswerData data{a.fragment, a.round_step, a.captured_step, a.base_version, a.steps, a.tokens, {}};
  // An answer comes in fp32 (a re-anchor, or a Δ the codec cannot carry) or in the run's diloco.wire_up with its
  // default block (topk: and the run's diloco.topk_density) (§10): another codec or block would let a learner pick
  // how much error it may claim in the norm screen (a q4 block of 65536 values with a few spikes claims more error
  // than its whole norm), or how much of its outer gradient it drops.
  const wire::Codec up = wire::parse_codec(to_string(config_.diloco.wire_up));
  const int64_t block = wire::default_block(up);
  const std::string expected =
      up == wire::Codec::kTopK ? wire::sparse::wire_name(block, config_.diloco.topk_density)
      : block > 0              ? std::string(wire::to_string(up)) + "/" + std::to_string(block)
                               : wire::to_string(up);
  std::string reason;
  if (a.delta.codec != "fp32" && a.delta.codec != expected) {
    reason = "codec '" + a.delta.codec.substr(0, 32) + "': this run's answers are fp32 or " + expected +
             " (diloco.wire_up)";
  } else {
    reason = wire::decode(a.delta, data.delta);
  }
  if (reason.empty()) data.codec_error = wire::error_bound(a.delta, data.delta);
  AnswerOutcome outcome = AnswerOutcome::kRefused;
  if (!reason.empty()) {
    reason = "undecodable payload: " + reason;
    state_->refuse_undecodable(learner, a.fragment, a.round_step);
  } else {
    outcome = state_->on_answer(learner, std::move(data), now_s(), &reason);
  }
  if (outcome != AnswerOutcome::kAccepted && events_) {
    events_->emit(outcome == AnswerOutcome::kDroppedLate ? "answer_dropped" : "answer_refused",
                  {{"learner", learner}, {"fragment", a.fragment}, {"round", a.round_step}, {"reason", reason}});
  }
}

void SyncerService::send(int learner, const wire::SyncerMessage& msg) {
  auto it = outboxes_.find(learner);
  if (it == outboxes_.end()) return;  // not connected: it fetches the current Θ when it (re)joins
  std::lock_guard lock(it->second->mu);
  it->second->queue.push_back(msg);
  it->second->cv.notify_one();
}

}  // namespace dloco
