// The protocol in one process (docs/protocol.md): a real SyncerService and three learners (LearnerLink +
// OuterSync over a toy inner job) as threads, over transport/inproc with its fault hooks. No sockets, no LibTorch,
// no wall-clock triggers: every fault fires at a learner's step, and every check reads what the roles did (their
// event logs, their own parameters, the syncer's durable Θ).
//
// The toy inner job moves each parameter by a fixed, learner-specific amount per step, so learners disagree and
// every merge changes Θ; its "data stream" is a token counter.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <iterator>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <map>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/hash.h"
#include "learner/outer_sync.h"
#include "process/events.h"
#include "syncer/syncer_service.h"
#include "transport/codec.h"
#include "transport/handshake.h"
#include "transport/inproc/inproc_transport.h"

namespace dloco {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;

constexpr int kTokensPerStep = 64;
const char* kAddress = "syncer:7070";

class ToyJob final : public InnerJob {
 public:
  ToyJob(int id, int64_t stream, const FragmentLayout& layout) : id_(id), stream_(stream) {
    for (const auto& f : layout.fragments) fragments_.emplace_back(static_cast<size_t>(f.numel), 0.0f);
  }
  InnerStep step(int64_t) override {
    for (auto& f : fragments_) {
      for (size_t i = 0; i < f.size(); ++i) f[i] += 1e-3f * static_cast<float>((id_ + 1) * (static_cast<int>(i % 7) - 3));
    }
    tokens_ += kTokensPerStep;
    return {1.0, kTokensPerStep, false};
  }
  StreamCursor cursor() const override { return {stream_, 0, 0, tokens_}; }
  void replace_stream(DataStream s) override {
    stream_ = s.cursor().stream;
    tokens_ = s.cursor().tokens_served;
  }
  void read_fragment(int p, std::span<float> out) override { std::copy(fragments_[p].begin(), fragments_[p].end(), out.begin()); }
  void write_fragment(int p, std::span<const float> in) override { fragments_[p].assign(in.begin(), in.end()); }
  void save_state(const fs::path&, int64_t) override {}
  int64_t restore_state(const fs::path&, std::string*) override { return -1; }

