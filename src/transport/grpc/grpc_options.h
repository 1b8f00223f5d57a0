// gRPC settings of every dloco channel and server (gRPC 1.51's defaults): message limits raised for whole
// fragments, SO_REUSEPORT off (a stale and a restarted syncer must not share a port silently), reconnect backoff
// capped at 2 s instead of 120 s, keepalive pings with a matching server policy, and deadlines.
// Only transport/grpc includes this.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "transport/transport.h"

namespace dloco::grpc_transport {

inline constexpr int kMaxMessageBytes = 1 << 30;  // 1 GiB: one fragment of a multi-billion-parameter model

/// A channel to `address` ("host:port") with dloco's arguments: TLS verified against security.ca_pem when set
/// (presenting cert_pem under mutual TLS), plain text otherwise. Never blocks.
std::shared_ptr<grpc::Channel> make_channel(const std::string& address, const wire::Security& security);

/// The server credentials of `security`: TLS with cert_pem / key_pem (client certificates required and verified
/// against ca_pem under mutual TLS) when ca_pem is set, plain text otherwise.
std::shared_ptr<grpc::ServerCredentials> server_credentials(const wire::Security& security);

/// Applies dloco's server arguments (message limits, no SO_REUSEPORT, keepalive policy) to a builder.
void configure_server(grpc::ServerBuilder& builder);

/// A client context whose deadline is `timeout` from now, carrying the bearer token of `secret` (none when empty).
std::unique_ptr<grpc::ClientContext> context_with_deadline(std::chrono::milliseconds timeout,
                                                           const std::string& secret);

/// Adds "authorization: Bearer <secret>" to a call's metadata (nothing when `secret` is empty).
void add_token(grpc::ClientContext& context, const std::string& secret);

/// Whether a call carries the bearer token of `secret` (compared in constant time; always true when `secret` is
/// empty: a loopback-only server without a secret, transport/transport.h check_listen_policy).
bool has_token(const grpc::ServerContext& context, const std::string& secret);

}  // namespace dloco::grpc_transport
