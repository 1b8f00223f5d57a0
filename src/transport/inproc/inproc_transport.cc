// The in-process transport; see inproc_transport.h.
//
// Lifetimes: a server (Hosted) counts the calls in flight and owns one thread per session running the handler;
// destroying the server refuses new calls, breaks every session, waits for the calls and joins the threads, so a
// handler is never called after its server is gone. A session is a Pipe of two queues. An orderly end (the
// handler returned) lets the learner read what was queued before it; a break (cut, cancel, server gone) drops it.
#include "transport/inproc/inproc_transport.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "core/check.h"

namespace dloco::inproc {

namespace {

using wire::Code;

wire::Status unavailable(const std::string& what) { return {Code::kUnavailable, what}; }

struct Pipe {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<wire::LearnerMessage> up;
  std::deque<wire::SyncerMessage> down;
  bool closed = false;  // the handler returned: the learner reads what is queued, then the end
  bool broken = false;  // cut, cancelled or the server went away: nothing more either way

  void end(bool broke) {
    std::lock_guard lock(mu);
    closed = true;
    broken = broken || broke;
    cv.notify_all();
  }
};

struct Link {
  std::atomic<bool> cut{false};
  std::atomic<int64_t> delay_ms{0};
  std::atomic<int> drop{0};
  std::atomic<int> dropped{0};
  std::atomic<int> drop_merges{0};
  std::atomic<int> dropped_merges{0};
  std::mutex mu;
  std::deque<std::function<bool(wire::Payload&)>> tamper;  // under mu: the next edit, kept until it applies
  std::vector<std::weak_ptr<Pipe>> pipes;

  void wait() const {
    if (const int64_t d = delay_ms.load(); d > 0) std::this_thread::sleep_for(std::chrono::milliseconds(d));
  }
  void break_all() {
    std::lock_guard lock(mu);
    for (auto& w : pipes) {
      if (auto p = w.lock()) p->end(true);
    }
    pipes.clear();
  }
};

// Takes one from a drop counter; false when it is 0.
bool take_one(std::atomic<int>& counter) {
  for (int left = counter.load(); left > 0;) {
    if (counter.compare_exchange_weak(left, left - 1)) return true;
  }
  return false;
}

struct Hosted {
  wire::SyncerHandler* syncer = nullptr;
  wire::PeerHandler* peer = nullptr;
  std::mutex mu;
  std::condition_variable cv;
  int calls = 0;
  bool down = false;
  std::vector<std::thread> sessions;
  std::vector<std::shared_ptr<Pipe>> pipes;

  bool enter() {
    std::lock_guard lock(mu);
    if (down) return false;
    ++calls;
    return true;
  }
  void leave() {
    std::lock_guard lock(mu);
    --calls;
    cv.notify_all();
  }
};

}  // namespace

struct InprocNetwork::State {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<Hosted>> servers;
  std::map<std::string, std::shared_ptr<Link>> links;
  int next_port = 1;

  std::shared_ptr<Link> link(const std::string& name) {
    std::lock_guard lock(mu);
    auto& l = links[name];
    if (!l) l = std::make_shared<Link>();
    return l;
  }
  std::shared_ptr<Hosted> find(const std::string& address) {
    std::lock_guard lock(mu);
    auto it = servers.find(address);
    return it == servers.end() ? nullptr : it->second;
  }
};

namespace {

using State = InprocNetwork::State;

// A call into a server: refused when the link is cut, the server is gone or going.
class Call {
 public:
  Call(State& state, const Link& link, const std::string& address) : hosted_(state.find(address)) {
    if (link.cut.load()) {
      status_ = unavailable("link cut (in-process fault)");
      hosted_ = nullptr;
    } else if (!hosted_ || !hosted_->enter()) {
      status_ = unavailable("nothing listens on '" + address + "'");
      hosted_ = nullptr;
    }
  }
  ~Call() {
    if (hosted_) hosted_->leave();
  }
  explicit operator bool() const { return hosted_ != nullptr; }
  Hosted& operator*() const { return *hosted_; }
  Hosted* operator->() const { return hosted_.get(); }
  const wire::Status& status() const { return status_; }

 private:
  std::shared_ptr<Hosted> hosted_;
  wire::Status status_;
};

class PipePeer final : public wire::SessionPeer {
 public:
  PipePeer(std::shared_ptr<Pipe> pipe, std::shared_ptr<Link> link) : pipe_(std::move(pipe)), link_(std::move(link)) {}
  bool read(wire::LearnerMessage* message) override {
    std::unique_lock lock(pipe_->mu);
    pipe_->cv.wait(lock, [&] { return pipe_->closed || !pipe_->up.empty(); });
    if (pipe_->up.empty() || pipe_->broken) return false;
    *message = std::move(pipe_->up.front());
    pipe_->up.pop_front();
    return true;
  }
  bool write(const wire::SyncerMessage& message) override {
    if (std::holds_alternative<wire::MergedFragment>(message) && take_one(link_->drop_merges)) {
      ++link_->dropped_merges;
      return true;  // vanished on the way
    }
    link_->wait();
    std::lock_guard lock(pipe_->mu);
    if (pipe_->closed) return false;
    pipe_->down.push_back(message);
    pipe_->cv.notify_all();
    return true;
  }

