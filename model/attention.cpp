// MLA attention over compressed block entries ∪ the raw sliding window, in one softmax.
// The absorbed form (decode form: queries moved into latent space) is the default; the naive
// form expands every visible latent through kv_b first (prefill form). Both see exactly the
// same entries: compressed runs ending before t − W + 1, raw entries of max(floor, t−W+1)…t.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "kernels/assert.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "model/forward_internal.hpp"

namespace shoal::model::detail {
namespace {

// The entries query position t sees, as runs: paged blocks and ring slots in the cache's
// stored form, the chunk's entries as fp32 rows of entry_dim + 1 floats.
struct visible_set {
  std::vector<kernels::kv_run> segments;
  int64_t total = 0;
  // Entries [k0, k1) of the set (in set order) widened into out, rows out_stride floats apart.
  void widen(int64_t k0, int64_t k1, int64_t r, int64_t rope, float* out, int64_t out_stride) const {
    int64_t j = 0;
    for (const auto& seg : segments) {
      for (int64_t k = std::max(k0, j); k < std::min(k1, j + seg.count); ++k)
        kernels::kv_decode(seg.elem, seg.data + (k - j) * seg.stride, r, rope, out + (k - k0) * out_stride);
      if ((j += seg.count) >= k1) break;
    }
  }
};

int64_t visible_runs(int64_t t, int64_t window, int64_t m) {
  int64_t start = t - window + 1;
  return start > 0 ? start / m : 0;
}

// Compressed runs a layer sees: none for a layer without a compressed cache (comp_layer < 0).
int64_t runs_seen(const layer_io& io, int64_t t, int64_t window, int64_t m) {
  return io.comp_layer < 0 ? 0 : visible_runs(t, window, m);
}

int64_t window_start(const sequence_cache& cache, const layer_io& io, int64_t t, int64_t W) {
  return std::max({cache.ring_floor[io.stream], t - W + 1, int64_t{0}});
}

// Entries seen by the queries t_first … t_last: compressed runs [0, runs(t_last)) then raw
// positions window_start(t_first) … t_last, in that order.
void collect(const model_config& c, const sequence_cache& cache, const layer_io& io,
             const row_span& span, const float* chunk_entries, int64_t t_first, int64_t t_last,
             visible_set& out) {
  int64_t m = c.ratio(), W = io.window > 0 ? io.window : c.window();
  int64_t dim = c.entry_dim(), bs = c.block_size;
  int64_t per_block = bs / m;
  out.segments.clear();
  out.total = 0;
  auto add = [&](const uint8_t* data, int64_t count, int64_t stride, kernels::kv_elem elem) {
    if (count <= 0) return;
    out.segments.push_back({data, count, stride, elem});
    out.total += count;
  };
  const int64_t row_bytes = static_cast<int64_t>(sizeof(float)) * (dim + 1);
  auto add_rows = [&](const float* data, int64_t count) {
    add(reinterpret_cast<const uint8_t*>(data), count, row_bytes, kernels::kv_elem::f32);
  };
  int64_t runs = runs_seen(io, t_last, W, m);
  if (runs > 0) {
    const kv_format& f = cache.pages->format();
    for (int64_t r0 = 0; r0 < runs; r0 += per_block)
      add(cache.block_entry(r0 / per_block, io.comp_layer, 0), std::min(per_block, runs - r0),
          static_cast<int64_t>(f.entry_bytes()), elem_of(f.dtype));
  }
  int64_t lo = window_start(cache, io, t_first, W);
  // ring part [lo, span.p0): contiguous pieces between wrap points
  for (int64_t p = lo; p < std::min(span.p0, t_last + 1);) {
    int64_t slot = p % cache.ring_tokens;
    int64_t n = std::min(span.p0 - p, cache.ring_tokens - slot);
    add(cache.ring_slot(io.stream, p), n, static_cast<int64_t>(cache.ring_slot_bytes()), elem_of(cache.ring_form.dtype));
    p += n;
  }
  int64_t c0 = std::max(lo, span.p0);
  add_rows(chunk_entries + (c0 - span.p0) * (dim + 1), t_last - c0 + 1);
}

// Query tiles of the fast path: rows of one item, scored against the union of their keys with
// GEMMs, a chunk of keys at a time (widened from the stored form into the chunk's buffer, its
// GEMMs' packing), each masked to each query's own visible set, under an online softmax.
constexpr int64_t tile_rows = 32;
constexpr int64_t key_chunk = 512;

// o_lat (rows of the tile, H, r) for queries t0 … t1−1 of one item (not batch-invariant).
void attend_tile(const model_config& c, const layer_weights& l, const sequence_cache& cache,
                 const layer_io& io, const row_span& s, const float* chunk_entries,
                 const float* q_lat, const float* q, int64_t t0, int64_t t1, float scale,
                 float* o_lat, std::vector<float>& buf) {
  const int64_t H = c.num_attention_heads, r = c.kv_lora_rank, rope = c.qk_rope_head_dim;
  const int64_t dim = r + rope, nope = c.qk_nope_head_dim, qk = c.qk_head_dim();
  const int64_t m = c.ratio(), W = io.window > 0 ? io.window : c.window();
  visible_set vs;
  collect(c, cache, io, s, chunk_entries, t0, t1 - 1, vs);
  const int64_t n_keys = vs.total, T = t1 - t0, TH = T * H, n_comp = runs_seen(io, t1 - 1, W, m);
  const int64_t raw_lo = window_start(cache, io, t0, W), K = std::min(n_keys, key_chunk);
  buf.resize(static_cast<size_t>(K * dim + TH * dim + TH * K + 2 * TH * r + 2 * TH));
  float* keys = buf.data();        // (K, dim): one chunk
  float* qt = keys + K * dim;      // (T·H, dim)
  float* scores = qt + TH * dim;   // (T·H, chunk)
  float* acc = scores + TH * K;    // (T·H, r): Σ p·c, scaled to the running max
  float* part = acc + TH * r;      // (T·H, r): one chunk's share
  float* mx = part + TH * r;       // (T·H) running max (the sink's logit to start with)
  float* sum = mx + TH;            // (T·H) running denominator
  for (int64_t i = 0; i < T; ++i)
    for (int64_t h = 0; h < H; ++h) {
      std::memcpy(qt + (i * H + h) * dim, q_lat + (i * H + h) * r, sizeof(float) * r);
      std::memcpy(qt + (i * H + h) * dim + r, q + i * H * qk + h * qk + nope, sizeof(float) * rope);
      mx[i * H + h] = l.attn.sink.empty() ? -INFINITY : l.attn.sink[h];
      sum[i * H + h] = l.attn.sink.empty() ? 0.0f : 1.0f;
    }
  std::fill(acc, acc + TH * r, 0.0f);
  for (int64_t k0 = 0; k0 < n_keys; k0 += K) {
    const int64_t nk = std::min(K, n_keys - k0);
    vs.widen(k0, k0 + nk, r, rope, keys, dim);
    kernels::matmul(qt, keys, scores, TH, nk, dim, false);
    for (int64_t i = 0; i < T; ++i) {
      // Query t sees keys [0, comp) (compressed) and [b0, b1) (its raw window); the rest of
      // the tile's union gets probability 0.
      const int64_t t = t0 + i, comp = runs_seen(io, t, W, m), lo = window_start(cache, io, t, W);
      const int64_t b0 = n_comp + lo - raw_lo, b1 = n_comp + t - raw_lo + 1;
      auto seen = [&](int64_t k) { return k < comp || (k >= b0 && k < b1); };
      for (int64_t h = 0; h < H; ++h) {
        const int64_t row_i = i * H + h;
        float* row = scores + row_i * nk;
        float top = -INFINITY;
        for (int64_t k = 0; k < nk; ++k)
          if (seen(k0 + k)) top = std::max(top, row[k] *= scale);
        const float next = std::max(mx[row_i], top);
        if (next == -INFINITY) {  // nothing seen yet
          std::fill(row, row + nk, 0.0f);
          continue;
        }
        const float shrink = std::exp(mx[row_i] - next);
        sum[row_i] *= shrink;
        for (int64_t j = 0; j < r; ++j) acc[row_i * r + j] *= shrink;
        for (int64_t k = 0; k < nk; ++k) sum[row_i] += (row[k] = seen(k0 + k) ? std::exp(row[k] - next) : 0.0f);
        mx[row_i] = next;
      }
    }
    kernels::matmul_nn(scores, keys, part, TH, r, nk, dim);
    for (int64_t j = 0; j < TH * r; ++j) acc[j] += part[j];
  }
  for (int64_t row_i = 0; row_i < TH; ++row_i)
    for (int64_t j = 0; j < r; ++j) o_lat[row_i * r + j] = acc[row_i * r + j] / sum[row_i];
}

// o_lat (H, r) of one query, fixed order (batch-invariant path).
void attend_row(const model_config& c, const layer_weights& l, const visible_set& vs,
                const float* q_lat, const float* q, float scale, float* o_lat, std::vector<float>& scratch) {
  int64_t H = c.num_attention_heads, rope = c.qk_rope_head_dim, qk = c.qk_head_dim();
  scratch.resize(static_cast<size_t>(H * rope) + kernels::mla_attend_scratch(H, vs.total, c.kv_lora_rank, rope));
  float* q_pe = scratch.data();
  for (int64_t h = 0; h < H; ++h)
    std::memcpy(q_pe + h * rope, q + h * qk + c.qk_nope_head_dim, sizeof(float) * rope);
  kernels::mla_attend(q_lat, q_pe, vs.segments.data(), static_cast<int>(vs.segments.size()), H,
                      c.kv_lora_rank, rope, scale, l.attn.sink.empty() ? nullptr : l.attn.sink.data(),
                      o_lat, q_pe + H * rope);
}

// q_lat (rows, H, r) = W_UK[h]ᵀ q_nope[h] for every row and head: one unsplit GEMM per head,
// heads spread over the pool.
void absorb_queries(const model_config& c, const layer_weights& l, const float* q, int64_t rows,
                    bool invariant, float* q_lat) {
  int64_t H = c.num_attention_heads, nope = c.qk_nope_head_dim, r = c.kv_lora_rank, qk = c.qk_head_dim();
  kernels::parallel_for(H, [&](int64_t h0, int64_t h1) {
    std::vector<float> qn(static_cast<size_t>(rows * nope)), out(static_cast<size_t>(rows * r));
    for (int64_t h = h0; h < h1; ++h) {
      for (int64_t i = 0; i < rows; ++i) std::memcpy(qn.data() + i * nope, q + i * H * qk + h * qk, sizeof(float) * nope);
      apply_rows(l.attn.w_uk_t, h * r, r, qn.data(), out.data(), rows, invariant);
      for (int64_t i = 0; i < rows; ++i) std::memcpy(q_lat + (i * H + h) * r, out.data() + i * r, sizeof(float) * r);
    }
  });
}

// heads (rows, H·v) = W_UV[h] o_lat[h] for every row and head (one GEMM per head).
void expand_outputs(const model_config& c, const layer_weights& l, const float* o_lat, int64_t rows,
                    bool invariant, float* heads) {
  int64_t H = c.num_attention_heads, nope = c.qk_nope_head_dim, r = c.kv_lora_rank, v = c.v_head_dim;
  kernels::parallel_for(H, [&](int64_t h0, int64_t h1) {
    std::vector<float> ol(static_cast<size_t>(rows * r)), out(static_cast<size_t>(rows * v));
    for (int64_t h = h0; h < h1; ++h) {
      for (int64_t i = 0; i < rows; ++i) std::memcpy(ol.data() + i * r, o_lat + (i * H + h) * r, sizeof(float) * r);
      apply_rows(l.attn.kv_b, h * (nope + v) + nope, v, ol.data(), out.data(), rows, invariant);
      for (int64_t i = 0; i < rows; ++i) std::memcpy(heads + i * H * v + h * v, out.data() + i * v, sizeof(float) * v);
    }
  });
}

// Naive attention of one row: every visible entry expanded through kv_b to (k_nope, v) per head.
void attend_naive(const model_weights& w, const layer_weights& l, const float* q,
                  const visible_set& vs, float* o, std::vector<float>& scratch) {
  const model_config& c = w.config;
  int64_t H = c.num_attention_heads, nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim;
  int64_t r = c.kv_lora_rank, v = c.v_head_dim, qk = c.qk_head_dim(), kvw = H * (nope + v);
  std::vector<float> ent(static_cast<size_t>(vs.total * (r + rope)));
  std::vector<float> lat(static_cast<size_t>(vs.total * r)), pe(static_cast<size_t>(vs.total * rope));
  vs.widen(0, vs.total, r, rope, ent.data(), r + rope);
  for (int64_t j = 0; j < vs.total; ++j) {
    std::memcpy(lat.data() + j * r, ent.data() + j * (r + rope), sizeof(float) * r);
    std::memcpy(pe.data() + j * rope, ent.data() + j * (r + rope) + r, sizeof(float) * rope);
  }
  scratch.resize(static_cast<size_t>(vs.total * kvw + vs.total));
  float* kv = scratch.data();  // (total, H, nope + v)
  apply(l.attn.kv_b, lat.data(), kv, vs.total, true);
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
  if (c.q_lora_rank == 0) {
    apply(l.attn.q_proj, xn, q, rows, invariant);
    return;
  }
  std::vector<float> qa(static_cast<size_t>(rows * c.q_lora_rank));
  apply(l.attn.q_a, xn, qa.data(), rows, invariant);
  kernels::rmsnorm(qa.data(), l.attn.q_a_norm.data(), qa.data(), rows, c.q_lora_rank,
                   static_cast<float>(c.rms_norm_eps));
  apply(l.attn.q_b, qa.data(), q, rows, invariant);
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
                  io.positions, o.batch_invariant, batch_format(items), entries.data());
  for (size_t i = 0; i < items.size(); ++i)
    if (io.writes_comp && spans[i].p1 > spans[i].p0)
      write_runs(c, *items[i].cache, io.stream, io.comp_layer, entries.data() + spans[i].row * (dim + 1),
                 spans[i].p0, spans[i].p1, items[i].blocks_valid_until);
  std::vector<int64_t> row_item(static_cast<size_t>(rows));
  for (size_t i = 0; i < items.size(); ++i)
    for (int64_t p = spans[i].p0; p < spans[i].p1; ++p) row_item[spans[i].row + p - spans[i].p0] = static_cast<int64_t>(i);
  auto chunk_of = [&](int64_t item) { return entries.data() + spans[item].row * (dim + 1); };
  // Per-row paths (naive form, batch-invariant absorbed form): fn(row, visible set, scratch).
  auto per_row = [&](const std::function<void(int64_t, const visible_set&, std::vector<float>&)>& fn) {
    kernels::parallel_for(rows, [&](int64_t r0, int64_t r1) {
      visible_set vs;
      std::vector<float> scratch;
      for (int64_t row = r0; row < r1; ++row) {
        const row_span& s = spans[row_item[row]];
        int64_t t = s.p0 + row - s.row;
        collect(c, *items[row_item[row]].cache, io, s, chunk_of(row_item[row]), t, t, vs);
        fn(row, vs, scratch);
      }
    });
  };
  if (o.naive_attention) {
    per_row([&](int64_t row, const visible_set& vs, std::vector<float>& scratch) {
      attend_naive(w, l, q.data() + row * H * qk, vs, heads.data() + row * H * v, scratch);
    });
  } else {
    int64_t r = c.kv_lora_rank;
    std::vector<float> q_lat(static_cast<size_t>(rows * H * r)), o_lat(q_lat.size());
    absorb_queries(c, l, q.data(), rows, o.batch_invariant, q_lat.data());
    if (o.batch_invariant) {
      per_row([&](int64_t row, const visible_set& vs, std::vector<float>& scratch) {
        attend_row(c, l, vs, q_lat.data() + row * H * r, q.data() + row * H * qk, w.softmax_scale,
                   o_lat.data() + row * H * r, scratch);
      });
    } else {
      std::vector<std::pair<int64_t, int64_t>> tiles;  // (item, first row of the tile)
      for (size_t i = 0; i < items.size(); ++i)
        for (int64_t row = spans[i].row; row < spans[i].row + spans[i].p1 - spans[i].p0; row += tile_rows)
          tiles.push_back({static_cast<int64_t>(i), row});
      kernels::parallel_for(static_cast<int64_t>(tiles.size()), [&](int64_t a0, int64_t a1) {
        std::vector<float> buf;
        for (int64_t k = a0; k < a1; ++k) {
          auto [item, row0] = tiles[k];
          const row_span& s = spans[item];
          int64_t row1 = std::min(row0 + tile_rows, s.row + s.p1 - s.p0);
          attend_tile(c, l, *items[item].cache, io, s, chunk_of(item), q_lat.data() + row0 * H * r,
                      q.data() + row0 * H * qk, s.p0 + row0 - s.row, s.p0 + row1 - s.row, w.softmax_scale,
                      o_lat.data() + row0 * H * r, buf);
        }
      });
    }
    expand_outputs(c, l, o_lat.data(), rows, o.batch_invariant, heads.data());
  }
  for (size_t i = 0; i < items.size(); ++i)
    store_ring(*items[i].cache, io.stream, entries.data() + spans[i].row * (dim + 1), spans[i].p0,
               spans[i].p1, dim);
  apply(l.attn.o_proj, heads.data(), out, rows, o.batch_invariant);
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
                  o.batch_invariant, batch_format(items), entries.data());
  for (size_t i = 0; i < items.size(); ++i) {
    const row_span& s = spans[i];
    if (s.p1 == s.p0) continue;
    write_runs(c, *items[i].cache, stream, c.n_encoder_layers, entries.data() + s.row * (dim + 1), s.p0,
               s.p1, items[i].blocks_valid_until);
    store_ring(*items[i].cache, stream, entries.data() + s.row * (dim + 1), s.p0, s.p1, dim);
  }
}

}  // namespace shoal::model::detail
