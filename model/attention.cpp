// MLA attention over compressed block entries ∪ the raw sliding window, in one softmax.
// The absorbed form (decode form: queries moved into latent space) is the default; the naive
// form expands every visible latent through kv_b first (prefill form). Both see exactly the
// same entries: compressed runs ending before t − W + 1, raw entries of max(floor, t−W+1)…t.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/assert.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "model/forward_internal.hpp"

namespace shoal::model::detail {
namespace {

// The entries query position t sees, as segments of (entry_dim (+1)) floats.
struct visible_set {
  std::vector<kernels::kv_segment> segments;
  int64_t total = 0;
};

int64_t visible_runs(int64_t t, int64_t window, int64_t m) {
  int64_t start = t - window + 1;
  return start > 0 ? start / m : 0;
}

void collect(const model_config& c, const sequence_cache& cache, const layer_io& io,
             const row_span& span, const float* chunk_entries, int64_t t, visible_set& out) {
  int64_t m = c.ratio(), W = io.window > 0 ? io.window : c.window();
  int64_t dim = c.entry_dim(), bs = c.block_size;
  int64_t per_block = bs / m;
  out.segments.clear();
  out.total = 0;
  auto add = [&](const float* data, int64_t count, int64_t stride) {
    if (count <= 0) return;
    out.segments.push_back({data, count, stride});
    out.total += count;
  };
  int64_t runs = visible_runs(t, W, m);
  for (int64_t r0 = 0; r0 < runs; r0 += per_block) {
    int64_t b = r0 / per_block;
    add(cache.blocks[b] + io.comp_layer * per_block * dim, std::min(per_block, runs - r0), dim);
  }
  int64_t lo = std::max({cache.ring_floor[io.stream], t - W + 1, int64_t{0}});
  // ring part [lo, span.p0): contiguous pieces between wrap points
  for (int64_t p = lo; p < std::min(span.p0, t + 1);) {
    int64_t slot = p % cache.ring_tokens;
    int64_t n = std::min(span.p0 - p, cache.ring_tokens - slot);
    add(cache.ring_entry(io.stream, p), n, dim + 1);
    p += n;
  }
  int64_t c0 = std::max(lo, span.p0);
  add(chunk_entries + (c0 - span.p0) * (dim + 1), t - c0 + 1, dim + 1);
}

// Absorbed attention of one row: o (H, v) from q (H, nope + rope), q_pe already roped.
void attend_absorbed(const model_weights& w, const layer_weights& l, const float* q,
                     const visible_set& vs, float* o, std::vector<float>& scratch) {
  const model_config& c = w.config;
  int64_t H = c.num_attention_heads, nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim;
  int64_t r = c.kv_lora_rank, v = c.v_head_dim, qk = c.qk_head_dim();
  scratch.resize(static_cast<size_t>(2 * H * r + H * rope + vs.total));
  float* q_lat = scratch.data();
  float* o_lat = q_lat + H * r;
  float* q_pe = o_lat + H * r;
  float* scores = q_pe + H * rope;
  const float* kv_b = l.attn.kv_b.w.data();  // (H, nope + v, r)
  for (int64_t h = 0; h < H; ++h) {
    float* ql = q_lat + h * r;
    std::fill(ql, ql + r, 0.0f);
    for (int64_t n = 0; n < nope; ++n) {
      float qn = q[h * qk + n];
      const float* row = kv_b + (h * (nope + v) + n) * r;
      for (int64_t i = 0; i < r; ++i) ql[i] += qn * row[i];
    }
    std::memcpy(q_pe + h * rope, q + h * qk + nope, sizeof(float) * rope);
  }
  kernels::mla_attend(q_lat, q_pe, vs.segments.data(), static_cast<int>(vs.segments.size()), H, r,
                      rope, w.softmax_scale, l.attn.sink.empty() ? nullptr : l.attn.sink.data(),
                      o_lat, scores);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t j = 0; j < v; ++j)
      o[h * v + j] = kernels::dot(kv_b + (h * (nope + v) + nope + j) * r, o_lat + h * r, r);
}

// Naive attention of one row: every visible entry expanded through kv_b to (k_nope, v) per head.
void attend_naive(const model_weights& w, const layer_weights& l, const float* q,
                  const visible_set& vs, float* o, std::vector<float>& scratch) {
  const model_config& c = w.config;
  int64_t H = c.num_attention_heads, nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim;
  int64_t r = c.kv_lora_rank, v = c.v_head_dim, qk = c.qk_head_dim(), kvw = H * (nope + v);
  std::vector<float> lat(static_cast<size_t>(vs.total * r)), pe(static_cast<size_t>(vs.total * rope));
  int64_t j = 0;
  for (const auto& s : vs.segments)
    for (int64_t e = 0; e < s.count; ++e, ++j) {
      std::memcpy(lat.data() + j * r, s.data + e * s.stride, sizeof(float) * r);
      std::memcpy(pe.data() + j * rope, s.data + e * s.stride + r, sizeof(float) * rope);
    }
  scratch.resize(static_cast<size_t>(vs.total * kvw + vs.total));
  float* kv = scratch.data();  // (total, H, nope + v)
  kernels::matmul(lat.data(), l.attn.kv_b.w.data(), kv, vs.total, kvw, r, true);
  float* p = kv + vs.total * kvw;
  for (int64_t h = 0; h < H; ++h) {
    float mx = l.attn.sink.empty() ? -INFINITY : l.attn.sink[h];
    for (int64_t k = 0; k < vs.total; ++k) {
      float s = kernels::dot(q + h * qk, kv + k * kvw + h * (nope + v), nope) +
                kernels::dot(q + h * qk + nope, pe.data() + k * rope, rope);
      p[k] = s * w.softmax_scale;
      mx = std::max(mx, p[k]);
    }
    float sum = l.attn.sink.empty() ? 0.0f : std::exp(l.attn.sink[h] - mx);
    for (int64_t k = 0; k < vs.total; ++k) sum += (p[k] = std::exp(p[k] - mx));
    float* oh = o + h * v;
    std::fill(oh, oh + v, 0.0f);
    for (int64_t k = 0; k < vs.total; ++k) {
      const float* vk = kv + k * kvw + h * (nope + v) + nope;
      for (int64_t i = 0; i < v; ++i) oh[i] += p[k] / sum * vk[i];
    }
  }
}

// q (rows, H·qk) from xn.
void project_q(const model_weights& w, const layer_weights& l, const float* xn, int64_t rows,
               bool invariant, float* q) {
  const model_config& c = w.config;
  int64_t d = c.hidden_size, nq = c.num_attention_heads * c.qk_head_dim();
  if (c.q_lora_rank == 0) {
    kernels::matmul(xn, l.attn.q_proj.w.data(), q, rows, nq, d, invariant);
    return;
  }
  std::vector<float> qa(static_cast<size_t>(rows * c.q_lora_rank));
  kernels::matmul(xn, l.attn.q_a.w.data(), qa.data(), rows, c.q_lora_rank, d, invariant);
  kernels::rmsnorm(qa.data(), l.attn.q_a_norm.data(), qa.data(), rows, c.q_lora_rank,
                   static_cast<float>(c.rms_norm_eps));
  kernels::matmul(qa.data(), l.attn.q_b.w.data(), q, rows, nq, c.q_lora_rank, invariant);
}

}  // namespace

