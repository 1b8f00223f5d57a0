// The mapping between the wire types (transport/protocol.h) and the messages of proto/dloco.proto. Needs protobuf,
// not gRPC: the gRPC transport uses it on both sides, and the fuzz target fuzz/syncer_rpc.cc feeds parsed messages
// through it into the syncer's handlers exactly as the server does.
// from_proto copies fields as they are; it checks nothing (the handlers do: docs/protocol.md §10), but reads a
// handshake's settings only up to kMaxSettings + 1, enough for check_handshake to refuse the list.
#pragma once

#include <cstdint>

#include "proto/dloco.pb.h"
#include "transport/protocol.h"

namespace dloco::grpc_transport {

void to_proto(const wire::Handshake& h, v1::Handshake* out);
wire::Handshake from_proto(const v1::Handshake& h);
void to_proto(const wire::Fragment& f, v1::Fragment* out);
wire::Fragment from_proto(const v1::Fragment& f);
void to_proto(const wire::JoinRequest& r, v1::JoinRequest* out);
wire::JoinRequest from_proto(const v1::JoinRequest& r);
void to_proto(const wire::JoinReply& r, v1::JoinReply* out);
wire::JoinReply from_proto(const v1::JoinReply& r);
void to_proto(const wire::Snapshot& s, v1::Snapshot* out);
wire::Snapshot from_proto(const v1::Snapshot& s);
void to_proto(const wire::StatusReply& s, v1::StatusReply* out);
wire::StatusReply from_proto(const v1::StatusReply& s);
void to_proto(const wire::EvalReport& r, v1::EvalReport* out);
wire::EvalReport from_proto(const v1::EvalReport& r);
/// A session's message; `session` names the session it belongs to.
void to_proto(uint64_t session, const wire::LearnerMessage& m, v1::LearnerMessage* out);
/// False for a message with neither body (a peer of another protocol): the session skips it. The session id is
/// the caller's check.
bool from_proto(const v1::LearnerMessage& m, wire::LearnerMessage* out);
void to_proto(const wire::SyncerMessage& m, v1::SyncerMessage* out);
/// False for a body this build does not know (skipped).
bool from_proto(const v1::SyncerMessage& m, wire::SyncerMessage* out);

}  // namespace dloco::grpc_transport
