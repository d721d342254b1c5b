// Forward pass: embedding, encoder stack with compressed + window attention, the shoal_flash
// shared decoder cache and decoder stack over each item's decoder rows, final norm and head.
// Attention itself (absorbed and naive MLA) lives in attention.cpp, the FFN in ffn.cpp.
#include "model/forward.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>

#include "kernels/assert.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "model/backend.hpp"
#include "model/forward_internal.hpp"

namespace shoal::model {

stream_layout streams_of(const model_config& c) {
  return {c.encoder_layers(), c.decoder_layers(), c.num_nextn_predict_layers, c.is_flash()};
}

int64_t min_ring_tokens(const model_config& c) {
  return std::max<int64_t>({c.window() - 1, c.ratio() - 1, 0});
}

int64_t exact_decoder_tail(const model_config& c) {
  return (c.decoder_layers() + c.num_nextn_predict_layers) * c.window();
}

int64_t moe_slot_count(const model_config& c) {
  if (c.n_routed_experts <= 0) return 0;
  int64_t layers = c.num_hidden_layers + c.num_nextn_predict_layers;
  return std::max<int64_t>(0, layers - c.first_k_dense_replace);
}

int64_t moe_slot_of_layer(const model_config& c, int64_t layer) {
  SHOAL_ASSERT(layer >= 0 && layer < c.num_hidden_layers + c.num_nextn_predict_layers);
  return c.is_moe_layer(layer) ? layer - c.first_k_dense_replace : -1;
}

const layer_weights& moe_slot_layer(const model_weights& w, int64_t moe_slot) {
  const model_config& c = w.config;
  SHOAL_ASSERT(moe_slot >= 0 && moe_slot < moe_slot_count(c));
  int64_t layer = c.first_k_dense_replace + moe_slot;
  const layer_weights& l = layer < c.num_hidden_layers ? w.layers[layer] : w.mtp[layer - c.num_hidden_layers].layer;
  SHOAL_ASSERT(l.ffn.moe);
  return l;
}

void routed_expert(const model_weights& w, int64_t moe_slot, int64_t expert, const float* xn,
                   int64_t rows, bool batch_invariant, float* out) {
  const ffn_weights& f = moe_slot_layer(w, moe_slot).ffn;
  SHOAL_ASSERT(expert >= 0 && expert < static_cast<int64_t>(f.experts.size()));
  detail::swiglu(f.experts[expert], xn, rows, w.config.hidden_size, batch_invariant, out);
}

void sequence_cache::init(const model_config& c, int64_t ring, kv_dtype dtype) {
  SHOAL_ASSERT(ring >= min_ring_tokens(c));
  ring_tokens = ring;
  ring_form = kv_format_of(c, dtype);
  int64_t n = streams_of(c).count();
  rings.assign(static_cast<size_t>(n), std::vector<uint8_t>(static_cast<size_t>(ring) * ring_slot_bytes(), 0));
  ring_floor.assign(static_cast<size_t>(n), 0);
  blocks.clear();
  computed = 0;
}

uint8_t* sequence_cache::ring_slot(int64_t stream, int64_t pos) {
  return rings[static_cast<size_t>(stream)].data() + static_cast<size_t>(pos % ring_tokens) * ring_slot_bytes();
}

const uint8_t* sequence_cache::ring_slot(int64_t stream, int64_t pos) const {
  return const_cast<sequence_cache*>(this)->ring_slot(stream, pos);
}

void sequence_cache::ring_read(int64_t stream, int64_t pos, float* entry) const {
  const uint8_t* slot = ring_slot(stream, pos);
  decode_entry(ring_form, slot, entry);
  std::memcpy(entry + ring_form.latent + ring_form.rope, slot + ring_form.entry_bytes(), sizeof(float));
}

void sequence_cache::ring_write(int64_t stream, int64_t pos, const float* entry) {
  uint8_t* slot = ring_slot(stream, pos);
  encode_entry(ring_form, entry, slot);
  std::memcpy(slot + ring_form.entry_bytes(), entry + ring_form.latent + ring_form.rope, sizeof(float));
}

uint8_t* sequence_cache::block_entry(int64_t i, int64_t layer, int64_t index) {
  SHOAL_ASSERT(pages && i >= 0 && i < static_cast<int64_t>(blocks.size()));
  const kv_format& f = pages->format();
  SHOAL_ASSERT(layer >= 0 && layer < f.layers && index >= 0 && index < f.per_layer);
  return pages->block(blocks[static_cast<size_t>(i)]) + static_cast<size_t>(layer * f.per_layer + index) * f.entry_bytes();
}

const uint8_t* sequence_cache::block_entry(int64_t i, int64_t layer, int64_t index) const {
  return const_cast<sequence_cache*>(this)->block_entry(i, layer, index);
}

namespace detail {

kv_format batch_format(std::span<const forward_item> items) {
  for (const forward_item& it : items)
    if (it.cache && it.cache->pages) return it.cache->pages->format();
  return {};
}

// Computes the latent entries of `rows` (normed c ‖ roped k_pe ‖ compress logit).
void compute_entries(const model_weights& w, const linear& kv_a, const std::vector<float>& kv_a_norm,
                     const std::vector<float>& kv_compress, const float* xn, int64_t rows,
                     const int32_t* positions, bool invariant, const kv_format& f, float* entries) {
  const model_config& c = w.config;
  int64_t r = c.kv_lora_rank, dim = c.entry_dim(), d = c.hidden_size;
  std::vector<float> kv(static_cast<size_t>(rows * dim));
  apply(kv_a, xn, kv.data(), rows, invariant);
  kernels::parallel_for(rows, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      float* e = entries + i * (dim + 1);
      kernels::rmsnorm(kv.data() + i * dim, kv_a_norm.data(), e, 1, r, static_cast<float>(c.rms_norm_eps));
      std::memcpy(e + r, kv.data() + i * dim + r, sizeof(float) * (dim - r));
      e[dim] = kv_compress.empty() ? 0.0f : kernels::dot(kv_compress.data(), xn + i * d, d);
    }
  });
  kernels::rope(entries + r, rows, dim + 1, 1, 0, positions, w.inv_freq.data(),
                c.qk_rope_head_dim, w.attn_factor);
  if (f.dtype != kv_dtype::fp32)
    kernels::parallel_for(rows, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) round_entry(f, entries + i * (dim + 1));
    });
}

