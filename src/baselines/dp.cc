// The dp baseline's gradient all-reduce; see dp.h.
#include "baselines/dp.h"

#include <chrono>

#include "collective/flat_model.h"

namespace dloco {

InnerTrainer::GradientHook dp_gradient_hook(GPT model, Collective& group, double* wait_s, int64_t* syncs,
                                            double* stop_votes) {
  return [model, &group, wait_s, syncs, stop_votes](double loss) mutable {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t extra = stop_votes ? 2 : 1;  // the loss, then the stop votes
    std::vector<torch::Tensor> parts{flatten_parameters(model, /*grads=*/true), torch::full({1}, loss, torch::kFloat)};
    if (stop_votes) parts.push_back(torch::full({1}, *stop_votes, torch::kFloat));
    auto flat = torch::cat(parts);  // (N + extra): Σ gradients, loss, votes after the all-reduce
    group.allreduce_sum(flat);
    if (stop_votes) *stop_votes = flat[flat.numel() - 1].item<double>();
    flat.div_(static_cast<double>(group.world()));
    unflatten_into(model, flat.narrow(0, 0, flat.numel() - extra), /*grads=*/true);
    if (wait_s) *wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (syncs) ++*syncs;
    return flat[flat.numel() - extra].item<double>();
  };
}

}  // namespace dloco
