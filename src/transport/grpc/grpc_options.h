// gRPC settings of every dloco channel and server (gRPC 1.51's defaults): message limits raised for whole
// fragments, SO_REUSEPORT off (a stale and a restarted syncer must not share a port silently), reconnect backoff
// capped at 2 s instead of 120 s, keepalive pings with a matching server policy, and deadlines.
// Only transport/grpc includes this.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

namespace dloco::grpc_transport {

inline constexpr int kMaxMessageBytes = 1 << 30;  // 1 GiB: one fragment of a multi-billion-parameter model

/// A channel to `address` ("host:port") with dloco's arguments. Never blocks.
std::shared_ptr<grpc::Channel> make_channel(const std::string& address);

/// Applies dloco's server arguments (message limits, no SO_REUSEPORT, keepalive policy) to a builder.
void configure_server(grpc::ServerBuilder& builder);

/// A client context whose deadline is `timeout` from now.
std::unique_ptr<grpc::ClientContext> context_with_deadline(std::chrono::milliseconds timeout);

}  // namespace dloco::grpc_transport
