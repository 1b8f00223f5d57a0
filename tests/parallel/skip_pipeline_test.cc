// SkipPipe nodes (parallel/skip_pipeline.h) against one process: 5 nodes as threads of this process over real Gloo
// (one FileStore) on a hand-written 3-stage schedule — stage 0 with data nodes 0 and 1, stage 1 with replicas 2
// and 3, stage 2 with node 4 alone — whose 6 micro-batches skip some stages (stage 1 visited 4 times, stage 2
// 3 times, one micro-batch only stage 0), against InnerTrainer with set_skip + set_path_source on the same stage
// paths, the same windows and the same lr schedule. Checked after one and after two iterations:
//   every node's parameters equal the reference model's to kParamTol = 1e-5 absolute (the pipeline sums each
//   stage's micro-batch gradients in another order and divides once by the visits where the reference divides by
//   grad_accum and rescales, so the gradients agree to fp32 rounding, not bitwise; AdamW divides by √v, which
//   turns a relative rounding error of a gradient into the same relative error of an lr-sized step: 1e-3 · 1e-6,
//   far below the bound; measured in the log line);
//   the loss and the global grad norm equal the reference's to 1e-5 relative;
//   replicas of a stage are bitwise identical (one all-reduce, the same division, clip and AdamW on each);
//   no node held more than C = 2 micro-batches' graphs, and some node held C (the memory limit was exercised).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <thread>

#include "core/check.h"
#include "data/shards.h"
#include "parallel/skip_pipeline.h"
#include "train/trainer.h"

