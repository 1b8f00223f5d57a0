// Sharded initialisation; see sharded_init.h.
#include "parallel/sharded_init.h"

#include <mutex>
#include <string>
#include <vector>

#include "core/check.h"

namespace dloco {

std::mutex& torch_generator_lock() {
  static std::mutex lock;
  return lock;
}

GPT seeded_gpt(const ModelConfig& cfg, uint64_t seed) {
  std::lock_guard<std::mutex> hold(torch_generator_lock());
  torch::manual_seed(seed);
  return GPT(cfg);
}

namespace {

// A part's tensors become placeholders: their shapes (which ZeroAdamW lays its units out by) over one element.
void to_placeholders(torch::nn::Module& part) {
  torch::NoGradGuard no_grad;
  for (auto& p : part.parameters()) p.set_data(torch::zeros({1}, p.options()).expand(p.sizes()));
}

}  // namespace

std::unique_ptr<ZeroAdamW> make_sharded_zero3(const ModelConfig& cfg, uint64_t seed, TensorParallelGroup& tensor,
                                              Collective& data, const ZeroOptions& options) {
  if (options.stage != 3) throw InputError("sharded initialisation builds ZeRO-3 slices: stage 3");
  std::lock_guard<std::mutex> hold(torch_generator_lock());
  torch::manual_seed(seed);
  TensorParallelGPT skeleton(cfg, tensor, to_placeholders);  // (1) the modules' own draws, one part at a time
  // (2) GPTImpl::init_parameter's draws, parameter by parameter in named_parameters() order (= unit order).
  const ZeroUnitInit init = [&](const std::vector<std::string>& names, const std::vector<torch::Tensor>& values) {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < names.size(); ++i) {
      const auto sizes = skeleton->full_size(names[i]);
      auto full = sizes.size() >= 2 ? torch::empty(sizes) : torch::ones(sizes);  // RMSNorm's gain is 1
      GPTImpl::init_parameter(names[i], full, cfg);
      values[i].copy_(shard_of(full, skeleton->shard_spec(names[i]), tensor.rank(), tensor.world()));
    }
  };
  return std::make_unique<ZeroAdamW>(skeleton, tensor, data, options, init);
}

}  // namespace dloco
