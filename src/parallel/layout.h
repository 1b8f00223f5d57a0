// The 3D rank layout of a learner (Megatron-LM, docs/parallel.md): W = t·p·d ranks,
// rank = tp + t·(dp + d·pp), so tensor-parallel ranks are adjacent (the fastest links) and pipeline stages
// outermost. Pure arithmetic: the coordinates of a rank and the rank lists of its TP, DP and PP groups, which the
// caller passes to Collective::subgroup.
// Deliberately not here: context or expert parallelism (Megatron's cp and ep axes), and forming the groups.
#pragma once

#include <vector>

namespace dloco {

/// A rank's place on the three axes: tp ∈ [0, t), dp ∈ [0, d), pp ∈ [0, p).
struct RankCoords {
  int tp = 0, dp = 0, pp = 0;
  bool operator==(const RankCoords& o) const { return tp == o.tp && dp == o.dp && pp == o.pp; }
};

/// W = t·p·d ranks of one learner, TP innermost, then DP, then PP (Megatron's order without cp/ep).
class ParallelLayout {
 public:
  /// t tensor-parallel degree, p pipeline stages, d data-parallel degree, world W. Throws InputError when a
  /// degree is below 1 or W ≠ t·p·d, with the numbers in the message.
  ParallelLayout(int world, int tensor, int pipeline, int data);

  int world() const { return world_; }
  int tensor() const { return t_; }
  int pipeline() const { return p_; }
  int data() const { return d_; }

  /// rank = tp + t·(dp + d·pp). Throws InputError when a coordinate is outside its axis.
  int rank_of(const RankCoords& c) const;
  /// The inverse of rank_of. Throws InputError for a rank outside [0, W).
  RankCoords coords_of(int rank) const;

  /// The t ranks sharing rank's (dp, pp), in tp order: its tensor-parallel group. Throws InputError (bad rank).
  std::vector<int> tensor_group(int rank) const;
  /// The d ranks sharing rank's (tp, pp), in dp order: its data-parallel group (ZeRO shards over it).
  std::vector<int> data_group(int rank) const;
  /// The p ranks sharing rank's (tp, dp), in stage order: its pipeline.
  std::vector<int> pipeline_group(int rank) const;

 private:
  int world_, t_, p_, d_;
};

}  // namespace dloco
