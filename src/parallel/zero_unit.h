// Internal to ZeRO (zero.cc, zero_state.cc): one flat, sharded group of parameters.
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "parallel/offload.h"
#include "parallel/zero.h"

namespace dloco {

/// One flat, sharded group of parameters: the whole model (stages 1, 2) or one stage-3 unit.
struct ZeroAdamW::Unit {
  std::vector<torch::Tensor> params;         // the module's parameter tensors (views of flat, or released)
  std::vector<std::string> names;            // model->named_parameters() keys
  std::vector<std::vector<int64_t>> shapes;  // their shapes (kept while released)
  std::vector<int64_t> offsets;              // element offset of each in the flat buffer
  int64_t numel = 0, padded = 0, shard = 0;  // Σ numel; rounded up to a multiple of N; padded / N = S
  torch::Tensor flat;                        // (padded) stages 1, 2: the full parameters the module views
  torch::Tensor slice;                       // (S) own parameters: a view of flat, or (stage 3) the only copy
  torch::Tensor grad;                        // (S) stages 2, 3: the summed gradient slice since the last step
  std::unique_ptr<MappedState> offload;      // m then v in a mapped file (ZeroOptions::offload_dir); declared
                                             // before the views below so that it outlives them
  torch::Tensor exp_avg, exp_avg_sq;         // (S) AdamW's m and v (views of `offload` when offloaded)
  std::vector<std::pair<int64_t, int64_t>> decay;  // (start, length) ranges of the slice with weight decay
  std::vector<std::pair<int64_t, int64_t>> counted;  // ranges of the slice this rank adds to ‖g‖² (with TP, the
                                                     // replicated gains on TP rank 0 only)
  torch::Tensor anchor;  // (0) requires grad: makes autograd call the unit's backward even when its input has none
};

}  // namespace dloco
