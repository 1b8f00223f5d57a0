// The c10d adapter's collectives for the inner parallelism (collective/process_group.h): all-gather (list and
// flat), reduce-scatter (both emulations) against all-reduce-then-slice, all-to-all, reduce, barrier, sub-groups,
// the deadline when a rank never calls, a peer that is gone, and the traffic counters. Ranks are threads of this
// process, each joining one Gloo group through one c10d FileStore (tests/support/gloo_ranks.h). Sizes sweep 0, 1
// and sizes not divisible by M, at M = 1, 2, 4.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "collective/process_group.h"
#include "core/check.h"
#include "support/gloo_ranks.h"

namespace dloco {
namespace {

namespace fs = std::filesystem;

using testing_support::expect_no_errors;
using testing_support::fresh_store;
using testing_support::on_ranks;

const std::vector<int> kWorlds = {1, 2, 4};
const std::vector<int64_t> kSizes = {0, 1, 7};  // 7: not divisible by 2 or 4

// Rank r's shard of n elements: 100·r + i, exact in fp32.
torch::Tensor shard_of(int r, int64_t n) { return torch::arange(n, torch::kFloat) + 100.0f * r; }

TEST(Collectives, AllGatherListAndFlatPlaceRankRsShardAtR) {
  for (int world : kWorlds) {
    for (int64_t n : kSizes) {
      expect_no_errors(on_ranks(world, [&](Collective& g) {
        const auto mine = shard_of(g.rank(), n);  // (n)
        const auto list = g.all_gather(mine.view({1, n}));
        ASSERT_EQ(static_cast<int>(list.size()), world);
        auto flat = torch::full({world * n}, -1.0f);  // (M·n)
        g.all_gather_flat(flat, mine);
        for (int r = 0; r < world; ++r) {
          EXPECT_TRUE(list[r].equal(shard_of(r, n).view({1, n}))) << "list, M " << world << " n " << n;
          EXPECT_TRUE(flat.narrow(0, r * n, n).equal(shard_of(r, n))) << "flat, M " << world << " n " << n;
        }
        EXPECT_THROW(g.all_gather_flat(torch::zeros({world * n + 1}), mine), InputError);
      }));
    }
  }
}

TEST(Collectives, AllReduceBroadcastReduceAtSizesZeroOneAndOdd) {
  for (int world : kWorlds) {
    for (int64_t n : kSizes) {
      expect_no_errors(on_ranks(world, [&](Collective& g) {
        const int root = world - 1;
        auto sum = shard_of(g.rank(), n);
        g.allreduce_sum(sum);
        auto expected = torch::zeros({n});
        for (int r = 0; r < world; ++r) expected += shard_of(r, n);  // integers: exact in any order
        EXPECT_TRUE(sum.equal(expected)) << "all-reduce, M " << world << " n " << n;
        auto reduced = shard_of(g.rank(), n);
        g.reduce_sum(reduced, root);
        if (g.rank() == root) {
          EXPECT_TRUE(reduced.equal(expected)) << "reduce, M " << world << " n " << n;
        }
        auto copy = shard_of(g.rank(), n);
        g.broadcast(copy, root);
        EXPECT_TRUE(copy.equal(shard_of(root, n))) << "broadcast, M " << world << " n " << n;
        g.barrier();
      }));
    }
  }
}

TEST(Collectives, AllToAllSendsChunkJToRankJ) {
  for (int world : kWorlds) {
    for (int64_t n : kSizes) {
      expect_no_errors(on_ranks(world, [&](Collective& g) {
        auto input = torch::empty({world * n});   // (M·n): chunk j = 10·rank + j
        for (int j = 0; j < world; ++j) input.narrow(0, j * n, n).fill_(10.0f * g.rank() + j);
        auto output = torch::empty({world * n});  // (M·n): chunk j from rank j = 10·j + rank
        g.all_to_all(output, input);
        for (int j = 0; j < world; ++j) {
          EXPECT_TRUE(output.narrow(0, j * n, n).equal(torch::full({n}, 10.0f * j + g.rank())));
        }
        if (world > 1) {
          EXPECT_THROW(g.all_to_all(torch::zeros({world + 1}), torch::zeros({world + 1})), InputError);
        }
      }));
    }
  }
}

// Reduce-scatter against all-reduce-then-slice on normal(0, 1) inputs. Not bitwise (the summation order differs);
// the spec's bound is 2.4e-7 of the largest |sum| (two different orders of M ≤ 4 fp32 additions).
TEST(Collectives, ReduceScatterMatchesAllReduceThenSliceBothWays) {
  std::mutex mu;
  double worst = 0;
  for (int world : kWorlds) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}}) {
      expect_no_errors(on_ranks(world, [&](Collective& g) {
        torch::Tensor input;
        {
          std::lock_guard<std::mutex> lock(mu);
          auto gen = at::detail::createCPUGenerator(1000 + g.rank());
          input = at::normal(0.0, 1.0, {world * n}, gen);  // (M·n)
        }
        auto reference = input.clone();
        g.allreduce_sum(reference);
        reference = reference.narrow(0, g.rank() * n, n);  // (n)
        for (auto algo : {ReduceScatterAlgo::kAllToAll, ReduceScatterAlgo::kReducePerOwner}) {
          auto out = torch::empty({n});  // (n)
          g.reduce_scatter_sum(out, input, algo);
          if (n == 0) continue;
          const double err = (out - reference).abs().max().item<double>();
          const double scale = reference.abs().max().item<double>();
          EXPECT_LE(err, 2.4e-7 * scale) << "M " << world << " n " << n << " algo " << static_cast<int>(algo);
          std::lock_guard<std::mutex> lock(mu);
          worst = std::max(worst, err / scale);
        }
        EXPECT_THROW(g.reduce_scatter_sum(torch::zeros({n + 1}), input), InputError);
      }));
    }
  }
  std::printf("reduce-scatter vs all-reduce-then-slice: worst relative difference %.3g\n", worst);
}

