// Inner training (loss falls, the non-finite guard), checkpoints (round trip, torn folders skipped, readable by
// an independent safetensors reader) and exact resume of a local run.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>

#include "core/check.h"
#include "core/safetensors.h"
#include "data/shards.h"
#include "train/checkpoint.h"
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
  auto config_for = [&](const std::string& name) {
    return parse_config("[model]\npreset = \"tiny\"\nvocab_size = 400\n[train]\nbatch_size = 4\ntotal_tokens = 3072\n"
                        "eval_interval = 0\ncheckpoint_interval = 0\nlog_interval = 100\n[diloco]\nmode = \"local\"\n"
                        "[run]\nthreads = 1\n",
                        {"run.name=" + name, "run.out_dir=\"" + dir_.string() + "\"",
                         "data.dir=\"" + (dir_ / "data").string() + "\""});
  };
  const auto whole = run_local(config_for("whole"), {});
  EXPECT_EQ(whole["status"], "finished");
  EXPECT_EQ(whole["steps"], 24);

  RunOptions first_half;
  first_half.stop_after_steps = 10;
  const auto part = run_local(config_for("split"), first_half);
  EXPECT_EQ(part["status"], "stopped");
  EXPECT_EQ(part["steps"], 10);
  RunOptions resume;
  resume.resume = true;
  const auto rest = run_local(config_for("split"), resume);
  EXPECT_EQ(rest["steps"], 24);
  EXPECT_EQ(rest["tokens_trained"], whole["tokens_trained"]);
  EXPECT_DOUBLE_EQ(rest["final_val_loss"].get<double>(), whole["final_val_loss"].get<double>());

  const auto a = read_safetensors(resolve_checkpoint(dir_ / "whole").dir / "model.safetensors");
  const auto b = read_safetensors(resolve_checkpoint(dir_ / "split").dir / "model.safetensors");
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) EXPECT_EQ(a.tensors[i].data, b.tensors[i].data) << a.tensors[i].name;

  // Starting again over an existing run folder is refused instead of overwriting it.
  EXPECT_THROW(run_local(config_for("whole"), {}), InputError);
}

}  // namespace
}  // namespace dloco