void attention(const model_weights& w, const layer_weights& l, std::span<forward_item> items,
               const std::vector<row_span>& spans, const layer_io& io, const float* x,
               int64_t rows, const forward_options& o, float* out) {
  const model_config& c = w.config;
  int64_t d = c.hidden_size, H = c.num_attention_heads, qk = c.qk_head_dim();
  int64_t dim = c.entry_dim(), v = c.v_head_dim;
  float eps = static_cast<float>(c.rms_norm_eps);
  std::vector<float> xn(static_cast<size_t>(rows * d)), q(static_cast<size_t>(rows * H * qk));
  std::vector<float> entries(static_cast<size_t>(rows * (dim + 1)));
  std::vector<float> heads(static_cast<size_t>(rows * H * v));
  if (rows == 0) return;
  kernels::rmsnorm(x, l.input_norm.data(), xn.data(), rows, d, eps);
  project_q(w, l, xn.data(), rows, o.batch_invariant, q.data());
  kernels::rope(q.data() + c.qk_nope_head_dim, rows, H * qk, H, qk, io.positions, w.inv_freq.data(),
                c.qk_rope_head_dim, w.attn_factor);
  compute_entries(w, l.attn.kv_a, l.attn.kv_a_norm, l.attn.kv_compress, xn.data(), rows,
                  io.positions, o.batch_invariant, entries.data());
  for (size_t i = 0; i < items.size(); ++i)
    if (io.writes_comp && spans[i].p1 > spans[i].p0)
      write_runs(c, *items[i].cache, io.stream, io.comp_layer, entries.data() + spans[i].row * (dim + 1),
                 spans[i].p0, spans[i].p1, items[i].blocks_valid_until);
  // Each row attends on its own; rows are spread over the pool.
  std::vector<int64_t> row_item(static_cast<size_t>(rows));
  for (size_t i = 0; i < items.size(); ++i)
    for (int64_t p = spans[i].p0; p < spans[i].p1; ++p) row_item[spans[i].row + p - spans[i].p0] = static_cast<int64_t>(i);
  kernels::parallel_for(rows, [&](int64_t r0, int64_t r1) {
    visible_set vs;
    std::vector<float> scratch;
    for (int64_t row = r0; row < r1; ++row) {
      const row_span& s = spans[row_item[row]];
      int64_t t = s.p0 + row - s.row;
      collect(c, *items[row_item[row]].cache, io, s, entries.data() + s.row * (dim + 1), t, vs);
      if (o.naive_attention) attend_naive(w, l, q.data() + row * H * qk, vs, heads.data() + row * H * v, scratch);
      else attend_absorbed(w, l, q.data() + row * H * qk, vs, heads.data() + row * H * v, scratch);
    }
  });
  for (size_t i = 0; i < items.size(); ++i)
    store_ring(*items[i].cache, io.stream, entries.data() + spans[i].row * (dim + 1), spans[i].p0,
               spans[i].p1, dim);
  kernels::matmul(heads.data(), l.attn.o_proj.w.data(), out, rows, d, H * v, o.batch_invariant);
}