TEST(Collectives, SubgroupsOfFourRanksTwoSplitsAtOnce) {
  expect_no_errors(on_ranks(4, [](Collective& g) {
    const int r = g.rank();
    // TP-like {0,1},{2,3} and DP-like {0,2},{1,3}, both formed before either is used.
    auto rows = g.subgroup(r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3}, "rows");
    auto cols = g.subgroup(r % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3}, "cols");
    EXPECT_EQ(rows->world(), 2);
    EXPECT_EQ(rows->rank(), r % 2);
    EXPECT_EQ(cols->rank(), r / 2);
    auto a = torch::full({3}, static_cast<float>(1 << r));  // a bit per rank: the sum names the members
    rows->allreduce_sum(a);
    EXPECT_EQ(a[0].item<float>(), r < 2 ? 1 + 2 : 4 + 8);
    auto b = torch::full({3}, static_cast<float>(1 << r));
    cols->allreduce_sum(b);
    EXPECT_EQ(b[0].item<float>(), r % 2 == 0 ? 1 + 4 : 2 + 8);
    auto c = torch::full({1}, static_cast<float>(1 << r));
    g.allreduce_sum(c);  // the parent still works
    EXPECT_EQ(c[0].item<float>(), 15.0f);
    EXPECT_THROW(g.subgroup({0, 0}, "bad"), InputError);
    EXPECT_THROW(g.subgroup({(r + 1) % 4}, "without me"), InputError);
  }));
}

// Rank 2 joins and then never calls: the others' all-reduce and all-gather must end in CollectiveError at the
// deadline (2 s here) instead of hanging. Rank 2 keeps its group alive until they have failed, so it is the
// deadline and not a closed socket that ends them.
TEST(Collectives, ARankThatNeverCallsMakesTheOthersFailWithCollectiveError) {
  std::mutex mu;
  std::condition_variable cv;
  int failed = 0;
  const auto errors = on_ranks(
      3,
      [&](Collective& g) {
        if (g.rank() == 2) {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return failed == 2; });
          return;
        }
        bool threw = false;
        try {
          auto t = torch::ones({16});
          g.allreduce_sum(t);
        } catch (const CollectiveError&) {
          threw = true;
        }
        std::lock_guard<std::mutex> lock(mu);
        EXPECT_TRUE(threw) << "rank " << g.rank();
        EXPECT_EQ(g.traffic().all_reduce.calls, 0) << "an all-reduce that passed its deadline moved nothing";
        EXPECT_EQ(g.bytes_sent(), 0);
        ++failed;
        cv.notify_all();
      },
      /*timeout_s=*/2);
  expect_no_errors(errors);
  EXPECT_EQ(failed, 2);
}

int64_t calls(const Traffic& t) {
  return t.all_reduce.calls + t.reduce_scatter.calls + t.all_gather.calls + t.all_to_all.calls + t.broadcast.calls +
         t.reduce.calls + t.barrier.calls + t.send.calls;
}

