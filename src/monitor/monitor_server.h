// A role's monitoring HTTP endpoint (issue 15, "Metrics and dashboard"): GET /metrics (Prometheus text), GET
// /status.json (what the dashboard polls) and GET / (the dashboard page, syncer only). One cpp-httplib server on its
// own thread, loopback unless configured otherwise. gRPC's HTTP/2 server cannot serve plain HTTP (checked on gRPC 1.51), so this
// is a second listener. Only GET is served; a request body, a long URI or a slow client is refused by the limits
// below (every read and write has a 5 s timeout), and the server never blocks the role that owns it.
// With TLS material it serves HTTPS (and under mutual TLS verifies the client's certificate against the run's CA);
// bound off loopback with a secret, every route asks for "Authorization: Bearer <secret>" (docs/protocol.md §12;
// the dashboard page takes the token from its URL's fragment, #token=…, which the browser never sends).
// Deliberately not here: what the metrics are (the roles).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "transport/transport.h"

namespace httplib {
class Server;
}

namespace dloco {

class MonitorServer {
 public:
  struct Routes {
    std::function<std::string()> metrics;      // GET /metrics: Prometheus text format 0.0.4
    std::function<std::string()> status_json;  // GET /status.json
    std::string page;                          // GET /: HTML ("" = no page: 404)
  };

  /// Listens on `address` ("host:port"; port 0 = a free one) and serves `routes` on a thread of its own until
  /// destroyed. Throws InputError naming the address if it cannot be bound, if the TLS material does not load, or if
  /// it would listen off loopback without TLS and a secret and !protection.insecure (wire::Security, transport/transport.h: the secret,
  /// the PEM texts, mutual, insecure). The callbacks run on the
  /// server's threads (two at most): they must be thread-safe.
  MonitorServer(const std::string& address, Routes routes, const wire::Security& protection = {});
  ~MonitorServer();
  MonitorServer(const MonitorServer&) = delete;
  MonitorServer& operator=(const MonitorServer&) = delete;

  /// The bound "host:port".
  const std::string& address() const { return address_; }
  /// "http://host:port/" or "https://…" (a wildcard host shown as this machine's loopback).
  std::string url() const;

 private:
  std::unique_ptr<httplib::Server> server_;
  std::string address_;
  bool https_ = false;
  std::atomic<bool> listen_returned_{false};
  std::thread thread_;
};

}  // namespace dloco