// Writes the compressed entry of every run that ends inside rows [p0, p1) of the item into
// the blocks of `cache_layer` (skipping runs already valid there).
void write_runs(const model_config& c, sequence_cache& cache, int64_t stream, int64_t cache_layer,
                const float* chunk_entries, int64_t p0, int64_t p1, int64_t valid_until) {
  int64_t m = c.ratio(), dim = c.entry_dim(), bs = c.block_size, per_block = bs / m;
  std::vector<float> from_ring;  // entries of a run that began before the chunk, widened
  for (int64_t r = p0 / m; (r + 1) * m <= p1; ++r) {
    int64_t end = r * m + m - 1;
    if (end < p0 || end < valid_until) continue;
    const float* e[64];
    SHOAL_ASSERT(m <= 64);
    float logits[64];
    from_ring.resize(static_cast<size_t>(m * (dim + 1)));
    for (int64_t i = 0; i < m; ++i) {
      int64_t pos = r * m + i;
      if (pos >= p0) {
        e[i] = chunk_entries + (pos - p0) * (dim + 1);
      } else {
        cache.ring_read(stream, pos, from_ring.data() + i * (dim + 1));
        e[i] = from_ring.data() + i * (dim + 1);
      }
      logits[i] = e[i][dim];
    }
    kernels::softmax(logits, m);
    int64_t block = (r * m) / bs;
    SHOAL_ASSERT(block < static_cast<int64_t>(cache.blocks.size()));
    float out[4096];
    SHOAL_ASSERT(dim <= 4096);
    for (int64_t j = 0; j < dim; ++j) {
      float acc = 0;
      for (int64_t i = 0; i < m; ++i) acc += logits[i] * e[i][j];
      out[j] = acc;
    }
    encode_entry(cache.pages->format(), out, cache.block_entry(block, cache_layer, r % per_block));
  }
}

void store_ring(sequence_cache& cache, int64_t stream, const float* chunk_entries, int64_t p0,
                int64_t p1, int64_t dim) {
  if (cache.ring_tokens == 0) return;
  for (int64_t pos = std::max(p0, p1 - cache.ring_tokens); pos < p1; ++pos)
    cache.ring_write(stream, pos, chunk_entries + (pos - p0) * (dim + 1));
}

}  // namespace detail

