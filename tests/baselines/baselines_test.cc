// The baselines pinned down by equivalences, each with what was measured:
// - dp with 2 workers (threads over a real Gloo group) vs one process on the doubled batch: bit-identical, and both
//   workers hold identical parameters;
// - diloco with H = 1, η = 1, μ = 0 is averaging the workers' parameters after every step (within 1e-5);
// - streaming with P = 1 and τ = 0 equals diloco, bit-identical, though the two run separate code
//   (baselines/outer_loops.cc: whole-model sync vs fragment path); decoupled configured synchronously equals
//   diloco (within 1e-5).
// - dp, diloco and streaming over workers that are learner groups (TP, ZeRO-2, PP; docs/parallel.md "Baselines
//   over learner groups") end where the same baselines over one-process workers end, within fp32 tolerance.
// The last four run the real `dloco train` (workers over Gloo, or syncer + learners over gRPC) on a tiny model.
// The merge itself through real Gloo against the syncer's is outer_loops_test.cc.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <set>
#include <functional>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <thread>

#include "baselines/dp.h"
#include "core/check.h"
#include "core/merge.h"
#include "core/safetensors.h"
#include "data/shards.h"
#include "data/stream.h"
#include "support/process_checks.h"
#include "support/tiny_corpus.h"
#include "train/checkpoint.h"
#include "train/fragment_io.h"
#include "train/trainer.h"

namespace dloco {
namespace {

namespace fs = std::filesystem;

const std::string kDloco = std::string(DLOCO_BINARY_DIR) + "/bin/dloco";
const std::string kDataTool = std::string(DLOCO_BINARY_DIR) + "/bin/dloco-data";

torch::Tensor flat_parameters(GPT& model) {
  std::vector<torch::Tensor> parts;
  for (auto& p : model->parameters()) parts.push_back(p.detach().reshape({-1}).clone());
  return torch::cat(parts);
}

// Largest element-wise difference relative to the largest magnitude of b.
double relative_difference(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

class Baselines : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    at::set_num_threads(1);
    root_ = testing_support::make_tiny_corpus("dloco_baselines", kDataTool);
    ASSERT_FALSE(root_.empty()) << "dloco-data prepare failed on the tiny corpus";
  }
  static void TearDownTestSuite() { testing_support::remove_unless_kept(root_); }

  // A tiny run of M = 2 with B = 4, T = 32: 20 steps per worker. `extra` is TOML appended per section.
  static Config tiny_config(const std::string& name, const std::string& mode, const std::string& diloco_extra = "",
                            int64_t steps = 20) {
    std::ostringstream os;
    os << "[model]\npreset = \"tiny\"\nvocab_size = 400\n"
       << "[data]\ndir = \"" << (root_ / "data").string() << "\"\n"
       << "[train]\nbatch_size = 4\ntotal_tokens = " << 2 * steps * 4 * 32
       << "\nlr = 3e-3\nwarmup_steps = 3\neval_interval = 0\neval_tokens = 2048\ncheckpoint_interval = 0\n"
       << "[diloco]\nmode = \"" << mode << "\"\nlearners = 2\n" << diloco_extra << "\n"
       << "[run]\nname = \"" << name << "\"\nout_dir = \"" << root_.string() << "\"\nthreads = 2\n"
       << "report_interval_s = 1.0\nrestart_delay_s = -1.0\ncollective_timeout_s = 60\n";
    return parse_config(os.str());
  }

  // Runs `dloco train` on the config and returns the final checkpoint's Θ, one flat tensor in model order.
  static torch::Tensor train_and_load(const Config& config) {
    const fs::path cfg = root_ / (config.run.name + ".toml");
    std::ofstream(cfg) << to_toml(config);
    const fs::path log = root_ / (config.run.name + ".log");
    EXPECT_EQ(std::system((kDloco + " train --config " + cfg.string() + " > " + log.string() + " 2>&1").c_str()), 0)
        << "see " << log;
    const auto ckpt = resolve_checkpoint(config.run_dir());
    torch::manual_seed(0);
    GPT model(config.model);
    load_model_weights(ckpt, model);
    return flat_parameters(model);
  }