 private:
  int id_;
  int64_t stream_;
  int64_t tokens_ = 0;
  std::vector<std::vector<float>> fragments_;
};

// What a learner thread ended with.
struct LearnerResult {
  std::vector<int64_t> versions;
  std::vector<std::string> hashes;  // of its own parameters after its last apply
  int reconnects = 0;
  std::string error;
};

class ProtocolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dloco_protocol_" + std::to_string(::getpid()) + "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "events");
    config_.run.name = "protocol";
    config_.diloco.learners = 3;
    config_.diloco.inner_steps = 4;  // H
    config_.diloco.fragments = 2;    // P
    config_.diloco.overlap = 2;      // τ
    config_.diloco.quorum = 2;       // K
    config_.diloco.grace_window = false;
    config_.diloco.anchor_versions = 1;  // a learner one version behind re-anchors
    config_.train.checkpoint_interval = 0;
    config_.train.total_tokens = 3 * kSteps * kTokensPerStep;
    config_.train.batch_size = 1;  // B·T·grad_accum = the toy job's tokens a step (the syncer bounds claims by it)
    config_.train.grad_accum = 1;
    config_.model.seq_len = kTokensPerStep;
    layout_ = make_fragment_layout({{"a.weight", {40, 8}}, {"b.weight", {24, 8}}}, 2);
    handshake_ = {"protocol", wire::kProtocolVersion, "", layout_.hash, 2, handshake_settings(config_)};
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  // (Re)starts the syncer on kAddress from whatever run_dir/syncer holds (a restart restores it).
  void start_syncer() {
    // The syncer takes answers in fp32 or the run's wire_up only (docs/protocol.md §10): the learners' codec is it.
    config_.diloco.wire_up = *parse_choice<WireDtype>(wire::to_string(codec_));
    if (error_feedback_) config_.diloco.error_feedback = true;
    std::vector<std::vector<float>> theta;
    for (const auto& f : layout_.fragments) theta.emplace_back(static_cast<size_t>(f.numel), 0.5f);
    auto state = std::make_unique<SyncerState>(config_, layout_, std::move(theta), [](const std::string&) { return false; });
    syncer_events_ = std::make_unique<EventLog>(dir_ / "events" / ("syncer_" + std::to_string(++syncer_starts_) + ".jsonl"),
                                                Role::kSyncer, 0);
    service_ = std::make_unique<SyncerService>(
        config_, std::move(state), handshake_, dir_, syncer_events_.get(),
        [this](const std::vector<SafetensorsEntry>&, const json&, int64_t) { return dir_ / "checkpoint"; });
    if (before_persist_) service_->set_before_persist(before_persist_);
    server_ = net_.endpoint("syncer").serve_syncer(kAddress, *service_);
    service_->start();
  }
  void stop_syncer() {
    server_.reset();  // breaks every session: learners see the link drop and re-join
    service_.reset();
  }

  // A learner's step hook (fault triggers): runs at each of its step boundaries while it trains; returning true
  // ends its training there.
  using StepHook = std::function<bool(int64_t step, const OuterSync& sync, LearnerLink& link)>;

  // One learner: join, bootstrap every fragment from the syncer, then `steps` inner steps with the outer sync at
  // every boundary, then answer the final flush until the syncer stops the run.
  LearnerResult run_learner(int id, int64_t steps, const StepHook& at_step) {
    LearnerResult out;
    try {
      EventLog events(dir_ / "events" / ("learner_" + std::to_string(id) + ".jsonl"), Role::kLearner, id);
      const std::string name = "learner " + std::to_string(id);
      LearnerLink link(net_.endpoint(name).connect_syncer(kAddress), kAddress, handshake_, id, name, 100 + id);
      const wire::JoinReply joined = link.join(30);
      link.set_held_stream(joined.stream_index);
      ToyJob job(id, joined.stream_index, layout_);
      OuterSyncConfig cfg;
      cfg.learner_id = id;
      cfg.fragments = 2;
      for (const auto& f : layout_.fragments) cfg.fragment_numel.push_back(f.numel);
      cfg.inner_steps = config_.diloco.inner_steps;
      cfg.overlap = config_.diloco.overlap;
      cfg.codec = codec_;
      cfg.error_feedback = error_feedback_;
      cfg.error_feedback_decay = config_.diloco.error_feedback_decay;
      cfg.topk_density = config_.diloco.topk_density;
      OuterSync sync(cfg, job, link, &events, nullptr);
      for (int p = 0; p < 2; ++p) {
        const wire::Fragment f = link.fetch_fragment(p).value;
        sync.adopt(p, f.version, std::make_shared<const std::vector<float>>(wire::fragment_values(f)));
      }
      link.start();
      int64_t step = joined.global_step, trained = 0;
      bool finished = false, stop = false;
      const auto deadline = std::chrono::steady_clock::now() + 120s;
      while (!stop) {
        if (std::chrono::steady_clock::now() > deadline) throw InputError("the run never ended");
        if (!finished) {
          const InnerStep r = job.step(step);
          ++step;
          sync.count_step(r.tokens);
          finished = ++trained >= steps;
          events.emit("step", {{"step", step}});
        }
        std::this_thread::sleep_for(step_time_);  // the step's "compute"
        wire::Metadata m;
        m.step = step;
        sync.fill_counters(m);
        m.step_time_s = std::chrono::duration<double>(step_time_).count();
        m.tokens_trained = job.cursor().tokens_served;
        m.finished = finished;
        m.stream = joined.stream_index;
        link.post(std::move(m));
        const BoundaryOutcome b = sync.boundary(step, finished);
        stop = b.stop;
        if (!finished && at_step && at_step(step, sync, link)) finished = true;
      }
      sync.boundary(step, true);
      out.versions = sync.versions();
      out.hashes = sync.parameter_hashes();
      out.reconnects = link.reconnects();
      link.stop();
    } catch (const std::exception& e) {
      out.error = e.what();
    }
    return out;
  }

  // A hook's end: true once the link has re-attached and the learner has since applied `more` versions of every
  // fragment; `at_reattach` (the hook's own) keeps the versions it held when it first saw the re-attach.
  static bool applied_since_reattach(const OuterSync& sync, const LearnerLink& link, int64_t more,
                                     std::vector<int64_t>& at_reattach) {
    if (at_reattach.empty() && link.reconnects() >= 1) at_reattach = sync.versions();
    bool done = !at_reattach.empty();
    for (size_t p = 0; done && p < at_reattach.size(); ++p) done = sync.versions()[p] >= at_reattach[p] + more;
    return done;
  }

  // Runs learners 0..2 to the end; `faults[id]` is learner id's step hook.
  // Runs learners 0..2 to the end, kSteps each unless `steps` says otherwise; `faults[id]` is learner id's hook.
  std::vector<LearnerResult> run_all(std::map<int, StepHook> faults = {}, std::map<int, int64_t> steps = {}) {
    std::vector<LearnerResult> results(3);
    std::vector<std::thread> threads;
    for (int id = 0; id < 3; ++id) {
      const int64_t n = steps.count(id) ? steps[id] : kSteps;
      const StepHook hook = faults.count(id) ? faults[id] : nullptr;  // looked up here: map::operator[] from three
                                                                      // threads at once is a race (ASan saw it)
      threads.emplace_back([&, id, n, hook] { results[id] = run_learner(id, n, hook); });
    }
    for (auto& t : threads) t.join();
    for (int id = 0; id < 3; ++id) EXPECT_EQ(results[id].error, "") << "learner " << id;
    return results;
  }

  // The syncer's durable Θ, read as the evaluator reads it.
  wire::Snapshot snapshot() {
    auto client = net_.endpoint("reader").connect_syncer(kAddress);
    wire::JoinRequest req{handshake_, -1, "reader", std::nullopt, {}, ""};
    const auto joined = client->join(req, 5s);
    EXPECT_TRUE(joined.ok()) << joined.status.message;
    const auto snap = client->snapshot(joined.value.session_id, 5s);
    EXPECT_TRUE(snap.ok()) << snap.status.message;
    return snap.value;
  }

  // Every learner's own parameters equal Θ, fragment by fragment, at the syncer's versions.
  void expect_copies_equal_theta(const std::vector<LearnerResult>& results) {
    const wire::Snapshot snap = snapshot();
    ASSERT_EQ(snap.fragments.size(), 2u);
    int compared = 0;
    for (int id = 0; id < 3; ++id) {
      ASSERT_EQ(results[id].hashes.size(), 2u) << "learner " << id;
      for (int p = 0; p < 2; ++p) {
        EXPECT_EQ(results[id].versions[p], snap.fragments[p].version) << "learner " << id << " fragment " << p;
        EXPECT_EQ(results[id].hashes[p], fnv1a64_hex(wire::fragment_values(snap.fragments[p])))
            << "learner " << id << "'s copy of fragment " << p << " is not Θ";
        ++compared;
      }
    }
    EXPECT_EQ(compared, 6);
  }

  std::vector<json> events_of(const std::string& file) const {
    std::vector<json> out;
    std::ifstream in(dir_ / "events" / file);
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) out.push_back(json::parse(line));
    }
    return out;
  }
  std::vector<json> named(const std::vector<json>& events, const std::string& name) const {
    std::vector<json> out;
    for (const auto& e : events) {
      if (e["event"] == name) out.push_back(e);
    }
    return out;
  }

  static constexpr int64_t kSteps = 300;
  std::chrono::milliseconds step_time_{2};
  wire::Codec codec_ = wire::Codec::kFp32;  // every learner's outer-gradient codec
  bool error_feedback_ = false;
  fs::path dir_;
  Config config_;
  FragmentLayout layout_;
  wire::Handshake handshake_;
  inproc::InprocNetwork net_;
  std::function<bool(int, int64_t)> before_persist_;
  int syncer_starts_ = 0;
  std::unique_ptr<EventLog> syncer_events_;
  std::unique_ptr<SyncerService> service_;
  std::unique_ptr<wire::Server> server_;
};