namespace detail {

static void add_into(float* x, const float* y, int64_t n) {
  kernels::parallel_for((n + 4095) / 4096, [&](int64_t b0, int64_t b1) {
    kernels::axpy(1.0f, y + b0 * 4096, x + b0 * 4096, std::min(n, b1 * 4096) - b0 * 4096);
  });
}

void run_layer(const model_weights& w, const layer_weights& l, std::span<forward_item> items,
               const std::vector<row_span>& spans, const layer_io& io, float* x,
               int64_t rows, const forward_options& o) {
  int64_t d = w.config.hidden_size;
  std::vector<float> tmp(static_cast<size_t>(rows * d));
  detail::attention(w, l, items, spans, io, x, rows, o, tmp.data());
  add_into(x, tmp.data(), rows * d);
  detail::ffn(w, l, x, rows, o, io.moe_slot, tmp.data());
  add_into(x, tmp.data(), rows * d);
}

}  // namespace detail

using detail::row_span;
using detail::run_layer;

forward_output forward(const model_weights& w, std::span<forward_item> items,
                       const forward_options& o) {
  const model_config& c = w.config;
  const stream_layout sl = streams_of(c);
  int64_t d = c.hidden_size;
  // Encoder rows: every new token of every item, as the step's host plan lays them out.
  for (auto& it : items)
    SHOAL_ASSERT(static_cast<int64_t>(it.cache->blocks.size()) * c.block_size >=
                 it.cache->computed + static_cast<int64_t>(it.tokens.size()));
  const batch_plan plan = build_plan(c, items);
  std::vector<row_span> spans;
  for (size_t i = 0; i < items.size(); ++i)
    spans.push_back({plan.row_begin[i], items[i].cache->computed,
                     items[i].cache->computed + plan.row_begin[i + 1] - plan.row_begin[i]});
  const std::vector<int32_t>& positions = plan.positions;
  const int64_t rows = plan.rows();
  std::vector<float> x(static_cast<size_t>(rows * d));
  {
    int64_t row = 0;
    for (auto& it : items) {
      const int64_t first = row, p0 = it.cache->computed, p1 = p0 + static_cast<int64_t>(it.tokens.size());
      for (int32_t t : it.tokens) {
        SHOAL_ASSERT(t >= 0 && t < c.vocab_size);
        row_of(w.embed, t, x.data() + row++ * d);
      }
      for (const input_rows& in : it.inputs)
        for (int64_t pos = std::max(in.pos, p0); pos < std::min(in.pos + in.count, p1); ++pos)
          std::memcpy(x.data() + (first + pos - p0) * d, in.values + (pos - in.pos) * d, sizeof(float) * d);
    }
  }
  for (int64_t l = 0; l < c.encoder_layers(); ++l)
    run_layer(w, w.layers[l], items, spans, {l, l, true, positions.data(), 0, moe_slot_of_layer(c, l)}, x.data(), rows, o);

  forward_output out;
  out.hidden.resize(items.size());
  out.hidden_from.assign(items.size(), 0);
  std::vector<row_span> dspans = spans;
  std::vector<float> xd;
  std::vector<int32_t> dpos;
  int64_t drows = 0;
  if (c.is_flash()) {
    detail::decoder_cache(w, items, spans, x.data(), rows, positions.data(), o);
    // Decoder rows: positions ≥ dec_from of each item.
    for (size_t i = 0; i < items.size(); ++i) {
      int64_t from = std::max(spans[i].p0, std::min(items[i].dec_from, spans[i].p1));
      for (int64_t p = from; p < spans[i].p1; ++p) {
        const float* src = x.data() + (spans[i].row + p - spans[i].p0) * d;
        xd.insert(xd.end(), src, src + d);
        dpos.push_back(static_cast<int32_t>(p));
      }
      dspans[i] = {drows, from, spans[i].p1};
      drows += spans[i].p1 - from;
      // the decoder stack's window is truncated at dec_from (see exact_decoder_tail)
      for (int64_t j = 0; j < sl.n_dec; ++j) items[i].cache->ring_floor[sl.decoder(j)] = items[i].dec_from;
    }
    for (int64_t j = 0; j < c.n_decoder_layers; ++j)
      run_layer(w, w.layers[c.n_encoder_layers + j], items, dspans,
                {sl.decoder(j), sl.dec_kv(), false, dpos.data(), 0,
                 moe_slot_of_layer(c, c.n_encoder_layers + j)}, xd.data(), drows, o);
  } else {
    xd = std::move(x);
    drows = rows;
  }
  std::vector<float> last;
  for (size_t i = 0; i < items.size(); ++i) {
    const row_span& s = dspans[i];
    if (items[i].hidden) {
      out.hidden[i].assign(xd.begin() + s.row * d, xd.begin() + (s.row + s.p1 - s.p0) * d);
      out.hidden_from[i] = s.p0;
    }
    if (items[i].logits) {
      const int64_t nr = items[i].logit_rows;
      SHOAL_ASSERT(nr >= 1 && s.p1 - s.p0 >= nr);  // those positions ran through the decoder
      const float* src = xd.data() + (s.row + s.p1 - s.p0 - nr) * d;
      last.insert(last.end(), src, src + nr * d);
    }
  }
  int64_t n_logits = static_cast<int64_t>(last.size()) / d;
  if (n_logits > 0) {
    kernels::rmsnorm(last.data(), w.norm.data(), last.data(), n_logits, d, static_cast<float>(c.rms_norm_eps));
    out.logits.resize(static_cast<size_t>(n_logits * c.vocab_size));
    apply(w.lm_head, last.data(), out.logits.data(), n_logits, o.batch_invariant);
  }
  for (size_t i = 0; i < items.size(); ++i) items[i].cache->computed = spans[i].p1;
  return out;
}

