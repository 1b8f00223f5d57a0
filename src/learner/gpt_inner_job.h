// The first inner job: one process holding the whole GPT, its AdamW state and its data stream
// (train/trainer.h). The outer sync reads and writes its fragments through the layout (train/fragment_io.h).
#pragma once

#include <memory>

#include "core/fragments.h"
#include "learner/inner_job.h"
#include "train/trainer.h"

namespace dloco {

class GptInnerJob final : public InnerJob {
 public:
  /// `model` already lives on `device`; `stream` is the leased data stream at its resume cursor.
  GptInnerJob(GPT model, const FragmentLayout& layout, const TrainConfig& train, LrSchedule schedule,
              torch::Device device, DataStream stream);

  InnerStep step(int64_t step) override;
  StreamCursor cursor() const override { return stream_.cursor(); }
  void replace_stream(DataStream stream) override { stream_ = std::move(stream); }
  void read_fragment(int p, std::span<float> out) override;
  void write_fragment(int p, std::span<const float> values) override;
  /// dir/optimizer.pt, then dir/state.json = {"format", "step", "bytes"} written after it, both atomically.
  void save_state(const std::filesystem::path& dir, int64_t step) override;
  int64_t restore_state(const std::filesystem::path& dir, std::string* why) override;
  void rewarm(int64_t from_step) override { trainer_.rewarm(from_step); }
  /// The trainer (the dp baseline sets its gradient hook and checkpoints its AdamW, baselines/run_worker.cc).
  InnerTrainer& trainer() { return trainer_; }

 private:
  FragmentLayout layout_;
  std::vector<torch::Tensor> params_;
  InnerTrainer trainer_;
  DataStream stream_;
};

}  // namespace dloco