TEST_F(ProtocolTest, ThreeLearnersMergeAndEveryCopyEndsEqualToTheta) {
  start_syncer();
  const auto results = run_all();
  const auto merged = named(events_of("syncer_1.jsonl"), "merged");
  ASSERT_GT(merged.size(), 20u);
  int combined = 0;
  for (const auto& m : merged) combined += m["participants"].size() >= 2 ? 1 : 0;
  EXPECT_GT(combined, 0) << "no merge combined two or more learners";
  expect_copies_equal_theta(results);
  // Versions only increase, as every learner applies them.
  for (int id = 0; id < 3; ++id) {
    std::map<int, int64_t> last;
    for (const auto& e : named(events_of("learner_" + std::to_string(id) + ".jsonl"), "applied")) {
      const int p = e["fragment"];
      EXPECT_GT(e["version"].get<int64_t>(), last[p]) << "learner " << id << " applied an older version";
      last[p] = e["version"];
    }
  }
}

TEST_F(ProtocolTest, AMergeIsAppliedTauStepsAfterTheCaptureOfTheAnswerItTook) {
  // τ = 6 steps of 8 ms: a merge usually arrives before s + τ and waits for it (a round trip through the syncer's
  // merger takes ~10 ms, a few times that on a loaded machine); H = 24 leaves one round of each fragment in flight.
  config_.diloco.inner_steps = 24;
  config_.diloco.overlap = 6;
  step_time_ = std::chrono::milliseconds(8);
  start_syncer();
  run_all();
  int checked = 0, exactly_tau = 0;
  for (int id = 0; id < 3; ++id) {
    const auto events = events_of("learner_" + std::to_string(id) + ".jsonl");
    std::map<std::pair<int, int64_t>, int64_t> applied_at;  // (fragment, version) -> step, while it trained
    for (const auto& e : named(events, "applied")) {
      if (e["step"].get<int64_t>() < kSteps) applied_at[{e["fragment"], e["version"]}] = e["step"];  // not the flush
    }
    for (const auto& k : named(events, "kept")) {
      const auto it = applied_at.find({k["fragment"], k["version"]});
      if (it == applied_at.end()) continue;  // overtaken by a newer version before its step came
      const int64_t captured = k["captured_step"];
      EXPECT_GE(it->second, captured + config_.diloco.overlap)
          << "learner " << id << " applied fragment " << k["fragment"] << " v" << k["version"] << " before s + τ";
      exactly_tau += it->second == captured + config_.diloco.overlap ? 1 : 0;
      ++checked;
    }
  }
  EXPECT_GT(checked, 10);
  EXPECT_GT(exactly_tau, 0) << "no merge was applied at s + τ exactly: each came after s + τ, so this run could "
                               "not tell a held-back merge from one applied on arrival";
}

TEST_F(ProtocolTest, ALearnerCutOffReattachesAndIsMergedAgain) {
  // Learner 1's link is cut at its step 60 and stays cut, for at least 100 of its steps, until the syncer has
  // merged a round without it since the cut (a round that waited its answer window for its lost answer, or one it
  // had not reached); it keeps training, slowed to 10 ms a step past its step 160 so it does not run far ahead. Once
  // re-attached it trains until the syncer has merged a round with it again; the others train until it is done,
  // slowed to 10 ms a step past kSteps so a learner 1 that lagged catches up and reaches a round among the first
  // K. Sized in steps and the syncer's own events, with a budget nobody reaches first: on any machine, loaded or
  // not, the cut outlasts a round and every learner is still training when learner 1 is merged again.
  config_.train.total_tokens = 1'000'000'000;
  start_syncer();
  std::atomic<bool> learner_1_done{false};
  std::atomic<double> cut_at{0}, back_at{0};  // event clock (system clock, s)
  const auto now_s = [] {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  };
  // Whether the syncer merged a training round (not the final flush) after `after_t` (event time, s): with learner
  // 1 among the participants when `with_1`, without it otherwise. K = 2 of 3 without a grace window leaves the last
  // learner to reach a round out of it, so merges without learner 1 also happen before the cut: only those after
  // it count.
  const auto merged = [&](bool with_1, double after_t) {
    std::ifstream in(dir_ / "events" / "syncer_1.jsonl");
    for (std::string line; std::getline(in, line);) {
      if (line.find("\"merged\"") == std::string::npos) continue;
      const json e = json::parse(line, nullptr, /*allow_exceptions=*/false);  // the last line may be half written
      if (e.is_discarded() || e["event"] != "merged" || e["round"] == -1 || e["t"].get<double>() <= after_t) continue;
      const auto& who = e["participants"];
      if ((std::find(who.begin(), who.end(), 1) != who.end()) == with_1) return true;
    }
    return false;
  };
  const StepHook learner_1 = [&](int64_t step, const OuterSync&, const LearnerLink& link) {
    static thread_local bool cut = false;
    if (step == 60) {
      cut_at = now_s();
      net_.cut("learner 1", cut = true);
    }
    if (cut && step >= 160 && merged(false, cut_at.load())) net_.cut("learner 1", cut = false);
    if (cut && step >= 160) std::this_thread::sleep_for(10ms);
    if (back_at.load() == 0 && link.reconnects() >= 1) back_at = now_s();
    if (back_at.load() > 0 && step % 5 == 0) learner_1_done = merged(true, back_at.load());
    return learner_1_done.load();
  };
  const StepHook others = [&](int64_t step, const OuterSync&, const LearnerLink&) {
    if (step >= kSteps && !learner_1_done.load()) std::this_thread::sleep_for(10ms);
    return step >= kSteps && learner_1_done.load();
  };
  const auto results = run_all({{0, others}, {1, learner_1}, {2, others}}, {{0, 1'000'000}, {1, 1'000'000}, {2, 1'000'000}});
  EXPECT_GE(results[1].reconnects, 1);
  // Merges of training rounds without learner 1 while it was away, and with it again after it came back.
  int without_1 = 0, with_1_after = 0;
  for (const auto& m : named(events_of("syncer_1.jsonl"), "merged")) {
    if (m["round"] == -1) continue;  // the final flush
    bool has_1 = false;
    for (int who : m["participants"]) has_1 |= who == 1;
    const double t = m["t"];
    without_1 += !has_1 && t > cut_at.load() && t <= back_at.load() ? 1 : 0;
    with_1_after += has_1 && t > back_at.load() ? 1 : 0;
  }
  EXPECT_GT(without_1, 0) << "no merge went ahead without the cut learner";
  EXPECT_GT(with_1_after, 0) << "learner 1 was never merged again during training after it came back";
  expect_copies_equal_theta(results);
}

