// One process-wide worker pool for the CPU kernels. parallel_for splits [0, n) into
// contiguous static ranges, one per thread, so the split depends only on n and the thread
// count (a requirement of batch-invariant mode: no work-stealing order effects on results).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace shoal::kernels {

// Sets the worker count (≥ 1). Default: the CPUs this process may run on (its affinity mask,
// so taskset, cgroup cpusets and pin_to_cpus all shrink it). The pool is the one threading
// owner: OpenBLAS is kept at one thread and called inside the pool's parts.
void set_num_threads(int n);
int num_threads();

// CPUs in this process's affinity mask (≥ 1).
int available_cpus();

// Restricts this thread and every thread it creates afterwards to `cpus` (CPU numbers as
// `lscpu` lists them, non-empty). Call before any worker thread starts. Empty string on
// success, else why not (a CPU beyond the machine's, or one outside the process's cpuset).
std::string pin_to_cpus(const std::vector<int>& cpus);

// Runs fn(begin, end) over static ranges covering [0, n); returns when all are done.
// Nested calls from inside a worker run inline on that worker. Calls from several threads
// are safe: they run one after another.
void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace shoal::kernels
