// CUDA kernels and host wrappers behind ops.cuh: one kernel per CPU op, written plainly
// (fp32, shared-memory tiles and block reductions, no libraries beyond the CUDA runtime) so
// that each can be checked against the scalar reference. Tie and masking rules of moe_gate
// mirror kernels/cpu/ops.cpp step by step; mla_attend uses an online softmax over tiles of
// entries instead of the CPU op's score scratch.
#include "kernels/cuda/ops.cuh"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "kernels/assert.hpp"

namespace shoal::kernels::cuda {

namespace {

[[noreturn]] void cuda_fail(cudaError_t err, const char* expr, const char* file, int line) {
  std::fprintf(stderr, "%s:%d: CUDA error %s (%s) in %s\n", file, line, cudaGetErrorName(err),
               cudaGetErrorString(err), expr);
  std::abort();
}

#define SHOAL_KERNELS_CUDA_CHECK(call)                                            \
  do {                                                                           \
    cudaError_t shoal_err_ = (call);                                             \
    if (shoal_err_ != cudaSuccess) cuda_fail(shoal_err_, #call, __FILE__, __LINE__); \
  } while (0)

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

constexpr int block_threads = 256;  // every kernel's block size: a multiple of 32
constexpr unsigned full_mask = 0xffffffffu;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct sum_op {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct max_op {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Reduces v over the whole block; every thread gets the result. All threads must call it.
// buf: 32 floats of shared memory; the leading sync lets consecutive calls reuse it.
template <class Op>
__device__ float block_reduce(float v, Op op, float* buf) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(full_mask, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) buf[threadIdx.x >> 5] = v;
  __syncthreads();
  float total = buf[0];
  for (int w = 1; w < int(blockDim.x >> 5); ++w) total = op(total, buf[w]);
  return total;
}

// ---- matmul: 64×64 output tile per block, 16-wide k slices, 4×4 outputs per thread ----

constexpr int mm_tile = 64;
constexpr int mm_k = 16;
constexpr int mm_pad = 4;  // keeps the transposed stores off a single bank

// No __launch_bounds__: with it ptxas caps this kernel at 64 registers and spills acc.
__global__ void matmul_kernel(const float* __restrict__ x, const float* __restrict__ w,
                              float* __restrict__ y, int64_t m, int64_t n, int64_t k) {
  __shared__ float xs[mm_k][mm_tile + mm_pad];  // (k slice, tile rows of x)
  __shared__ float ws[mm_k][mm_tile + mm_pad];  // (k slice, tile rows of w)
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int64_t row0 = int64_t(blockIdx.y) * mm_tile, col0 = int64_t(blockIdx.x) * mm_tile;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < k; k0 += mm_k) {
    // 64 rows × 16 k of each operand: 4 loads per thread, 16 threads read one row's slice.
    for (int part = 0; part < mm_tile * mm_k / block_threads; ++part) {
      const int idx = tid + part * block_threads, rr = idx / mm_k, kk = idx % mm_k;
      const int64_t kg = k0 + kk;
      xs[kk][rr] = (row0 + rr < m && kg < k) ? x[(row0 + rr) * k + kg] : 0.0f;
      ws[kk][rr] = (col0 + rr < n && kg < k) ? w[(col0 + rr) * k + kg] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < mm_k; ++kk) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        a[i] = xs[kk][ty * 4 + i];
        b[i] = ws[kk][tx * 4 + i];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll  // constant indices keep acc in registers
  for (int i = 0; i < 4; ++i) {
    const int64_t row = row0 + ty * 4 + i;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t col = col0 + tx * 4 + j;
      if (row < m && col < n) y[row * n + col] = acc[i][j];
    }
  }
}

// ---- row-wise and elementwise ops ----

// One block per row; x and y may alias (each thread rewrites only what it read).
__global__ void rmsnorm_kernel(const float* x, const float* w, float* y, int64_t dim, float eps) {
  __shared__ float buf[32];
  const float* xr = x + int64_t(blockIdx.x) * dim;
  float* yr = y + int64_t(blockIdx.x) * dim;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
  ss = block_reduce(ss, sum_op{}, buf);
  const float inv = 1.0f / sqrtf(ss / float(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * inv * w[i];
}

// One thread per (row, head, pair).
__global__ void rope_kernel(float* x, int64_t rows, int64_t row_stride, int64_t heads,
                            int64_t head_stride, const int32_t* positions, const float* inv_freq,
                            int64_t half, float attn_factor) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= rows * heads * half) return;
  const int64_t i = t % half, h = (t / half) % heads, r = t / (half * heads);
  const double angle = double(positions[r]) * double(inv_freq[i]);
  double sn, cs;
  sincos(angle, &sn, &cs);
  const float c = float(cs * attn_factor), s = float(sn * attn_factor);
  float* p = x + r * row_stride + h * head_stride + 2 * i;
  const float a = p[0], b = p[1];
  p[0] = a * c - b * s;
  p[1] = b * c + a * s;
}

__global__ void silu_mul_kernel(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

// One block per row, in place.
__global__ void softmax_kernel(float* x, int64_t n) {
  __shared__ float buf[32];
  float* xr = x + int64_t(blockIdx.x) * n;
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) mx = fmaxf(mx, xr[i]);
  mx = block_reduce(mx, max_op{}, buf);
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += (xr[i] = expf(xr[i] - mx));
  sum = block_reduce(sum, sum_op{}, buf);
  const float inv = 1.0f / sum;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) xr[i] *= inv;
}

// ---- moe_gate ----

constexpr int gate_max_experts = 1024;
constexpr int gate_max_groups = 256;

// A candidate expert; index < 0 means none. The better of two: a real candidate, then the
// higher score, then the lower index (the CPU op's strict-greater scan in index order).
struct candidate {
  float score;
  int index;
};

__device__ candidate better(candidate a, candidate b) {
  if (a.index < 0) return b;
  if (b.index < 0) return a;
  if (a.score > b.score) return a;
  if (b.score > a.score) return b;
  return a.index < b.index ? a : b;
}

__device__ candidate block_best(candidate c, candidate* buf) {
  for (int o = 16; o > 0; o >>= 1)
    c = better(c, candidate{__shfl_xor_sync(full_mask, c.score, o),
                            __shfl_xor_sync(full_mask, c.index, o)});
  __syncthreads();
  if ((threadIdx.x & 31) == 0) buf[threadIdx.x >> 5] = c;
  __syncthreads();
  candidate best = buf[0];
  for (int w = 1; w < int(blockDim.x >> 5); ++w) best = better(best, buf[w]);
  return best;
}

// Keeps the topk_group groups with the largest top-2 sums (ties to the lower group) and masks
// the other groups' selection scores to -inf. Called by the whole block.
__device__ void mask_groups(float* sel, const gate_params& p, float* group_score, bool* keep) {
  const int64_t per_group = p.n_experts / p.n_group;
  for (int64_t g = threadIdx.x; g < p.n_group; g += blockDim.x) {
    float a = -INFINITY, b = -INFINITY;  // two largest of the group
    for (int64_t e = g * per_group; e < (g + 1) * per_group; ++e) {
      if (sel[e] > a) {
        b = a;
        a = sel[e];
      } else if (sel[e] > b) {
        b = sel[e];
      }
    }
    group_score[g] = per_group >= 2 ? a + b : a;
    keep[g] = false;
  }
  __syncthreads();
  if (threadIdx.x == 0)
    for (int64_t k = 0; k < p.topk_group; ++k) {
      int64_t best = -1;
      for (int64_t g = 0; g < p.n_group; ++g)
        if (!keep[g] && (best < 0 || group_score[g] > group_score[best])) best = g;
      keep[best] = true;
    }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < p.n_experts; e += blockDim.x)
    if (!keep[e / per_group]) sel[e] = -INFINITY;
  __syncthreads();
}

// One block per token.
__global__ void moe_gate_kernel(const float* logits, const float* bias, gate_params p,
                                int32_t* ids, float* weights) {
  __shared__ float s[gate_max_experts], sel[gate_max_experts], group_score[gate_max_groups];
  __shared__ bool taken[gate_max_experts], keep[gate_max_groups];
  __shared__ candidate buf[32];
  const float* lg = logits + int64_t(blockIdx.x) * p.n_experts;
  for (int64_t e = threadIdx.x; e < p.n_experts; e += blockDim.x) {
    s[e] = 1.0f / (1.0f + expf(-lg[e]));
    sel[e] = s[e] + (bias ? bias[e] : 0.0f);
    taken[e] = false;
  }
  __syncthreads();
  if (p.n_group > 1) mask_groups(sel, p, group_score, keep);
  int32_t* out_ids = ids + int64_t(blockIdx.x) * p.top_k;
  float* out_w = weights + int64_t(blockIdx.x) * p.top_k;
  float total = 0.0f;  // meaningful in thread 0 only
  for (int64_t k = 0; k < p.top_k; ++k) {
    candidate c{0.0f, -1};
    for (int64_t e = threadIdx.x; e < p.n_experts; e += blockDim.x)
      if (!taken[e]) c = better(c, candidate{sel[e], int(e)});
    const candidate best = block_best(c, buf);
    if (threadIdx.x == 0) {
      taken[best.index] = true;
      out_ids[k] = best.index;
      out_w[k] = s[best.index];
      total += s[best.index];
    }
    __syncthreads();  // `taken` is read by the next round's scan
  }
  if (threadIdx.x == 0) {
    const float norm = p.norm_topk_prob ? 1.0f / (total + 1e-20f) : 1.0f;
    for (int64_t k = 0; k < p.top_k; ++k) out_w[k] *= norm * p.routed_scaling_factor;
  }
}

// ---- mla_attend ----

constexpr int mla_tile = 32;  // entries scored per step of the online softmax
constexpr int64_t mla_max_dim = 4096;

// One block per head. Per tile: each warp scores entries, then the running max m, the
// denominator l and the accumulator acc (r) are rescaled by exp(m_old − m_new) and extended.
__global__ void __launch_bounds__(block_threads)
    mla_attend_kernel(const float* q_lat, const float* q_pe, const kv_segment* segments,
                      int n_segments, int64_t r, int64_t rope, float scale, const float* sink,
                      float* o_lat) {
  extern __shared__ float smem[];  // q (r + rope) then acc (r)
  __shared__ float p[mla_tile];    // scores, then their exponentials
  const int64_t h = blockIdx.x, dim = r + rope;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, n_warps = blockDim.x >> 5;
  float* q = smem;
  float* acc = smem + dim;
  for (int64_t i = tid; i < dim; i += blockDim.x) q[i] = i < r ? q_lat[h * r + i] : q_pe[h * rope + i - r];
  for (int64_t i = tid; i < r; i += blockDim.x) acc[i] = 0.0f;
  float m = sink ? sink[h] : -INFINITY;  // every thread keeps identical copies of m and l
  float l = sink ? 1.0f : 0.0f;
  __syncthreads();
  for (int s = 0; s < n_segments; ++s) {
    const kv_segment seg = segments[s];
    for (int64_t base = 0; base < seg.count; base += mla_tile) {
      const int n_tile = int(seg.count - base < mla_tile ? seg.count - base : mla_tile);
      const float* tile = seg.data + base * seg.stride;
      for (int j = warp; j < n_tile; j += n_warps) {
        const float* entry = tile + j * seg.stride;  // c (r) ‖ k_pe (rope), contiguous
        float d = 0.0f;
        for (int64_t i = lane; i < dim; i += 32) d = fmaf(q[i], entry[i], d);
        for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(full_mask, d, o);
        if (lane == 0) p[j] = d * scale;
      }
      __syncthreads();
      float m_new = m;
      for (int j = 0; j < n_tile; ++j) m_new = fmaxf(m_new, p[j]);
      const float corr = expf(m - m_new);  // 0 on the first tile without a sink
      __syncthreads();                     // all raw scores read before they are replaced
      if (tid < n_tile) p[tid] = expf(p[tid] - m_new);
      __syncthreads();
      float tile_sum = 0.0f;
      for (int j = 0; j < n_tile; ++j) tile_sum += p[j];
      l = l * corr + tile_sum;
      m = m_new;
      for (int64_t i = tid; i < r; i += blockDim.x) {
        float a = acc[i] * corr;
        for (int j = 0; j < n_tile; ++j) a = fmaf(p[j], tile[j * seg.stride + i], a);
        acc[i] = a;
      }
      __syncthreads();  // p is overwritten by the next tile
    }
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  for (int64_t i = tid; i < r; i += blockDim.x) o_lat[h * r + i] = acc[i] * inv;
}

}  // namespace

// ---- host side ----

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no device: clear the error, report none
    return 0;
  }
  return count;
}