TEST_F(ProtocolTest, ALearnerWhoseBaseIsGoneReanchors) {
  // The next two merged fragments for learner 2 never reach it (it stays connected and live): its base falls
  // behind Θ, and with anchor_versions = 1 the syncer no longer holds that base, so its next answer of each such
  // fragment must be raw θ (base −1), and the merge must take it.
  start_syncer();
  const auto results = run_all({{2, [&](int64_t step, const OuterSync&, const LearnerLink&) {
                                   if (step == 40) net_.drop_merges("learner 2", 2);
                                   return false;
                                 }}});
  EXPECT_EQ(net_.dropped_merges("learner 2"), 2);
  int reanchored = 0;
  for (const auto& a : named(events_of("learner_2.jsonl"), "answered")) reanchored += a["base_version"] == -1 ? 1 : 0;
  EXPECT_GT(reanchored, 0) << "learner 2 answered against a base the syncer no longer holds";
  EXPECT_TRUE(named(events_of("syncer_1.jsonl"), "answer_refused").empty()) << "an answer was refused";
  expect_copies_equal_theta(results);
}

TEST_F(ProtocolTest, ADroppedAnswerClosesTheRoundAtItsWindowWithoutThatLearner) {
  start_syncer();
  const auto results = run_all({{2, [&](int64_t step, const OuterSync&, const LearnerLink&) {
                                   if (step == 40) net_.drop_answers("learner 2", 1);
                                   return false;
                                 }}});
  EXPECT_EQ(net_.dropped_answers("learner 2"), 1);
  bool closed_without_2 = false;
  for (const auto& e : named(events_of("syncer_1.jsonl"), "answer_window_closed")) {
    for (int who : e["missing"]) closed_without_2 |= who == 2;
  }
  EXPECT_TRUE(closed_without_2) << "the round waited for an answer that never came";
  EXPECT_FALSE(named(events_of("learner_2.jsonl"), "answer_not_merged").empty());
  expect_copies_equal_theta(results);
}

// Learner 1's answers seen on the wire (`answered`: its "answered" events) go as `codec`, or as fp32 only for a re-anchor (raw θ, base −1: the learner
// fell two versions behind, as a slow one under ASan does when the global clock opens the next round while its last
// merge still waits for s + τ; docs/protocol.md §4); at least one goes as `codec`.
void expect_codec_or_reanchor(const std::vector<std::string>& seen, const std::vector<nlohmann::json>& answered,
                              const std::string& codec) {
  int reanchored = 0;
  for (const auto& e : answered) reanchored += e["base_version"] == -1 ? 1 : 0;
  const auto raw = std::count(seen.begin(), seen.end(), std::string("fp32"));
  EXPECT_LE(raw, reanchored) << "an answer went as fp32 without being a re-anchor";
  for (const auto& c : seen) EXPECT_TRUE(c == codec || c == "fp32") << c;
  EXPECT_GT(static_cast<int64_t>(seen.size()) - raw, 0) << "no answer went as " << codec;
}

// Issue 14: q4 outer gradients with error feedback (transport/codec.h). Every answer goes as "q4/64" (seen on the
// wire by a pass-through edit), the syncer refuses none, merges combine learners, and every learner's copy ends
// bitwise equal to the syncer's Θ (the downlink is fp32).
TEST_F(ProtocolTest, Q4OuterGradientsWithErrorFeedbackMergeAndEveryCopyEndsEqualToTheta) {
  codec_ = wire::Codec::kQ4;
  error_feedback_ = true;
  start_syncer();
  std::vector<std::string> seen;
  std::mutex seen_mu;
  const auto results = run_all({{1, [&](int64_t step, const OuterSync&, const LearnerLink&) {
                                   if (step == 20) {
                                     std::vector<std::function<bool(wire::Payload&)>> look(3, [&](wire::Payload& p) {
                                       std::lock_guard lock(seen_mu);
                                       seen.push_back(p.codec);
                                       return true;
                                     });
                                     net_.tamper_answers("learner 1", look);
                                   }
                                   return false;
                                 }}});
  ASSERT_FALSE(seen.empty());
  expect_codec_or_reanchor(seen, named(events_of("learner_1.jsonl"), "answered"), "q4/64");
  EXPECT_TRUE(named(events_of("syncer_1.jsonl"), "answer_refused").empty());
  const auto merged = named(events_of("syncer_1.jsonl"), "merged");
  EXPECT_GT(merged.size(), 20u);
  expect_copies_equal_theta(results);
}

// Issue 33: sparse outer gradients both ways (topk, transport/sparse_codec.h: 1/64 of the values, 2 bits each) with
// error feedback at SparseLoCo's decay β = 0.95. Every answer goes as "topk/4096", the norm screen refuses none of the
// honest sparse answers (no allowance for topk: they are compared as sent), merges combine learners and go down as
// sparse updates, and every learner's copy ends bitwise equal to the syncer's Θ.
// Both ways at the default density (1/64, "topk/4096") and at 1/16 ("topk/4096/16", diloco.topk_density), which the
// syncer asks of every answer and sends down.
class TopKDensity : public ProtocolTest, public ::testing::WithParamInterface<int64_t> {};

