// The mapping between the wire types (transport/protocol.h) and the messages of proto/dloco.proto; see
// proto_convert.h.
#include "transport/grpc/proto_convert.h"

#include <algorithm>
#include <string>
#include <utility>
#include <variant>

namespace dloco::grpc_transport {

namespace {

template <class T>
std::vector<T> vec(const google::protobuf::RepeatedField<T>& r) {
  return {r.begin(), r.end()};
}

}  // namespace

void to_proto(const wire::Handshake& h, v1::Handshake* out) {
  out->set_run_id(h.run_id);
  out->set_protocol_version(h.protocol_version);
  out->set_secret(h.secret);
  out->set_layout_hash(h.layout_hash);
  out->set_tokenizer_hash(h.tokenizer_hash);
  for (const wire::Setting& s : h.settings) {
    v1::Setting* o = out->add_settings();
    o->set_name(s.name);
    if (const auto* i = std::get_if<int64_t>(&s.value)) o->set_int_value(*i);
    if (const auto* d = std::get_if<double>(&s.value)) o->set_double_value(*d);
    if (const auto* b = std::get_if<bool>(&s.value)) o->set_bool_value(*b);
    if (const auto* t = std::get_if<std::string>(&s.value)) o->set_string_value(*t);
  }
}

// A setting that came without a value stays valueless (std::monostate): check_handshake refuses it by name. Reads
// at most kMaxSettings + 1 settings, enough for check_handshake to refuse more.
wire::Handshake from_proto(const v1::Handshake& h) {
  wire::Handshake out{h.run_id(), h.protocol_version(), h.secret(), h.layout_hash(), h.tokenizer_hash(), {}};
  const int n = std::min<int>(h.settings_size(), static_cast<int>(wire::kMaxSettings) + 1);
  for (int i = 0; i < n; ++i) {
    const v1::Setting& s = h.settings(i);
    wire::Setting::Value value;
    switch (s.value_case()) {
      case v1::Setting::kIntValue: value = s.int_value(); break;
      case v1::Setting::kDoubleValue: value = s.double_value(); break;
      case v1::Setting::kBoolValue: value = s.bool_value(); break;
      case v1::Setting::kStringValue: value = s.string_value(); break;
      default: break;
    }
    out.settings.push_back({s.name(), std::move(value)});
  }
  return out;
}

void to_proto(const wire::Fragment& f, v1::Fragment* out) {
  out->set_fragment(f.fragment);
  out->set_version(f.version);
  out->set_dtype(f.payload.codec);
  out->set_data(f.payload.bytes);
}

wire::Fragment from_proto(const v1::Fragment& f) { return {f.fragment(), f.version(), {f.dtype(), f.data()}}; }


void to_proto(const wire::JoinRequest& r, v1::JoinRequest* out) {
  to_proto(r.handshake, out->mutable_handshake());
  out->set_learner_id(r.learner_id);
  out->set_host(r.host);
  if (r.held_stream) {
    out->set_holds_stream(true);
    out->set_held_stream(*r.held_stream);
  }
  for (int64_t s : r.busy_streams) out->add_busy_streams(s);
  out->set_peer_address(r.peer_address);
}

wire::JoinRequest from_proto(const v1::JoinRequest& r) {
  wire::JoinRequest out;
  out.handshake = from_proto(r.handshake());
  out.learner_id = r.learner_id();
  out.host = r.host();
  if (r.holds_stream()) out.held_stream = r.held_stream();
  out.busy_streams = vec(r.busy_streams());
  out.peer_address = r.peer_address();
  return out;
}

void to_proto(const wire::JoinReply& r, v1::JoinReply* out) {
  out->set_session_id(r.session_id);
  out->set_syncer_generation(r.syncer_generation);
  out->set_global_step(r.global_step);
  for (int64_t v : r.fragment_versions) out->add_fragment_versions(v);
  out->set_stream_index(r.stream_index);
  out->set_stream_cursor_json(r.stream_cursor_json);
  out->set_tokens_budget(r.tokens_budget);
  for (const auto& p : r.peers) {
    auto* info = out->add_peers();
    info->set_learner(p.learner);
    info->set_address(p.address);
  }
  out->set_streams(r.streams);
}

wire::JoinReply from_proto(const v1::JoinReply& r) {
  wire::JoinReply out;
  out.session_id = r.session_id();
  out.syncer_generation = r.syncer_generation();
  out.global_step = r.global_step();
  out.fragment_versions = vec(r.fragment_versions());
  out.stream_index = r.stream_index();
  out.stream_cursor_json = r.stream_cursor_json();
  out.tokens_budget = r.tokens_budget();
  for (const auto& p : r.peers()) out.peers.push_back({p.learner(), p.address()});
  out.streams = r.streams();
  return out;
}

void to_proto(const wire::Snapshot& s, v1::Snapshot* out) {
  out->set_global_step(s.global_step);
  out->set_tokens_merged(s.tokens_merged);
  for (const auto& f : s.fragments) to_proto(f, out->add_fragments());
}

wire::Snapshot from_proto(const v1::Snapshot& s) {
  wire::Snapshot out{s.global_step(), {}, s.tokens_merged()};
  for (const auto& f : s.fragments()) out.fragments.push_back(from_proto(f));
  return out;
}

void to_proto(const wire::StatusReply& s, v1::StatusReply* out) {
  out->set_global_step(s.global_step);
  out->set_merges(s.merges);
  out->set_last_quorum(s.last_quorum);
  for (const auto& l : s.learners) {
    auto* o = out->add_learners();
    o->set_id(l.id);
    o->set_live(l.live);
    o->set_step(l.step);
    o->set_tokens_trained(l.tokens_trained);
    o->set_tokens_per_s(l.tokens_per_s);
    o->set_loss(l.loss);
    o->set_bytes_sent(l.bytes_sent);
    o->set_bytes_received(l.bytes_received);
  }
  out->set_last_val_loss(s.last_val_loss);
  out->set_last_eval_step(s.last_eval_step);
  out->set_tokens_trained(s.tokens_trained);
  out->set_tokens_budget(s.tokens_budget);
  out->set_finished(s.finished);
  out->set_bytes_sent(s.bytes_sent);
  out->set_bytes_received(s.bytes_received);
  out->set_answers_dropped(s.answers_dropped);
  out->set_answers_refused(s.answers_refused);
  for (const auto& [kind, n] : s.answers_refused_by_kind) (*out->mutable_answers_refused_by_kind())[kind] = n;
  out->set_reports_refused(s.reports_refused);
  out->set_answers_clipped(s.answers_clipped);
  out->set_merges_dropped(s.merges_dropped);
}

wire::StatusReply from_proto(const v1::StatusReply& s) {
  wire::StatusReply out;
  out.global_step = s.global_step();
  out.merges = s.merges();
  out.last_quorum = s.last_quorum();
  for (const auto& l : s.learners()) {
    out.learners.push_back({l.id(), l.live(), l.step(), l.tokens_trained(), l.tokens_per_s(), l.loss(), l.bytes_sent(),
                            l.bytes_received()});
  }
  out.last_val_loss = s.last_val_loss();
  out.last_eval_step = s.last_eval_step();
  out.tokens_trained = s.tokens_trained();
  out.tokens_budget = s.tokens_budget();
  out.finished = s.finished();
  out.bytes_sent = s.bytes_sent();
  out.bytes_received = s.bytes_received();
  out.answers_dropped = s.answers_dropped();
  out.answers_refused = s.answers_refused();
  for (const auto& [kind, n] : s.answers_refused_by_kind()) out.answers_refused_by_kind[kind] = n;
  out.reports_refused = s.reports_refused();
  out.answers_clipped = s.answers_clipped();
  out.merges_dropped = s.merges_dropped();
  return out;
}

void to_proto(const wire::EvalReport& r, v1::EvalReport* out) {
  out->set_session_id(r.session_id);
  out->set_global_step(r.global_step);
  out->set_val_loss(r.val_loss);
  for (int64_t v : r.fragment_versions) out->add_fragment_versions(v);
  out->set_seconds(r.seconds);
}

wire::EvalReport from_proto(const v1::EvalReport& r) {
  return {r.session_id(), r.global_step(), r.val_loss(), vec(r.fragment_versions()), r.seconds()};
}

void to_proto(uint64_t session, const wire::LearnerMessage& m, v1::LearnerMessage* out) {
  out->set_session_id(session);
  if (const auto* meta = std::get_if<wire::Metadata>(&m)) {
    auto* o = out->mutable_metadata();
    o->set_step(meta->step);
    for (int64_t s : meta->steps) o->add_steps(s);
    for (int64_t t : meta->tokens) o->add_tokens(t);
    o->set_step_time_s(meta->step_time_s);
    o->set_tokens_trained(meta->tokens_trained);
    o->set_cursor_json(meta->cursor_json);
    o->set_tokens_per_s(meta->tokens_per_s);
    o->set_loss(meta->loss);
    o->set_finished(meta->finished);
    if (meta->stream) o->set_stream(*meta->stream);
    o->set_leaving(meta->leaving);
    for (int64_t v : meta->versions) o->add_versions(v);
    o->set_takes_over(meta->takes_over);
    if (meta->declined_stream) o->set_declined_stream(*meta->declined_stream);
  } else {
    const auto& a = std::get<wire::PullAnswer>(m);
    auto* o = out->mutable_answer();
    o->set_fragment(a.fragment);
    o->set_round_step(a.round_step);
    o->set_captured_step(a.captured_step);
    o->set_base_version(a.base_version);
    o->set_steps(a.steps);
    o->set_tokens(a.tokens);
    o->set_dtype(a.delta.codec);
    o->set_delta(a.delta.bytes);
  }
}

// False for a message with neither body (a peer of another protocol): the session ignores it.
bool from_proto(const v1::LearnerMessage& m, wire::LearnerMessage* out) {
  if (m.has_metadata()) {
    const auto& i = m.metadata();
    wire::Metadata meta;
    meta.step = i.step();
    meta.steps = vec(i.steps());
    meta.tokens = vec(i.tokens());
    meta.step_time_s = i.step_time_s();
    meta.tokens_trained = i.tokens_trained();
    meta.cursor_json = i.cursor_json();
    meta.tokens_per_s = i.tokens_per_s();
    meta.loss = i.loss();
    meta.finished = i.finished();
    if (i.has_stream()) meta.stream = i.stream();
    meta.leaving = i.leaving();
    meta.versions = vec(i.versions());
    meta.takes_over = i.takes_over();
    if (i.has_declined_stream()) meta.declined_stream = i.declined_stream();
    *out = std::move(meta);
    return true;
  }
  if (m.has_answer()) {
    const auto& i = m.answer();
    *out = wire::PullAnswer{i.fragment(), i.round_step(), i.captured_step(), i.base_version(), i.steps(), i.tokens(),
                            {i.dtype(), i.delta()}};
    return true;
  }
  return false;
}

void to_proto(const wire::SyncerMessage& m, v1::SyncerMessage* out) {
  if (const auto* pull = std::get_if<wire::PullRequest>(&m)) {
    out->mutable_pull()->set_fragment(pull->fragment);
    out->mutable_pull()->set_round_step(pull->round_step);
    out->mutable_pull()->set_oldest_anchor(pull->oldest_anchor);
    if (pull->version >= 0) out->mutable_pull()->set_version(pull->version);
  } else if (const auto* merged = std::get_if<wire::MergedFragment>(&m)) {
    to_proto(merged->fragment, out->mutable_merged()->mutable_fragment());
    out->mutable_merged()->set_round_step(merged->round_step);
    for (int who : merged->participants) out->mutable_merged()->add_participants(who);
    if (merged->base_version >= 0) {
      out->mutable_merged()->set_base_version(merged->base_version);
      out->mutable_merged()->set_base_hash(merged->base_hash);
    }
    if (merged->refetch) out->mutable_merged()->set_refetch(true);
  } else if (std::holds_alternative<wire::Stop>(m)) {
    out->set_stop(true);
  } else if (const auto* offer = std::get_if<wire::StreamOffer>(&m)) {
    out->mutable_offer()->set_stream(offer->stream);
    out->mutable_offer()->set_cursor_json(offer->cursor_json);
    out->mutable_offer()->set_tokens_budget(offer->tokens_budget);
  } else {
    out->set_budget_spent(true);
  }
}

bool from_proto(const v1::SyncerMessage& m, wire::SyncerMessage* out) {
  switch (m.body_case()) {
    case v1::SyncerMessage::kPull:
      *out = wire::PullRequest{m.pull().fragment(), m.pull().round_step(), m.pull().oldest_anchor(),
                               m.pull().has_version() ? m.pull().version() : -1};
      return true;
    case v1::SyncerMessage::kMerged: {
      const auto& p = m.merged().participants();
      *out = wire::MergedFragment{from_proto(m.merged().fragment()), m.merged().round_step(), {p.begin(), p.end()},
                                  m.merged().has_base_version() ? m.merged().base_version() : -1,
                                  m.merged().base_hash(), m.merged().refetch()};
      return true;
    }
    case v1::SyncerMessage::kStop: *out = wire::Stop{}; return true;
    case v1::SyncerMessage::kBudgetSpent: *out = wire::BudgetSpent{}; return true;
    case v1::SyncerMessage::kOffer:
      *out = wire::StreamOffer{m.offer().stream(), m.offer().cursor_json(), m.offer().tokens_budget()};
      return true;
    default: return false;
  }
}

}  // namespace dloco::grpc_transport
