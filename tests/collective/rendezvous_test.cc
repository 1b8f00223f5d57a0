// How a group's ranks meet (collective/process_group.h, docs/protocol.md §11 "Across hosts"): over a TCP store
// that rank 0 serves (tcp://HOST:PORT) as well as through a file; each rank proves it holds the run secret before
// Gloo joins, and a group with a rank that cannot is refused on every rank, naming it; a group off loopback is
// refused without run.trusted_network (Gloo's traffic has no TLS; a TCP store listens on every interface, so
// on loopback too); a group may meet inside another group's TCP store
// (dp over learner groups) and a re-formed group may reuse the port; a rank claimed twice is refused to the second
// process; IPv6 addresses work. Ranks are threads of this process.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collective/process_group.h"
#include "core/check.h"
#include "support/gloo_ranks.h"

namespace dloco {
namespace {

using testing_support::expect_no_errors;

// A TCP port nothing on this machine listens on right now, on any interface (bound to port 0, read back, closed): a
// TCP store listens on every interface.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t length = sizeof(a);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &length), 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Runs body on `world` ranks (threads) joined at `store` (run.trusted_network set: a TCP store listens on every
// interface); secrets[i] is thread i's secret, ranks[i] its rank (default: i). Each thread's error, "" if none;
// `failures`, when given, counts the threads that failed as they fail.
std::vector<std::string> on_ranks(const std::string& store, const std::vector<std::string>& secrets,
                                  const std::function<void(Collective&)>& body, std::vector<int> ranks_of = {},
                                  std::atomic<int>* failures = nullptr) {
  const int world = ranks_of.empty() ? static_cast<int>(secrets.size()) : static_cast<int>(secrets.size()) - 1;
  if (ranks_of.empty()) {
    for (int r = 0; r < world; ++r) ranks_of.push_back(r);
  }
  const int threads = static_cast<int>(secrets.size());
  std::vector<std::string> errors(threads);
  std::vector<std::thread> ranks;
  for (int i = 0; i < threads; ++i) {
    ranks.emplace_back([&, i] {
      try {
        CollectiveOptions o{store, ranks_of[static_cast<size_t>(i)], world, "", 20};
        o.secret = secrets[i];
        o.trusted_network = true;
        Collective group(o);
        body(group);
      } catch (const std::exception& e) {
        errors[i] = e.what();
        if (failures != nullptr) ++*failures;
      }
    });
  }
  for (auto& t : ranks) t.join();
  return errors;
}

// Rank r contributes r + 1 to every element: the sum over 3 ranks is 6.
void sum_ranks(Collective& group) {
  auto t = torch::full({1000}, static_cast<float>(group.rank() + 1));
  group.allreduce_sum(t);
  EXPECT_TRUE(torch::equal(t, torch::full({1000}, 6.0f))) << "rank " << group.rank();
}

TEST(Rendezvous, ThreeRanksMeetOverTcpWithTheSecretAndReduceAndFormSubGroups) {
  const std::string store = "tcp://127.0.0.1:" + std::to_string(free_port());
  const auto errors = on_ranks(store, {"s3cret", "s3cret", "s3cret"}, [](Collective& group) {
    sum_ranks(group);
    if (group.rank() < 2) {  // a sub-group rendezvouses through a prefix of the same TCP store
      auto pair = group.subgroup({0, 1}, "pair");
      auto t = torch::ones({7});
      pair->allreduce_sum(t);
      EXPECT_TRUE(torch::equal(t, torch::full({7}, 2.0f)));
    }
    group.barrier();
  });
  expect_no_errors(errors);
}

TEST(Rendezvous, ARankWithAnotherSecretIsRefusedOnEveryRankAndNamed) {
  for (const bool tcp : {true, false}) {
    const std::string store = tcp ? "tcp://127.0.0.1:" + std::to_string(free_port())
                                  : testing_support::fresh_store("rendezvous").string();
    const auto errors = on_ranks(store, {"s3cret", "s3cret", "guess"}, [](Collective&) {
      ADD_FAILURE() << "a group with a rank of another secret was formed";
    });
    for (int r = 0; r < 3; ++r) {
      EXPECT_NE(errors[r].find("proof of the run secret"), std::string::npos) << tcp << " rank " << r << ": " << errors[r];
    }
    EXPECT_NE(errors[0].find("rank(s) 2 does not match"), std::string::npos) << errors[0];
    EXPECT_NE(errors[2].find("rank(s) 0, 1 does not match"), std::string::npos) << errors[2];
    // No secret on one rank is no better than a wrong one.
    const auto unproven = on_ranks(tcp ? "tcp://127.0.0.1:" + std::to_string(free_port())
                                       : testing_support::fresh_store("rendezvous").string(),
                                   {"s3cret", ""}, [](Collective&) { ADD_FAILURE() << "formed without a proof"; });
    EXPECT_NE(unproven[0].find("rank(s) 1 does not match"), std::string::npos) << unproven[0];
  }
}

TEST(Rendezvous, ARankClaimedTwiceIsRefusedToTheSecondProcess) {
  const std::string store = "tcp://127.0.0.1:" + std::to_string(free_port());
  // Threads 1 and 2 both claim rank 1 of 2: whichever comes second is refused, naming the claim. The group that
  // formed keeps rank 0's store up until then (else the second claimant could only find it gone).
  std::atomic<int> failures{0};
  const auto keep_store = [&failures](Collective& group) {
    group.barrier();
    for (int i = 0; i < 6000 && failures.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  };
  const auto errors = on_ranks(store, {"s", "s", "s"}, keep_store, {0, 1, 1}, &failures);
  int claimed = 0;
  for (const auto& e : errors) claimed += e.find("rank 1 was already claimed by another process") != std::string::npos;
  EXPECT_EQ(claimed, 1) << errors[0] << " | " << errors[1] << " | " << errors[2];
}

TEST(Rendezvous, AGroupOffLoopbackIsRefusedWithoutTrustedNetworkBeforeItDialsAnything) {
  // 192.0.2.1 is TEST-NET-1: nothing answers there, so a refusal that came from dialing would take the deadline. A
  // TCP store on loopback is refused too: the store listens on every interface.
  for (const auto& [store, host] : std::vector<std::pair<std::string, std::string>>{
           {"tcp://192.0.2.1:29500", "127.0.0.1"},
           {"tcp://127.0.0.1:" + std::to_string(free_port()), "127.0.0.1"},
           {testing_support::fresh_store("rendezvous").string(), "192.0.2.1"}}) {
    CollectiveOptions o{store, 0, 2, host, 20};
    try {
      Collective group(o);
      ADD_FAILURE() << "formed off loopback without run.trusted_network: " << store;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("run.trusted_network = true"), std::string::npos) << e.what();
    }
  }
}

TEST(Rendezvous, MalformedTcpAddressesAreInputErrors) {
  for (const std::string store : {"tcp://127.0.0.1", "tcp://:29500", "tcp://127.0.0.1:0", "tcp://127.0.0.1:70000",
                                  "tcp://127.0.0.1:29x00", "tcp://127.0.0.1:29500/"}) {
    CollectiveOptions o{store, 0, 1, "127.0.0.1", 5};
    EXPECT_THROW(Collective{o}, InputError) << store;
  }
}

TEST(Rendezvous, AGroupMeetsInsideAnotherGroupsStoreAndAReformedGroupReusesThePort) {
  const std::string store = "tcp://127.0.0.1:" + std::to_string(free_port());
  // The outer group (its rank 0 serves the store) and, inside it, the group of dp's rank-1 replicas; then a second
  // inner group whose rank 1 holds another secret, refused there too.
  std::vector<std::string> inner_errors(2), refused(2);
  const auto errors = on_ranks(store, {"s", "s"}, [&](Collective& outer) {
    std::thread inner([&, r = outer.rank()] {
      auto join = [&](const std::string& at, const std::string& secret) {
        CollectiveOptions o{at, r, 2, "", 20};
        o.secret = secret;
        o.trusted_network = true;
        return std::make_unique<Collective>(o);
      };
      try {
        auto replicas = join(replica_rendezvous(store, 1), "s");
        auto t = torch::full({5}, 3.0f);
        replicas->allreduce_sum(t);
        EXPECT_TRUE(torch::equal(t, torch::full({5}, 6.0f)));
        replicas->barrier();
      } catch (const std::exception& e) {
        inner_errors[r] = e.what();
      }
      try {
        join(replica_rendezvous(store, 2), r == 0 ? "s" : "not s");
      } catch (const CollectiveError& e) {
        refused[r] = e.what();
      }
    });
    inner.join();  // the outer rank 0, which serves the store, lives until its inner rank is done
    outer.barrier();
  });
  expect_no_errors(errors);
  expect_no_errors(inner_errors);
  for (const auto& e : refused) EXPECT_NE(e.find("proof of the run secret"), std::string::npos) << e;
  EXPECT_EQ(replica_rendezvous(store, 1), store + "/rank_1");
  EXPECT_EQ(replica_rendezvous("/tmp/x.store", 1), "/tmp/x.store.rank_1");
  // The first group is gone with its store: the next generation meets on the same port, from fresh keys.
  expect_no_errors(on_ranks(store, {"a", "a", "a"}, sum_ranks));
}

TEST(Rendezvous, RanksMeetOverIpv6Loopback) {
  const std::string store = "tcp://[::1]:" + std::to_string(free_port());
  expect_no_errors(on_ranks(store, {"s", "s", "s"}, sum_ranks));
}

}  // namespace
}  // namespace dloco