TEST_P(TopKDensity, TopKBothWaysWithErrorFeedbackMergesAndEveryCopyEndsEqualToTheta) {
  const int64_t density = GetParam();
  const std::string wire_name = density == 64 ? "topk/4096" : "topk/4096/" + std::to_string(density);
  config_.diloco.topk_density = density;
  codec_ = wire::Codec::kTopK;
  error_feedback_ = true;
  config_.diloco.wire_down = WireDtype::kTopK;
  config_.diloco.error_feedback_decay = 0.95;
  // topk gets no error-feedback allowance in the screen (syncer_merge.cc): an honest short answer after a long one
  // carries the long one's residual, and under ASan with other tests beside it one was 13.2× the median (1 run in
  // ~20). The screen is tested at its default ratio elsewhere; here at 30, with that limit in docs/protocol.md §10.
  config_.diloco.screen_ratio = 30.0;
  start_syncer();
  std::vector<std::string> seen;
  std::mutex seen_mu;
  const auto results = run_all({{1, [&](int64_t step, const OuterSync&, const LearnerLink&) {
                                   if (step == 20) {
                                     std::vector<std::function<bool(wire::Payload&)>> look(3, [&](wire::Payload& p) {
                                       std::lock_guard lock(seen_mu);
                                       seen.push_back(p.codec);
                                       return true;
                                     });
                                     net_.tamper_answers("learner 1", look);
                                   }
                                   return false;
                                 }}});
  ASSERT_FALSE(seen.empty());
  expect_codec_or_reanchor(seen, named(events_of("learner_1.jsonl"), "answered"), wire_name);
  EXPECT_TRUE(named(events_of("syncer_1.jsonl"), "answer_refused").empty());
  int combined = 0;
  for (const auto& m : named(events_of("syncer_1.jsonl"), "merged")) combined += m["participants"].size() >= 2 ? 1 : 0;
  int updates = 0;
  for (const auto& e : named(events_of("learner_0.jsonl"), "applied")) updates += e["from"] == "update" ? 1 : 0;
  std::printf("%s: %d merges of two or more learners, %d sparse updates applied by learner 0\n", wire_name.c_str(), combined,
              updates);
  // (was > 20: 18 in 1 run of 8 on an idle machine, the rounds' timing decides how many close with both answers)
  EXPECT_GE(combined, 8) << "merges did not combine learners";
  EXPECT_GE(updates, 10) << "merges did not go down as sparse updates";
  expect_copies_equal_theta(results);
}

INSTANTIATE_TEST_SUITE_P(ProtocolTest, TopKDensity, ::testing::Values(int64_t{64}, int64_t{16}));

// Issue 14 part 3: q4 both ways with error feedback both ways. The syncer sends each merge as an encoded update
// (after a whole first copy per session) and keeps as Θ exactly what the learners rebuild; two merges to learner 1
// vanish on the way, so its next update is against a version it lacks: it refuses to guess, re-opens its session,
// gets a whole copy and goes on applying updates. Sized in versions (learner 1 trains until it has applied six
// more of every fragment after re-attaching; the others until it is done), so it holds on any machine. Every copy
// ends bitwise equal to Θ.
TEST_F(ProtocolTest, Q4BothWaysKeepsEveryCopyBitwiseEqualToThetaAndRecoversFromALostUpdate) {
  codec_ = wire::Codec::kQ4;
  error_feedback_ = true;
  config_.diloco.wire_down = WireDtype::kQ4;
  config_.diloco.error_feedback = true;
  config_.train.total_tokens = 3 * 1'000'000 * kTokensPerStep;  // the learners train until the test has seen enough
  start_syncer();
  std::atomic<bool> learner_1_done{false};
  const StepHook learner_1 = [&](int64_t step, const OuterSync& sync, const LearnerLink& link) {
    if (step == 40) net_.drop_merges("learner 1", 2);
    static thread_local std::vector<int64_t> at_reattach;
    // Six versions past the ones held at the re-attach: the whole copies may jump a few, the rest are updates.
    learner_1_done = applied_since_reattach(sync, link, 6, at_reattach);
    return learner_1_done.load();
  };
  const StepHook others = [&](int64_t step, const OuterSync&, const LearnerLink&) {
    return step >= kSteps && learner_1_done.load();
  };
  const auto results = run_all({{0, others}, {1, learner_1}, {2, others}}, {{0, 1'000'000}, {1, 1'000'000}, {2, 1'000'000}});
  EXPECT_EQ(net_.dropped_merges("learner 1"), 2);
  const auto learner_1_events = events_of("learner_1.jsonl");
  const auto gaps = named(learner_1_events, "merged_gap");
  ASSERT_FALSE(gaps.empty()) << "an update against a version learner 1 never got was not noticed";
  EXPECT_GE(results[1].reconnects, 1) << "learner 1 did not re-open its session for a whole copy";
  int updates_after_gap = 0;
  for (const auto& e : named(learner_1_events, "applied")) {
    updates_after_gap += e["from"] == "update" && e["t"].get<double>() > gaps[0]["t"].get<double>() ? 1 : 0;
  }
  EXPECT_GE(updates_after_gap, 4) << "learner 1 did not go back to applying updates after its whole copy";
  // Learner 0 kept one session: one whole copy of each fragment, then updates only.
  int whole = 0, updates = 0;
  for (const auto& e : named(events_of("learner_0.jsonl"), "applied")) (e["from"] == "whole" ? whole : updates) += 1;
  EXPECT_LE(whole, 2);
  EXPECT_GE(updates, 10);
  for (const char* who : {"learner_0.jsonl", "learner_1.jsonl", "learner_2.jsonl"}) {
    EXPECT_TRUE(named(events_of(who), "merged_refused").empty()) << who;
  }
  EXPECT_TRUE(named(events_of("syncer_1.jsonl"), "answer_refused").empty());
  expect_copies_equal_theta(results);
}

// A well-formed topk answer at another density than the run's ("topk/4096" where the run sends "topk/4096/16") is
// refused for its codec (§10): a learner may not pick how much of its outer gradient it drops; the run goes on.
TEST_F(ProtocolTest, ATopKAnswerAtAnotherDensityThanTheRunsIsRefused) {
  codec_ = wire::Codec::kTopK;
  error_feedback_ = true;
  config_.diloco.topk_density = 16;
  config_.diloco.error_feedback_decay = 0.95;
  config_.diloco.screen_ratio = 30.0;  // as in TopKDensity: the screen is not what this checks
  start_syncer();
  std::atomic<int> applied{0};
  const std::vector<std::function<bool(wire::Payload&)>> edits = {[&applied](wire::Payload& p) {
    std::vector<float> values;
    if (p.codec != "topk/4096/16" || !wire::decode(p, values).empty()) return false;
    p = wire::encode(values, wire::Codec::kTopK);  // the default density: "topk/4096"
    ++applied;
    return true;
  }};
  const auto results = run_all({{0, [&](int64_t step, const OuterSync&, const LearnerLink&) {
                                   if (step == 8) net_.tamper_answers("learner 0", edits);
                                   return false;
                                 }}});
  ASSERT_EQ(applied.load(), 1);
  const auto refused = named(events_of("syncer_1.jsonl"), "answer_refused");
  ASSERT_EQ(refused.size(), 1u);
  const std::string why = refused[0]["reason"];
  EXPECT_NE(why.find("codec 'topk/4096': this run's answers are fp32 or topk/4096/16"), std::string::npos) << why;
  expect_copies_equal_theta(results);
}

