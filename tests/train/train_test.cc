// Inner training (loss falls, the non-finite guard), checkpoints (round trip, torn folders skipped, readable by
// an independent safetensors reader) and exact resume of a local run.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>

#include "core/check.h"
#include "core/safetensors.h"
#include "data/shards.h"
#include "model/stages.h"
#include "process/safetensors_file.h"
#include "train/checkpoint.h"
#include "train/fragment_io.h"
#include "train/run.h"
#include "train/trainer.h"

namespace dloco {
namespace {

namespace fs = std::filesystem;

class TrainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dloco_train_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "_" +
            std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    torch::manual_seed(0);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A learnable split: the sequence 0, 1, …, 49 repeated (next token = current + 1 mod 50).
  std::shared_ptr<TokenSplit> pattern_split(int64_t n) {
    std::vector<int32_t> tokens(n);
    for (int64_t i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>(i % 50);
    write_shard(dir_ / "train_000.bin", tokens, 512);
    return std::make_shared<TokenSplit>(std::vector<fs::path>{dir_ / "train_000.bin"});
  }

  static TrainConfig tiny_train() {
    TrainConfig t;
    t.batch_size = 4;
    t.lr = 3e-3;
    t.warmup_steps = 2;
    return t;
  }

  fs::path dir_;
};

// Why a joiner re-warms (core/lr_schedule.h LrSchedule::rewarm_from): on noise-dominated gradients (uniformly random
// tokens) a fresh AdamW's first steps from a warm learner's parameters move them several times further per unit of
// lr than the warm learner's own steps, the syncer's norm screen compares exactly that (docs/protocol.md §10); with
// the warmup repeated they move no further than the warm ones.
TEST_F(TrainTest, AFreshAdamWAmongWarmOnesMovesFurtherPerStepUnlessItRewarms) {
  std::vector<int32_t> tokens(200000);
  uint64_t x = 88172645463325252ull;
  for (auto& t : tokens) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    t = static_cast<int32_t>(x % 512);
  }
  write_shard(dir_ / "train_000.bin", tokens, 512);
  auto split = std::make_shared<TokenSplit>(std::vector<fs::path>{dir_ / "train_000.bin"});
  TrainConfig train = tiny_train();
  train.warmup_steps = 5;
  const LrSchedule schedule{train.lr, train.warmup_steps, 1000, 0.1};
  GPT warm_model(model_preset("tiny"));
  InnerTrainer warm(warm_model, train, schedule, torch::kCPU);
  DataStream stream(split, 0, 1, 4, 32, StreamCursor{});
  const int64_t t0 = 60, k = 2;
  for (int64_t t = 0; t < t0; ++t) warm.step(stream, t);
  const StreamCursor at = stream.cursor();
  auto flat = [](GPT& m) {
    std::vector<torch::Tensor> v;
    for (const auto& p : m->parameters()) v.push_back(p.detach().flatten().clone());
    return torch::cat(v);
  };
  const torch::Tensor start = flat(warm_model);
  double lr_sum = 0;
  for (int64_t t = t0; t < t0 + k; ++t) lr_sum += schedule.global_at(t);
  // ‖Δ‖ per unit of the run's lr over k steps from `start` on the same batches.
  auto per_lr = [&](InnerTrainer& trainer, GPT& model) {
    DataStream s(split, 0, 1, 4, 32, at);
    for (int64_t t = t0; t < t0 + k; ++t) trainer.step(s, t);
    return (flat(model) - start).norm().item<double>() / lr_sum;
  };
  auto fresh_copy = [&]() {
    GPT m(model_preset("tiny"));
    torch::NoGradGuard no_grad;
    auto dst = m->parameters();
    auto src = warm_model->parameters();
    for (size_t i = 0; i < dst.size(); ++i) dst[i].copy_(src[i]);
    return m;
  };
  GPT cold_model = fresh_copy(), rewarmed_model = fresh_copy();
  InnerTrainer cold(cold_model, train, schedule, torch::kCPU);
  InnerTrainer rewarmed(rewarmed_model, train, schedule, torch::kCPU);
  rewarmed.rewarm(t0);
  const double cold_size = per_lr(cold, cold_model), rewarmed_size = per_lr(rewarmed, rewarmed_model);
  const double warm_size = per_lr(warm, warm_model);
  std::printf("per unit of lr over %lld steps: warm %.3g, fresh %.3g (%.2f×), fresh re-warmed %.3g (%.2f×)\n",
              static_cast<long long>(k), warm_size, cold_size, cold_size / warm_size, rewarmed_size,
              rewarmed_size / warm_size);
  EXPECT_GT(cold_size, 2.5 * warm_size);
  EXPECT_LT(rewarmed_size, 1.2 * warm_size);
  EXPECT_DOUBLE_EQ(schedule.at(t0), schedule.global_at(t0));
  EXPECT_DOUBLE_EQ(rewarmed.schedule().at(t0), schedule.global_at(t0) / 5);
  EXPECT_DOUBLE_EQ(rewarmed.schedule().at(t0 + 5), schedule.global_at(t0 + 5));
}

TEST_F(TrainTest, InnerStepsReduceTheLoss) {
  auto split = pattern_split(20000);
  GPT model(model_preset("tiny"));
  LrSchedule schedule{3e-3, 2, 100, 0.1};
  InnerTrainer trainer(model, tiny_train(), schedule, torch::kCPU);
  DataStream stream(split, 0, 1, 4, 32, StreamCursor{});
  const StepResult first = trainer.step(stream, 0);
  StepResult last;
  for (int i = 1; i < 40; ++i) last = trainer.step(stream, i);
  EXPECT_FALSE(last.skipped);
  EXPECT_LT(last.loss, 0.5 * first.loss);
  EXPECT_EQ(stream.cursor().tokens_served, 40 * 4 * 32);
  EXPECT_NEAR(first.lr, 3e-3 / 2, 1e-12);  // warmup step 0 of 2
}

TEST_F(TrainTest, NonFiniteLossSkipsTheStepAndKeepsParameters) {
  auto split = pattern_split(5000);
  GPT model(model_preset("tiny"));
  InnerTrainer trainer(model, tiny_train(), LrSchedule{}, torch::kCPU);
  DataStream stream(split, 0, 1, 4, 32, StreamCursor{});
  trainer.step(stream, 0);  // moments exist now
  {
    torch::NoGradGuard g;
    model->ln_f->named_parameters()["weight"][0] = std::numeric_limits<float>::quiet_NaN();
  }
  std::vector<torch::Tensor> before;
  for (auto& p : model->parameters()) before.push_back(p.detach().clone());
  const StepResult r = trainer.step(stream, 1);
  EXPECT_TRUE(r.skipped);
  EXPECT_FALSE(std::isfinite(r.loss));
  auto params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::equal(params[i].isnan(), before[i].isnan()));
    EXPECT_TRUE(torch::allclose(params[i].nan_to_num(0), before[i].nan_to_num(0), 0, 0));
  }
}

