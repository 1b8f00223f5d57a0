// Megatron's 3D rank layout (parallel/layout.h) against the spec's example W = 16, t = 2, p = 4, d = 2
// (docs/parallel.md): TP {0,1},{2,3}…; DP {0,2},{1,3}…; PP {0,4,8,12}…. Torch-free.
#include <gtest/gtest.h>

#include <set>

#include "core/check.h"
#include "parallel/layout.h"

namespace dloco {
namespace {

using Ranks = std::vector<int>;

TEST(ParallelLayout, SpecExampleSixteenRanksGroupsTable) {
  const ParallelLayout layout(16, /*tensor=*/2, /*pipeline=*/4, /*data=*/2);
  struct Row {
    int rank;
    RankCoords coords;
    Ranks tp, dp, pp;
  };
  const std::vector<Row> table = {
      {0, {0, 0, 0}, {0, 1}, {0, 2}, {0, 4, 8, 12}},     {1, {1, 0, 0}, {0, 1}, {1, 3}, {1, 5, 9, 13}},
      {2, {0, 1, 0}, {2, 3}, {0, 2}, {2, 6, 10, 14}},    {3, {1, 1, 0}, {2, 3}, {1, 3}, {3, 7, 11, 15}},
      {4, {0, 0, 1}, {4, 5}, {4, 6}, {0, 4, 8, 12}},     {7, {1, 1, 1}, {6, 7}, {5, 7}, {3, 7, 11, 15}},
      {10, {0, 1, 2}, {10, 11}, {8, 10}, {2, 6, 10, 14}}, {15, {1, 1, 3}, {14, 15}, {13, 15}, {3, 7, 11, 15}},
  };
  for (const auto& row : table) {
    EXPECT_EQ(layout.coords_of(row.rank), row.coords) << "rank " << row.rank;
    EXPECT_EQ(layout.rank_of(row.coords), row.rank);
    EXPECT_EQ(layout.tensor_group(row.rank), row.tp) << "rank " << row.rank;
    EXPECT_EQ(layout.data_group(row.rank), row.dp) << "rank " << row.rank;
    EXPECT_EQ(layout.pipeline_group(row.rank), row.pp) << "rank " << row.rank;
  }
}

// Every rank is in exactly one group per axis, the groups of an axis partition the world, and each rank sits at
// its own coordinate inside its groups (the index Collective::subgroup makes its sub-rank).
TEST(ParallelLayout, GroupsPartitionTheWorldAndRoundTrip) {
  for (const auto& [t, p, d] : std::vector<std::tuple<int, int, int>>{{1, 1, 1}, {2, 4, 2}, {3, 1, 2}, {1, 5, 1}}) {
    const ParallelLayout layout(t * p * d, t, p, d);
    std::set<Ranks> tp_groups, dp_groups, pp_groups;
    for (int r = 0; r < layout.world(); ++r) {
      const RankCoords c = layout.coords_of(r);
      EXPECT_EQ(layout.rank_of(c), r);
      EXPECT_EQ(layout.tensor_group(r).at(c.tp), r);
      EXPECT_EQ(layout.data_group(r).at(c.dp), r);
      EXPECT_EQ(layout.pipeline_group(r).at(c.pp), r);
      tp_groups.insert(layout.tensor_group(r));
      dp_groups.insert(layout.data_group(r));
      pp_groups.insert(layout.pipeline_group(r));
    }
    EXPECT_EQ(static_cast<int>(tp_groups.size()), p * d);
    EXPECT_EQ(static_cast<int>(dp_groups.size()), t * p);
    EXPECT_EQ(static_cast<int>(pp_groups.size()), t * d);
  }
}

TEST(ParallelLayout, InvalidShapesAreInputErrors) {
  EXPECT_THROW(ParallelLayout(15, 2, 4, 2), InputError);  // W ≠ t·p·d
  EXPECT_THROW(ParallelLayout(0, 0, 1, 1), InputError);   // a degree below 1
  EXPECT_THROW(ParallelLayout(-2, -1, 1, 2), InputError);
  const ParallelLayout layout(8, 2, 2, 2);
  EXPECT_THROW(layout.coords_of(8), InputError);
  EXPECT_THROW(layout.coords_of(-1), InputError);
  EXPECT_THROW(layout.rank_of({2, 0, 0}), InputError);
  EXPECT_THROW(layout.data_group(9), InputError);
}

}  // namespace
}  // namespace dloco