// A learner whose answers arrive malformed (an unknown codec, a cut payload, a wrong count, a NaN, an infinite and a
// negative scale, an integer outside the range): the syncer refuses each with its reason, counts it, merges nothing
// from it, and the run goes on to the end with every copy equal to Θ.
TEST_F(ProtocolTest, MalformedQuantizedAnswersAreRefusedCountedAndTheRunGoesOn) {
  codec_ = wire::Codec::kQ8;
  start_syncer();
  // Each edit waits for a q8 answer (a re-anchoring answer goes as fp32 and passes) and counts what it broke.
  std::atomic<int> applied{0};
  auto on_q8 = [&applied](std::function<void(wire::Payload&)> edit) {
    return [&applied, edit](wire::Payload& p) {
      if (p.codec.rfind("q8/", 0) != 0) return false;
      edit(p);
      ++applied;
      return true;
    };
  };
  auto set_scale = [](float v) {
    return [v](wire::Payload& p) { std::memcpy(p.bytes.data() + 8, &v, sizeof(v)); };
  };
  // Each refused answer holds its round for the answer window (2 s) while the toy learners' 300 steps take well
  // under a second, so only the first four or so meet an answer: the four distinct kinds come first (every kind is
  // refused in codec_test; these check the syncer's handling of any of them).
  const std::vector<std::function<bool(wire::Payload&)>> edits = {
      on_q8([](wire::Payload& p) {  // a well-formed payload in another block than the run's (§10 "codec")
        std::vector<float> values;
        if (wire::decode(p, values).empty()) p = wire::encode(values, wire::Codec::kQ8, 16);
      }),
      on_q8(set_scale(std::numeric_limits<float>::quiet_NaN())),
      on_q8([](wire::Payload& p) { p.bytes.back() = static_cast<char>(0x80); }),  // int8 −128
      on_q8([](wire::Payload& p) { p.bytes.pop_back(); }),
      on_q8([](wire::Payload& p) { p.bytes[0] = static_cast<char>(p.bytes[0] + 1); }),  // the value count
      on_q8(set_scale(std::numeric_limits<float>::infinity())),
      on_q8(set_scale(-1.0f)),
  };
  const auto results = run_all({{0, [&](int64_t step, const OuterSync&, const LearnerLink&) {
                                   if (step == 8) net_.tamper_answers("learner 0", edits);
                                   return false;
                                 }}});
  std::set<std::string> reasons;
  int refused = 0;
  for (const auto& e : named(events_of("syncer_1.jsonl"), "answer_refused")) {
    const std::string why = e["reason"];
    EXPECT_EQ(e["learner"], 0) << why;
    EXPECT_EQ(why.rfind("undecodable payload: ", 0), 0u) << why;
    reasons.insert(why.substr(0, why.find_first_of("0123456789")));
    ++refused;
  }
  EXPECT_GE(applied.load(), 4) << "the first four edits should have met a q8 answer";
  EXPECT_EQ(refused, applied.load()) << "each malformed answer refused once, nothing else";
  EXPECT_GE(reasons.size(), 4u);
  EXPECT_TRUE(reasons.count("undecodable payload: codec 'q")) << "the q8/16 answer was not refused for its block";
  EXPECT_EQ(service_->status().answers_refused, applied.load());
  expect_copies_equal_theta(results);
}

// Screening end to end (docs/protocol.md §10): once every fragment has been merged (so each round has references:
// the round's other answers and the fragment's recent merged ones) learner 0's answers carry 10^4 times its outer
// gradient (a bug or a hostile learner; still finite and well formed). Started at a fixed step instead, a learner
// that ran ahead answered a fragment's first round with it, where one honest answer is no median: under load in CI
// (ASan) that round merged it. The syncer refuses them as "norm" and merges the
// others': Θ ends within 2× of where an honest run of the same set-up puts it (max |Θ|), and every copy ends equal
// to Θ. Screening off, the same outliers throw Θ over 10× beyond it: the test can fail.
TEST_F(ProtocolTest, OutlierAnswersAreRefusedByNormAndThetaStaysWhereHonestTrainingPutsIt) {
  float honest = 0;
  for (const std::string run : {"honest", "screened", "unscreened"}) {
    SCOPED_TRACE(run);
    config_.diloco.screen_ratio = run == "unscreened" ? 0.0 : 10.0;
    fs::remove_all(dir_);  // each run in a clean folder
    fs::create_directories(dir_ / "events");
    start_syncer();
    std::atomic<int> applied{0};
    auto scale = [&applied](wire::Payload& p) {
      std::vector<float> values;
      if (!wire::decode(p, values).empty()) return false;
      for (float& v : values) v *= 1e4f;
      p = wire::encode(values, wire::Codec::kFp32);
      ++applied;
      return true;
    };
    bool tampering = false;
    const auto results = run_all({{0, [&](int64_t, const OuterSync& sync, LearnerLink&) {
                                     const auto& v = sync.versions();
                                     const bool every_fragment_merged =
                                         std::all_of(v.begin(), v.end(), [](int64_t x) { return x >= 1; });
                                     if (!tampering && every_fragment_merged && run != "honest") {
                                       tampering = true;
                                       net_.tamper_answers("learner 0", std::vector<std::function<bool(wire::Payload&)>>(6, scale));
                                     }
                                     return false;
                                   }}});
    const wire::Snapshot snap = snapshot();
    float largest = 0;
    for (const auto& f : snap.fragments) {
      for (float v : wire::fragment_values(f)) largest = std::max(largest, std::fabs(v));
    }
    const auto refused = named(events_of("syncer_" + std::to_string(syncer_starts_) + ".jsonl"), "answer_refused");
    const int64_t by_norm = std::count_if(refused.begin(), refused.end(), [](const json& e) {
      return e.value("kind", "") == "norm";
    });
    if (run == "honest") {
      honest = largest;
      EXPECT_EQ(by_norm, 0) << "an honest answer was screened out";
      EXPECT_TRUE(named(events_of("syncer_" + std::to_string(syncer_starts_) + ".jsonl"), "refetch_told").empty());
      expect_copies_equal_theta(results);
    } else if (run == "screened") {
      ASSERT_GE(applied.load(), 3);
      EXPECT_GE(by_norm, applied.load() - 1) << "each outlier that reached a merge with two reference values";
      for (const auto& e : refused) EXPECT_EQ(e["learner"], 0) << e.dump();
      EXPECT_LT(largest, 2 * honest) << "honest run: max |Θ| " << honest;
      EXPECT_EQ(service_->status().answers_refused_by_kind.at("norm"), by_norm);
      expect_copies_equal_theta(results);
      // §10: learner 0 is told to re-fetch Θ_p at every 3rd refusal in a row of its answers of p (a merged answer of
      // its own of p starts the count again), as the syncer's own events show; it takes Θ_p whole, or skips it when a
      // merge of p at that version waits to be applied anyway.
      const auto events = events_of("syncer_" + std::to_string(syncer_starts_) + ".jsonl");
      std::map<int, int> in_a_row;
      int expected = 0;
      for (const auto& e : events) {
        if (e["event"] == "answer_refused" && e["learner"] == 0 && e.value("kind", "") == "norm" &&
            ++in_a_row[e["fragment"].get<int>()] == 3) {
          ++expected, in_a_row[e["fragment"].get<int>()] = 0;
        }
        if (e["event"] == "merged") {
          const auto who = e["participants"].get<std::vector<int>>();
          if (std::find(who.begin(), who.end(), 0) != who.end()) in_a_row[e["fragment"].get<int>()] = 0;
        }
      }
      const auto told = named(events, "refetch_told");
      EXPECT_GE(expected, 1) << "the test needs three refusals in a row";
      EXPECT_EQ(static_cast<int>(told.size()), expected);
      for (const auto& e : told) EXPECT_EQ(e["learner"], 0) << e.dump();
      EXPECT_EQ(service_->monitor_status()["screening"]["refetches"], static_cast<int64_t>(told.size()));
      const auto learner0 = events_of("learner_0.jsonl");
      EXPECT_GE(named(learner0, "refetch").size() + named(learner0, "refetch_skipped").size(), 1u);
    } else {
      EXPECT_EQ(by_norm, 0);
      EXPECT_GT(largest, 10 * honest) << "unscreened, the outliers should have moved Θ";
    }
    stop_syncer();
  }
}