TEST_F(TrainTest, CheckpointRoundTripAndTornFoldersAreSkipped) {
  GPT model(model_preset("tiny"));
  auto split = pattern_split(5000);
  InnerTrainer trainer(model, tiny_train(), LrSchedule{}, torch::kCPU);
  DataStream stream(split, 0, 1, 4, 32, StreamCursor{});
  trainer.step(stream, 0);
  nlohmann::json manifest = {{"config", to_json(parse_config("[model]\npreset = \"tiny\"\n"))}, {"tokens_trained", 1}};
  save_checkpoint(dir_, 5, model, &trainer.optimizer(), manifest);
  const auto saved = model->named_parameters()["wte.weight"].detach().clone();
  trainer.step(stream, 1);
  save_checkpoint(dir_, 9, model, &trainer.optimizer(), manifest);

  // A newest checkpoint whose optimizer state is cut short is skipped too.
  save_checkpoint(dir_, 11, model, &trainer.optimizer(), manifest, 3);
  const fs::path opt = dir_ / "checkpoints" / "step_00000011" / "optimizer.pt";
  fs::resize_file(opt, fs::file_size(opt) / 2);
  EXPECT_EQ(latest_checkpoint(dir_)->step, 9);
  fs::remove_all(dir_ / "checkpoints" / "step_00000011");
  // So is one whose extra files (a learner group's group_state rank files) were cut short or are missing.
  const auto group_state = [](const fs::path& dir, nlohmann::json& m) {
    fs::create_directories(dir / "group_state");
    std::ofstream(dir / "group_state" / "rank_0.pt") << std::string(1000, 'a');
    std::ofstream(dir / "group_state" / "rank_1.pt") << std::string(1000, 'b');
    m["group_state"] = "group_state";
  };
  save_checkpoint(dir_, 11, model, &trainer.optimizer(), manifest, 3, group_state);
  const fs::path group = dir_ / "checkpoints" / "step_00000011" / "group_state";
  EXPECT_EQ(latest_checkpoint(dir_)->step, 11);
  EXPECT_EQ(latest_checkpoint(dir_)->manifest["files"].size(), 2u);
  fs::resize_file(group / "rank_1.pt", 999);
  EXPECT_EQ(latest_checkpoint(dir_)->step, 9) << "a torn group_state rank file was not noticed";
  std::ofstream(group / "rank_1.pt") << std::string(1000, 'b');
  EXPECT_EQ(latest_checkpoint(dir_)->step, 11);
  fs::remove(group / "rank_0.pt");
  EXPECT_EQ(latest_checkpoint(dir_)->step, 9) << "a missing group_state rank file was not noticed";
  fs::remove_all(dir_ / "checkpoints" / "step_00000011");
  // A torn newest checkpoint (model file cut short) and a .tmp folder are skipped.
  const fs::path newest = dir_ / "checkpoints" / "step_00000009" / "model.safetensors";
  fs::resize_file(newest, fs::file_size(newest) - 10);
  fs::create_directories(dir_ / "checkpoints" / "step_00000012.tmp");
  const auto latest = latest_checkpoint(dir_);
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->step, 5);

  GPT other(model_preset("tiny"));
  load_model_weights(*latest, other);
  EXPECT_TRUE(torch::equal(other->named_parameters()["wte.weight"], saved));
  EXPECT_EQ(checkpoint_config(*latest).model.preset, "tiny");

  // Another model shape is refused with the tensor named.
  ModelConfig wider = model_preset("tiny");
  wider.d_model = 64;
  GPT wrong(wider);
  try {
    load_model_weights(*latest, wrong);
    FAIL() << "a mis-shaped checkpoint was loaded";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("another shape"), std::string::npos);
  }

  // The independent Python reader sees every parameter with its shape.
  const std::string cmd = "python3 " DLOCO_SOURCE_DIR "/tests/core/safetensors_reader.py " +
                          (latest->dir / "model.safetensors").string() + " > " + (dir_ / "py.json").string();
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const auto py = nlohmann::json::parse(std::ifstream(dir_ / "py.json"));
  EXPECT_EQ(py["tensors"].size(), model->named_parameters().size());
  EXPECT_EQ(py["tensors"]["wte.weight"]["shape"], nlohmann::json::array({512, 32}));
  EXPECT_FLOAT_EQ(py["tensors"]["wte.weight"]["values"][3].get<float>(), saved.view({-1})[3].item<float>());
}

