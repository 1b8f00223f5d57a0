// SkipPipe's stage subsets; see stages.h.
#include "model/stages.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"
#include "core/stages_per_path.h"

namespace dloco {

std::vector<bool> stage_blocks(int64_t n_layer, int64_t S, const std::vector<int64_t>& stages) {
  if (S < 1 || n_layer % S != 0) {
    throw InputError("a model of " + std::to_string(n_layer) + " blocks cannot be cut into " + std::to_string(S) +
                     " stages of equal size (the stage count must divide model.n_layer)");
  }
  if (stages.empty() || stages.front() != 0) {
    throw InputError("a stage subset must contain stage 0 (the embedding, the first blocks, the head)");
  }
  for (size_t i = 0; i < stages.size(); ++i) {
    if (stages[i] < 0 || stages[i] >= S || (i > 0 && stages[i] <= stages[i - 1])) {
      throw InputError("stage " + std::to_string(stages[i]) + ": a stage subset lists stages of [0, " +
                       std::to_string(S) + ") in increasing order, each once");
    }
  }
  const int64_t per_stage = n_layer / S;
  std::vector<bool> active(static_cast<size_t>(n_layer), false);
  for (int64_t s : stages) {
    for (int64_t b = s * per_stage; b < (s + 1) * per_stage; ++b) active[static_cast<size_t>(b)] = true;
  }
  return active;
}

std::vector<int64_t> random_stage_subset(int64_t S, double skip, std::mt19937_64& rng) {
  if (S < 1) throw InputError("the stage count must be ≥ 1 (got " + std::to_string(S) + ")");
  if (!(skip >= 0 && skip < 1)) throw InputError("the skip ratio must be in [0, 1) (got " + std::to_string(skip) + ")");
  const int64_t keep = std::max<int64_t>(1, stages_per_path(S, skip));
  std::vector<int64_t> others(static_cast<size_t>(S - 1));
  std::iota(others.begin(), others.end(), 1);
  std::shuffle(others.begin(), others.end(), rng);
  others.resize(static_cast<size_t>(keep - 1));
  std::sort(others.begin(), others.end());
  others.insert(others.begin(), 0);
  return others;
}

std::vector<std::vector<int64_t>> balanced_stage_paths(int64_t S, double skip, int64_t G, std::mt19937_64& rng) {
  if (S < 2) throw InputError("balanced paths need S ≥ 2 stages (got " + std::to_string(S) + ")");
  if (G < 1) throw InputError("balanced paths need at least one micro-batch (got " + std::to_string(G) + ")");
  if (!(skip >= 0 && skip < 1)) throw InputError("the skip ratio must be in [0, 1) (got " + std::to_string(skip) + ")");
  const int64_t others = std::max<int64_t>(1, stages_per_path(S, skip)) - 1;
  if ((G * others) % (S - 1) != 0) {
    throw InputError(std::to_string(G) + " micro-batches × " + std::to_string(others) + " non-zero stages per path "
                     "cannot visit each of the " + std::to_string(S - 1) + " non-zero stages equally");
  }
  // Taking the `others` least-visited stages keeps every pair of counts within 1 of each other; the total is a
  // multiple of S − 1, so at the end every count is equal.
  std::vector<int64_t> visits(static_cast<size_t>(S), 0);
  std::vector<std::vector<int64_t>> paths;
  paths.reserve(static_cast<size_t>(G));
  for (int64_t m = 0; m < G; ++m) {
    std::vector<std::pair<uint64_t, int64_t>> order;  // (random priority, stage): ties in visits broken at random
    for (int64_t s = 1; s < S; ++s) order.emplace_back(rng(), s);
    std::sort(order.begin(), order.end(), [&](const auto& a, const auto& b) {
      const int64_t va = visits[static_cast<size_t>(a.second)], vb = visits[static_cast<size_t>(b.second)];
      return va != vb ? va < vb : a < b;
    });
    std::vector<int64_t> path{0};
    for (int64_t i = 0; i < others; ++i) path.push_back(order[static_cast<size_t>(i)].second);
    std::sort(path.begin(), path.end());
    for (size_t i = 1; i < path.size(); ++i) ++visits[static_cast<size_t>(path[i])];
    paths.push_back(std::move(path));
  }
  return paths;
}

int64_t stage_of_block(int64_t block, int64_t n_layer, int64_t S) {
  DLOCO_CHECK(S >= 1 && n_layer % S == 0 && block >= 0 && block < n_layer);
  return block / (n_layer / S);
}

std::vector<int64_t> parse_stage_list(const std::string& text) {
  std::vector<int64_t> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, end - start);
    if (item.empty() || item.find_first_not_of("0123456789") != std::string::npos || item.size() > 6) {
      throw InputError("--stages '" + text + "': expected comma-separated stage numbers such as 0,2,4");
    }
    out.push_back(std::stoll(item));
    start = end + 1;
  }
  return out;
}

}  // namespace dloco
