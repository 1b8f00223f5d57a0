// gRPC settings; see grpc_options.h.
#include "transport/grpc/grpc_options.h"

namespace dloco::grpc_transport {

std::shared_ptr<grpc::Channel> make_channel(const std::string& address, const wire::Security& security) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  if (!security.tls()) return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  grpc::SslCredentialsOptions tls;
  tls.pem_root_certs = security.ca_pem;
  if (security.mutual) {
    tls.pem_private_key = security.key_pem;
    tls.pem_cert_chain = security.cert_pem;
  }
  return grpc::CreateCustomChannel(address, grpc::SslCredentials(tls), args);
}

std::shared_ptr<grpc::ServerCredentials> server_credentials(const wire::Security& security) {
  if (!security.tls()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions tls(security.mutual ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                                        : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  tls.pem_root_certs = security.ca_pem;
  tls.pem_key_cert_pairs.push_back({security.key_pem, security.cert_pem});
  return grpc::SslServerCredentials(tls);
}

void add_token(grpc::ClientContext& context, const std::string& secret) {
  if (!secret.empty()) context.AddMetadata("authorization", "Bearer " + secret);
}

bool has_token(const grpc::ServerContext& context, const std::string& secret) {
  if (secret.empty()) return true;
  const auto& md = context.client_metadata();
  const auto it = md.find("authorization");
  const std::string_view got = it == md.end() ? std::string_view() : std::string_view(it->second.data(), it->second.size());
  return wire::constant_time_equal(got, "Bearer " + secret);
}

void configure_server(grpc::ServerBuilder& builder) {
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
}

std::unique_ptr<grpc::ClientContext> context_with_deadline(std::chrono::milliseconds timeout,
                                                           const std::string& secret) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + timeout);
  add_token(*ctx, secret);
  return ctx;
}

}  // namespace dloco::grpc_transport
