// Megatron's 3D rank layout; see layout.h. Torch-free (built with DLOCO_WITH_TORCH=OFF, sanitized in CI).
#include "parallel/layout.h"

#include <string>

#include "core/check.h"

namespace dloco {

ParallelLayout::ParallelLayout(int world, int tensor, int pipeline, int data)
    : world_(world), t_(tensor), p_(pipeline), d_(data) {
  if (tensor < 1 || pipeline < 1 || data < 1) {
    throw InputError("parallel layout: degrees must be at least 1 (tensor " + std::to_string(tensor) +
                     ", pipeline " + std::to_string(pipeline) + ", data " + std::to_string(data) + ")");
  }
  if (static_cast<long long>(tensor) * pipeline * data != world) {
    throw InputError("parallel layout: world " + std::to_string(world) + " ≠ tensor · pipeline · data = " +
                     std::to_string(tensor) + " · " + std::to_string(pipeline) + " · " + std::to_string(data) +
                     "; choose degrees whose product is the number of ranks");
  }
}

int ParallelLayout::rank_of(const RankCoords& c) const {
  if (c.tp < 0 || c.tp >= t_ || c.dp < 0 || c.dp >= d_ || c.pp < 0 || c.pp >= p_) {
    throw InputError("parallel layout: coordinates (tp " + std::to_string(c.tp) + ", dp " + std::to_string(c.dp) +
                     ", pp " + std::to_string(c.pp) + ") outside t = " + std::to_string(t_) + ", d = " +
                     std::to_string(d_) + ", p = " + std::to_string(p_));
  }
  return c.tp + t_ * (c.dp + d_ * c.pp);
}

RankCoords ParallelLayout::coords_of(int rank) const {
  if (rank < 0 || rank >= world_) {
    throw InputError("parallel layout: rank " + std::to_string(rank) + " outside [0, " + std::to_string(world_) +
                     ")");
  }
  return {rank % t_, (rank / t_) % d_, rank / (t_ * d_)};
}

std::vector<int> ParallelLayout::tensor_group(int rank) const {
  RankCoords c = coords_of(rank);
  std::vector<int> ranks;
  for (c.tp = 0; c.tp < t_; ++c.tp) ranks.push_back(rank_of(c));
  return ranks;
}

std::vector<int> ParallelLayout::data_group(int rank) const {
  RankCoords c = coords_of(rank);
  std::vector<int> ranks;
  for (c.dp = 0; c.dp < d_; ++c.dp) ranks.push_back(rank_of(c));
  return ranks;
}

std::vector<int> ParallelLayout::pipeline_group(int rank) const {
  RankCoords c = coords_of(rank);
  std::vector<int> ranks;
  for (c.pp = 0; c.pp < p_; ++c.pp) ranks.push_back(rank_of(c));
  return ranks;
}

}  // namespace dloco
