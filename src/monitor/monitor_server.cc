// The monitoring HTTP endpoint; see monitor_server.h.
#include "monitor/monitor_server.h"

#include <httplib.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include <spdlog/spdlog.h>

#include "core/check.h"
#include "transport/local_address.h"

namespace dloco {

namespace {

// "host:port" → (host, port); throws InputError on a malformed address.
std::pair<std::string, int> split_address(const std::string& address) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    throw InputError("monitoring address '" + address + "' must look like host:port (port 0 = any free port)");
  }
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  int port = -1;
  try {
    size_t used = 0;
    port = std::stoi(address.substr(colon + 1), &used);
    if (used != address.size() - colon - 1) port = -1;
  } catch (const std::exception&) {
  }
  if (port < 0 || port > 65535) {
    throw InputError("monitoring address '" + address + "': the port must be in [0, 65535]");
  }
  return {host, port};
}

// Loads this process's certificate and key (and, under mutual TLS, the CA that signs clients) from PEM texts into
// an OpenSSL context; false if any does not parse or the key does not match the certificate.
bool load_tls(SSL_CTX& ctx, const wire::Security& p) {
  auto bio = [](const std::string& pem) { return BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())); };
  // An encrypted key is refused, not prompted for on the terminal (the role would block).
  pem_password_cb* no_password = [](char*, int, int, void*) { return 0; };
  BIO* cert_bio = bio(p.cert_pem);
  X509* cert = PEM_read_bio_X509(cert_bio, nullptr, no_password, nullptr);
  bool ok = cert && SSL_CTX_use_certificate(&ctx, cert) == 1;
  X509_free(cert);
  while (ok) {  // the rest of the chain (intermediates), as gRPC sends it
    X509* extra = PEM_read_bio_X509(cert_bio, nullptr, no_password, nullptr);
    if (!extra) break;
    if (SSL_CTX_add0_chain_cert(&ctx, extra) != 1) {  // takes ownership on success
      X509_free(extra);
      ok = false;
    }
  }
  BIO_free(cert_bio);
  BIO* key_bio = bio(p.key_pem);
  EVP_PKEY* key = PEM_read_bio_PrivateKey(key_bio, nullptr, no_password, nullptr);
  BIO_free(key_bio);
  ok = ok && key && SSL_CTX_use_PrivateKey(&ctx, key) == 1 && SSL_CTX_check_private_key(&ctx) == 1;
  EVP_PKEY_free(key);
  if (ok && p.mutual) {
    BIO* ca_bio = bio(p.ca_pem);
    X509* ca = PEM_read_bio_X509(ca_bio, nullptr, nullptr, nullptr);
    BIO_free(ca_bio);
    ok = ca && X509_STORE_add_cert(SSL_CTX_get_cert_store(&ctx), ca) == 1;
    X509_free(ca);
    SSL_CTX_set_verify(&ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION);
  ERR_clear_error();  // the end-of-chain read leaves an error queued
  return ok;
}

}  // namespace

MonitorServer::MonitorServer(const std::string& address, Routes routes, const wire::Security& protection) {
  auto [host, port] = split_address(address);
  https_ = !protection.cert_pem.empty() && !protection.key_pem.empty() && !protection.ca_pem.empty();
  const bool off_loopback = !is_loopback_host(host);
  // The servers' one listening rule (docs/protocol.md §12): throws off loopback without TLS and a secret.
  if (const std::string warning = wire::check_listen_policy(host, protection, "the monitoring endpoint");
      !warning.empty()) {
    spdlog::warn("[dloco] {}", warning);
  }
  if (https_) {
    bool loaded = false;
    server_ = std::make_unique<httplib::SSLServer>([&](SSL_CTX& ctx) { return loaded = load_tls(ctx, protection); });
    if (!loaded || !server_->is_valid()) {
      throw InputError("the monitoring endpoint cannot load run.tls_cert / run.tls_key (and run.tls_ca under "
                       "run.tls_mutual): not a matching PEM certificate and key");
    }
  } else {
    server_ = std::make_unique<httplib::Server>();
  }
  httplib::Server& s = *server_;
  if (off_loopback && !protection.secret.empty()) {  // every route: the bearer token, compared in constant time
    s.set_pre_routing_handler([token = "Bearer " + protection.secret](const httplib::Request& req,
                                                                      httplib::Response& res) {
      const bool authenticated = wire::constant_time_equal(req.get_header_value("Authorization"), token);
      if (authenticated || req.path == "/") return httplib::Server::HandlerResponse::Unhandled;  // the page holds no data
      res.status = 401;
      res.set_header("WWW-Authenticate", "Bearer");
      res.set_content("not authenticated: send Authorization: Bearer <run secret>\n", "text/plain");
      return httplib::Server::HandlerResponse::Handled;
    });
  }
  s.new_task_queue = [] { return new httplib::ThreadPool(2); };
  s.set_read_timeout(5, 0);
  s.set_write_timeout(5, 0);
  s.set_idle_interval(0, 100000);
  s.set_keep_alive_max_count(100);
  s.set_payload_max_length(1024);  // GET only: no body worth reading
  auto text = [](const std::function<std::string()>& f, const char* type) {
    return [f, type](const httplib::Request&, httplib::Response& res) {
      try {
        res.set_content(f(), type);
      } catch (const std::exception& e) {  // never takes the role down
        res.status = 500;
        res.set_content(std::string("error: ") + e.what() + "\n", "text/plain");
      }
      res.set_header("Cache-Control", "no-store");
    };
  };
  if (routes.metrics) s.Get("/metrics", text(routes.metrics, "text/plain; version=0.0.4; charset=utf-8"));
  if (routes.status_json) s.Get("/status.json", text(routes.status_json, "application/json"));
  if (!routes.page.empty()) {
    s.Get("/", [page = std::move(routes.page)](const httplib::Request&, httplib::Response& res) {
      res.set_content(page, "text/html; charset=utf-8");
    });
  }
  const int bound = port == 0 ? s.bind_to_any_port(host) : (s.bind_to_port(host, port) ? port : -1);
  if (bound <= 0) {
    throw InputError("cannot serve the monitoring endpoint on " + address + " (in use, or not an address here)");
  }
  address_ = (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(bound);
  thread_ = std::thread([this] {
    server_->listen_after_bind();
    listen_returned_ = true;
  });
}

MonitorServer::~MonitorServer() {
  // stop() only acts on a running server: one destroyed right after it was made must first have started listening
  // (else its thread would listen for ever and the join below never return).
  while (!server_->is_running() && !listen_returned_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  server_->stop();
  if (thread_.joinable()) thread_.join();
}

std::string MonitorServer::url() const {
  const auto colon = address_.rfind(':');
  std::string host = address_.substr(0, colon);
  if (host == "0.0.0.0" || host == "[::]") host = "127.0.0.1";
  return (https_ ? "https://" : "http://") + host + address_.substr(colon) + "/";
}

}  // namespace dloco