// A second checkpoint at a step already written (a resumed syncer's final flush merges without moving the clock)
// goes to the next revision folder; the first is left as it was, and the newest in name order is the later one.
TEST_F(TrainTest, ACheckpointIsNeverReplacedByAnotherAtTheSameStep) {
  auto save = [&](int64_t step, float value) {
    std::vector<float> theta(4, value);
    const std::vector<SafetensorsEntry> tensors = {f32_entry("w", {4}, theta)};
    return save_checkpoint_files(dir_, step, tensors, {{"value", value}}, {}, 10);
  };
  const fs::path first = save(995, 1.0f);
  const auto written = fs::last_write_time(first / "manifest.json");
  const fs::path second = save(995, 2.0f);
  const fs::path third = save(995, 3.0f);
  EXPECT_EQ(first.filename(), "step_00000995");
  EXPECT_EQ(second.filename(), "step_00000995_r001");
  EXPECT_EQ(third.filename(), "step_00000995_r002");
  EXPECT_EQ(fs::last_write_time(first / "manifest.json"), written);
  EXPECT_EQ(resolve_checkpoint(first).manifest["value"], 1.0);
  EXPECT_EQ(latest_checkpoint(dir_)->dir, third);
  EXPECT_EQ(save(996, 4.0f).filename(), "step_00000996");
  EXPECT_EQ(latest_checkpoint(dir_)->step, 996);
  // With the default keep = 2 pruning frees step_N; the next revision still follows the highest, so the checkpoint
  // just written is the newest and is kept (the first free name, step_N, sorted first and was pruned at once).
  for (int i = 0; i < 4; ++i) {
    std::vector<float> theta(4, static_cast<float>(10 + i));
    const std::vector<SafetensorsEntry> tensors = {f32_entry("w", {4}, theta)};
    const fs::path written = save_checkpoint_files(dir_, 997, tensors, {{"value", 10 + i}});
    EXPECT_TRUE(fs::exists(written / "manifest.json")) << written;
    EXPECT_EQ(latest_checkpoint(dir_)->dir, written);
    EXPECT_EQ(latest_checkpoint(dir_)->manifest["value"], 10 + i);
  }
  EXPECT_EQ(latest_checkpoint(dir_)->dir.filename(), "step_00000997_r003");
}

