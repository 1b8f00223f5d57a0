// gRPC settings shared by every dloco role (NOTES.md "gRPC 1.51"): message limits raised for whole fragments,
// SO_REUSEPORT off (a stale and a restarted syncer must not share a port silently), learner reconnect backoff
// capped at a few seconds instead of 120 s, keepalive pings with a matching server policy, and deadlines.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <vector>

#include <grpcpp/grpcpp.h>

#include "proto/dloco.pb.h"

namespace dloco {

inline constexpr int kMaxMessageBytes = 1 << 30;  // 1 GiB: one fragment of a multi-billion-parameter model
inline constexpr uint32_t kProtocolVersion = 1;

/// A channel to `address` ("host:port") with dloco's arguments. Never blocks.
std::shared_ptr<grpc::Channel> make_channel(const std::string& address);

/// Applies dloco's server arguments (message limits, no SO_REUSEPORT, keepalive policy) to a builder.
void configure_server(grpc::ServerBuilder& builder);

/// The fp32 values of a fragment message. Throws InputError if its dtype is not "fp32" or its payload is not a
/// whole number of floats.
std::vector<float> fragment_values(const v1::Fragment& fragment);

/// A client context whose deadline is `timeout` from now.
std::unique_ptr<grpc::ClientContext> context_with_deadline(std::chrono::milliseconds timeout);

}  // namespace dloco