  // The "applied" events of worker 0 of a run, in order.
  static std::vector<nlohmann::json> applied_events(const Config& config) {
    std::ifstream in(config.run_dir() / "events" / "worker_0.jsonl");
    std::vector<nlohmann::json> out;
    std::string line;
    while (std::getline(in, line)) {
      auto e = nlohmann::json::parse(line);
      if (e["event"] == "applied") out.push_back(std::move(e));
    }
    return out;
  }

  // Θ0 of a config: what every mode starts from (seed run.seed).
  static torch::Tensor initial_parameters(const Config& config) {
    torch::manual_seed(config.run.seed);
    GPT model(config.model);
    return flat_parameters(model);
  }

  static fs::path root_;
};
fs::path Baselines::root_;

TEST_F(Baselines, DpTwoWorkersMatchOneProcessOnTheDoubledBatch) {
  const ModelConfig m = model_preset("tiny");
  const int64_t B = 4, T = m.seq_len, BT = B * T, steps = 5;
  // Two worker streams whose tokens at every multiple of B·T are the same token c: then the doubled batch of one
  // process (worker 0's B sequences, then worker 1's) is a contiguous window of the reference corpus R below,
  // targets included, and grad_accum = 2 over R gives exactly the mean gradient over both batches.
  std::mt19937 rng(5);
  auto stream_tokens = [&] {
    std::vector<int32_t> s(static_cast<size_t>(steps * BT + 1));
    for (size_t i = 0; i < s.size(); ++i) s[i] = i % BT == 0 ? 7 : static_cast<int32_t>(rng() % m.vocab_size);
    return s;
  };
  const auto s0 = stream_tokens(), s1 = stream_tokens();
  std::vector<int32_t> x(s0), r;
  x.insert(x.end(), s1.begin(), s1.end());
  for (int64_t k = 0; k < steps; ++k) {
    r.insert(r.end(), s0.begin() + k * BT, s0.begin() + (k + 1) * BT);
    r.insert(r.end(), s1.begin() + k * BT, s1.begin() + (k + 1) * BT);
  }
  r.push_back(7);
  const fs::path dir = root_ / "dp_equivalence";
  fs::create_directories(dir);
  write_shard(dir / "workers.bin", x, static_cast<uint32_t>(m.vocab_size));
  write_shard(dir / "reference.bin", r, static_cast<uint32_t>(m.vocab_size));
  auto worker_split = std::make_shared<TokenSplit>(std::vector<fs::path>{dir / "workers.bin"});
  auto reference_split = std::make_shared<TokenSplit>(std::vector<fs::path>{dir / "reference.bin"});

  TrainConfig t;
  t.batch_size = B;
  t.lr = 1e-2;
  t.grad_clip = 0.5;  // clipping acts on the averaged gradient in both
  const LrSchedule schedule{t.lr, 2, steps, 0.1};

  std::vector<GPT> models;  // made here, one after the other: the init draws from the global generator
  for (int rank = 0; rank < 2; ++rank) {
    torch::manual_seed(1);
    models.emplace_back(m);
  }
  torch::manual_seed(1);
  GPT reference(m);
  const auto initial = flat_parameters(reference);

  std::vector<torch::Tensor> finals(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> workers;
  for (int rank = 0; rank < 2; ++rank) {
    workers.emplace_back([&, rank] {
      try {
        Collective group({dir / "gloo.store", rank, 2, "127.0.0.1", 60});
        InnerTrainer trainer(models[rank], t, schedule, torch::kCPU);
        trainer.set_gradient_hook(dp_gradient_hook(models[rank], group, nullptr, nullptr));
        DataStream stream(worker_split, rank, 2, B, T, StreamCursor{rank, 0, 0, 0});
        for (int64_t k = 0; k < steps; ++k) trainer.step(stream, k);
        finals[rank] = flat_parameters(models[rank]);
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  }
  for (auto& w : workers) w.join();
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");

  TrainConfig doubled = t;
  doubled.grad_accum = 2;
  InnerTrainer trainer(reference, doubled, schedule, torch::kCPU);
  DataStream stream(reference_split, 0, 1, B, T, StreamCursor{});
  for (int64_t k = 0; k < steps; ++k) trainer.step(stream, k);
  const auto expected = flat_parameters(reference);

  EXPECT_TRUE(torch::equal(finals[0], finals[1])) << "the two dp workers' parameters differ";
  EXPECT_GT(relative_difference(expected, initial), 1e-3) << "training did not move the parameters";
  // Bit-identical, measured and asserted: the reference backpropagates loss/2 per micro-batch and sums, the workers
  // backpropagate the loss, all-reduce (a two-rank sum, which commutes) and halve; scaling by 2⁻¹ is exact in fp32,
  // so both hold (g0 + g1)/2 to the bit, and clipping and AdamW see the same numbers.
  EXPECT_TRUE(torch::equal(finals[0], expected))
      << "dp (2 workers) vs one process on the doubled batch: max relative difference "
      << relative_difference(finals[0], expected);
  std::printf("dp (2 workers) vs one process on the doubled batch: max relative difference %.2e\n",
              relative_difference(finals[0], expected));
}

// Issue 31 part 3: a baseline run stopped with Ctrl-C mid-run and resumed with `dloco train --resume` ends bitwise
// where the same run uninterrupted ends, with the same tokens trained and syncs: no batch twice, none skipped.
// dp: rank 0's checkpoint holds the AdamW state and every slot's cursor. diloco/streaming: the signal is voted in
// the next merge, every worker stops after the same one and saves its own θ_m, AdamW state, cursor and outer state
// (streaming: the merges in flight, already summed). Stopped at a step count, not a time.
// `signal` SIGKILL: the launcher and its workers die at once (no stop vote, no final state); the resume falls back
// to the newest checkpoint whose every worker state is complete (`slowdown` makes the workers drift apart).
// `terminal`: the signal goes to the launcher's whole process group, as a terminal's Ctrl-C does (every worker and
// every rank of a learner group gets it too).
void stop_and_resume(const std::string& mode, const fs::path& root, const std::function<Config(const std::string&)>& make,
                     int signal = SIGINT, const std::string& slowdown = "0:4,1:4", bool terminal = false) {
  const Config whole = make("whole");
  const fs::path whole_cfg = root / (whole.run.name + ".toml");
  std::ofstream(whole_cfg) << to_toml(whole);
  ASSERT_EQ(std::system((kDloco + " train --config " + whole_cfg.string() + " > " + (root / (whole.run.name + ".log")).string() +
                         " 2>&1").c_str()), 0);
  Config cut = make("cut");
  // Slowed 4× (a sleep after each step, no change to the math): the stop lands ~1 s after step 30 (the launcher's
  // poll, the workers' next step boundary or merge), well before step 600 also on a machine 3× faster than this one.
  cut.run.slowdown = slowdown;
  const fs::path cfg = root / (cut.run.name + ".toml");
  std::ofstream(cfg) << to_toml(cut);
  testing_support::ChildGuard guard;
  const fs::path cut_log = root / (cut.run.name + ".log");
  const pid_t launcher =
      guard.hold(testing_support::spawn_to_log(kDloco, {"train", "--config", cfg.string()}, cut_log, terminal));
  ASSERT_GT(launcher, 0);
  auto steps = [&] {
    int n = 0;
    for (const auto& e : testing_support::read_events(cut.run_dir() / "events" / "worker_0.jsonl")) {
      n += e["event"] == "step";
    }
    return n;
  };
  for (int i = 0; i < 3000 && steps() < 30; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_GE(steps(), 30) << "see " << cut_log;
  if (terminal) {
    ASSERT_EQ(::kill(-launcher, signal), 0);
  } else {
    guard.kill(launcher, signal, "the launcher");
  }
  int status = 0;
  ::waitpid(launcher, &status, 0);
  if (signal == SIGINT) {
    ASSERT_TRUE(WIFEXITED(status)) << "see " << cut_log;
    ASSERT_EQ(WEXITSTATUS(status), 128 + SIGINT) << "see " << cut_log;
    const nlohmann::json stopped = nlohmann::json::parse(std::ifstream(cut.run_dir() / "report.json"));
    ASSERT_EQ(stopped["status"], "stopped");
    const auto all_steps = nlohmann::json::parse(std::ifstream(whole.run_dir() / "report.json"))["steps"].get<int64_t>();
    ASSERT_LT(stopped["steps"].get<int64_t>(), all_steps) << "the stop came after the end: nothing left to resume";
    std::printf("%s: stopped at step %lld\n", mode.c_str(), static_cast<long long>(stopped["steps"].get<int64_t>()));
    // every worker stopped after the same step (the vote) and saved its state there
    std::set<int64_t> at;
    for (int w = 0; w < 2; ++w) {
      for (const auto& e : testing_support::read_events(cut.run_dir() / "events" / ("worker_" + std::to_string(w) + ".jsonl"))) {
        if (e["event"] == "stopped") at.insert(e["step"].get<int64_t>());
      }
    }
    EXPECT_EQ(at, std::set<int64_t>{stopped["steps"].get<int64_t>()});
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the workers die with their launcher
  }
  const fs::path log = root / (cut.run.name + "-resume.log");
  ASSERT_EQ(std::system((kDloco + " train --resume " + cut.run_dir().string() + " > " + log.string() + " 2>&1").c_str()),
            0)
      << "see " << log;
  const nlohmann::json report = nlohmann::json::parse(std::ifstream(cut.run_dir() / "report.json"));
  EXPECT_EQ(report["status"], "finished");
  for (const auto& e : testing_support::read_events(cut.run_dir() / "events" / "worker_1.jsonl")) {
    if (e["event"] == "worker_state_restored" || e["event"] == "optimizer_restored") {
      std::printf("%s: worker 1 resumed from step %lld\n", mode.c_str(), static_cast<long long>(e["step"].get<int64_t>()));
    }
  }
  const nlohmann::json uninterrupted = nlohmann::json::parse(std::ifstream(whole.run_dir() / "report.json"));
  EXPECT_EQ(report["tokens_trained"], uninterrupted["tokens_trained"]);
  EXPECT_EQ(report["steps"], uninterrupted["steps"]);
  EXPECT_EQ(report["syncs"], uninterrupted["syncs"]) << "the report covers the whole run, not its last part";
  auto load = [](const Config& c) {
    torch::manual_seed(0);
    GPT model(c.model);
    load_model_weights(resolve_checkpoint(c.run_dir()), model);
    return flat_parameters(model);
  };
  const torch::Tensor expected = load(whole), resumed = load(cut);
  EXPECT_TRUE(torch::equal(resumed, expected)) << "max difference " << (resumed - expected).abs().max().item<double>();
  // A finished run is left alone.
  EXPECT_EQ(std::system((kDloco + " train --resume " + cut.run_dir().string() + " >> " + log.string() + " 2>&1").c_str()),
            0);
}

TEST_F(Baselines, DpStoppedAndResumedEndsBitwiseWhereTheUninterruptedRunEnds) {
  stop_and_resume("dp", root_, [](const std::string& part) { return tiny_config("dp-" + part, "dp", "", 600); });
}

TEST_F(Baselines, DilocoStoppedAndResumedEndsBitwiseWhereTheUninterruptedRunEnds) {
  stop_and_resume("diloco", root_, [](const std::string& part) {
    return tiny_config("diloco-" + part, "diloco", "inner_steps = 10\n", 600);
  });
}

// Killed (SIGKILL, no vote, no final state) with a checkpoint every 4 steps and the workers 2× apart in speed:
// the resume falls back to the newest step every worker saved, drops what came after, and still ends bitwise.
TEST_F(Baselines, DilocoKilledResumesFromTheNewestCompleteStateBitwise) {
  stop_and_resume("diloco-killed", root_, [](const std::string& part) {
    Config c = tiny_config("diloco-killed-" + part, "diloco", "inner_steps = 10\n", 600);
    c.train.checkpoint_interval = 4;
    return c;
  }, SIGKILL, "0:3,1:6");
}

// A terminal's Ctrl-C reaches every process of the run, the ranks of a learner group included (TP = 2 here): the
// ranks leave the stop to their leader, so the group stops after the voted merge like a one-process worker, and
// the resume restores every rank's optimizer shard (GroupInnerJob::save_state). 160 steps: a stop ~1 s after
// step 30 of steps slowed 4× lands near step 50 here, before the end also on a machine 3× faster.
TEST_F(Baselines, DilocoOverLearnerGroupsStopsOnATerminalCtrlCAndResumesBitwise) {
  stop_and_resume("diloco-tp2", root_, [](const std::string& part) {
    return tiny_config("diloco-tp2-" + part, "diloco", "inner_steps = 10\n[parallel]\ntensor = 2\n", 160);
  }, SIGINT, "0:4,1:4", /*terminal=*/true);
}

// τ = 4 ≥ H/P = 3 (fragments due every 3 steps, applied 4 later): when the group stops after a merge, the next one
// is in flight and is saved summed, then applied at its step after the resume.
TEST_F(Baselines, StreamingStoppedAndResumedEndsBitwiseWhereTheUninterruptedRunEnds) {
  stop_and_resume("streaming", root_, [](const std::string& part) {
    return tiny_config("streaming-" + part, "streaming", "inner_steps = 9\nfragments = 3\noverlap = 4\n", 600);
  });
}

TEST_F(Baselines, DilocoWithOneInnerStepAveragesTheParametersEveryStep) {
  const Config c = tiny_config("avg", "diloco", "inner_steps = 1\nouter_lr = 1.0\nouter_momentum = 0.0\n", 8);
  const auto diloco = train_and_load(c);
  // Reference: two trainers in this process, their parameters averaged after every step.
  auto split = std::make_shared<TokenSplit>(split_shards(c.data.dir, "train"));
  std::vector<GPT> models;
  std::vector<std::unique_ptr<InnerTrainer>> trainers;
  std::vector<std::unique_ptr<DataStream>> streams;
  for (int r = 0; r < 2; ++r) {
    torch::manual_seed(c.run.seed);
    models.emplace_back(c.model);
    trainers.push_back(std::make_unique<InnerTrainer>(models[r], c.train, make_schedule(c), torch::kCPU));
    streams.push_back(std::make_unique<DataStream>(split, r, 2, c.train.batch_size, c.model.seq_len,
                                                   StreamCursor{r, 0, 0, 0}));
  }
  for (int64_t step = 0; step < 8; ++step) {
    for (int r = 0; r < 2; ++r) trainers[r]->step(*streams[r], step);
    torch::NoGradGuard no_grad;
    auto p0 = models[0]->parameters(), p1 = models[1]->parameters();
    for (size_t i = 0; i < p0.size(); ++i) {
      auto mean = (p0[i] + p1[i]) / 2;
      p0[i].copy_(mean);
      p1[i].copy_(mean);
    }
  }
  const auto expected = flat_parameters(models[0]);
  EXPECT_GT(relative_difference(diloco, initial_parameters(c)), 1e-3) << "training did not move Θ";
  EXPECT_LT(relative_difference(diloco, expected), 1e-5);
  std::printf("diloco (H = 1, η = 1, μ = 0) vs parameter averaging: max relative difference %.2e\n",
              relative_difference(diloco, expected));
}

TEST_F(Baselines, StreamingWithOneFragmentAndNoOverlapEqualsDiloco) {
  // 22 steps per worker, H = 4: merges at steps 4, 8, …, 20 and the final flush of the 2 steps after 20.
  const Config diloco_config = tiny_config("diloco_h4", "diloco", "inner_steps = 4\n", 22);
  const Config streaming_config =
      tiny_config("streaming_p1", "streaming", "inner_steps = 4\nfragments = 1\noverlap = 0\n", 22);
  const auto diloco = train_and_load(diloco_config);
  const auto streaming = train_and_load(streaming_config);
  EXPECT_GT(relative_difference(diloco, initial_parameters(diloco_config)), 1e-3) << "training did not move Θ";
  // Two code paths (baselines/outer_loops.cc): diloco's whole-model sync, streaming's fragment path; the same
  // merges at the same steps.
  const auto by_diloco = applied_events(diloco_config), by_streaming = applied_events(streaming_config);
  const std::vector<int64_t> merge_steps = {4, 8, 12, 16, 20, 22};
  ASSERT_EQ(by_diloco.size(), merge_steps.size());
  ASSERT_EQ(by_streaming.size(), merge_steps.size());
  for (size_t i = 0; i < merge_steps.size(); ++i) {
    EXPECT_EQ(by_diloco[i]["step"], merge_steps[i]);
    EXPECT_EQ(by_streaming[i]["step"], merge_steps[i]);
    EXPECT_TRUE(by_diloco[i].value("whole_model", false)) << by_diloco[i].dump();
    EXPECT_FALSE(by_streaming[i].contains("whole_model")) << by_streaming[i].dump();
  }
  // Measured bit-identical: both paths do the same fp32 arithmetic per element (Δ, w·Δ, a two-rank sum that
  // commutes, the division, Nesterov), only over different buffers (every fragment concatenated vs one merge per
  // fragment).
  EXPECT_TRUE(torch::equal(streaming, diloco))
      << "streaming (P = 1, τ = 0) vs diloco: max relative difference " << relative_difference(streaming, diloco);
  std::printf("streaming (P = 1, τ = 0) vs diloco: max relative difference %.2e\n",
              relative_difference(streaming, diloco));
  // And overlap changes the result (the equivalence above is not vacuous).
  const auto overlapped = train_and_load(
      tiny_config("streaming_p1_tau1", "streaming", "inner_steps = 4\nfragments = 1\noverlap = 1\n", 22));
  EXPECT_GT(relative_difference(overlapped, diloco), 1e-4);
}

// Each baseline over learner groups against the same baseline over one-process workers: the engines reproduce
// one process's step (group_inner_job_test), so the runs end within fp32 tolerance of each other. dp: both
// workers the same group (it averages rank by rank); diloco and streaming: a different group per worker.
TEST_F(Baselines, DpDilocoAndStreamingOverLearnerGroupsEndWhereOneProcessWorkersEnd) {
  struct Case {
    const char* name;
    const char* mode;
    const char* label;
    std::string diloco;  // [diloco] keys
    std::string groups;  // [parallel] and [[parallel.learner]]
  };
  const std::vector<Case> cases = {
      {"dp", "dp", "ZeRO-2 × 2, both", "", "[parallel]\ndata = 2\nzero = 2\n"},
      {"dp", "dp", "TP = 2, both", "", "[parallel]\ntensor = 2\n"},
      {"dp", "dp", "ZeRO-1 × 2, both", "", "[parallel]\ndata = 2\nzero = 1\n"},
      {"dp", "dp", "DP = 2 (zero = 0), both", "", "[parallel]\ndata = 2\n"},
      {"dp", "dp", "PP = 2 (1F1B, m = 2), both", "", "[parallel]\npipeline = 2\nmicro_batches = 2\n"},
      {"diloco", "diloco", "TP = 2 and ZeRO-2 × 2", "inner_steps = 4\n", "[parallel]\ntensor = 2\n[[parallel.learner]]\nid = 1\ntensor = 1\n"
                                                  "data = 2\nzero = 2\n"},
      {"streaming", "streaming", "PP = 2 (1F1B, m = 2) and DP = 2", "inner_steps = 4\nfragments = 2\noverlap = 1\n",
       "[parallel]\npipeline = 2\nmicro_batches = 2\n[[parallel.learner]]\nid = 1\npipeline = 1\nmicro_batches = 1\ndata = 2\n"},
  };
  std::map<std::string, torch::Tensor> reference;  // one-process workers, per mode
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    if (!reference.count(c.name)) {
      reference[c.name] = train_and_load(tiny_config(std::string("groups_ref_") + c.name, c.mode, c.diloco));
      EXPECT_GT(relative_difference(reference[c.name], initial_parameters(tiny_config("x", c.mode))), 1e-3)
          << "training did not move Θ";
    }
    const Config grouped = tiny_config("groups_" + std::to_string(i), c.mode, c.diloco + "\n" + c.groups);
    ASSERT_GT(grouped.parallel_for(0).ranks() + grouped.parallel_for(1).ranks(), 2) << c.groups;
    const auto theta = train_and_load(grouped);
    const double diff = relative_difference(theta, reference[c.name]);
    std::printf("%s over learner groups (%s) vs one-process workers: max relative difference %.2e\n", c.mode,
                c.label, diff);
    EXPECT_LT(diff, 1e-4) << c.mode << " over " << c.groups;  // measured 1.9e-7 … 8.0e-6
    if (std::string(c.label).rfind("ZeRO", 0) == 0) {
      // ZeRO's ranks all-reduce disjoint slices with the other worker: together the one process's gradient, so the
      // worker's reported bytes (its leader's plus its rank's, report.json) match the one-process worker's
      auto sent = [](const Config& cfg) {
        const auto report = nlohmann::json::parse(std::ifstream(cfg.run_dir() / "report.json"));
        return report["bytes"]["worker_0"]["sent"].get<double>();
      };
      const double ratio = sent(grouped) / sent(tiny_config(std::string("groups_ref_") + c.name, c.mode, c.diloco));
      std::printf("  bytes sent by worker 0 vs the one-process worker: %.3f\n", ratio);
      EXPECT_GT(ratio, 0.98);
      EXPECT_LT(ratio, 1.05);
    }
    // every rank of every group took part: each rank's event log says it joined and stopped
    for (int id = 0; id < 2; ++id) {
      for (int r = 1; r < grouped.parallel_for(id).ranks(); ++r) {
        std::ifstream in(grouped.run_dir() / "events" /
                         ("learner_" + std::to_string(id) + "_rank_" + std::to_string(r) + ".jsonl"));
        const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        EXPECT_NE(text.find("\"rank_stopped\""), std::string::npos) << "worker " << id << " rank " << r;
      }
    }
  }
}

TEST_F(Baselines, SynchronousDecoupledEqualsDiloco) {
  const auto diloco = train_and_load(tiny_config("diloco_sync_ref", "diloco", "inner_steps = 4\n"));
  const auto decoupled = train_and_load(tiny_config(
      "decoupled_sync", "decoupled",
      "inner_steps = 4\nfragments = 1\noverlap = 0\nquorum = 2\ngrace_window = false\nblocking = true\n"
      "weights = \"uniform\"\nmerge = \"mean\"\n"));
  EXPECT_LT(relative_difference(decoupled, diloco), 1e-5);
  std::printf("synchronous decoupled vs diloco: max relative difference %.2e\n", relative_difference(decoupled, diloco));
  // Not vacuous: the decoupled default (non-blocking, τ = 1, RDA, token weights) ends elsewhere.
  const auto async = train_and_load(tiny_config("decoupled_async", "decoupled",
                                                "inner_steps = 4\nfragments = 1\noverlap = 1\nquorum = 2\n"));
  EXPECT_GT(relative_difference(async, diloco), 1e-4);
}

TEST_F(Baselines, CompareWritesTheTableTheRunsAndThePlot) {
  Config c = tiny_config("unused", "decoupled", "inner_steps = 4\nfragments = 2\noverlap = 1\nquorum = 2\n", 12);
  c.train.eval_interval = 4;
  const fs::path cfg = root_ / "compare.toml";
  std::ofstream(cfg) << to_toml(c);
  const fs::path log = root_ / "compare.log";
  ASSERT_EQ(std::system((kDloco + " compare --config " + cfg.string() + " --modes dp,decoupled --variant "
                         "\"mean:diloco.merge=mean;diloco.weights=uniform\" --variant "
                         "\"q4:diloco.wire_up=q4;diloco.wire_down=q4;diloco.error_feedback=true\" --seeds 1 --name cmp > " +
                         log.string() +
                         " 2>&1").c_str()),
            0)
      << "see " << log;
  const fs::path dir = root_ / "cmp";
  const auto report = nlohmann::json::parse(std::ifstream(dir / "compare.json"));
  ASSERT_EQ(report["runs"].size(), 4u);
  for (const auto& run : report["runs"]) {
    EXPECT_EQ(run["report"]["status"], "finished") << run.dump();
    EXPECT_EQ(run["report"]["tokens_trained"], c.train.total_tokens) << "runs compare at equal tokens";
    EXPECT_LT(run["report"]["final_val_loss"].get<double>(), std::log(400.0));
  }
  EXPECT_EQ(report["runs"][0]["config"]["diloco"]["mode"], "dp");
  EXPECT_EQ(report["runs"][2]["config"]["diloco"]["merge"], "mean");  // the variant's overrides were applied
  std::ifstream md(dir / "compare.md");
  const std::string table((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
  for (const char* row : {"| dp |", "| decoupled |", "| mean |", "| q4 |"}) {
    EXPECT_NE(table.find(row), std::string::npos) << table;
  }
  // Bytes per direction and per learner-step (issue 14 part 4): decoupled sends a fragment every H steps where dp
  // all-reduces every step, and q4 sends about 4.5 / 32 of fp32's bytes up. Down is not compared here: in so short
  // a run it is mostly the fp32 model each learner fetches at bootstrap and again whenever it falls behind and
  // re-anchors, and how often that happens, like the number of merges, depends on the machine's timing (a CI run:
  // q4 0.222 MB down per learner against fp32's 0.206). That merges go down as q4 updates is asserted in
  // ProtocolTest.Q4BothWaysKeepsEveryCopyBitwiseEqualToThetaAndRecoversFromALostUpdate, their size in the codec's
  // tests.
  ASSERT_EQ(report["variants"].size(), 4u);
  const auto& dp = report["variants"][0];
  const auto& decoupled = report["variants"][1];
  const auto& q4 = report["variants"][3];
  EXPECT_NEAR(dp["fewer_bytes_than_dp"].get<double>(), 1.0, 1e-9);
  EXPECT_GT(decoupled["fewer_bytes_than_dp"].get<double>(), 1.5) << table;
  EXPECT_GT(decoupled["mb_down_per_learner"].get<double>(), 0) << table;
  EXPECT_GT(decoupled["mb_up_per_learner"].get<double>(), 0) << table;
  EXPECT_LT(q4["mb_up_per_learner"].get<double>(), 0.35 * decoupled["mb_up_per_learner"].get<double>()) << table;
  EXPECT_GT(q4["mb_down_per_learner"].get<double>(), 0) << table;
  EXPECT_TRUE(fs::exists(dir / "loss.png")) << "see " << log;
  // A typo in a variant fails before any training.
  EXPECT_NE(std::system((kDloco + " compare --config " + cfg.string() + " --variant \"bad:diloco.merj=mean\" --name "
                         "cmp_bad > /dev/null 2>&1").c_str()),
            0);
  EXPECT_FALSE(fs::exists(root_ / "cmp_bad" / "bad-s1"));
}

}  // namespace
}  // namespace dloco