void decoder_cache(const model_weights& w, std::span<forward_item> items,
                   const std::vector<row_span>& spans, const float* h_e, int64_t rows,
                   const int32_t* positions, const forward_options& o) {
  const model_config& c = w.config;
  const decoder_kv_weights& k = w.decoder_kv;
  int64_t d = c.hidden_size, dim = c.entry_dim(), stream = streams_of(c).dec_kv();
  std::vector<float> hn(static_cast<size_t>(rows * d)), entries(static_cast<size_t>(rows * (dim + 1)));
  kernels::rmsnorm(h_e, k.input_norm.data(), hn.data(), rows, d, static_cast<float>(c.rms_norm_eps));
  compute_entries(w, k.kv_a, k.kv_a_norm, k.kv_compress, hn.data(), rows, positions,
                  o.batch_invariant, entries.data());
  for (size_t i = 0; i < items.size(); ++i) {
    const row_span& s = spans[i];
    if (s.p1 == s.p0) continue;
    write_runs(c, *items[i].cache, stream, c.n_encoder_layers, entries.data() + s.row * (dim + 1), s.p0,
               s.p1, items[i].blocks_valid_until);
    store_ring(*items[i].cache, stream, entries.data() + s.row * (dim + 1), s.p0, s.p1, dim);
  }
}

}  // namespace shoal::model::detail
