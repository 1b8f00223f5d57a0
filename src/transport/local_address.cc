// This machine's address towards a host; see local_address.h.
#include "transport/local_address.h"

#include "core/check.h"
#include "transport/transport.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <set>

namespace dloco {

std::string local_address_towards(const std::string& host_port) {
  const auto colon = host_port.rfind(':');
  if (colon == std::string::npos) return "";
  std::string host = host_port.substr(0, colon);
  const std::string port = host_port.substr(colon + 1);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0 || found == nullptr) return "";
  std::string out;
  for (addrinfo* a = found; a != nullptr && out.empty(); a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_DGRAM, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char text[INET6_ADDRSTRLEN] = {};
      const void* where = local.ss_family == AF_INET
                              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
                              : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      if (::inet_ntop(local.ss_family, where, text, sizeof(text)) != nullptr) {
        out = local.ss_family == AF_INET6 ? "[" + std::string(text) + "]" : std::string(text);
      }
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return out;
}

std::string sole_machine_address() {
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) return "";
  std::set<std::string> found;
  for (ifaddrs* a = all; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET || !(a->ifa_flags & IFF_UP) ||
        (a->ifa_flags & IFF_LOOPBACK)) {
      continue;
    }
    char text[INET_ADDRSTRLEN] = {};
    if (::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof(text)) == nullptr) {
      continue;
    }
    found.insert(text);
  }
  ::freeifaddrs(all);
  return found.size() == 1 ? *found.begin() : "";
}

bool is_wildcard_host(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]";
}

bool is_loopback_host(const std::string& host) {
  std::string h = host;
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  if (h == "localhost") return true;
  in_addr v4{};
  if (::inet_pton(AF_INET, h.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, h.c_str(), &v6) != 1) return false;  // a name other than localhost: not known here
  if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
  return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;  // ::ffff:127.x.y.z
}

}  // namespace dloco

namespace dloco::wire {

std::string check_dial_policy(const std::string& address, const Security& security) {
  std::string host = address.substr(0, address.rfind(':'));
  if (is_loopback_host(host) || security.tls() || security.insecure) return "";
  throw InputError("would send the run secret in clear text to '" + address.substr(0, 256) +
                   "' (not loopback, no TLS): set run.tls_cert, run.tls_key and run.tls_ca (README \"Running on several "
                   "machines by hand\"), or pass --insecure (run.insecure = true) on a trusted network");
}

std::string check_listen_policy(const std::string& host, const Security& security, const std::string& what) {
  if (is_loopback_host(host)) return "";
  const bool tls = security.tls() && !security.cert_pem.empty() && !security.key_pem.empty();
  if (tls && !security.secret.empty()) return "";
  const std::string missing = !tls && security.secret.empty() ? "TLS (run.tls_cert, run.tls_key, run.tls_ca) and a "
                                                                "secret (run.secret or DLOCO_SECRET)"
                              : !tls ? "TLS (run.tls_cert, run.tls_key, run.tls_ca)"
                                     : "a secret (run.secret or DLOCO_SECRET)";
  const std::string where = is_wildcard_host(host) ? "every interface" : "'" + host + "'";
  if (!security.insecure) {
    throw InputError(what + " would listen on " + where + " without " + missing +
                     ": anyone who reaches it could read the run and send updates. Set them (README \"Running on "
                     "several machines by hand\"), listen on 127.0.0.1, or pass --insecure (run.insecure = true) "
                     "on a trusted network");
  }
  return "warning: " + what + " listens on " + where + " without " + missing + " (run.insecure = true)";
}

}  // namespace dloco::wire
