// A delay line for the emulated sites of bench/wan/utilisation.sh (issue 32 item 1), for kernels without sch_netem
// (this machine's 6.18 has none, docs/measurements.md "Utilisation over constrained links"): every packet netfilter
// queues to it (iptables -A INPUT -i VETH -j NFQUEUE --queue-num Q, in the host's namespace) is held for --delay-us
// and then let in, in arrival order. With every host's line at RTT/2 on its ingress any two hosts are RTT apart.
// Rate limits stay with tc (TBF) on the veths. On ingress, not egress: a packet held on its way out still counts
// against its socket's TCP small-queue budget and caps the sender (5 of 100 Mbit/s at 40 ms RTT, measured).
//
// Only the packet's metadata crosses to user space (NFQNL_COPY_META), GSO packets stay whole (NFQA_CFG_F_GSO), and
// the packets due at one wake-up (or within 0.2 ms of it) go with one batch verdict. It prints "ready" once bound
// (add the iptables rules after it: a queue with no reader drops) and, on SIGTERM or SIGINT, a line of counts:
// packets, the most held at once, and the largest lateness of a release (the timer's slack on a loaded machine:
// run it with a real-time priority, chrt -f).
//
// Usage: bench_wan_delay_line --queue Q --delay-us D [--max-queued N]
// Exit status 1 when netfilter's queue cannot be opened or bound (not root, no nfnetlink_queue), with the reason.
#include <arpa/inet.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>

#include <linux/netfilter.h>
#include <libnetfilter_queue/libnetfilter_queue.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>

#include <CLI/CLI.hpp>

namespace {

volatile sig_atomic_t stop = 0;
constexpr int64_t kSlackNs = 200000;  // a packet due within 0.2 ms goes with the ones due now

int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

struct Held {
  uint32_t id;
  int64_t due_ns;
};

struct Line {
  int64_t delay_ns = 0;
  std::deque<Held> held;
  uint64_t packets = 0;
  size_t most_held = 0;
  int64_t latest_ns = 0;  // the largest lateness of a release
};

int on_packet(nfq_q_handle*, nfgenmsg*, nfq_data* data, void* arg) {
  auto* line = static_cast<Line*>(arg);
  const nfqnl_msg_packet_hdr* hdr = nfq_get_msg_packet_hdr(data);
  if (hdr == nullptr) return 0;
  line->held.push_back({ntohl(hdr->packet_id), now_ns() + line->delay_ns});
  line->packets++;
  line->most_held = std::max(line->most_held, line->held.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int queue = 0;
  int64_t delay_us = 0;
  uint32_t max_queued = 65536;
  CLI::App app{"Hold every NFQUEUE'd packet for a fixed delay (an emulated link's latency)", "bench_wan_delay_line"};
  app.add_option("--queue", queue, "netfilter queue number (iptables -j NFQUEUE --queue-num)")
      ->required()
      ->check(CLI::Range(0, 65535));
  app.add_option("--delay-us", delay_us, "how long each packet is held, µs")
      ->required()
      ->check(CLI::Range(0, 10000000));
  app.add_option("--max-queued", max_queued, "packets the kernel may hold for this line before it drops")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  CLI11_PARSE(app, argc, argv);

  Line line;
  line.delay_ns = delay_us * 1000;
  nfq_handle* h = nfq_open();
  if (h == nullptr) {
    std::fprintf(stderr, "delay_line: nfq_open failed: %s (root and nfnetlink_queue needed)\n", std::strerror(errno));
    return 1;
  }
  nfq_q_handle* qh = nfq_create_queue(h, static_cast<uint16_t>(queue), &on_packet, &line);
  if (qh == nullptr) {
    std::fprintf(stderr, "delay_line: cannot bind queue %d: %s\n", queue, std::strerror(errno));
    nfq_close(h);
    return 1;
  }
  if (nfq_set_mode(qh, NFQNL_COPY_META, 0) < 0 || nfq_set_queue_maxlen(qh, max_queued) < 0 ||
      nfq_set_queue_flags(qh, NFQA_CFG_F_GSO, NFQA_CFG_F_GSO) < 0) {
    std::fprintf(stderr, "delay_line: cannot configure queue %d: %s\n", queue, std::strerror(errno));
    nfq_destroy_queue(qh);
    nfq_close(h);
    return 1;
  }
  const int fd = nfq_fd(h);
  // a burst of queued packets must not overflow the socket (ENOBUFS): a large buffer, and no error if it does
  if (nfnl_rcvbufsiz(nfq_nfnlh(h), 16u << 20) < (8u << 20)) {
    std::fprintf(stderr, "delay_line: the netlink receive buffer stayed below 8 MiB (net.core.rmem_max)\n");
  }
  int on = 1;
  if (setsockopt(fd, SOL_NETLINK, NETLINK_NO_ENOBUFS, &on, sizeof on) != 0) {
    std::fprintf(stderr, "delay_line: NETLINK_NO_ENOBUFS: %s\n", std::strerror(errno));
  }

  // SIGTERM and SIGINT are blocked except inside ppoll, so one that arrives between the stop check and the wait
  // ends that wait at once (the bench's cleanup gives the line 0.3 s to write its counts).
  struct sigaction sa{};
  sa.sa_handler = [](int) { stop = 1; };
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  sigset_t blocked, waiting;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGTERM);
  sigaddset(&blocked, SIGINT);
  sigprocmask(SIG_BLOCK, &blocked, &waiting);
  std::printf("ready\n");
  std::fflush(stdout);

  alignas(8) static char buf[1 << 16];
  while (!stop) {
    // release what is due (and what falls due within kSlackNs: one wake-up for packets that arrived together) with
    // one batch verdict: ids grow in arrival order, so accepting every id up to the last one due is exactly those
    const int64_t t = now_ns();
    uint32_t last_due = 0;
    bool any = false;
    while (!line.held.empty() && line.held.front().due_ns <= t + kSlackNs) {
      line.latest_ns = std::max(line.latest_ns, t - line.held.front().due_ns);
      last_due = line.held.front().id;
      any = true;
      line.held.pop_front();
    }
    if (any && nfq_set_verdict_batch(qh, last_due, NF_ACCEPT) < 0) {
      // the kernel keeps those packets queued: say so (the bench's runs then stall and fail on their deadlines)
      std::fprintf(stderr, "delay_line: verdict for packets up to %u failed: %s\n", last_due, std::strerror(errno));
    }
    timespec wait{1, 0};
    if (!line.held.empty()) {
      const int64_t left = std::max<int64_t>(0, line.held.front().due_ns - now_ns());  // > kSlackNs - (time since t)
      wait = {static_cast<time_t>(left / 1000000000), static_cast<long>(left % 1000000000)};
    }
    pollfd p{fd, POLLIN, 0};
    if (ppoll(&p, 1, &wait, &waiting) <= 0) continue;  // timeout, or a signal
    for (;;) {
      const ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n <= 0) break;
      nfq_handle_packet(h, buf, static_cast<int>(n));
    }
  }
  if (!line.held.empty()) nfq_set_verdict_batch(qh, line.held.back().id, NF_ACCEPT);
  std::printf("packets %llu, most held %zu, latest release %.3f ms late\n",
              static_cast<unsigned long long>(line.packets), line.most_held, line.latest_ns / 1e6);
  nfq_destroy_queue(qh);
  nfq_close(h);
  return 0;
}