 private:
  std::shared_ptr<Pipe> pipe_;
  std::shared_ptr<Link> link_;
};

class PipeStream final : public wire::SessionStream {
 public:
  PipeStream(std::shared_ptr<Pipe> pipe, std::shared_ptr<Link> link) : pipe_(std::move(pipe)), link_(std::move(link)) {}
  ~PipeStream() override { pipe_->end(true); }
  bool write(const wire::LearnerMessage& message) override {
    if (link_->cut.load()) return false;
    if (std::holds_alternative<wire::PullAnswer>(message) && take_one(link_->drop)) {
      ++link_->dropped;
      return true;  // vanished on the way
    }
    wire::LearnerMessage sent = message;
    if (auto* answer = std::get_if<wire::PullAnswer>(&sent)) {
      std::lock_guard lock(link_->mu);
      if (!link_->tamper.empty() && link_->tamper.front()(answer->delta)) link_->tamper.pop_front();
    }
    link_->wait();
    std::lock_guard lock(pipe_->mu);
    if (pipe_->closed) return false;
    pipe_->up.push_back(std::move(sent));
    pipe_->cv.notify_all();
    return true;
  }
  bool read(wire::SyncerMessage* message) override {
    std::unique_lock lock(pipe_->mu);
    pipe_->cv.wait(lock, [&] { return pipe_->closed || !pipe_->down.empty(); });
    if (pipe_->down.empty() || pipe_->broken) return false;
    *message = std::move(pipe_->down.front());
    pipe_->down.pop_front();
    return true;
  }
  void cancel() override { pipe_->end(true); }

 private:
  std::shared_ptr<Pipe> pipe_;
  std::shared_ptr<Link> link_;
};

class Client final : public wire::SyncerClient {
 public:
  Client(std::shared_ptr<State> state, std::shared_ptr<Link> link, std::string address)
      : state_(std::move(state)), link_(std::move(link)), address_(std::move(address)) {}

  template <class F>
  auto call(F&& f) -> decltype(f(std::declval<wire::SyncerHandler&>())) {
    link_->wait();
    Call c(*state_, *link_, address_);
    if (!c || !c->syncer) return c ? unavailable("'" + address_ + "' is not a syncer") : c.status();
    auto out = f(*c->syncer);
    link_->wait();
    if (link_->cut.load()) return unavailable("link cut (in-process fault)");  // the answer is lost on the way
    return out;
  }
  wire::Result<wire::JoinReply> join(const wire::JoinRequest& r, wire::Deadline) override {
    return call([&](wire::SyncerHandler& h) { return h.join(r); });
  }
  wire::Result<wire::Fragment> fragment(uint64_t session, int p, wire::Deadline) override {
    return call([&](wire::SyncerHandler& h) { return h.fragment(session, p); });
  }
  wire::Result<wire::Snapshot> snapshot(uint64_t session, wire::Deadline) override {
    return call([&](wire::SyncerHandler& h) { return h.snapshot(session); });
  }
  wire::Result<wire::StatusReply> status(wire::Deadline) override {
    return call([&](wire::SyncerHandler& h) { return wire::Result<wire::StatusReply>(h.status()); });
  }
  wire::Result<wire::StatusReply> report_eval(const wire::EvalReport& r, wire::Deadline) override {
    return call([&](wire::SyncerHandler& h) { return h.report_eval(r); });
  }
  std::unique_ptr<wire::SessionStream> session(uint64_t session_id) override {
    auto pipe = std::make_shared<Pipe>();
    auto stream = std::make_unique<PipeStream>(pipe, link_);
    Call c(*state_, *link_, address_);
    if (!c || !c->syncer) {
      pipe->end(true);
      return stream;
    }
    {
      std::lock_guard lock(link_->mu);
      link_->pipes.push_back(pipe);
    }
    std::lock_guard lock(c->mu);
    c->pipes.push_back(pipe);
    wire::SyncerHandler* handler = c->syncer;
    c->sessions.emplace_back([handler, pipe, link = link_, session_id] {
      PipePeer peer(pipe, link);
      handler->session(session_id, peer);
      pipe->end(false);
    });
    return stream;
  }