namespace dloco {
namespace {

namespace fs = std::filesystem;

constexpr double kParamTol = 1e-5;  // absolute, after AdamW steps at lr ≤ 1e-3
constexpr double kScalarTol = 1e-5;  // relative: loss and grad norm
// Of the tensor's largest |gradient|: the averaged, clipped gradients AdamW stepped on. Iteration 1 from the same
// parameters; iteration 2 at parameters that already differ by up to kParamTol (see the header), hence looser.
constexpr double kGradTol[2] = {1e-5, 1e-4};
constexpr int kNodes = 5, kIterations = 2;
constexpr int64_t kB = 2, kT = 32;  // micro-batch size, sequence length

pipeline::Setting hand_setting() {
  nlohmann::json nodes = nlohmann::json::array();
  for (int i = 0; i < kNodes; ++i) nodes.push_back({{"region", "A"}, {"forward_s", i == 4 ? 1.5 : 1.0}});
  const nlohmann::json j = {{"format", "dloco-skippipe-setting"},
                            {"version", 1},
                            {"source", "hand case"},
                            {"regions", {"A"}},
                            {"nodes", nodes},
                            {"links", nlohmann::json::array()},
                            {"default_link", {{"latency_s", 0.1}, {"bandwidth_bytes_per_s", 1e6}}},
                            {"hop_overhead_s", 0.05},
                            {"bytes_per_hop", 16384},
                            {"memory_capacity", 2},
                            {"backward_factor", 1.5},
                            {"head_factor", 0.25}};
  return pipeline::parse_setting(j, "hand");
}

// Stage 1 = nodes {2, 3}, stage 2 = node 4; visits: stage 1 four (node 2: 0, 3; node 3: 2, 5), stage 2 three.
pipeline::Schedule hand_schedule(const pipeline::Setting& setting) {
  const auto mb = [](int id, int data, std::vector<int> path) {
    return nlohmann::json{{"id", id}, {"data_node", data}, {"path", path}, {"inject_s", 0}};
  };
  const nlohmann::json j = {
      {"format", "dloco-skippipe-schedule"},
      {"version", 1},
      {"source", "hand case"},
      {"method", "hand"},
      {"placement", {{0, 1}, {2, 3}, {4}}},
      {"micro_batches", {mb(0, 0, {2}), mb(1, 1, {4}), mb(2, 0, {3, 4}), mb(3, 1, {2, 4}), mb(4, 0, {}),
                         mb(5, 1, {3})}}};
  return pipeline::parse_schedule(j, "hand", setting);
}

// The schedule's stage sequences, as InnerTrainer's path source wants them (stage 0, then increasing stages).
std::vector<std::vector<int64_t>> stage_paths(const pipeline::Schedule& schedule) {
  std::vector<std::vector<int64_t>> out;
  for (const auto& m : schedule.micro_batches) {
    std::vector<int64_t> path{0};
    for (int node : m.path) path.push_back(schedule.stage_of_node[node]);
    out.push_back(path);
  }
  return out;
}

using Params = std::map<std::string, torch::Tensor>;
Params cloned(const Params& p) {
  Params out;
  for (const auto& [name, t] : p) out[name] = t.detach().clone();
  return out;
}
// The gradients AdamW stepped on (left in .grad after the step: averaged and clipped).
Params grads_of(const Params& p) {
  Params out;
  for (const auto& [name, t] : p) out[name] = t.grad().clone();
  return out;
}

class SkipPipelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dloco_skippipe_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::mt19937 rng(7);
    std::vector<int32_t> tokens(20000);
    for (auto& t : tokens) t = static_cast<int32_t>(rng() % 512);
    write_shard(dir_ / "train_000.bin", tokens, 512);
    split_ = std::make_shared<TokenSplit>(std::vector<fs::path>{dir_ / "train_000.bin"});
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
  std::shared_ptr<TokenSplit> split_;
};

TEST_F(SkipPipelineTest, NodesMatchOneProcessAndReplicasAreBitwiseEqual) {
  torch::set_num_threads(1);
  ModelConfig cfg = model_preset("tiny");
  cfg.n_layer = 3;
  TrainConfig train;
  train.batch_size = kB;
  train.grad_accum = 6;
  train.lr = 1e-3;
  train.grad_clip = 0.2;  // below the first steps' norms (asserted), so the clip's rule is compared too
  const LrSchedule lr{1e-3, 1, 10, 0.1};  // a different lr at each step
  const auto setting = hand_setting();
  const auto schedule = hand_schedule(setting);

  torch::manual_seed(42);
  GPT start(cfg), reference(cfg);
  {
    torch::NoGradGuard no_grad;
    auto a = start->parameters(), b = reference->parameters();
    for (size_t i = 0; i < a.size(); ++i) b[i].copy_(a[i]);
  }
  // The one-process reference: the schedule's stage paths, the same stream, one step per iteration.
  InnerTrainer trainer(reference, train, lr, torch::kCPU);
  trainer.set_skip(SkipConfig{3, 0.0, 0}, 1);
  trainer.set_path_source([&](int64_t) { return stage_paths(schedule); });
  DataStream ref_stream(split_, 0, 1, kB, kT, StreamCursor{});
  std::vector<StepResult> ref_steps;
  std::vector<Params> ref_params, ref_grads;
  for (int s = 0; s < kIterations; ++s) {
    ref_steps.push_back(trainer.step(ref_stream, s));
    Params named;
    for (const auto& q : reference->named_parameters()) named[q.key()] = q.value().detach().clone();
    ref_params.push_back(named);
    Params named_grads;
    for (const auto& q : reference->named_parameters()) named_grads[q.key()] = q.value().grad().clone();
    ref_grads.push_back(named_grads);
  }

  const fs::path store = dir_ / "store";
  std::vector<std::string> errors(kNodes);
  std::vector<std::vector<SkipIterationStats>> stats(kNodes);
  std::vector<std::vector<Params>> params(kNodes), grads(kNodes);  // (node, iteration)
  std::vector<std::thread> ranks;
  for (int r = 0; r < kNodes; ++r) {
    ranks.emplace_back([&, r] {
      try {
        Collective group({store, r, kNodes, "127.0.0.1", 60});
        SkipPipeNode node(start, setting, schedule, group, train, lr);
        DataStream stream(split_, 0, 1, kB, kT, StreamCursor{});
        for (int s = 0; s < kIterations; ++s) {
          stats[r].push_back(node.run_iteration(node.stage() == 0 ? &stream : nullptr, s));
          params[r].push_back(cloned(node.named_parameters()));
          grads[r].push_back(grads_of(node.named_parameters()));
        }
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < kNodes; ++r) ASSERT_EQ(errors[r], "") << "node " << r;

  for (int s = 0; s < kIterations; ++s) {
    SCOPED_TRACE("iteration " + std::to_string(s + 1));
    EXPECT_GT(ref_steps[s].grad_norm, train.grad_clip) << "the clip acts";
    double worst = 0, worst_grad = 0;
    std::string worst_name;
    size_t covered = 0;
    for (int r = 0; r < kNodes; ++r) {
      const auto& st = stats[r][s];
      EXPECT_FALSE(st.skipped);
      EXPECT_NEAR(st.loss, ref_steps[s].loss, kScalarTol * ref_steps[s].loss) << "node " << r;
      EXPECT_NEAR(st.grad_norm, ref_steps[s].grad_norm, kScalarTol * ref_steps[s].grad_norm) << "node " << r;
      EXPECT_DOUBLE_EQ(st.lr, ref_steps[s].lr);
      for (const auto& [name, t] : params[r][s]) {
        const double diff = (t - ref_params[s].at(name)).abs().max().item<double>();
        EXPECT_LE(diff, kParamTol) << "node " << r << " " << name;
        const auto& want = ref_grads[s].at(name);
        const double rel =
            (grads[r][s].at(name) - want).abs().max().item<double>() / want.abs().max().item<double>();
        EXPECT_LE(rel, kGradTol[s]) << "node " << r << " " << name << " gradient";
        worst_grad = std::max(worst_grad, rel);
        if (diff > worst) worst_name = name;
        worst = std::max(worst, diff);
      }
      if (r == 0 || r == 2 || r == 4) covered += params[r][s].size();
    }
    EXPECT_EQ(covered, ref_params[s].size()) << "stages 0, 1, 2 hold every parameter once";
    for (const auto& [a, b] : {std::pair{0, 1}, std::pair{2, 3}}) {
      for (const auto& [name, t] : params[a][s]) {
        EXPECT_TRUE(torch::equal(t, params[b][s].at(name))) << "replicas " << a << ", " << b << ": " << name;
      }
    }
    std::printf("[skippipe test] iteration %d: loss %.6f (reference %.6f), grad norm %.6f (reference %.6f), "
                "worst |param - reference| %.3g (%s), worst gradient error %.3g of the tensor's max\n",
                s + 1, stats[0][s].loss, ref_steps[s].loss, stats[0][s].grad_norm, ref_steps[s].grad_norm, worst,
                worst_name.c_str(), worst_grad);
  }
  int peak = 0;
  for (int r = 0; r < kNodes; ++r) {
    EXPECT_LE(stats[r][0].peak_held, setting.memory_capacity) << "node " << r;
    peak = std::max(peak, stats[r][0].peak_held);
  }
  EXPECT_EQ(peak, setting.memory_capacity) << "some node's memory was full";
  // Micro-batches per node: data nodes 3 each; node 2: 0, 3; node 3: 2, 5; node 4: 1, 2, 3.
  const std::vector<int> served{3, 3, 2, 2, 3};
  for (int r = 0; r < kNodes; ++r) EXPECT_EQ(stats[r][0].micro_batches, served[r]) << "node " << r;
  EXPECT_GT(stats[2][0].allreduce_bytes, 0);
  EXPECT_EQ(stats[4][0].allreduce_bytes, 0) << "a stage of one node all-reduces nothing";
}

}  // namespace
}  // namespace dloco