// Metadata a learner cannot have sent honestly (docs/protocol.md §10), sent by learner 0 in the middle of the run:
// a step of 10^12 (the syncer used to enumerate 10^12 due rounds under its lock and die of bad_alloc), 10^15 tokens
// trained (it would end a shared-budget run), an infinite step time (the lease is 3 step times). Each is ignored
// whole and counted; the clock never moves past the run's own steps and the run ends with every copy equal to Θ.
TEST_F(ProtocolTest, ImpossibleMetadataIsIgnoredCountedAndTheRunGoesOn) {
  start_syncer();
  // Each is posted once the one before was counted: the link keeps only the newest metadata queued.
  int posted = 0;
  const auto results = run_all({{0, [&](int64_t step, const OuterSync& sync, LearnerLink& link) {
                                   if (step != 10) return false;
                                   for (int k = 0; k < 3; ++k) {
                                     wire::Metadata m;
                                     sync.fill_counters(m);
                                     m.stream = 0;
                                     m.step = k == 0 ? 1'000'000'000'000 : step;
                                     m.tokens_trained = k == 1 ? 1'000'000'000'000'000 : 0;
                                     m.step_time_s = k == 2 ? std::numeric_limits<double>::infinity() : 0.01;
                                     link.post(m);
                                     const auto deadline = std::chrono::steady_clock::now() + 10s;
                                     while (service_->status().reports_refused <= k &&
                                            std::chrono::steady_clock::now() < deadline) {
                                       std::this_thread::sleep_for(1ms);
                                     }
                                     ++posted;
                                   }
                                   return false;
                                 }}});
  ASSERT_EQ(posted, 3);
  const wire::StatusReply status = service_->status();
  EXPECT_EQ(status.reports_refused, 3);
  EXPECT_LT(status.global_step, 1000);
  EXPECT_LT(status.tokens_trained, 1'000'000);
  const auto refused = named(events_of("syncer_1.jsonl"), "report_refused");
  ASSERT_FALSE(refused.empty());
  EXPECT_EQ(refused[0]["learner"], 0);
  expect_copies_equal_theta(results);
}

