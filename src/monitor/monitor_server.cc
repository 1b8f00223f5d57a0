// The monitoring HTTP endpoint; see monitor_server.h.
#include "monitor/monitor_server.h"

#include <httplib.h>

#include "core/check.h"

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

}  // namespace

MonitorServer::MonitorServer(const std::string& address, Routes routes) : server_(std::make_unique<httplib::Server>()) {
  auto [host, port] = split_address(address);
  httplib::Server& s = *server_;
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
  thread_ = std::thread([this] { server_->listen_after_bind(); });
}

MonitorServer::~MonitorServer() {
  server_->stop();
  if (thread_.joinable()) thread_.join();
}

std::string MonitorServer::url() const {
  const auto colon = address_.rfind(':');
  std::string host = address_.substr(0, colon);
  if (host == "0.0.0.0" || host == "[::]") host = "127.0.0.1";
  return "http://" + host + address_.substr(colon) + "/";
}

}  // namespace dloco
