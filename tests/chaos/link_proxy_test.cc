// The fault-injecting link (chaos/link_proxy.h) between a client and a loopback echo server: bytes pass
// unchanged, a cut holds them (silence, no reset) until it ends, a delay adds latency each way.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "chaos/link_proxy.h"
#include "core/check.h"

namespace dloco {
namespace {

using Clock = std::chrono::steady_clock;

// Echoes every byte back on every connection it accepts, until destroyed.
class EchoServer {
 public:
  EchoServer() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(fd_, 8), 0);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] {
      while (!stop_) {
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, 20) <= 0) continue;
        const int c = ::accept(fd_, nullptr, nullptr);
        if (c < 0) continue;
        char buf[4096];
        for (;;) {
          pollfd q{c, POLLIN, 0};
          if (stop_) break;
          if (::poll(&q, 1, 20) <= 0) continue;
          const ssize_t n = ::read(c, buf, sizeof(buf));
          if (n <= 0) break;
          if (::write(c, buf, static_cast<size_t>(n)) != n) break;
        }
        ::close(c);
      }
    });
  }
  ~EchoServer() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int fd_ = -1, port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

int dial(const std::string& address) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(address.rfind(':') + 1))));
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

// Sends `msg` and waits up to `timeout` for its echo; returns the seconds it took, or -1 if it did not come.
double round_trip(int fd, const std::string& msg, std::chrono::milliseconds timeout) {
  const auto t0 = Clock::now();
  EXPECT_EQ(::write(fd, msg.data(), msg.size()), static_cast<ssize_t>(msg.size()));
  std::string got;
  while (got.size() < msg.size()) {
    const auto left = timeout - std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return -1;
    char buf[4096];
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n <= 0) return -1;
    got.append(buf, static_cast<size_t>(n));
  }
  EXPECT_EQ(got, msg);
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

TEST(LinkProxy, ForwardsCutsAndDelays) {
  EchoServer server;
  LinkProxy proxy(server.address());
  const int fd = dial(proxy.address());
  // Plain forwarding, fast.
  const double plain = round_trip(fd, "hello", std::chrono::milliseconds(2000));
  ASSERT_GE(plain, 0);
  EXPECT_LT(plain, 0.25);  // loopback; generous for a loaded 2-core machine, still below one delayed round trip
  EXPECT_EQ(proxy.connections(), 1);
  // A 0.6 s cut: nothing comes back within 0.3 s, and the held bytes arrive once the cut is over.
  proxy.cut(0.6);
  EXPECT_LT(round_trip(fd, "during the cut", std::chrono::milliseconds(300)), 0);
  std::string rest;
  const auto t0 = Clock::now();
  while (rest.size() < 14 && Clock::now() - t0 < std::chrono::seconds(3)) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char buf[64];
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    ASSERT_GT(n, 0) << "the connection was reset by the cut";
    rest.append(buf, static_cast<size_t>(n));
  }
  EXPECT_EQ(rest, "during the cut");
  // A 150 ms delay: each direction waits, so the round trip takes ≥ 300 ms; after it ends, fast again.
  proxy.delay(150, 0.8);
  const double delayed = round_trip(fd, "slow", std::chrono::milliseconds(3000));
  EXPECT_GE(delayed, 0.29);
  std::this_thread::sleep_for(std::chrono::milliseconds(900));
  const double after = round_trip(fd, "fast again", std::chrono::milliseconds(2000));
  ASSERT_GE(after, 0);
  EXPECT_LT(after, 0.25);
  // The proxy counts a chunk after sending it: the echo can reach us before the count moves (a loaded machine).
  const int64_t expected = 2 * (5 + 14 + 4 + 10);
  for (int i = 0; i < 100 && proxy.bytes_forwarded() < expected; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GE(proxy.bytes_forwarded(), expected);
  ::close(fd);
}

TEST(LinkProxy, RefusesATargetThatIsNotHostPort) {
  EXPECT_THROW(LinkProxy("localhost"), InputError);
  EXPECT_THROW(LinkProxy("localhost:http"), InputError);
}

}  // namespace
}  // namespace dloco
