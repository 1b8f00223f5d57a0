// Thread budget; see threads.h.
#include "train/threads.h"

#include <dlfcn.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <thread>

namespace dloco {

int machine_cores() { return std::max(1u, std::thread::hardware_concurrency()); }

ThreadBudget thread_budget(int cores) {
  if (cores <= 0) cores = machine_cores();
  return ThreadBudget{1, std::max(1, cores)};
}

void apply_thread_budget(const ThreadBudget& budget) {
  at::set_num_threads(budget.torch_threads);
  using SetThreads = void (*)(int);
  if (auto set = reinterpret_cast<SetThreads>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set(budget.blas_threads);
  }
}

std::string blas_description() {
  using GetConfig = char* (*)();
  if (auto get = reinterpret_cast<GetConfig>(::dlsym(RTLD_DEFAULT, "openblas_get_config"))) {
    return std::string("OpenBLAS ") + get();
  }
  return "reference BLAS (slow: install libopenblas0-pthread, see scripts/setup.sh)";
}

std::string allocator_description() {
  if (::dlsym(RTLD_DEFAULT, "tc_malloc") != nullptr) return "tcmalloc";
  return "glibc malloc (slower: large tensors are page-faulted in again every step; build with DLOCO_TCMALLOC=ON)";
}

}  // namespace dloco
