// Golden test of the GPT (llm.c's test_gpt2): the C++ model against an independent PyTorch implementation of the
// same model (tests/model/golden_gpt.py, run by Debian's /usr/bin/python3 with python3-torch).
//
// 1. Build a small GPT on a fixed seed, with larger-than-default weights and random RMSNorm gains so that the
//    attention is far from uniform and every gain matters, and draw a fixed batch (idx, targets) (B, T).
// 2. C++: loss = model->loss(idx, targets), backward, and logits = model->forward(idx).
// 3. Write every parameter, the batch and the model shape to a safetensors file; golden_gpt.py recomputes the
//    logits, the loss and every parameter's gradient from scratch in float64 and writes them back.
// 4. Compare: the loss, the logits (B, T, V) and each gradient, within the fp32 tolerances below.
// Not here: bf16 or multi-threaded determinism, generate() (sampling), training dynamics (gpt_test.cc).
// Dimension letters: B batch, T sequence length, C d_model, V vocabulary, L layers, NH heads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "core/safetensors.h"
#include "model/gpt.h"
#include "process/safetensors_file.h"

namespace dloco {
namespace {

namespace fs = std::filesystem;

const std::string kPython = "/usr/bin/python3";  // Debian's Python: the one with python3-torch
const std::string kGolden = std::string(DLOCO_SOURCE_DIR) + "/tests/model/golden_gpt.py";

// Tolerances. The reference is float64 (computed from the same fp32 parameters), so a difference is the C++ fp32
// rounding error alone. Measured (Release, OpenBLAS, 1 and 2 threads, both cases below): loss ≤ 3.1e-7 abs;
// logits ≤ 6.5e-6 abs against logits up to ~5 (1.4e-6 of the largest); gradients ≤ 2.2e-6 of their tensor's
// largest element. PyTorch's own fp32 error is the same size (golden_gpt.py prints it: loss 1.7e-7, logits 6.2e-6,
// gradients 2.8e-6). The bounds below leave a margin of ~30x (loss), ~9x (logits) and ~12x (gradients) over those
// maxima, for another BLAS or summation order, while real mistakes land far outside: an RMSNorm eps of 1e-6 in
// place of 1e-5 moved the logits by 2.5e-3 (40x the bound), a RoPE base of 10000 in place of 500 by 5.7.
// A gradient element is checked against its tensor's scale as well as its own size: fp32 sums of terms of both
// signs leave an error proportional to the terms, so a near-zero element can have a large relative error.
constexpr double kLossAtol = 1e-5;         // |loss − ref|, nats
constexpr double kLogitsAtol = 5e-5;       // |logit − ref| ≤ kLogitsAtol + kLogitsRtol · |ref|
constexpr double kLogitsRtol = 1e-5;
constexpr double kGradScaledAtol = 2e-5;   // |g − ref| ≤ kGradScaledAtol · max|ref| + kGradRtol · |ref|
constexpr double kGradRtol = 1e-4;

struct GoldenCase {
  std::string name;
  ModelConfig model;
  int64_t B = 2, T = 0;  // batch shape; T ≤ model.seq_len
  uint64_t seed = 0;
};

std::string exact(double x) {
  std::ostringstream s;
  s << std::setprecision(17) << x;
  return s.str();
}

std::span<const std::byte> bytes_of(const torch::Tensor& t) {
  return {static_cast<const std::byte*>(t.data_ptr()), static_cast<size_t>(t.numel() * t.element_size())};
}

// A float64 tensor read back from golden_gpt.py's output; fails the test if it is absent or not F64.
torch::Tensor reference(const SafetensorsFile& file, const std::string& name) {
  const SafetensorsTensor* t = file.find(name);
  if (t == nullptr || t->dtype != Dtype::kF64) {
    ADD_FAILURE() << "golden output lacks F64 tensor " << name;
    return {};
  }
  auto data = const_cast<std::byte*>(t->data.data());
  return torch::from_blob(data, t->shape, torch::kDouble).clone();
}

// Runs `command` with stdout and stderr captured; returns the exit status (−1 if it could not run).
int run_captured(const std::string& command, std::string& output) {
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  char buffer[4096];
  while (size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) output.append(buffer, n);
  const int status = ::pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

struct Difference {
  double max_abs = 0;    // max |x − ref|
  double scale = 0;      // max |ref|
  double worst = 0;      // max |x − ref| / (atol + rtol · |ref|): the test passes when ≤ 1
};

Difference compare(const torch::Tensor& x, const torch::Tensor& ref, double atol, double rtol) {
  auto diff = (x.to(torch::kDouble) - ref).abs();
  Difference d;
  d.max_abs = diff.max().item<double>();
  d.scale = ref.abs().max().item<double>();
  d.worst = (diff / (atol + rtol * ref.abs())).max().item<double>();
  return d;
}

void print_row(const std::string& name, const Difference& d) {
  std::cout << "  " << std::left << std::setw(26) << name << std::right << std::scientific << std::setprecision(2)
            << " max|diff| " << d.max_abs << "  max|ref| " << d.scale << "  max|diff|/max|ref| "
            << d.max_abs / std::max(d.scale, 1e-300) << "  of bound " << std::fixed << d.worst << "\n";
}

void check_against_golden(const GoldenCase& c) {
  // 1. Model and batch. The default init (std 0.02) leaves attention nearly uniform and the gains are all 1, which
  //    would hide a wrong RoPE or a misplaced gain: draw larger weights and random gains instead.
  torch::manual_seed(c.seed);
  GPT model(c.model);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->named_parameters()) {
      if (p.value().dim() == 1) p.value().normal_(1.0, 0.3);  // RMSNorm gains
    }
  }
  auto idx = torch::randint(0, c.model.vocab_size, {c.B, c.T}, torch::kLong);      // (B, T)
  auto targets = torch::randint(0, c.model.vocab_size, {c.B, c.T}, torch::kLong);  // (B, T)

