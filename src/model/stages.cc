// SkipPipe's stage subsets; see stages.h.
#include "model/stages.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"

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
  const int64_t keep = std::max<int64_t>(1, std::llround(static_cast<double>(S) * (1 - skip)));
  std::vector<int64_t> others(static_cast<size_t>(S - 1));
  std::iota(others.begin(), others.end(), 1);
  std::shuffle(others.begin(), others.end(), rng);
  others.resize(static_cast<size_t>(keep - 1));
  std::sort(others.begin(), others.end());
  others.insert(others.begin(), 0);
  return others;
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
