// One process-wide worker pool for the CPU kernels. parallel_for splits [0, n) into
// contiguous static ranges, one per thread, so the split depends only on n and the thread
// count (a requirement of batch-invariant mode: no work-stealing order effects on results).
#pragma once

#include <cstdint>
#include <functional>

namespace shoal::kernels {

// Sets the worker count (≥ 1). Default: hardware threads. The pool is the one threading
// owner: OpenBLAS is kept at one thread and called inside the pool's parts.
void set_num_threads(int n);
int num_threads();

// Runs fn(begin, end) over static ranges covering [0, n); returns when all are done.
// Nested calls from inside a worker run inline on that worker. Calls from several threads
// are safe: they run one after another.
void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace shoal::kernels
