// Feed-forward blocks: dense SwiGLU and the noaux_tc mixture of experts. Routed rows are
// grouped per expert and each expert runs one GEMM pair; outputs are summed in a fixed order
// (shared expert first, then routed experts by ascending id) so a row's result does not
// depend on the other rows of the batch.
#include <cstring>

#include <algorithm>

#include "kernels/assert.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "model/forward_internal.hpp"

namespace shoal::model::detail {

void swiglu(const expert_weights& e, const float* xn, int64_t rows, int64_t d, bool invariant,
            float* out) {
  // An expert-parallel rank holds only its own routed experts (expert_reader): computing
  // another is a bug in who computes what, not something to run on empty weights.
  SHOAL_ASSERT(!e.gate_up.empty() && !e.down.empty());
  int64_t width = e.gate_up.out / 2;
  std::vector<float> gu(static_cast<size_t>(rows * 2 * width)), h(static_cast<size_t>(rows * width));
  apply(e.gate_up, xn, gu.data(), rows, invariant);
  kernels::parallel_for(rows, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      kernels::silu_mul(gu.data() + i * 2 * width, gu.data() + i * 2 * width + width,
                        h.data() + i * width, width);
  });
  apply(e.down, h.data(), out, rows, invariant);
}

void ffn(const model_weights& w, const layer_weights& l, const float* x, int64_t rows,
         const forward_options& o, int64_t moe_slot, float* out) {
  const model_config& c = w.config;
  const bool invariant = o.batch_invariant;
  int64_t d = c.hidden_size;
  std::vector<float> xn(static_cast<size_t>(rows * d));
  kernels::rmsnorm(x, l.post_norm.data(), xn.data(), rows, d, static_cast<float>(c.rms_norm_eps));
  const ffn_weights& f = l.ffn;
  if (!f.moe) {
    swiglu(f.dense, xn.data(), rows, d, invariant, out);
    return;
  }
  if (c.n_shared_experts > 0) swiglu(f.shared, xn.data(), rows, d, invariant, out);
  else std::memset(out, 0, sizeof(float) * rows * d);
  int64_t E = c.n_routed_experts, k = c.num_experts_per_tok;
  std::vector<float> logits(static_cast<size_t>(rows * E));
  kernels::matmul(xn.data(), f.router.w.data(), logits.data(), rows, E, d, invariant);
  kernels::gate_params gp{E, c.n_group, c.topk_group, k, c.norm_topk_prob,
                          static_cast<float>(c.routed_scaling_factor)};
  std::vector<int32_t> ids(static_cast<size_t>(rows * k));
  std::vector<float> weights(static_cast<size_t>(rows * k));
  kernels::parallel_for(rows, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      kernels::moe_gate(logits.data() + i * E, f.router_bias.data(), gp, ids.data() + i * k,
                        weights.data() + i * k);
  });
  if (o.moe) {  // expert parallelism: routed experts run on their owners
    o.moe->routed_experts(w, moe_slot, xn.data(), rows, ids.data(), weights.data(), invariant, out);
    return;
  }
  // rows routed to each expert, in row order
  std::vector<std::vector<std::pair<int64_t, float>>> routed(static_cast<size_t>(E));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < k; ++j) routed[ids[i * k + j]].push_back({i, weights[i * k + j]});
  // Experts run whole on one thread each (largest first, each to the least loaded thread), so
  // every GEMM is one unsplit single-threaded call; results are summed afterwards in expert
  // order.
  std::vector<size_t> rows_of(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) rows_of[e] = routed[e].size();
  int64_t parts = kernels::num_threads();
  std::vector<std::vector<int64_t>> assigned = assign_experts(rows_of, parts);
  std::vector<std::vector<float>> results(static_cast<size_t>(E));
  kernels::parallel_for(parts, [&](int64_t p0, int64_t p1) {
    std::vector<float> in;
    for (int64_t part = p0; part < p1; ++part)
      for (int64_t e : assigned[part]) {
        const auto& list = routed[e];
        int64_t n = static_cast<int64_t>(list.size());
        in.resize(static_cast<size_t>(n * d));
        results[e].resize(static_cast<size_t>(n * d));
        for (int64_t i = 0; i < n; ++i)
          std::memcpy(in.data() + i * d, xn.data() + list[i].first * d, sizeof(float) * d);
        swiglu(f.experts[e], in.data(), n, d, invariant, results[e].data());
      }
  });
  // Per row, contributions in ascending expert order (ids sorted per row), rows in parallel.
  std::vector<int64_t> slot(static_cast<size_t>(rows * k));  // index of the row in its expert's list
  {
    std::vector<int64_t> fill(static_cast<size_t>(E), 0);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < k; ++j) slot[i * k + j] = fill[ids[i * k + j]]++;
  }
  sum_in_expert_order(rows, k, d, ids.data(), weights.data(), [&](int64_t i, int64_t j) {
    return results[ids[i * k + j]].data() + slot[i * k + j] * d;
  }, out);
}

}  // namespace shoal::model::detail

namespace shoal::model {

std::vector<std::vector<int64_t>> assign_experts(const std::vector<size_t>& rows, int64_t parts) {
  std::vector<int64_t> order;
  for (size_t e = 0; e < rows.size(); ++e)
    if (rows[e] > 0) order.push_back(static_cast<int64_t>(e));
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return rows[a] > rows[b]; });
  std::vector<std::vector<int64_t>> assigned(static_cast<size_t>(parts));
  std::vector<size_t> load(static_cast<size_t>(parts), 0);
  for (int64_t e : order) {
    size_t t = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    assigned[t].push_back(e);
    load[t] += rows[e];
  }
  return assigned;
}

void sum_in_expert_order(int64_t rows, int64_t k, int64_t d, const int32_t* ids, const float* weights,
                         const std::function<const float*(int64_t, int64_t)>& expert_out, float* out) {
  kernels::parallel_for(rows, [&](int64_t i0, int64_t i1) {
    std::vector<int64_t> js(static_cast<size_t>(k));
    for (int64_t i = i0; i < i1; ++i) {
      for (int64_t j = 0; j < k; ++j) js[j] = j;
      std::sort(js.begin(), js.end(), [&](int64_t a, int64_t b) { return ids[i * k + a] < ids[i * k + b]; });
      for (int64_t j : js) kernels::axpy(weights[i * k + j], expert_out(i, j), out + i * d, d);
    }
  });
}

}  // namespace shoal::model
