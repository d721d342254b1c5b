// glibc malloc settings for shoal's processes. KV blocks, chunks and activations of 0.1–10 MiB
// are allocated and freed at a high rate; by default glibc serves such sizes from fresh
// mmaps at first and returns the top of its heap to the kernel after every burst, so each
// burst pays page faults and page zeroing again. Serving up to 64 MiB from the heap and
// keeping up to 512 MiB of free heap avoids that (`shoal bench storage --dir /dev/shm`, 2
// cores, 8 blocks in flight: get through the storage cluster 0.32–0.34 GB/s with glibc's
// defaults, 0.54–0.62 GB/s with these; `SHOAL_DEFAULT_MALLOC=1 shoal …` keeps the defaults).
#pragma once

#include <malloc.h>

namespace shoal::tools {

inline void tune_allocator() {
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
}

}  // namespace shoal::tools
