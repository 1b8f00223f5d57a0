// The GPT inner job; see gpt_inner_job.h.
#include "learner/gpt_inner_job.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "process/atomic_file.h"
#include "process/json_file.h"
#include "train/fragment_io.h"

namespace dloco {

namespace fs = std::filesystem;

namespace {
constexpr int kStateFormat = 1;  // of state.json beside optimizer.pt
}  // namespace

GptInnerJob::GptInnerJob(GPT model, const FragmentLayout& layout, const TrainConfig& train, LrSchedule schedule,
                         torch::Device device, DataStream stream)
    : layout_(layout),
      params_(layout_parameters(model, layout_)),
      trainer_(model, train, std::move(schedule), device),
      stream_(std::move(stream)) {}

InnerStep GptInnerJob::step(int64_t step) {
  const StepResult r = trainer_.step(stream_, step);
  return {r.loss, r.tokens, r.skipped, r.grad_norm};
}

void GptInnerJob::read_fragment(int p, std::span<float> out) { gather_parameters(params_, layout_, p, out); }

void GptInnerJob::write_fragment(int p, std::span<const float> values) {
  scatter_parameters(params_, layout_, p, values);
}

void GptInnerJob::save_state(const fs::path& dir, int64_t step) {
  fs::create_directories(dir);
  const fs::path tmp = dir / "optimizer.pt.tmp";
  torch::save(trainer_.optimizer(), tmp.string());
  const auto bytes = fs::file_size(tmp);
  fs::rename(tmp, dir / "optimizer.pt");
  write_file_atomically(dir / "state.json",
                        nlohmann::json{{"format", kStateFormat}, {"step", step}, {"bytes", bytes}}.dump() + "\n");
}

int64_t GptInnerJob::restore_state(const fs::path& dir, std::string* why) {
  std::error_code ec;
  if (!fs::exists(dir / "state.json", ec)) return -1;
  try {
    const auto state = read_json_file(dir / "state.json");
    if (const int format = state.value("format", kStateFormat); format != kStateFormat) {  // none: written before 1
      *why = "state.json has format " + std::to_string(format) + ", this build reads " + std::to_string(kStateFormat);
      return -1;
    }
    if (fs::file_size(dir / "optimizer.pt") != state.at("bytes").get<uintmax_t>()) {
      *why = "optimizer.pt does not have the size state.json records";
      return -1;
    }
    torch::load(trainer_.optimizer(), (dir / "optimizer.pt").string());
    return state.at("step").get<int64_t>();
  } catch (const std::exception& e) {
    *why = e.what();
    return -1;
  }
}

}  // namespace dloco
