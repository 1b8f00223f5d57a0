// The fault-injecting link; see link_proxy.h.
#include "chaos/link_proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include "core/check.h"

namespace dloco {

namespace {

using Clock = std::chrono::steady_clock;

struct Chunk {
  Clock::time_point release;
  std::string bytes;
  size_t sent = 0;
};

// One forwarded connection: fd[0] the learner's side, fd[1] the syncer's; queue[i] holds what was read from
// fd[i] and is to be written to fd[1 − i].
struct Pair {
  int fd[2] = {-1, -1};
  std::deque<Chunk> queue[2];
  size_t queued[2] = {0, 0};
  bool closed = false;
};

constexpr size_t kMaxQueued = 8 << 20;  // stop reading a side while this much of it waits (backpressure)

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

int dial(const std::string& host, int port) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || res == nullptr) return -1;
  int fd = -1;
  for (auto* a = res; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {  // loopback: immediate success or refusal
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  if (fd >= 0) {
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    set_nonblocking(fd);
  }
  return fd;
}

}  // namespace

LinkProxy::LinkProxy(std::string target) {
  const auto colon = target.rfind(':');
  if (colon == std::string::npos || colon == 0) throw InputError("link proxy: target '" + target + "' is not host:port");
  target_host_ = target.substr(0, colon);
  try {
    target_port_ = std::stoi(target.substr(colon + 1));
  } catch (const std::exception&) {
    throw InputError("link proxy: target '" + target + "' has no numeric port");
  }
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) throw InputError(std::string("link proxy: socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(listen_fd_, 64) != 0 ||
      ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string err = std::strerror(errno);
    ::close(listen_fd_);
    throw InputError("link proxy: cannot listen on loopback: " + err);
  }
  port_ = ntohs(addr.sin_port);
  set_nonblocking(listen_fd_);
  thread_ = std::thread([this] { run(); });
}

LinkProxy::~LinkProxy() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  ::close(listen_fd_);
}

std::string LinkProxy::address() const { return "127.0.0.1:" + std::to_string(port_); }

void LinkProxy::cut(double duration_s) {
  std::lock_guard lock(mu_);
  cut_until_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(duration_s));
}

void LinkProxy::delay(double delay_ms, double duration_s) {
  std::lock_guard lock(mu_);
  delay_s_ = delay_ms / 1000.0;
  delay_until_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(duration_s));
}

void LinkProxy::record() {
  std::lock_guard lock(mu_);
  recording_ = true;
  recording_flag_ = true;
}

std::string LinkProxy::recorded() const {
  std::lock_guard lock(mu_);
  return recorded_;
}

void LinkProxy::end_cut() {
  std::lock_guard lock(mu_);
  cut_until_ = std::min(cut_until_, Clock::now());
}

void LinkProxy::end_delay() {
  std::lock_guard lock(mu_);
  delay_until_ = std::min(delay_until_, Clock::now());
}

void LinkProxy::run() {
  std::vector<std::unique_ptr<Pair>> pairs;
  std::vector<char> buf(64 << 10);
  while (!stop_.load()) {
    const auto now = Clock::now();
    bool cut = false;
    double delay_s = 0;
    {
      std::lock_guard lock(mu_);
      cut = now < cut_until_;
      delay_s = now < delay_until_ ? delay_s_ : 0.0;
    }
    std::vector<pollfd> fds{{listen_fd_, static_cast<short>(cut ? 0 : POLLIN), 0}};  // a partition accepts nobody
    std::vector<std::pair<Pair*, int>> owner{{nullptr, -1}};
    auto wait = std::chrono::milliseconds(10);
    for (auto& p : pairs) {
      for (int side = 0; side < 2; ++side) {
        short events = 0;
        if (!cut && p->queued[side] < kMaxQueued) events |= POLLIN;
        const auto& out = p->queue[1 - side];  // what is to be written to this side
        if (!cut && !out.empty()) {
          if (out.front().release <= now) {
            events |= POLLOUT;
          } else {
            wait = std::min(wait, std::chrono::duration_cast<std::chrono::milliseconds>(out.front().release - now) +
                                      std::chrono::milliseconds(1));
          }
        }
        fds.push_back({p->fd[side], events, 0});
        owner.emplace_back(p.get(), side);
      }
    }
    if (::poll(fds.data(), fds.size(), static_cast<int>(wait.count())) < 0 && errno != EINTR) break;
    if (fds[0].revents & POLLIN) {
      for (;;) {
        const int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (client < 0) break;
        const int server = dial(target_host_, target_port_);
        if (server < 0) {  // the syncer is not listening (down): the learner sees a closed connection and retries
          ::close(client);
          continue;
        }
        int one = 1;
        ::setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        auto p = std::make_unique<Pair>();
        p->fd[0] = client;
        p->fd[1] = server;
        pairs.push_back(std::move(p));
        connections_.fetch_add(1);
      }
    }
    const auto t = Clock::now();
    for (size_t i = 1; i < fds.size(); ++i) {
      auto [p, side] = owner[i];
      if (p->closed) continue;
      if (fds[i].revents & POLLIN) {
        const ssize_t n = ::read(p->fd[side], buf.data(), buf.size());
        if (n > 0) {
          {  // the delay in force now (it may have started while poll waited)
            std::lock_guard lock(mu_);
            delay_s = Clock::now() < delay_until_ ? delay_s_ : 0.0;
          }
          p->queue[side].push_back({t + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(delay_s)),
                                    std::string(buf.data(), static_cast<size_t>(n)), 0});
          p->queued[side] += static_cast<size_t>(n);
        } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
          p->closed = true;  // one side hung up: so does the other (gRPC reconnects)
          continue;
        }
      }
      if ((fds[i].revents & (POLLERR | POLLHUP)) && !(fds[i].revents & POLLIN) && !cut) {
        p->closed = true;  // during a cut the other side learns nothing, not even a hang-up
      }
      if (fds[i].revents & POLLOUT) {
        auto& out = p->queue[1 - side];
        while (!out.empty() && out.front().release <= t) {
          Chunk& c = out.front();
          const ssize_t n = ::send(p->fd[side], c.bytes.data() + c.sent, c.bytes.size() - c.sent, MSG_NOSIGNAL);
          if (n < 0) {
            if (errno != EAGAIN && errno != EINTR) p->closed = true;
            break;
          }
          if (n > 0 && recording_flag_.load(std::memory_order_relaxed)) {
            std::lock_guard lock(mu_);
            if (recording_ && recorded_.size() < (64u << 20)) recorded_.append(c.bytes.data() + c.sent, n);
          }
          c.sent += static_cast<size_t>(n);
          bytes_.fetch_add(n);
          if (c.sent < c.bytes.size()) break;
          p->queued[1 - side] -= c.bytes.size();
          out.pop_front();
        }
      }
    }
    for (auto it = pairs.begin(); it != pairs.end();) {
      if ((*it)->closed) {
        ::close((*it)->fd[0]);
        ::close((*it)->fd[1]);
        it = pairs.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& p : pairs) {
    ::close(p->fd[0]);
    ::close(p->fd[1]);
  }
}

}  // namespace dloco