std::vector<std::vector<mtp_draft>> mtp_chain(const model_weights& w, std::span<const mtp_chain_item> items,
                                              int64_t depth, const draft_chooser& choose,
                                              const forward_options& o) {
  const model_config& c = w.config;
  SHOAL_ASSERT(!w.mtp.empty() && depth >= 1);
  const int64_t d = c.hidden_size, V = c.vocab_size, modules = static_cast<int64_t>(w.mtp.size());
  const float eps = static_cast<float>(c.rms_norm_eps);
  const stream_layout sl = streams_of(c);
  // Rows: positions hidden_from … n−1 of each item; `prev` holds the previous depth's output.
  std::vector<row_span> spans;
  std::vector<int32_t> pos;
  std::vector<std::vector<int32_t>> u(items.size());
  std::vector<float> prev;
  int64_t rows = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const mtp_chain_item& it = items[i];
    const int64_t n = static_cast<int64_t>(it.tokens.size()) - 1, p0 = it.hidden_from;
    SHOAL_ASSERT(p0 >= 0 && n - p0 >= 1 && it.cache && it.hidden);
    spans.push_back({rows, p0, n});
    for (int64_t p = p0; p < n; ++p) pos.push_back(static_cast<int32_t>(p));
    prev.insert(prev.end(), it.hidden, it.hidden + (n - p0) * d);
    u[i].assign(it.tokens.begin(), it.tokens.end());
    rows += n - p0;
  }
  std::vector<std::vector<mtp_draft>> out(items.size());
  std::vector<float> cat(static_cast<size_t>(rows * 2 * d)), x(static_cast<size_t>(rows * d));
  std::vector<float> heads(items.size() * static_cast<size_t>(d)), logits(items.size() * static_cast<size_t>(V));
  for (int64_t k = 0; k < depth; ++k) {
    const int64_t module = std::min(k, modules - 1);
    const mtp_weights& m = w.mtp[module];
    const int64_t stream = sl.mtp(module);
    for (size_t i = 0; i < items.size(); ++i)
      for (int64_t p = spans[i].p0; p < spans[i].p1; ++p) {
        const int64_t row = spans[i].row + p - spans[i].p0;
        float* cr = cat.data() + row * 2 * d;
        row_of(mtp_embed(w, m), u[i][static_cast<size_t>(p + k + 1)], cr);
        kernels::rmsnorm(cr, m.enorm.data(), cr, 1, d, eps);
        kernels::rmsnorm(prev.data() + row * d, m.hnorm.data(), cr + d, 1, d, eps);
      }
    apply(m.eh_proj, cat.data(), x.data(), rows, o.batch_invariant);
    // Private views of the caches: the shared decoder blocks (read only) and this depth's own
    // rows only (ring floor at hidden_from, so no ring entry from before is read).
    std::vector<sequence_cache> views(items.size());
    std::vector<forward_item> fitems(items.size());
    for (size_t i = 0; i < items.size(); ++i) {
      views[i].blocks = items[i].cache->blocks;
      views[i].pages = items[i].cache->pages;
      views[i].rings.resize(static_cast<size_t>(sl.count()));
      views[i].ring_form = items[i].cache->ring_form;
      views[i].ring_floor.assign(static_cast<size_t>(sl.count()), 0);
      views[i].ring_floor[static_cast<size_t>(stream)] = spans[i].p0;
      views[i].computed = spans[i].p0;
      fitems[i] = {&views[i], std::span<const int32_t>(u[i]).subspan(static_cast<size_t>(spans[i].p0),
                                                                      static_cast<size_t>(spans[i].p1 - spans[i].p0)),
                   0, INT64_MAX, false, false, {}};
    }
    // deepseek_v3's MTP layer sees all its rows: a window longer than any sequence.
    detail::layer_io io{stream, c.is_flash() ? sl.dec_kv() : 0, false, pos.data(),
                        c.is_flash() ? 0 : (int64_t{1} << 40), moe_slot_of_layer(c, c.num_hidden_layers + module)};
    run_layer(w, m.layer, fitems, spans, io, x.data(), rows, o);
    for (size_t i = 0; i < items.size(); ++i)
      kernels::rmsnorm(x.data() + (spans[i].p1 - spans[i].p0 - 1 + spans[i].row) * d, m.head_norm.data(),
                       heads.data() + i * d, 1, d, eps);
    apply(mtp_head(w, m), heads.data(), logits.data(), static_cast<int64_t>(items.size()), o.batch_invariant);
    for (size_t i = 0; i < items.size(); ++i) {
      const float confidence = detail::draft_confidence(w, heads.data() + i * d);
      int32_t t = choose(i, k, std::span<const float>(logits.data() + i * V, static_cast<size_t>(V)), confidence);
      SHOAL_ASSERT(t >= 0 && t < V);
      out[i].push_back({t, confidence});
      u[i].push_back(t);
    }
    prev.swap(x);
  }
  return out;
}

