// Host-callable CUDA twins of the CPU ops in kernels/cpu/ops.hpp, computing what the scalar
// references in kernels/cpu/reference.hpp define. A plain C++ header: .cpp files include it
// without nvcc; every pointer argument is a device pointer unless said otherwise, and `stream`
// is an opaque cudaStream_t (nullptr = the legacy default stream). Launches are asynchronous;
// CUDA runtime failures are treated as programmer errors (message + abort, like SHOAL_ASSERT).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu/ops.hpp"  // gate_params, kv_segment

namespace shoal::kernels::cuda {

// Number of visible CUDA devices; 0 (not an error) when there is no GPU or no driver.
int cuda_device_count();

// Waits for all work on the current device; aborts with the CUDA error if any launch failed.
void synchronize();

// y (m, n) = x (m, k) · w (n, k)ᵀ, fp32, shared-memory tiles. Always batch invariant: every
// output is the same fixed-order sum over k whatever m is.
void matmul(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k,
            void* stream = nullptr);

// y (rows, dim) = x · rsqrt(mean(x²) + eps) ⊙ w (dim). In place allowed (y == x).
void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps,
             void* stream = nullptr);

// In-place rotation of interleaved pairs, same layout as the CPU op: row r of x starts at
// x + r·row_stride, head h at + h·head_stride; positions (rows), inv_freq (rope_dim / 2).
// The angle is formed in double (positions reach 1e5+).
void rope(float* x, int64_t rows, int64_t row_stride, int64_t heads, int64_t head_stride,
          const int32_t* positions, const float* inv_freq, int64_t rope_dim, float attn_factor,
          void* stream = nullptr);

// out (n) = silu(gate (n)) ⊙ up (n).
void silu_mul(const float* gate, const float* up, float* out, int64_t n, void* stream = nullptr);

// In-place softmax of each row of x (rows, n), max-subtracted, fp32.
void softmax(float* x, int64_t rows, int64_t n, void* stream = nullptr);

// noaux_tc routing of n_tokens tokens, one thread block each, same rules as the CPU op.
// logits (n_tokens, n_experts); bias (n_experts) or nullptr; ids, weights (n_tokens, top_k).
// Limits: n_experts ≤ 1024, n_group ≤ 256, n_experts % n_group == 0.
void moe_gate(const float* logits, const float* bias, const gate_params& p, int32_t* ids,
              float* weights, int64_t n_tokens, void* stream = nullptr);

// Absorbed MLA attention of one query, one thread block per head, online softmax (no scratch).
// q_lat (heads, r), q_pe (heads, rope); `segments` is a DEVICE array of n_segments kv_segment
// whose `data` are device pointers, entry = (c (r) ‖ k_pe (rope)); sink (heads) or nullptr;
// o_lat (heads, r). Limit: r + rope ≤ 4096.
void mla_attend(const float* q_lat, const float* q_pe, const kv_segment* segments,
                int n_segments, int64_t heads, int64_t r, int64_t rope, float scale,
                const float* sink, float* o_lat, void* stream = nullptr);

// Owning device allocation (cudaMalloc / cudaFree) with blocking host copies, so tests and
// tools stay short. Move-only.
class device_buffer {
 public:
  device_buffer() = default;
  explicit device_buffer(size_t bytes);
  ~device_buffer();
  device_buffer(device_buffer&& other) noexcept;
  device_buffer& operator=(device_buffer&& other) noexcept;
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;

  // A buffer holding a copy of `host`.
  template <class T>
  static device_buffer of(const std::vector<T>& host) {
    device_buffer b(host.size() * sizeof(T));
    b.upload(host.data(), host.size() * sizeof(T));
    return b;
  }

  // Blocking copies of `bytes` bytes at the start of the buffer (bytes ≤ size_bytes()).
  void upload(const void* src, size_t bytes);
  void download(void* dst, size_t bytes) const;

  // The whole buffer as host values of type T.
  template <class T>
  std::vector<T> download() const {
    std::vector<T> host(bytes_ / sizeof(T));
    download(host.data(), host.size() * sizeof(T));
    return host;
  }

  template <class T>
  T* data() const {
    return static_cast<T*>(ptr_);
  }
  size_t size_bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace shoal::kernels::cuda
