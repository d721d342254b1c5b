// Incremental chained MTP drafting (mtp_chain_step): per-depth rings of MTP entries kept
// between steps. See forward.hpp.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/assert.hpp"
#include "kernels/cpu/ops.hpp"
#include "model/forward.hpp"
#include "model/forward_internal.hpp"

namespace shoal::model {

namespace {

// Reset when the state cannot continue: never used, another depth count, or rows it would
// need from before the hidden rows given.
void reset_if_needed(mtp_state& s, int64_t depth, int64_t window, int64_t hidden_from, int64_t n,
                     size_t slot_bytes) {
  const bool usable = s.valid && static_cast<int64_t>(s.rings.size()) == depth && s.window == window &&
                      s.rings[0].size() == static_cast<size_t>(s.ring_tokens) * slot_bytes &&
                      s.frontier[0] >= hidden_from && s.frontier[0] < n;
  if (usable) return;
  s.valid = true;
  s.window = window;
  s.ring_tokens = window + depth + 2;
  s.rings.assign(static_cast<size_t>(depth), std::vector<uint8_t>(static_cast<size_t>(s.ring_tokens) * slot_bytes, 0));
  s.floor.assign(static_cast<size_t>(depth), hidden_from);
  s.frontier.assign(static_cast<size_t>(depth), hidden_from);
  s.out.assign(static_cast<size_t>(depth), {});
  s.out_from.assign(static_cast<size_t>(depth), hidden_from);
}

}  // namespace

std::vector<std::vector<mtp_draft>> mtp_chain_step(const model_weights& w, std::span<const mtp_step_item> items,
                                                   int64_t depth, int64_t window, const draft_chooser& choose,
                                                   const forward_options& o) {
  const model_config& c = w.config;
  SHOAL_ASSERT(!w.mtp.empty() && depth >= 1 && window >= 1);
  const int64_t d = c.hidden_size, V = c.vocab_size, modules = static_cast<int64_t>(w.mtp.size());
  const float eps = static_cast<float>(c.rms_norm_eps);
  const stream_layout sl = streams_of(c);
  const size_t n_items = items.size();
  std::vector<int64_t> n(n_items);
  std::vector<std::vector<int32_t>> u(n_items);
  for (size_t i = 0; i < n_items; ++i) {
    const mtp_step_item& it = items[i];
    n[i] = static_cast<int64_t>(it.tokens.size()) - 1;
    SHOAL_ASSERT(it.state && it.cache && it.hidden && it.hidden_from >= 0 && it.hidden_from < n[i]);
    reset_if_needed(*it.state, depth, window, it.hidden_from, n[i], it.cache->ring_slot_bytes());
    u[i].assign(it.tokens.begin(), it.tokens.end());
  }
  std::vector<std::vector<mtp_draft>> out(n_items);
  std::vector<float> prev, x, cat;      // previous depth's rows / this depth's rows (batch layout)
  std::vector<detail::row_span> prev_spans;
  std::vector<float> heads(n_items * static_cast<size_t>(d)), logits(n_items * static_cast<size_t>(V));
  for (int64_t k = 0; k < depth; ++k) {
    const int64_t module = std::min(k, modules - 1);
    const mtp_weights& m = w.mtp[static_cast<size_t>(module)];
    const int64_t stream = sl.mtp(module);
    // Rows of this depth: [frontier, n) of each item.
    std::vector<detail::row_span> spans;
    std::vector<int32_t> pos;
    int64_t rows = 0;
    for (size_t i = 0; i < n_items; ++i) {
      const int64_t f = items[i].state->frontier[static_cast<size_t>(k)];
      spans.push_back({rows, f, n[i]});
      for (int64_t p = f; p < n[i]; ++p) pos.push_back(static_cast<int32_t>(p));
      rows += n[i] - f;
    }
    cat.assign(static_cast<size_t>(rows * 2 * d), 0.0f);
    x.assign(static_cast<size_t>(rows * d), 0.0f);
    for (size_t i = 0; i < n_items; ++i) {
      const mtp_state& st = *items[i].state;
      for (int64_t p = spans[i].p0; p < spans[i].p1; ++p) {
        const int64_t row = spans[i].row + p - spans[i].p0;
        const float* h;
        if (k == 0) {
          h = items[i].hidden + (p - items[i].hidden_from) * d;
        } else if (p < prev_spans[i].p0) {  // final at the previous depth in an earlier step
          const size_t kk = static_cast<size_t>(k - 1);
          SHOAL_ASSERT(p >= st.out_from[kk] && p < st.out_from[kk] + static_cast<int64_t>(st.out[kk].size()) / d);
          h = st.out[kk].data() + (p - st.out_from[kk]) * d;
        } else {
          h = prev.data() + (prev_spans[i].row + p - prev_spans[i].p0) * d;
        }
        float* cr = cat.data() + row * 2 * d;
        row_of(mtp_embed(w, m), u[i][static_cast<size_t>(p + k + 1)], cr);
        kernels::rmsnorm(cr, m.enorm.data(), cr, 1, d, eps);
        kernels::rmsnorm(h, m.hnorm.data(), cr + d, 1, d, eps);
      }
    }
    apply(m.eh_proj, cat.data(), x.data(), rows, o.batch_invariant);
    // Each item's depth ring, lent to a view of its caches for the layer.
    std::vector<sequence_cache> views(n_items);
    std::vector<forward_item> fitems(n_items);
    for (size_t i = 0; i < n_items; ++i) {
      mtp_state& st = *items[i].state;
      sequence_cache& v = views[i];
      v.blocks = items[i].cache->blocks;
      v.pages = items[i].cache->pages;
      v.ring_tokens = st.ring_tokens;
      v.rings.resize(static_cast<size_t>(sl.count()));
      v.ring_form = items[i].cache->ring_form;
      v.rings[static_cast<size_t>(stream)] = std::move(st.rings[static_cast<size_t>(k)]);
      v.ring_floor.assign(static_cast<size_t>(sl.count()), 0);
      v.ring_floor[static_cast<size_t>(stream)] = st.floor[static_cast<size_t>(k)];
      v.computed = spans[i].p0;
      fitems[i] = {&v, std::span<const int32_t>(u[i]).subspan(static_cast<size_t>(spans[i].p0),
                                                               static_cast<size_t>(spans[i].p1 - spans[i].p0)),
                   0, INT64_MAX, false, false, {}};
    }
    detail::layer_io io{stream, c.is_flash() ? sl.dec_kv() : -1, false, pos.data(), c.is_flash() ? 0 : window,
                        moe_slot_of_layer(c, c.num_hidden_layers + module)};
    detail::run_layer(w, m.layer, fitems, spans, io, x.data(), rows, o);
    for (size_t i = 0; i < n_items; ++i) {
      mtp_state& st = *items[i].state;
      st.rings[static_cast<size_t>(k)] = std::move(views[i].rings[static_cast<size_t>(stream)]);
      kernels::rmsnorm(x.data() + (spans[i].row + spans[i].p1 - spans[i].p0 - 1) * d, m.head_norm.data(),
                       heads.data() + i * d, 1, d, eps);
    }
    apply(mtp_head(w, m), heads.data(), logits.data(), static_cast<int64_t>(n_items), o.batch_invariant);
    for (size_t i = 0; i < n_items; ++i) {
      const float confidence = detail::draft_confidence(w, heads.data() + i * d);
      const int32_t t = choose(i, k, std::span<const float>(logits.data() + i * V, static_cast<size_t>(V)), confidence);
      SHOAL_ASSERT(t >= 0 && t < V);
      out[i].push_back({t, confidence});
      u[i].push_back(t);
    }
    // Rows whose tokens are all accepted ([old frontier, n − k)) are final: keep their outputs
    // for the next depth's later steps and move the frontier.
    for (size_t i = 0; i < n_items; ++i) {
      mtp_state& st = *items[i].state;
      const size_t kk = static_cast<size_t>(k);
      const int64_t f0 = spans[i].p0, f1 = std::max(f0, n[i] - k);
      std::vector<float>& keep = st.out[kk];
      if (st.out_from[kk] + static_cast<int64_t>(keep.size()) / d != f0) {
        keep.clear();
        st.out_from[kk] = f0;
      }
      keep.insert(keep.end(), x.begin() + spans[i].row * d, x.begin() + (spans[i].row + f1 - f0) * d);
      const int64_t extra = static_cast<int64_t>(keep.size()) / d - (depth + 2);
      if (extra > 0) {
        keep.erase(keep.begin(), keep.begin() + extra * d);
        st.out_from[kk] += extra;
      }
      st.frontier[kk] = f1;
    }
    prev.swap(x);
    prev_spans = spans;
  }
  return out;
}

namespace detail {

float draft_confidence(const model_weights& w, const float* head_row) {
  const model_config& c = w.config;
  if (c.conf_head_hidden <= 0) return NAN;
  std::vector<float> h1(static_cast<size_t>(c.conf_head_hidden)), act(h1.size()), ones(h1.size(), 1.0f);
  kernels::matmul(head_row, w.conf_fc1.w.data(), h1.data(), 1, c.conf_head_hidden, c.hidden_size, true);
  kernels::silu_mul(h1.data(), ones.data(), act.data(), c.conf_head_hidden);
  return 1.0f / (1.0f + std::exp(-kernels::dot(w.conf_fc2.w.data(), act.data(), c.conf_head_hidden)));
}

}  // namespace detail

}  // namespace shoal::model