// Rank 1 joins and leaves (its group, and with it its sockets, is gone); rank 0 then tries every operation on a
// non-empty tensor. Each must throw CollectiveError and leave traffic() at zero: the counters say what the group
// moved, not what it tried (an operation is counted once it completed, an async one at wait()).
TEST(Collectives, AnOperationThatFailsBecauseThePeerIsGoneIsNotCounted) {
  const fs::path store = fresh_store("collectives");
  std::atomic<bool> gone{false};
  std::string join_error;
  std::thread leaver([&] {
    try {
      Collective group({store, 1, 2, "127.0.0.1", 3});
    } catch (const std::exception& e) {
      join_error = e.what();
    }
    gone = true;
  });
  try {
    Collective g({store, 0, 2, "127.0.0.1", /*timeout_s=*/3});
    while (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const auto t = torch::ones({1024});  // (n), fp32
    const std::vector<std::pair<const char*, std::function<void()>>> ops = {
        {"all-reduce", [&] { g.allreduce_sum(t.clone()); }},
        {"async all-reduce", [&] { g.allreduce_sum_async(t.clone()).wait(); }},
        {"broadcast from the root", [&] { g.broadcast(t.clone(), 0); }},
        {"broadcast to this rank", [&] { g.broadcast(t.clone(), 1); }},
        {"all-gather", [&] { g.all_gather(t); }},
        {"flat all-gather", [&] { g.all_gather_flat(torch::empty({2048}), t); }},
        {"all-to-all", [&] { g.all_to_all(torch::empty({1024}), t); }},
        {"reduce to this rank", [&] { g.reduce_sum(t.clone(), 0); }},
        {"reduce to the peer", [&] { g.reduce_sum(t.clone(), 1); }},
        {"reduce-scatter (all-to-all)",
         [&] { g.reduce_scatter_sum(torch::empty({512}), t, ReduceScatterAlgo::kAllToAll); }},
        {"reduce-scatter (reduce per owner)",
         [&] { g.reduce_scatter_sum(torch::empty({512}), t, ReduceScatterAlgo::kReducePerOwner); }},
        {"barrier", [&] { g.barrier(); }},
        {"send", [&] { g.send(t.clone(), 1); }},
        {"isend", [&] { g.isend(t.clone(), 1).wait(); }},
    };
    for (const auto& [what, op] : ops) {
      EXPECT_THROW(op(), CollectiveError) << what;
      EXPECT_EQ(calls(g.traffic()), 0) << "after a failed " << what;
      EXPECT_EQ(g.bytes_sent(), 0) << "after a failed " << what;
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << "rank 0: " << e.what();
  }
  leaver.join();
  EXPECT_EQ(join_error, "");
}

TEST(Collectives, TrafficCountersFollowTheRingModel) {
  expect_no_errors(on_ranks(4, [](Collective& g) {
    const int64_t n = 1000, bytes = 4 * n;  // fp32
    auto t = torch::ones({n});
    g.allreduce_sum(t);
    EXPECT_EQ(g.traffic().all_reduce.bytes, 2 * 3 * bytes / 4);  // 2(M−1)/M·n
    auto out = torch::empty({n / 4});
    g.reduce_scatter_sum(out, t, ReduceScatterAlgo::kAllToAll);
    g.reduce_scatter_sum(out, t, ReduceScatterAlgo::kReducePerOwner);
    EXPECT_EQ(g.traffic().reduce_scatter.calls, 2);
    EXPECT_EQ(g.traffic().reduce_scatter.bytes, 2 * 3 * bytes / 4);  // (M−1)/M of the full input, each
    EXPECT_EQ(g.traffic().reduce.calls, 0);                          // counted once, as a reduce-scatter
    EXPECT_EQ(g.traffic().all_to_all.calls, 0);
    g.all_gather_flat(t, out);
    EXPECT_EQ(g.traffic().all_gather.bytes, 3 * bytes / 4);  // (M−1)/M of the full output
    g.broadcast(t, 1);
    EXPECT_EQ(g.traffic().broadcast.bytes, g.rank() == 1 ? bytes : 0);
    g.reduce_sum(t, 2);
    EXPECT_EQ(g.traffic().reduce.bytes, g.rank() == 2 ? 0 : bytes);
    g.barrier();
    EXPECT_EQ(g.traffic().barrier.calls, 1);
    EXPECT_EQ(g.bytes_sent(), g.traffic().bytes());
    EXPECT_EQ(g.bytes_sent(), 6000 + 6000 + 3000 + (g.rank() == 1 ? 4000 : 0) + (g.rank() == 2 ? 0 : 4000));
  }));
}

}  // namespace
}  // namespace dloco
