// CPU thread budget of a process: LibTorch's intra-op pool and OpenBLAS's pool are separate, and
// oversubscribing them is slower than using fewer threads (measured on 2 cores:, torch 1 + OpenBLAS 2 threads
// beat torch 2 + OpenBLAS 2 by 1.5×). Child processes get the same budget through their environment.
#pragma once

#include <string>

namespace dloco {

/// How a process splits its share of the cores.
struct ThreadBudget {
  int torch_threads = 1;     // LibTorch intra-op (OpenMP) threads
  int blas_threads = 1;      // OpenBLAS threads (all large matmuls)
};

/// The budget for `cores` cores: OpenBLAS gets all of them (the GEMMs dominate), LibTorch's elementwise pool
/// gets one. cores ≤ 0 means all cores of the machine.
ThreadBudget thread_budget(int cores);

/// Applies a budget to this process (torch::set_num_threads, openblas_set_num_threads when OpenBLAS is loaded,
/// interop threads 1).
void apply_thread_budget(const ThreadBudget& budget);

/// Which BLAS serves matmuls in this process, e.g. "OpenBLAS 0.3.21 ... (pthread)" or "reference BLAS (slow:
/// install libopenblas0-pthread)". Found by symbol lookup, so it reports what is actually loaded.
std::string blas_description();

/// Which malloc serves this process: "tcmalloc" when it was linked in (DLOCO_TCMALLOC), else a warning that
/// glibc's malloc is slower for training. Found by symbol lookup.
std::string allocator_description();

/// Number of cores of this machine (hardware_concurrency, at least 1).
int machine_cores();

}  // namespace dloco