// A local run stopped halfway and resumed ends with exactly the parameters of an uninterrupted run.
TEST_F(TrainTest, LocalRunResumesExactly) {
  const std::string tool = std::string(DLOCO_BINARY_DIR) + "/bin/dloco-data";
  setenv("DLOCO_DATA_BIN", tool.c_str(), 1);
  {
    std::ofstream txt(dir_ / "corpus.txt");
    for (int i = 0; i < 3000; ++i) txt << "And it came to pass on day " << i % 97 << " that the word was spoken.\n";
  }
  ASSERT_EQ(std::system((tool + " prepare " + (dir_ / "corpus.txt").string() + " --out " + (dir_ / "data").string() +
                         " --vocab-size 400 --threads 1 >/dev/null 2>&1")
                            .c_str()),
            0);
  // skip: 4 blocks in 4 stages, skip 0.5 (paths of stage 0 + one other), 3 micro-batches per step: 8 steps.
  auto config_for = [&](const std::string& name, bool skip) {
    const std::string skippipe = skip ? "[skippipe]\nstages = 4\nskip = 0.5\n" : "";
    return parse_config("[model]\npreset = \"tiny\"\nvocab_size = 400\n[train]\nbatch_size = 4\ntotal_tokens = 3072\n"
                        "eval_interval = 0\ncheckpoint_interval = 0\nlog_interval = 100\n[diloco]\nmode = \"local\"\n"
                        "[run]\nthreads = 1\n" + skippipe,
                        {"run.name=" + name, "run.out_dir=\"" + dir_.string() + "\"",
                         "data.dir=\"" + (dir_ / "data").string() + "\"", std::string("model.n_layer=") + (skip ? "4" : "2"),
                         std::string("train.grad_accum=") + (skip ? "3" : "1")});
  };
  for (bool skip : {false, true}) {
    SCOPED_TRACE(skip ? "with skippipe" : "full depth");
    const std::string tag = skip ? "_skip" : "";
    const int64_t steps = skip ? 8 : 24;
    const auto whole = run_local(config_for("whole" + tag, skip), {});
    EXPECT_EQ(whole["status"], "finished");
    EXPECT_EQ(whole["steps"], steps);

    RunOptions first_half;
    first_half.stop_after_steps = steps / 2 - 1;
    const auto part = run_local(config_for("split" + tag, skip), first_half);
    EXPECT_EQ(part["status"], "stopped");
    EXPECT_EQ(part["steps"], steps / 2 - 1);
    RunOptions resume;
    resume.resume = true;
    const auto rest = run_local(config_for("split" + tag, skip), resume);
    EXPECT_EQ(rest["steps"], steps);
    EXPECT_EQ(rest["tokens_trained"], whole["tokens_trained"]);
    EXPECT_DOUBLE_EQ(rest["final_val_loss"].get<double>(), whole["final_val_loss"].get<double>());

    // A skip run's paths are drawn from the seed and the step: the resumed run drew the same ones.
    const auto a = read_safetensors(resolve_checkpoint(dir_ / ("whole" + tag)).dir / "model.safetensors");
    const auto b = read_safetensors(resolve_checkpoint(dir_ / ("split" + tag)).dir / "model.safetensors");
    ASSERT_EQ(a.tensors.size(), b.tensors.size());
    for (size_t i = 0; i < a.tensors.size(); ++i) EXPECT_EQ(a.tensors[i].data, b.tensors[i].data) << a.tensors[i].name;
  }

  // Starting again over an existing run folder is refused instead of overwriting it.
  EXPECT_THROW(run_local(config_for("whole", false), {}), InputError);
}