void synchronize() { SHOAL_KERNELS_CUDA_CHECK(cudaDeviceSynchronize()); }

void matmul(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k,
            void* stream) {
  SHOAL_ASSERT(m >= 0 && n >= 0 && k >= 0 && ceil_div(m, mm_tile) <= 65535);
  if (m == 0 || n == 0) return;
  const dim3 grid(unsigned(ceil_div(n, mm_tile)), unsigned(ceil_div(m, mm_tile)));
  matmul_kernel<<<grid, block_threads, 0, as_stream(stream)>>>(x, w, y, m, n, k);
  SHOAL_KERNELS_CUDA_CHECK(cudaGetLastError());
}

void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps,
             void* stream) {
  SHOAL_ASSERT(rows >= 0 && rows <= INT32_MAX && dim > 0);
  if (rows == 0) return;
  rmsnorm_kernel<<<unsigned(rows), block_threads, 0, as_stream(stream)>>>(x, w, y, dim, eps);
  SHOAL_KERNELS_CUDA_CHECK(cudaGetLastError());
}

void rope(float* x, int64_t rows, int64_t row_stride, int64_t heads, int64_t head_stride,
          const int32_t* positions, const float* inv_freq, int64_t rope_dim, float attn_factor,
          void* stream) {
  SHOAL_ASSERT(rows >= 0 && heads >= 0 && rope_dim % 2 == 0);
  const int64_t half = rope_dim / 2, total = rows * heads * half;
  if (total == 0) return;
  SHOAL_ASSERT(ceil_div(total, block_threads) <= INT32_MAX);
  rope_kernel<<<unsigned(ceil_div(total, block_threads)), block_threads, 0, as_stream(stream)>>>(
      x, rows, row_stride, heads, head_stride, positions, inv_freq, half, attn_factor);
  SHOAL_KERNELS_CUDA_CHECK(cudaGetLastError());
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n, void* stream) {
  SHOAL_ASSERT(n >= 0);
  if (n == 0) return;
  const int64_t blocks = ceil_div(n, block_threads) < 65536 ? ceil_div(n, block_threads) : 65536;
  silu_mul_kernel<<<unsigned(blocks), block_threads, 0, as_stream(stream)>>>(gate, up, out, n);
  SHOAL_KERNELS_CUDA_CHECK(cudaGetLastError());
}