// Issue 16's probes of who may say what (docs/protocol.md §12): a caller with a wrong secret gets the one answer and
// leaves nothing in the syncer's events (its host is not logged); a right secret with another run id is refused
// without the syncer's run id in the message; a learner's session cannot report an evaluation, and the evaluator's
// cannot report a step or versions the syncer has not reached or a negative loss (each counted); an honest
// report is taken.
TEST_F(ProtocolTest, StrangersAndFakeEvaluationsAreRefusedCountedAndNotLogged) {
  handshake_.secret = "s3cret";
  start_syncer();
  const auto client = net_.endpoint("stranger").connect_syncer(kAddress);
  wire::JoinRequest join;
  join.handshake = handshake_;
  join.handshake.secret = "guess";
  join.handshake.run_id = "guessed-run";
  join.host = "evil-host";
  const auto unauthenticated = client->join(join, 5s);
  EXPECT_EQ(unauthenticated.status.code, wire::Code::kUnauthenticated);
  EXPECT_EQ(unauthenticated.status.message, wire::kNotAuthenticated);
  join.handshake.secret = "s3cret";
  join.host = "authenticated-host";  // past the secret, a refusal is logged (with the host)
  const auto other_run = client->join(join, 5s);
  EXPECT_EQ(other_run.status.code, wire::Code::kRefused);
  EXPECT_NE(other_run.status.message.find("'guessed-run'"), std::string::npos) << other_run.status.message;
  EXPECT_EQ(other_run.status.message.find("'protocol'"), std::string::npos) << other_run.status.message;

  join.handshake = handshake_;
  join.learner_id = 0;
  const auto learner = client->join(join, 5s);
  ASSERT_TRUE(learner.ok()) << learner.status.message;
  join.learner_id = -1;
  const auto evaluator = client->join(join, 5s);
  ASSERT_TRUE(evaluator.ok()) << evaluator.status.message;
  const std::vector<int64_t> versions = evaluator.value.fragment_versions;
  const wire::EvalReport fakes[] = {
      {learner.value.session_id, 0, 0.01, versions, 1.0},                 // a learner's session
      {evaluator.value.session_id, 1'000'000'000, 0.01, versions, 1.0},   // a step the run has not reached
      {evaluator.value.session_id, 0, -1.0, versions, 1.0},               // a negative loss
      {evaluator.value.session_id, 0, 0.01, {versions[0] + 5, 0}, 1.0}};  // a version never published
  for (const auto& fake : fakes) EXPECT_EQ(client->report_eval(fake, 5s).status.code, wire::Code::kInvalid);
  const auto honest = client->report_eval({evaluator.value.session_id, 0, 3.25, versions, 1.0}, 5s);
  ASSERT_TRUE(honest.ok()) << honest.status.message;
  EXPECT_EQ(honest.value.last_val_loss, 3.25);
  EXPECT_EQ(honest.value.reports_refused, 4);

  stop_syncer();
  const std::string text = [&] {
    std::ifstream in(dir_ / "events" / "syncer_1.jsonl");
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }();
  EXPECT_EQ(text.find("evil-host"), std::string::npos) << "an unauthenticated request was logged";
  EXPECT_NE(text.find("\"call_refused\""), std::string::npos);
  EXPECT_EQ(named(events_of("syncer_1.jsonl"), "eval_refused").size(), 4u);
}

// A compressed downlink across a syncer that comes back with an older history (its persisted fragments gone: it
// restarts every fragment from version 0): the learners hold higher versions, so their deltas are against bases
// the syncer never had (they re-anchor: the pull names the syncer's version) and the new session's whole copies
// come at lower versions than theirs. Each learner takes them as the syncer's word (within one syncer versions
// only grow), goes on with updates against them, and every copy ends bitwise equal to the new Θ.
TEST_F(ProtocolTest, ACompressedDownlinkFollowsASyncerThatCameBackWithAnOlderHistory) {
  codec_ = wire::Codec::kQ4;
  config_.diloco.wire_down = WireDtype::kQ4;
  config_.train.total_tokens = 3 * 1'000'000 * kTokensPerStep;  // the learners train until the test has seen enough
  start_syncer();
  std::atomic<bool> restart{false}, restarted{false};
  std::thread restarter([&] {
    while (!restart.load()) std::this_thread::sleep_for(1ms);
    stop_syncer();
    for (const auto& f : fs::directory_iterator(dir_ / "syncer")) {
      if (f.path().filename().string().rfind("fragment_", 0) == 0) fs::remove(f.path());
    }
    start_syncer();
    restarted = true;
  });
  const StepHook trigger = [&](int64_t step, const OuterSync& sync, const LearnerLink&) {
    if (step >= 60 && sync.versions()[0] >= 3 && sync.versions()[1] >= 3) restart = true;
    return false;
  };
  // Each learner trains on until it has seen its copies change 12 times since the restart (merges of the new
  // syncer, up or down in version): sized in merges, not time.
  const StepHook others = [&](int64_t step, const OuterSync& sync, const LearnerLink&) {
    static thread_local std::vector<int64_t> last;
    static thread_local int changes = 0;
    if (restarted.load()) {
      if (!last.empty() && sync.versions() != last) ++changes;
      last = sync.versions();
    }
    return step >= kSteps && changes >= 12;
  };
  const auto results = run_all({{0, [&](int64_t step, const OuterSync& sync, LearnerLink& link) {
                                   trigger(step, sync, link);
                                   return others(step, sync, link);
                                 }},
                                {1, others}, {2, others}},
                               {{0, 1'000'000}, {1, 1'000'000}, {2, 1'000'000}});
  restart = true;  // in case learner 0 never triggered it (the test then fails below)
  restarter.join();
  int replaced = 0, reanchored = 0;
  for (const char* who : {"learner_0.jsonl", "learner_1.jsonl", "learner_2.jsonl"}) {
    const auto events = events_of(who);
    for (const auto& e : named(events, "answered")) reanchored += e["base_version"] == -1 ? 1 : 0;
    int64_t highest = -1;
    for (const auto& e : named(events, "applied")) {
      if (e["from"] == "whole" && e["version"].get<int64_t>() < highest) ++replaced;
      highest = std::max(highest, e["version"].get<int64_t>());
    }
  }
  EXPECT_GT(replaced, 0) << "no learner took a whole copy at a lower version than its own";
  EXPECT_GT(reanchored, 0) << "no learner re-anchored against the syncer's older history";
  EXPECT_GT(named(events_of("syncer_2.jsonl"), "merged").size(), 10u) << "the restarted syncer merged (almost) nothing";
  expect_copies_equal_theta(results);
}

TEST_F(ProtocolTest, ASyncerKilledBetweenMergeAndPersistHandsOutNoVersionItLoses) {
  // The merger "dies" right after merging fragment 0 to version 4, before persisting it. Until then nobody may
  // be handed version 4 (fragment, snapshot, join, broadcast): the restarted syncer re-issues version 4 with other
  // contents, and a learner holding the lost one would take deltas against the wrong base.
  std::atomic<bool> died{false};
  before_persist_ = [&](int p, int64_t version) {
    if (p != 0 || version != 4 || died.exchange(true)) return true;
    return false;
  };
  start_syncer();
  std::thread restarter([&] {
    while (!died.load()) std::this_thread::sleep_for(1ms);
    const wire::Snapshot snap = snapshot();
    EXPECT_EQ(snap.fragments.at(0).version, 3) << "a version that was never persisted was handed out";
    stop_syncer();
    before_persist_ = nullptr;
    start_syncer();  // restores version 3 from run_dir/syncer
  });
  const auto results = run_all();
  restarter.join();
  EXPECT_TRUE(died.load());
  expect_copies_equal_theta(results);
  for (int id = 0; id < 3; ++id) EXPECT_GE(results[id].reconnects, 1) << "learner " << id << " never re-attached";
}

}  // namespace
}  // namespace dloco
