// The learner's link to the syncer; see link.h.
#include "learner/link.h"

#include <chrono>

namespace dloco {

using namespace std::chrono_literals;

LearnerLink::LearnerLink(std::unique_ptr<wire::SyncerClient> client, std::string address, wire::Handshake handshake,
                         int learner_id, std::string host, uint64_t seed)
    : client_(std::move(client)),
      address_(std::move(address)),
      handshake_(std::move(handshake)),
      learner_id_(learner_id),
      host_(std::move(host)),
      seed_(seed) {}

LearnerLink::~LearnerLink() { stop(); }

BackoffConfig LearnerLink::backoff_config() const {
  BackoffConfig b;
  b.initial = std::chrono::milliseconds(200);
  b.max = std::chrono::seconds(2);
  b.seed = seed_;
  return b;
}

wire::JoinReply LearnerLink::join(double timeout_s) {
  auto r = try_join(timeout_s);
  if (r.ok()) return std::move(r.value);
  if (!r.status.retryable()) throw HandshakeRefused(r.status.message);
  throw InputError("cannot join the syncer at " + address_ + " within " + std::to_string(timeout_s) +
                   " s (last error: " + r.status.message + ")");
}

wire::Result<wire::JoinReply> LearnerLink::try_join(double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  Backoff backoff(backoff_config());
  wire::Status last{wire::Code::kDeadline, "no attempt within the time"};
  while (std::chrono::steady_clock::now() < deadline) {
    wire::JoinRequest req;
    req.handshake = handshake_;
    req.learner_id = learner_id_;
    req.host = host_;
    if (held_stream_ >= 0) req.held_stream = held_stream_.load();
    {
      std::lock_guard lock(mu_);
      const auto now = std::chrono::steady_clock::now();
      for (const auto& [s, when] : busy_streams_) {
        if (now - when < std::chrono::seconds(10)) req.busy_streams.push_back(s);
      }
      req.peer_address = peer_address_;
    }
    auto reply = client_->join(req, 5s);
    if (reply.ok()) session_id_ = reply.value.session_id;
    if (reply.ok() || !reply.status.retryable()) return reply;  // joined, or refused: retrying cannot help
    last = reply.status;  // unreachable, or no free stream yet: retry
    std::this_thread::sleep_for(backoff.next_delay());
  }
  return last;
}

void LearnerLink::add_busy_stream(int64_t stream) {
  std::lock_guard lock(mu_);
  busy_streams_.emplace_back(stream, std::chrono::steady_clock::now());
}

void LearnerLink::set_peer_address(std::string address) {
  std::lock_guard lock(mu_);
  peer_address_ = std::move(address);
}

wire::Result<wire::Fragment> LearnerLink::fetch_fragment(int p) { return client_->fragment(session_id_, p, 30s); }

std::optional<wire::Snapshot> LearnerLink::snapshot() {
  auto r = client_->snapshot(session_id_, 60s);
  if (!r.ok()) return std::nullopt;
  return std::move(r.value);
}

std::optional<wire::StatusReply> LearnerLink::status() {
  auto r = client_->status(5s);
  if (!r.ok()) return std::nullopt;
  return std::move(r.value);
}

bool LearnerLink::report_eval(const wire::EvalReport& report) {
  wire::EvalReport r = report;
  r.session_id = session_id_;
  return client_->report_eval(r, 5s).ok();
}

void LearnerLink::start() {
  running_ = true;
  thread_ = std::thread([this] { session_loop(); });
}

void LearnerLink::post(wire::LearnerMessage msg) {
  std::lock_guard lock(mu_);
  if (std::holds_alternative<wire::Metadata>(msg) && !outbox_.empty() &&
      std::holds_alternative<wire::Metadata>(outbox_.back())) {
    // Only the newest metadata matters, but a take-over decline it replaces is said once and must arrive.
    auto& newer = std::get<wire::Metadata>(msg);
    if (!newer.declined_stream) newer.declined_stream = std::get<wire::Metadata>(outbox_.back()).declined_stream;
    outbox_.back() = std::move(msg);
  } else {
    outbox_.push_back(std::move(msg));
  }
  cv_.notify_one();
}

bool LearnerLink::drain(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (outbox_.empty()) return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
}

bool LearnerLink::poll(wire::SyncerMessage* msg) {
  std::lock_guard lock(mu_);
  if (inbox_.empty()) return false;
  *msg = std::move(inbox_.front());
  inbox_.pop_front();
  return true;
}

std::string LearnerLink::fatal_error() const {
  std::lock_guard lock(mu_);
  return fatal_;
}

bool LearnerLink::rejoin() {
  const auto r = try_join(5.0);
  if (r.ok()) return true;
  if (!r.status.retryable()) {  // e.g. the syncer came back with another layout: stop training
    std::lock_guard lock(mu_);
    fatal_ = r.status.message;
    running_ = false;
  }
  return false;  // still unreachable: keep training, try again after the backoff
}

void LearnerLink::session_loop() {
  Backoff backoff(backoff_config());
  bool first = true;
  while (running_) {
    if (!first) {
      std::this_thread::sleep_for(backoff.next_delay());
      if (!running_ || !rejoin()) continue;
      ++reconnects_;
    }
    first = false;
    std::unique_ptr<wire::SessionStream> stream = client_->session(session_id_.load());
    // The session's first message identifies it: the newest metadata queued, else an empty one.
    wire::LearnerMessage hello = wire::Metadata{};
    {
      std::lock_guard lock(mu_);
      stream_ = stream.get();
      for (auto it = outbox_.rbegin(); it != outbox_.rend(); ++it) {
        if (std::holds_alternative<wire::Metadata>(*it)) {
          hello = *it;
          break;
        }
      }
    }
    if (!running_ || !stream->write(hello)) {
      std::lock_guard lock(mu_);
      stream_ = nullptr;
      continue;
    }
    backoff.reset();
    std::atomic<bool> broken{false};
    std::thread reader([&] {
      wire::SyncerMessage in;
      while (stream->read(&in)) {
        std::lock_guard lock(mu_);
        inbox_.push_back(std::move(in));
      }
      broken = true;
      cv_.notify_all();
    });
    while (running_ && !broken) {
      wire::LearnerMessage out;
      {
        std::unique_lock lock(mu_);
        cv_.wait_for(lock, 100ms, [&] { return !outbox_.empty() || !running_ || broken; });
        if (outbox_.empty()) continue;
        out = std::move(outbox_.front());
        outbox_.pop_front();
      }
      if (!stream->write(out)) {  // the session broke (or resync() ended it): the next one sends it
        std::lock_guard lock(mu_);
        outbox_.push_front(std::move(out));
        break;
      }
    }
    stream->cancel();
    reader.join();
    std::lock_guard lock(mu_);
    stream_ = nullptr;
  }
}

void LearnerLink::resync() {
  std::lock_guard lock(mu_);
  if (stream_) stream_->cancel();
}

void LearnerLink::stop() {
  running_ = false;
  {
    std::lock_guard lock(mu_);
    if (stream_) stream_->cancel();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace dloco
