// The gRPC transport: wire::Transport over proto/dloco.proto (services Syncer and Peer, protocol version 4: transport/protocol.h kProtocolVersion).
// This folder and the generated code are the only places that include gRPC or protobuf headers; the roles see
// transport/transport.h only. Messages map one to one between the plain types and the proto messages, payloads
// stay encoded (transport/codec.h), so a learner built before the transport interface still talks to a syncer
// built after it, and the other way round.
#pragma once

#include <memory>

#include "transport/transport.h"

namespace dloco::grpc_transport {

/// The transport of every process of a real run (loopback or across machines), authenticated and encrypted as
/// `security` says (docs/protocol.md §12; dloco::transport_security builds it from the config). Its servers throw
/// InputError when they may not listen where asked (wire::check_listen_policy).
std::unique_ptr<wire::Transport> make_transport(const wire::Security& security);

}  // namespace dloco::grpc_transport
