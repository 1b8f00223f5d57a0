// Point-to-point send/recv of the c10d adapter (collective/process_group.h), as pipeline stages use them: ranks
// are threads of this process joined through one FileStore over real Gloo. Sizes 0, 1 and 4 Mi floats arrive
// bitwise; messages with different tags can be received out of order while the sends are in flight; a peer that
// never sends makes recv fail with CollectiveError once the group's deadline has passed (not before, and within
// 20× the deadline, measured with steady_clock); bad peers and tags are InputError.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "collective/process_group.h"
#include "core/check.h"
#include "support/gloo_ranks.h"

namespace dloco {
namespace {

namespace fs = std::filesystem;
using testing_support::on_ranks;

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("dloco_p2p_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

TEST(PointToPoint, SizesZeroOneLargeArriveBitwise) {
  const fs::path dir = fresh_dir("sizes");
  const std::vector<int64_t> sizes = {0, 1, 4 << 20};  // elements; the last is 16 MiB of fp32
  std::vector<torch::Tensor> sent, received;
  for (int64_t n : sizes) sent.push_back(torch::randn({n}));
  const auto errors = on_ranks(dir / "store", 2, [&](Collective& group) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (group.rank() == 0) {
        group.send(sent[i], 1, static_cast<int>(i));
      } else {
        auto t = torch::full({sizes[i]}, NAN);
        group.recv(t, 0, static_cast<int>(i));
        received.push_back(t);
      }
    }
    if (group.rank() == 0) {
      EXPECT_EQ(group.bytes_sent(), (1 + (4 << 20)) * 4);
    }
  });
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");
  ASSERT_EQ(received.size(), sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) EXPECT_TRUE(torch::equal(sent[i], received[i])) << sizes[i];
  fs::remove_all(dir);
}

TEST(PointToPoint, TagsMatchOutOfOrderWhileSendsAreInFlight) {
  const fs::path dir = fresh_dir("tags");
  torch::Tensor a_in = torch::zeros({3, 4}), b_in = torch::zeros({5});
  const auto errors = on_ranks(dir / "store", 2, [&](Collective& group) {
    if (group.rank() == 1) {
      auto a = group.isend(torch::arange(12, torch::kFloat).view({3, 4}), 0, /*tag=*/7);
      auto b = group.isend(torch::full({5}, 2.5f), 0, /*tag=*/9);
      a.wait();
      b.wait();
    } else {
      group.recv(b_in, 1, 9);  // the second message first
      group.recv(a_in, 1, 7);
    }
  });
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");
  EXPECT_TRUE(torch::equal(a_in, torch::arange(12, torch::kFloat).view({3, 4})));
  EXPECT_TRUE(torch::equal(b_in, torch::full({5}, 2.5f)));
  fs::remove_all(dir);
}

// The upper bound is generous (20× the deadline: a loaded 2-core machine delays the wake-up, not by a minute), and
// it is enforced even when recv never gives up: rank 0 stays silent only that long, then drops its group, so a recv
// that ignores its deadline ends (on the closed socket) after the bound and fails the test instead of hanging it.
TEST(PointToPoint, SilentPeerFailsRecvAfterTheDeadlineAndWithinAMarginOfIt) {
  const fs::path dir = fresh_dir("silent");
  const double deadline_s = 3;
  const double bound_s = 20 * deadline_s;
  std::atomic<bool> done{false};
  std::atomic<bool> joined{false};
  double waited_s = -1;
  const auto errors = on_ranks(dir / "store", 2, [&](Collective& group) {
    if (group.rank() == 0) {  // alive but silent until rank 1 has given up, or the bound has passed
      const auto start = std::chrono::steady_clock::now();
      while (!done && std::chrono::steady_clock::now() - start < std::chrono::duration<double>(bound_s)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      return;
    }
    joined = true;
    const auto start = std::chrono::steady_clock::now();
    try {
      auto t = torch::zeros({4});
      group.recv(t, 0, 0);
    } catch (...) {
      waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      done = true;
      throw;
    }
    done = true;
  }, deadline_s);
  ASSERT_TRUE(joined) << "the group did not form: " << errors[1];
  EXPECT_EQ(errors[0], "");
  EXPECT_NE(errors[1].find("recv from rank 0"), std::string::npos) << errors[1];
  EXPECT_GE(waited_s, 0.9 * deadline_s) << "recv gave up before its deadline";
  EXPECT_LT(waited_s, bound_s) << "recv did not fail within 20× its deadline";
  std::printf("silent peer: recv failed after %.2f s (deadline %.1f s): %s\n", waited_s, deadline_s,
              errors[1].c_str());
  fs::remove_all(dir);
}

TEST(PointToPoint, BadPeerOrTagIsInputError) {
  const fs::path dir = fresh_dir("bad");
  const auto errors = on_ranks(dir / "store", 2, [&](Collective& group) {
    auto t = torch::zeros({2});
    EXPECT_THROW(group.send(t, group.rank(), 0), InputError);  // to itself
    EXPECT_THROW(group.send(t, 2, 0), InputError);             // outside the group
    EXPECT_THROW(group.recv(t, 1 - group.rank(), -1), InputError);
    EXPECT_THROW(group.send(torch::zeros({4, 4}).t(), 1 - group.rank(), 0), InputError);  // not contiguous
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dloco