void softmax(float* x, int64_t rows, int64_t n, void* stream) {
  SHOAL_ASSERT(rows >= 0 && rows <= INT32_MAX && n > 0);
  if (rows == 0) return;
  softmax_kernel<<<unsigned(rows), block_threads, 0, as_stream(stream)>>>(x, n);
  SHOAL_KERNELS_CUDA_CHECK(cudaGetLastError());
}

void moe_gate(const float* logits, const float* bias, const gate_params& p, int32_t* ids,
              float* weights, int64_t n_tokens, void* stream) {
  SHOAL_ASSERT(p.n_experts > 0 && p.n_experts <= gate_max_experts);
  SHOAL_ASSERT(p.n_group >= 1 && p.n_group <= gate_max_groups && p.n_experts % p.n_group == 0);
  SHOAL_ASSERT(p.topk_group >= 1 && p.topk_group <= p.n_group);
  SHOAL_ASSERT(p.top_k >= 1 && p.top_k <= p.n_experts * p.topk_group / p.n_group);
  SHOAL_ASSERT(n_tokens >= 0 && n_tokens <= INT32_MAX);
  if (n_tokens == 0) return;
  moe_gate_kernel<<<unsigned(n_tokens), block_threads, 0, as_stream(stream)>>>(logits, bias, p,
                                                                                ids, weights);
  SHOAL_KERNELS_CUDA_CHECK(cudaGetLastError());
}