// A GPT of 4 blocks for the SkipPipe steps (tiny otherwise).
ModelConfig four_blocks() {
  ModelConfig m = model_preset("tiny");
  m.n_layer = 4;
  return m;
}

void copy_parameters(GPT& from, GPT& to) {
  torch::NoGradGuard no_grad;
  auto a = from->parameters(), b = to->parameters();
  for (size_t i = 0; i < a.size(); ++i) b[i].copy_(a[i]);
}

TEST_F(TrainTest, SkipStepWithoutSkippingIsTheFullDepthStepBitwise) {
  auto split = pattern_split(20000);
  torch::manual_seed(3);
  GPT plain(four_blocks()), staged(four_blocks());
  copy_parameters(plain, staged);
  TrainConfig t = tiny_train();
  t.grad_accum = 3;
  InnerTrainer a(plain, t, LrSchedule{}, torch::kCPU), b(staged, t, LrSchedule{}, torch::kCPU);
  b.set_skip(SkipConfig{4, 0.0, 0}, 11);  // 4 stages, skip 0: every path is 0, 1, 2, 3
  DataStream sa(split, 0, 1, 4, 32, StreamCursor{}), sb(split, 0, 1, 4, 32, StreamCursor{});
  for (int step = 0; step < 3; ++step) {
    EXPECT_EQ(a.step(sa, step).loss, b.step(sb, step).loss);
    ASSERT_EQ(b.last_paths().size(), 3u);
    EXPECT_EQ(b.last_paths()[0], (std::vector<int64_t>{0, 1, 2, 3}));
  }
  auto pa = plain->parameters(), pb = staged->parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i])) << i;
}

// The gradients a skip step hands to the hook (before the clip) equal, per stage, the mean over the micro-batches
// whose paths visited it of each micro-batch's own gradient, computed here one micro-batch at a time by hand.
// 6 blocks in 3 stages of 2, so a block index mistaken for a stage index shows.
TEST_F(TrainTest, SkipStepAveragesEachStageOverTheMicroBatchesThatVisitedIt) {
  auto split = pattern_split(20000);
  torch::manual_seed(5);
  ModelConfig six = model_preset("tiny");
  six.n_layer = 6;
  GPT model(six), by_hand(six);
  copy_parameters(model, by_hand);
  TrainConfig t = tiny_train();
  t.grad_accum = 4;  // 3 stages, skip 1/3: paths of 2 stages, 4 visits over stages 1–2: each visited twice
  InnerTrainer trainer(model, t, LrSchedule{}, torch::kCPU);
  trainer.set_skip(SkipConfig{3, 1.0 / 3, 0}, 99);
  std::vector<torch::Tensor> seen;
  double loss_seen = 0;
  trainer.set_gradient_hook([&](double loss) {
    for (auto& p : model->parameters()) seen.push_back(p.grad().clone());
    loss_seen = loss;
    return loss;
  });
  DataStream stream(split, 0, 1, 4, 32, StreamCursor{}), replay(split, 0, 1, 4, 32, StreamCursor{});
  trainer.step(stream, 0);
  const auto paths = trainer.last_paths();
  ASSERT_EQ(paths.size(), 4u);
  EXPECT_TRUE(model->active_blocks().empty()) << "the model runs the full depth again after the step";

  auto params = by_hand->parameters();
  auto named = by_hand->named_parameters();
  std::vector<torch::Tensor> sum;
  for (auto& p : params) sum.push_back(torch::zeros_like(p));
  std::vector<int> visits(3, 0);
  double loss_sum = 0;
  std::vector<int64_t> window(window_tokens(4, 32));
  for (const auto& path : paths) {
    for (int64_t s : path) ++visits[static_cast<size_t>(s)];
    replay.next(std::span<int64_t>(window));
    auto w = torch::tensor(window);
    by_hand->set_active_blocks(stage_blocks(6, 3, path));
    for (auto& p : params) p.mutable_grad() = torch::Tensor();
    const auto [x, y] = window_batch(w, 4, 32);
    auto loss = by_hand->loss(x, y);
    loss.backward();
    loss_sum += loss.item<double>();
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].grad().defined()) sum[i] += params[i].grad();
    }
  }
  EXPECT_EQ(visits, (std::vector<int>{4, 2, 2}));
  EXPECT_NEAR(loss_seen, loss_sum / 4, 1e-5);
  ASSERT_EQ(seen.size(), params.size());
  size_t i = 0;
  for (const auto& item : named) {
    const std::string& name = item.key();  // "h.<block>.…" or a stage-0 tensor
    const int64_t stage = name.rfind("h.", 0) == 0 ? stage_of_block(std::stoll(name.substr(2)), 6, 3) : 0;
    const auto expected = sum[i] / visits[static_cast<size_t>(stage)];
    // fp32: the trainer sums losses / 4 then rescales by 4 / 2; by hand sums and divides by 2 (~1e-7 relative).
    EXPECT_TRUE(torch::allclose(seen[i], expected, 1e-4, 1e-6)) << name << " max diff "
        << (seen[i] - expected).abs().max().item<double>();
    ++i;
  }
}