 private:
  std::shared_ptr<State> state_;
  std::shared_ptr<Link> link_;
  std::string address_;
};

class PeerClientImpl final : public wire::PeerClient {
 public:
  PeerClientImpl(std::shared_ptr<State> state, std::shared_ptr<Link> link, std::string address)
      : state_(std::move(state)), link_(std::move(link)), address_(std::move(address)) {}
  wire::Result<wire::Fragment> fragment(const wire::Handshake& handshake, int p, wire::Deadline) override {
    link_->wait();
    Call c(*state_, *link_, address_);
    if (!c || !c->peer) return c ? unavailable("'" + address_ + "' is not a peer") : c.status();
    return c->peer->fragment(handshake, p);
  }

 private:
  std::shared_ptr<State> state_;
  std::shared_ptr<Link> link_;
  std::string address_;
};

class InprocServer final : public wire::Server {
 public:
  InprocServer(std::shared_ptr<State> state, std::string address, std::shared_ptr<Hosted> hosted)
      : state_(std::move(state)), address_(std::move(address)), hosted_(std::move(hosted)) {}
  ~InprocServer() override {
    {
      std::lock_guard lock(state_->mu);
      state_->servers.erase(address_);
    }
    std::vector<std::thread> threads;
    {
      std::unique_lock lock(hosted_->mu);
      hosted_->down = true;
      for (auto& p : hosted_->pipes) p->end(true);
      hosted_->cv.wait(lock, [&] { return hosted_->calls == 0; });
      for (auto& p : hosted_->pipes) p->end(true);  // sessions opened while the last calls finished
      threads.swap(hosted_->sessions);
    }
    for (auto& t : threads) t.join();
  }
  const std::string& address() const override { return address_; }

 private:
  std::shared_ptr<State> state_;
  std::string address_;
  std::shared_ptr<Hosted> hosted_;
};

class Endpoint final : public wire::Transport {
 public:
  Endpoint(std::shared_ptr<State> state, std::shared_ptr<Link> link) : state_(std::move(state)), link_(std::move(link)) {}
  std::unique_ptr<wire::SyncerClient> connect_syncer(const std::string& address) override {
    return std::make_unique<Client>(state_, link_, address);
  }
  std::unique_ptr<wire::PeerClient> connect_peer(const std::string& address) override {
    return std::make_unique<PeerClientImpl>(state_, link_, address);
  }
  std::unique_ptr<wire::Server> serve_syncer(const std::string& address, wire::SyncerHandler& handler) override {
    auto hosted = std::make_shared<Hosted>();
    hosted->syncer = &handler;
    return host(address, std::move(hosted));
  }
  std::unique_ptr<wire::Server> serve_peer(const std::string& host_name, wire::PeerHandler& handler) override {
    auto hosted = std::make_shared<Hosted>();
    hosted->peer = &handler;
    return host(host_name + ":0", std::move(hosted));
  }

 private:
  std::unique_ptr<wire::Server> host(std::string address, std::shared_ptr<Hosted> hosted) {
    std::lock_guard lock(state_->mu);
    if (address.size() >= 2 && address.compare(address.size() - 2, 2, ":0") == 0) {
      address = address.substr(0, address.size() - 1) + std::to_string(state_->next_port++);
    }
    if (state_->servers.count(address)) throw InputError("in-process address '" + address + "' is in use");
    state_->servers[address] = hosted;
    return std::make_unique<InprocServer>(state_, address, std::move(hosted));
  }

  std::shared_ptr<State> state_;
  std::shared_ptr<Link> link_;
};

}  // namespace

InprocNetwork::InprocNetwork() : state_(std::make_shared<State>()) {}
InprocNetwork::~InprocNetwork() = default;

wire::Transport& InprocNetwork::endpoint(const std::string& name) {
  std::lock_guard lock(mu_);
  auto& e = endpoints_[name];
  if (!e) e = std::make_unique<Endpoint>(state_, state_->link(name));
  return *e;
}

void InprocNetwork::cut(const std::string& name, bool cut) {
  auto link = state_->link(name);
  link->cut = cut;
  if (cut) link->break_all();
}

void InprocNetwork::delay(const std::string& name, std::chrono::milliseconds delay) {
  state_->link(name)->delay_ms = delay.count();
}

void InprocNetwork::drop_answers(const std::string& name, int count) { state_->link(name)->drop = count; }

void InprocNetwork::tamper_answers(const std::string& name, std::vector<std::function<bool(wire::Payload&)>> edits) {
  auto link = state_->link(name);
  std::lock_guard lock(link->mu);
  for (auto& e : edits) link->tamper.push_back(std::move(e));
}

int InprocNetwork::dropped_answers(const std::string& name) const { return state_->link(name)->dropped.load(); }

void InprocNetwork::drop_merges(const std::string& name, int count) { state_->link(name)->drop_merges = count; }

int InprocNetwork::dropped_merges(const std::string& name) const { return state_->link(name)->dropped_merges.load(); }

}  // namespace dloco::inproc