void mla_attend(const float* q_lat, const float* q_pe, const kv_segment* segments,
                int n_segments, int64_t heads, int64_t r, int64_t rope, float scale,
                const float* sink, float* o_lat, void* stream) {
  SHOAL_ASSERT(heads >= 0 && heads <= INT32_MAX && r > 0 && rope >= 0 && r + rope <= mla_max_dim);
  SHOAL_ASSERT(n_segments >= 0 && (n_segments == 0 || segments != nullptr));
  if (heads == 0) return;
  const size_t smem = size_t(2 * r + rope) * sizeof(float);
  mla_attend_kernel<<<unsigned(heads), block_threads, smem, as_stream(stream)>>>(
      q_lat, q_pe, segments, n_segments, r, rope, scale, sink, o_lat);
  SHOAL_KERNELS_CUDA_CHECK(cudaGetLastError());
}

device_buffer::device_buffer(size_t bytes) : bytes_(bytes) {
  if (bytes > 0) SHOAL_KERNELS_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
}

device_buffer::~device_buffer() {
  if (ptr_) cudaFree(ptr_);  // no check: a destructor must not abort on a torn-down context
}

device_buffer::device_buffer(device_buffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

device_buffer& device_buffer::operator=(device_buffer&& other) noexcept {
  if (this != &other) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void device_buffer::upload(const void* src, size_t bytes) {
  SHOAL_ASSERT(bytes <= bytes_);
  if (bytes > 0) SHOAL_KERNELS_CUDA_CHECK(cudaMemcpy(ptr_, src, bytes, cudaMemcpyHostToDevice));
}

void device_buffer::download(void* dst, size_t bytes) const {
  SHOAL_ASSERT(bytes <= bytes_);
  if (bytes > 0) SHOAL_KERNELS_CUDA_CHECK(cudaMemcpy(dst, ptr_, bytes, cudaMemcpyDeviceToHost));
}

}  // namespace shoal::kernels::cuda