mtp_output mtp_last(const model_weights& w, std::span<const int32_t> tokens,
                    const std::vector<float>& hidden, int64_t hidden_from,
                    const sequence_cache& cache, const forward_options& o) {
  SHOAL_ASSERT(!w.mtp.empty() && tokens.size() >= 2);
  // The MTP rows pair h_i with t_{i+1} for i = hidden_from … n−2: the chain's depth 0 with
  // t_{n−1} as its newest token.
  mtp_chain_item item{tokens, hidden.data(), hidden_from, &cache};
  mtp_output out;
  mtp_chain(w, std::span<const mtp_chain_item>(&item, 1), 1,
            [&](size_t, int64_t, std::span<const float> logits, float confidence) {
              out.logits.assign(logits.begin(), logits.end());
              out.confidence = confidence;
              return 0;
            },
            o);
  return out;
}

full_result forward_full(const model_weights& w, std::span<const int32_t> tokens,
                         const forward_options& o, std::span<const input_rows> inputs, kv_dtype kv) {
  const model_config& c = w.config;
  int64_t n = static_cast<int64_t>(tokens.size());
  int64_t n_blocks = (n + c.block_size - 1) / c.block_size;
  kv_pages pages(kv_format_of(c, kv), static_cast<int32_t>(n_blocks));
  sequence_cache cache;
  cache.init(c, std::max<int64_t>(min_ring_tokens(c), 1), kv);
  cache.pages = &pages;
  for (int64_t b = 0; b < n_blocks; ++b) cache.blocks.push_back(static_cast<int32_t>(b));
  bool mtp = !w.mtp.empty() && n >= 2;
  int64_t dec_from = std::max<int64_t>(0, n - exact_decoder_tail(c));
  if (mtp) dec_from = std::min(dec_from, n - 2);
  forward_item item{&cache, tokens, dec_from, 0, true, mtp, inputs};
  forward_output fo = forward(w, std::span<forward_item>(&item, 1), o);
  full_result res;
  res.logits = std::move(fo.logits);
  if (mtp) res.mtp = mtp_last(w, tokens, fo.hidden[0], fo.hidden_from[0], cache, o);
  return res;
}

}  // namespace shoal::model
