// The fault-injecting link between one learner and the syncer (fault plans: cut_link, delay_link). The launcher
// puts one in front of the syncer per learner slot when a plan has link faults, and the learner dials the proxy
// instead of the syncer. Loopback TCP only; the syncer may restart on its address underneath (each accepted
// connection dials the syncer anew).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace dloco {

/// Forwards every TCP connection accepted on 127.0.0.1:<port> to `target` ("host:port"), byte for byte, on one
/// background thread (poll). While a cut is in force nothing is read or written on either side: both peers see
/// silence, as in a network partition (no reset), and their own deadlines and keepalives decide what happens;
/// bytes already read are held and delivered when the cut ends. While a delay is in force every chunk read is
/// held delay_ms before it is written (added latency each way, order kept). Thread-safe.
class LinkProxy {
 public:
  /// Starts listening on an ephemeral loopback port. Throws InputError if `target` is not host:port or the
  /// socket cannot be opened.
  explicit LinkProxy(std::string target);
  /// Stops the thread and closes every socket.
  ~LinkProxy();
  LinkProxy(const LinkProxy&) = delete;
  LinkProxy& operator=(const LinkProxy&) = delete;

  /// "127.0.0.1:<port>": what the learner dials.
  std::string address() const;
  /// Nothing crosses the link for `duration_s` seconds from now.
  void cut(double duration_s);
  /// Every chunk waits `delay_ms` more for `duration_s` seconds from now.
  void delay(double delay_ms, double duration_s);
  /// Ends a cut now (a fault bounded in steps ends when the launcher sees the global step; no-op if none).
  void end_cut();
  /// Ends a delay now (as end_cut).
  void end_delay();
  /// Bytes forwarded so far, both directions.
  int64_t bytes_forwarded() const { return bytes_.load(); }
  /// Connections accepted so far.
  int64_t connections() const { return connections_.load(); }
  /// From now on, keeps a copy of every byte forwarded (both directions, at most 64 MiB): what a relay on the path
  /// can read (the TLS test: it must not find the run secret).
  void record();
  /// The bytes recorded so far.
  std::string recorded() const;

 private:
  void run();

  std::string target_host_;
  int target_port_ = 0;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> bytes_{0}, connections_{0};
  mutable std::mutex mu_;  // guards the two deadlines below
  std::chrono::steady_clock::time_point cut_until_{}, delay_until_{};
  double delay_s_ = 0;
  bool recording_ = false;  // under mu_, as is recorded_
  std::atomic<bool> recording_flag_{false};  // recording_, read without the lock on every chunk
  std::string recorded_;
  std::thread thread_;
};

}  // namespace dloco