  // 2. The C++ side.
  auto loss = model->loss(idx, targets);
  loss.backward();
  torch::Tensor logits;
  {
    torch::NoGradGuard no_grad;
    logits = model->forward(idx);  // (B, T, V)
  }

  // 3. Parameters, batch and shape to the reference, and its answer back.
  const fs::path dir = fs::temp_directory_path() / ("dloco_golden_" + c.name + "_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::vector<torch::Tensor> keep;  // owns the bytes the entries borrow
  std::vector<SafetensorsEntry> entries;
  for (const auto& p : model->named_parameters()) {
    keep.push_back(p.value().detach().contiguous());
    entries.push_back({p.key(), Dtype::kF32, keep.back().sizes().vec(), bytes_of(keep.back())});
  }
  entries.push_back({"idx", Dtype::kI64, {c.B, c.T}, bytes_of(idx)});
  entries.push_back({"targets", Dtype::kI64, {c.B, c.T}, bytes_of(targets)});
  const ModelConfig& m = c.model;
  const std::map<std::string, std::string> shape = {
      {"vocab_size", std::to_string(m.vocab_size)}, {"n_layer", std::to_string(m.n_layer)},
      {"n_head", std::to_string(m.n_head)},         {"d_model", std::to_string(m.d_model)},
      {"d_ff", std::to_string(m.d_ff)},             {"tie_embeddings", m.tie_embeddings ? "true" : "false"},
      {"rope_theta", exact(m.rope_theta)},          {"norm_eps", exact(m.norm_eps)}};
  write_safetensors(dir / "in.safetensors", entries, shape);

  std::string output;
  const std::string command = "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 " + kPython + " " + kGolden + " " +
                              (dir / "in.safetensors").string() + " " + (dir / "out.safetensors").string();
  const int rc = run_captured(command, output);
  ASSERT_EQ(rc, 0) << "the golden reference failed: " << command << "\n" << output
                   << (rc == 3 || rc == 127 ? "Install Debian's python3-torch and python3-numpy: run scripts/setup.sh\n"
                                            : "");
  std::cout << "[golden " << c.name << "] " << output;
  const SafetensorsFile golden = read_safetensors(dir / "out.safetensors");

  // 4. Compare.
  auto check = [&](const std::string& name, const torch::Tensor& x, const torch::Tensor& ref, double atol,
                   double rtol) {
    ASSERT_TRUE(ref.defined());
    ASSERT_EQ(x.sizes(), ref.sizes()) << name;
    const Difference d = compare(x, ref, atol, rtol);
    print_row(name, d);
    EXPECT_LE(d.worst, 1.0) << c.name << " " << name << ": max|diff| " << d.max_abs << " (max|ref| " << d.scale
                            << ") beyond atol " << atol << " + rtol " << rtol << " · |ref|";
  };
  std::cout << "[golden " << c.name << "] C++ fp32 against the float64 reference:\n";
  check("loss", loss.detach(), reference(golden, "loss"), kLossAtol, 0.0);
  check("logits", logits, reference(golden, "logits"), kLogitsAtol, kLogitsRtol);
  int64_t n_grads = 0;
  for (const auto& p : model->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key() << " has no gradient";
    const auto ref = reference(golden, "grad." + p.key());
    ASSERT_TRUE(ref.defined());
    check("grad." + p.key(), p.value().grad(), ref, kGradScaledAtol * ref.abs().max().item<double>(), kGradRtol);
    ++n_grads;
  }
  EXPECT_EQ(static_cast<int64_t>(golden.tensors.size()), 2 + n_grads);  // nothing unchecked in the reference
  if (!::testing::Test::HasFailure()) fs::remove_all(dir);  // keep the files of a failure to look at
}

TEST(GoldenGPT, TiedMatchesPyTorch) {
  GoldenCase c;
  c.name = "tied";
  c.model = model_preset("tiny");  // L 2, NH 2, C 32, F = round_up(8C/3, 64) = 128
  c.model.vocab_size = 256;
  c.model.seq_len = 32;
  c.model.init_std = 0.2;
  c.T = 32;
  c.seed = 1234;
  check_against_golden(c);
}

// Every other branch and constant: untied head, explicit d_ff, other RoPE base and eps, 4 heads, T < seq_len (the
// rotary tables and the mask are narrowed), an odd vocabulary.
TEST(GoldenGPT, UntiedMatchesPyTorch) {
  GoldenCase c;
  c.name = "untied";
  c.model = model_preset("tiny");
  c.model.vocab_size = 97;
  c.model.seq_len = 32;
  c.model.n_layer = 3;
  c.model.n_head = 4;
  c.model.d_model = 48;
  c.model.d_ff = 80;
  c.model.tie_embeddings = false;
  c.model.rope_theta = 500.0;
  c.model.norm_eps = 1e-6;
  c.model.init_std = 0.2;
  c.T = 20;
  c.seed = 99;
  check_against_golden(c);
}

}  // namespace
}  // namespace dloco