TEST_F(TrainTest, FullDepthEveryNthStepRunsEveryStage) {
  auto split = pattern_split(20000);
  GPT model(four_blocks());
  TrainConfig t = tiny_train();
  t.grad_accum = 3;
  InnerTrainer trainer(model, t, LrSchedule{}, torch::kCPU);
  trainer.set_skip(SkipConfig{4, 0.5, 3}, 1);
  DataStream stream(split, 0, 1, 4, 32, StreamCursor{});
  std::vector<size_t> path_counts;
  for (int step = 0; step < 6; ++step) {
    trainer.step(stream, step);
    path_counts.push_back(trainer.last_paths().size());
  }
  EXPECT_EQ(path_counts, (std::vector<size_t>{3, 3, 0, 3, 3, 0})) << "steps 2 and 5 (the 3rd and 6th) run full depth";
}

TEST_F(TrainTest, PathsFromASourceAndAStageNoPathVisitsIsLeftAlone) {
  auto split = pattern_split(20000);
  GPT model(four_blocks());
  TrainConfig t = tiny_train();
  t.grad_accum = 2;
  InnerTrainer trainer(model, t, LrSchedule{}, torch::kCPU);
  trainer.set_skip(SkipConfig{4, 0.5, 0}, 1);
  trainer.set_path_source([](int64_t) { return std::vector<std::vector<int64_t>>{{0, 1}, {0, 2}}; });  // never 3
  auto named = model->named_parameters();
  const auto block3 = named["h.3.attn.qkv.weight"].detach().clone();
  const auto block2 = named["h.2.attn.qkv.weight"].detach().clone();
  DataStream stream(split, 0, 1, 4, 32, StreamCursor{});
  trainer.step(stream, 0);
  EXPECT_EQ(trainer.last_paths(), (std::vector<std::vector<int64_t>>{{0, 1}, {0, 2}}));
  EXPECT_TRUE(torch::equal(named["h.3.attn.qkv.weight"], block3)) << "no gradient, no decay: untouched";
  EXPECT_FALSE(torch::equal(named["h.2.attn.qkv.weight"], block2));
}

}  // namespace
}  // namespace dloco

// The (name, shape) list from the config alone is the one GPT(cfg) registers, tied and untied, with d_ff set or not.
TEST(FragmentIo, SpecsFromTheConfigAreTheModels) {
  for (const bool tied : {true, false}) {
    for (const int64_t d_ff : {int64_t{0}, int64_t{96}}) {
      dloco::ModelConfig m = dloco::model_preset("tiny");
      m.tie_embeddings = tied;
      m.d_ff = d_ff;
      dloco::GPT model(m);
      const auto from_model = dloco::parameter_specs(model), from_config = dloco::parameter_specs(m);
      ASSERT_EQ(from_config.size(), from_model.size()) << "tied " << tied;
      for (size_t i = 0; i < from_model.size(); ++i) {
        EXPECT_EQ(from_config[i].name, from_model[i].name) << i;
        EXPECT_EQ(from_config[i].shape, from_model[i].shape) << from_model[i].name;
      }
    }
  }
}
