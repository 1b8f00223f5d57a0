// The learner's link to the syncer; see link.h.
#include "learner/link.h"

#include <chrono>

#include "core/check.h"
#include "transport/grpc_options.h"

namespace dloco {

using namespace std::chrono_literals;

namespace {
BackoffConfig link_backoff() {
  BackoffConfig b;
  b.initial = std::chrono::milliseconds(200);
  b.max = std::chrono::seconds(2);
  return b;
}
}  // namespace

LearnerLink::LearnerLink(std::string syncer_address, v1::Handshake handshake, int learner_id, std::string host)
    : address_(std::move(syncer_address)),
      handshake_(std::move(handshake)),
      learner_id_(learner_id),
      host_(std::move(host)),
      channel_(make_channel(address_)),
      stub_(v1::Syncer::NewStub(channel_)) {}

LearnerLink::~LearnerLink() { stop(); }

v1::JoinReply LearnerLink::join(double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  Backoff backoff(link_backoff());
  std::string last_error;
  while (std::chrono::steady_clock::now() < deadline) {
    v1::JoinRequest req;
    *req.mutable_handshake() = handshake_;
    req.set_learner_id(learner_id_);
    req.set_host(host_);
    if (held_stream_ >= 0) {
      req.set_holds_stream(true);
      req.set_held_stream(held_stream_);
    }
    {
      std::lock_guard lock(mu_);
      const auto now = std::chrono::steady_clock::now();
      for (const auto& [s, when] : busy_streams_) {
        if (now - when < std::chrono::seconds(10)) req.add_busy_streams(s);
      }
      req.set_peer_address(peer_address_);
    }
    v1::JoinReply reply;
    auto ctx = context_with_deadline(5s);
    const grpc::Status status = stub_->Join(ctx.get(), req, &reply);
    if (status.ok()) {
      session_id_ = reply.session_id();
      return reply;
    }
    if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
        status.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
        status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
      throw HandshakeRefused(status.error_message());  // refused: retrying cannot help
    }
    last_error = status.error_message();  // unreachable, or no free stream yet (RESOURCE_EXHAUSTED): retry
    std::this_thread::sleep_for(backoff.next_delay());
  }
  throw InputError("cannot join the syncer at " + address_ + " within " + std::to_string(timeout_s) +
                   " s (last error: " + last_error + ")");
}

void LearnerLink::add_busy_stream(int64_t stream) {
  std::lock_guard lock(mu_);
  busy_streams_.emplace_back(stream, std::chrono::steady_clock::now());
}

void LearnerLink::set_peer_address(std::string address) {
  std::lock_guard lock(mu_);
  peer_address_ = std::move(address);
}

v1::Fragment LearnerLink::fetch_fragment(int p) {
  v1::FragmentRequest req;
  req.set_session_id(session_id_);
  req.set_fragment(p);
  v1::Fragment out;
  auto ctx = context_with_deadline(30s);
  const grpc::Status status = stub_->GetFragment(ctx.get(), req, &out);
  if (!status.ok()) {
    throw InputError("fetching fragment " + std::to_string(p) + " from " + address_ + " failed: " +
                     status.error_message());
  }
  return out;
}

std::optional<v1::Snapshot> LearnerLink::snapshot() {
  v1::SnapshotRequest req;
  req.set_session_id(session_id_);
  v1::Snapshot out;
  auto ctx = context_with_deadline(60s);
  if (!stub_->GetSnapshot(ctx.get(), req, &out).ok()) return std::nullopt;
  return out;
}

std::optional<v1::StatusReply> LearnerLink::status() {
  v1::StatusReply out;
  auto ctx = context_with_deadline(5s);
  if (!stub_->Status(ctx.get(), v1::StatusRequest(), &out).ok()) return std::nullopt;
  return out;
}

bool LearnerLink::report_eval(const v1::EvalReport& report) {
  v1::EvalReport r = report;
  r.set_session_id(session_id_);
  v1::StatusReply out;
  auto ctx = context_with_deadline(5s);
  return stub_->ReportEval(ctx.get(), r, &out).ok();
}

void LearnerLink::start() {
  running_ = true;
  thread_ = std::thread([this] { session_loop(); });
}

void LearnerLink::post(v1::LearnerMessage msg) {
  std::lock_guard lock(mu_);
  if (msg.has_metadata() && !outbox_.empty() && outbox_.back().has_metadata()) {
    outbox_.back() = std::move(msg);  // only the newest metadata matters
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

bool LearnerLink::poll(v1::SyncerMessage* msg) {
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
  try {
    join(5.0);
    return true;
  } catch (const HandshakeRefused& e) {  // e.g. the syncer came back with another layout: stop training
    std::lock_guard lock(mu_);
    fatal_ = e.what();
    running_ = false;
    return false;
  } catch (const InputError&) {  // still unreachable: keep training, try again after the backoff
    return false;
  }
}

void LearnerLink::session_loop() {
  Backoff backoff(link_backoff());
  bool first = true;
  while (running_) {
    if (!first) {
      std::this_thread::sleep_for(backoff.next_delay());
      if (!running_ || !rejoin()) continue;
      ++reconnects_;
    }
    first = false;
    auto ctx = std::make_shared<grpc::ClientContext>();
    {
      std::lock_guard lock(mu_);
      context_ = ctx;
    }
    auto stream = stub_->Session(ctx.get());
    const uint64_t session = session_id_.load();
    // The session's first message identifies it (metadata of where the learner stands comes right after).
    v1::LearnerMessage hello;
    hello.set_session_id(session);
    hello.mutable_metadata();
    {
      std::lock_guard lock(mu_);
      for (auto it = outbox_.rbegin(); it != outbox_.rend(); ++it) {
        if (it->has_metadata()) {
          *hello.mutable_metadata() = it->metadata();
          break;
        }
      }
    }
    if (!stream->Write(hello)) continue;
    backoff.reset();
    std::atomic<bool> broken{false};
    std::thread reader([&] {
      v1::SyncerMessage in;
      while (stream->Read(&in)) {
        std::lock_guard lock(mu_);
        inbox_.push_back(std::move(in));
      }
      broken = true;
      cv_.notify_all();
    });
    while (running_ && !broken) {
      v1::LearnerMessage out;
      {
        std::unique_lock lock(mu_);
        cv_.wait_for(lock, 100ms, [&] { return !outbox_.empty() || !running_ || broken; });
        if (outbox_.empty()) continue;
        out = std::move(outbox_.front());
        outbox_.pop_front();
      }
      out.set_session_id(session);
      if (!stream->Write(out)) break;
    }
    ctx->TryCancel();
    reader.join();
    stream->Finish();
  }
}

void LearnerLink::stop() {
  running_ = false;
  {
    std::lock_guard lock(mu_);
    if (context_) context_->TryCancel();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace dloco
