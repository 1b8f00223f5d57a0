// Pipeline-parallel GPT (parallel/pipeline_stage.h) against one process training the full model on the same
// batches: p ranks as threads of this process over real Gloo (one FileStore), GPipe, 1F1B and interleaved, tied
// and untied embeddings, with and without activation checkpointing. Checked per case:
//   step 1: the loss and every parameter's gradient (the pipeline's micro-batch sums run in another order, so not
//     bitwise; bound kGradTol = 1e-5 of the tensor's largest |gradient|, measured ≤ 6.6e-7);
//   after 5 AdamW steps: the parameters written back into one full model, |Δ| ≤ kParamTol = 1e-5 (AdamW divides
//     by √v, which amplifies the gradients' rounding where they are tiny; lr·steps = 5e-3 would be the worst
//     case; measured ≤ 1.7e-6) and the tied copies of wte on the first and last stage bitwise equal;
//   the stored activations per rank during the real run equal simulate_pipeline's peak for the same schedule.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <thread>

#include "core/check.h"
#include "parallel/pipeline_stage.h"

namespace dloco {
namespace {

namespace fs = std::filesystem;
using Kind = PipelineScheduleKind;

constexpr double kGradTol = 1e-5;   // of max |grad| per tensor
constexpr double kParamTol = 1e-5;  // absolute, after 5 AdamW steps at lr 1e-3
constexpr int kSteps = 5;
constexpr int64_t kB = 8, kT = 16, kM = 4;  // batch, sequence, micro-batches (b = 2)

ModelConfig tiny(bool tied) {
  ModelConfig cfg = model_preset("tiny");
  cfg.vocab_size = 128;
  cfg.seq_len = kT;
  cfg.n_layer = 4;
  cfg.tie_embeddings = tied;
  return cfg;
}

torch::optim::AdamWOptions adamw() { return torch::optim::AdamWOptions(1e-3).weight_decay(0.1); }

struct Case {
  Kind kind;
  int p;
  int v = 1;
  bool tied = true;
  bool checkpoint = false;
};

std::string describe(const Case& c) {
  return to_string(c.kind) + " p=" + std::to_string(c.p) + " v=" + std::to_string(c.v) +
         (c.tied ? " tied" : " untied") + (c.checkpoint ? " checkpointed" : "");
}

struct Batches {
  std::vector<torch::Tensor> idx, targets;  // (kSteps) of (B, T) int64
};

// One process on the whole batch: each step's loss, the first step's gradients.
struct ReferenceRun {
  std::vector<double> loss;
  std::map<std::string, torch::Tensor> grad;
};
ReferenceRun train_reference(GPT& model, const Batches& data) {
  torch::optim::AdamW opt(model->parameters(), adamw());
  ReferenceRun r;
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    auto loss = model->loss(data.idx[s], data.targets[s]);
    loss.backward();
    r.loss.push_back(loss.item<double>());
    if (s == 0) {
      for (const auto& q : model->named_parameters()) r.grad[q.key()] = q.value().grad().clone();
    }
    opt.step();
  }
  return r;
}

// p ranks, one thread each, starting from `start`; the trained parameters are written back into `gathered`.
struct PipelineRun {
  std::vector<std::string> errors;                        // (p) "" when the rank finished
  std::vector<std::vector<PipelineIterationStats>> stats;  // (p, kSteps)
  std::vector<std::map<std::string, torch::Tensor>> grad;  // (p) first step's gradients of the owned parameters
  torch::Tensor tied_copy;                                 // the last stage's copy of wte after training
};
PipelineRun train_pipeline(const Case& c, GPT& start, GPT& gathered, const Batches& data,
                           const PipelineSchedule& schedule) {
  const fs::path dir = fs::temp_directory_path() / ("dloco_pipe_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path store = dir / ("store_" + std::to_string(std::hash<std::string>{}(describe(c))));
  fs::remove(store);
  PipelineRun run;
  run.errors.resize(c.p);
  run.stats.resize(c.p);
  run.grad.resize(c.p);
  std::vector<std::thread> ranks;
  for (int r = 0; r < c.p; ++r) {
    ranks.emplace_back([&, r] {
      try {
        Collective group({store, r, c.p, "127.0.0.1", 60});
        PipelineStage stage(start, {r, c.p, c.v, c.checkpoint});
        torch::optim::AdamW opt(stage.parameters(), adamw());
        for (int s = 0; s < kSteps; ++s) {
          stage.zero_grad();
          run.stats[r].push_back(run_pipeline_iteration(stage, group, schedule, data.idx[s], data.targets[s]));
          if (s == 0) {
            for (const auto& [name, q] : stage.named_parameters()) run.grad[r][name] = q.grad().clone();
          }
          opt.step();
        }
        stage.write_back(gathered);
        if (stage.tied_head().defined()) run.tied_copy = stage.tied_head().detach().clone();
      } catch (const std::exception& e) {
        run.errors[r] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  fs::remove_all(dir);
  return run;
}

void run_case(const Case& c) {
  SCOPED_TRACE(describe(c));
  torch::set_num_threads(1);
  const ModelConfig cfg = tiny(c.tied);
  torch::manual_seed(42);
  GPT reference(cfg);
  GPT start(cfg), gathered(cfg);
  {
    torch::NoGradGuard no_grad;
    auto from = reference->parameters();
    auto a = start->parameters(), g = gathered->parameters();
    for (size_t i = 0; i < from.size(); ++i) a[i].copy_(from[i]), g[i].fill_(NAN);
  }
  Batches data;
  for (int s = 0; s < kSteps; ++s) {
    data.idx.push_back(torch::randint(0, cfg.vocab_size, {kB, kT}, torch::kLong));
    data.targets.push_back(torch::randint(0, cfg.vocab_size, {kB, kT}, torch::kLong));
  }
  const auto ref = train_reference(reference, data);
  const auto schedule = make_pipeline_schedule({c.kind, c.p, static_cast<int>(kM), c.v});
  const auto simulated = simulate_pipeline(schedule, {});
  const auto run = train_pipeline(c, start, gathered, data, schedule);
  for (int r = 0; r < c.p; ++r) ASSERT_EQ(run.errors[r], "") << "rank " << r;

  double worst_grad = 0, worst_param = 0, worst_loss = 0;
  size_t owned = 0;
  for (int r = 0; r < c.p; ++r) {
    EXPECT_EQ(run.stats[r][0].peak_stored_activations, simulated.peak_stored_activations[r]) << "rank " << r;
    for (int s = 0; s < kSteps; ++s) worst_loss = std::max(worst_loss, std::abs(run.stats[r][s].loss - ref.loss[s]));
    for (const auto& [name, g] : run.grad[r]) {
      const auto& want = ref.grad.at(name);
      const double rel = (g - want).abs().max().item<double>() / want.abs().max().item<double>();
      EXPECT_LE(rel, kGradTol) << name;
      worst_grad = std::max(worst_grad, rel);
    }
    owned += run.grad[r].size();
  }
  EXPECT_EQ(owned, ref.grad.size()) << "every parameter lives on exactly one stage";
  EXPECT_LE(worst_loss, 1e-5) << "loss (nats), float32 means of 128 tokens";
  for (const auto& q : reference->named_parameters()) {
    const double diff = (gathered->named_parameters()[q.key()] - q.value()).abs().max().item<double>();
    EXPECT_LE(diff, kParamTol) << q.key();
    worst_param = std::max(worst_param, diff);
  }
  if (c.tied && c.p > 1) {
    ASSERT_TRUE(run.tied_copy.defined());
    EXPECT_TRUE(torch::equal(run.tied_copy, gathered->named_parameters()["wte.weight"])) << "tied copies diverged";
  }
  std::printf("%s: |loss diff| %.2e, grad rel %.2e, params after %d AdamW steps %.2e; stored peak", describe(c).c_str(),
              worst_loss, worst_grad, kSteps, worst_param);
  for (int r = 0; r < c.p; ++r) std::printf(" %d", run.stats[r][0].peak_stored_activations);
  std::printf("; bytes sent rank 0 %lld\n", static_cast<long long>(run.stats[0][0].bytes_sent));
}

TEST(PipelineStage, GPipeTwoStages) { run_case({Kind::kGPipe, 2}); }
TEST(PipelineStage, OneFOneBTwoStages) { run_case({Kind::k1F1B, 2}); }
TEST(PipelineStage, GPipeFourStages) { run_case({Kind::kGPipe, 4}); }
TEST(PipelineStage, OneFOneBFourStages) { run_case({Kind::k1F1B, 4}); }
TEST(PipelineStage, InterleavedTwoStagesTwoChunks) { run_case({Kind::kInterleaved, 2, 2}); }
TEST(PipelineStage, OneFOneBUntiedCheckpointed) { run_case({Kind::k1F1B, 2, 1, false, true}); }

TEST(PipelineStage, SplitsBlocksAndRejectsBadShapes) {
  EXPECT_EQ(virtual_stage_blocks(0, 3, 4), (std::pair<int, int>{0, 2}));
  EXPECT_EQ(virtual_stage_blocks(1, 3, 4), (std::pair<int, int>{2, 3}));
  EXPECT_EQ(virtual_stage_blocks(2, 3, 4), (std::pair<int, int>{3, 4}));
  EXPECT_THROW(virtual_stage_blocks(0, 5, 4), InputError);
  GPT model(tiny(true));
  EXPECT_THROW(PipelineStage(model, {0, 8, 1, false}), InputError);  // 8 stages, 4 blocks
  EXPECT_THROW(PipelineStage(model, {2, 2, 1, false}), InputError);  // stage outside [0, p)
}

}  // namespace
}  // namespace dloco
