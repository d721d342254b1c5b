// Scalar reference ops: the definitions the optimised kernels are tested against.
#include "kernels/cpu/reference.hpp"

#include <algorithm>
#include <cstring>
#include <cmath>
#include <vector>

namespace shoal::kernels::ref {

void matmul(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t t = 0; t < k; ++t) acc += double(x[i * k + t]) * w[j * k + t];
      y[i * n + j] = static_cast<float>(acc);
    }
}

void matmul_bf16(const float* x, const uint16_t* w, float* y, int64_t m, int64_t n, int64_t k) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t t = 0; t < k; ++t) {
        uint32_t bits = uint32_t(w[j * k + t]) << 16;
        float v;
        std::memcpy(&v, &bits, sizeof v);
        acc += double(x[i * k + t]) * v;
      }
      y[i * n + j] = static_cast<float>(acc);
    }
}

double e4m3_value(uint8_t code) {
  const int e = (code >> 3) & 0xf, mant = code & 7;
  if (e == 15 && mant == 7) return std::nan("");
  const double mag = e == 0 ? std::ldexp(double(mant), -9) : std::ldexp(1.0 + mant / 8.0, e - 7);
  return code & 0x80 ? -mag : mag;
}

void matmul_fp8(const float* x, const fp8_matrix& w, float* y, int64_t m, int64_t n, int64_t k) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t t = 0; t < k; ++t)
        acc += double(x[i * k + t]) * e4m3_value(w.codes[j * k + t]) * w.scales[w.row_scales[j] + t / w.block_k];
      y[i * n + j] = static_cast<float>(acc);
    }
}

void matmul_nn(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k,
               int64_t ldw) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t t = 0; t < k; ++t) acc += double(x[i * k + t]) * w[t * ldw + j];
      y[i * n + j] = static_cast<float>(acc);
    }
}

void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += double(x[r * dim + i]) * x[r * dim + i];
    double inv = 1.0 / std::sqrt(ss / dim + eps);
    for (int64_t i = 0; i < dim; ++i) y[r * dim + i] = static_cast<float>(x[r * dim + i] * inv * w[i]);
  }
}

void rope(float* x, int64_t rows, int64_t row_stride, int64_t heads, int64_t head_stride,
          const int32_t* positions, const float* inv_freq, int64_t rope_dim, float attn_factor) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < rope_dim / 2; ++i) {
        double angle = double(positions[r]) * inv_freq[i];
        float* p = x + r * row_stride + h * head_stride + 2 * i;
        double a = p[0], b = p[1];
        p[0] = static_cast<float>((a * std::cos(angle) - b * std::sin(angle)) * attn_factor);
        p[1] = static_cast<float>((b * std::cos(angle) + a * std::sin(angle)) * attn_factor);
      }
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(gate[i] / (1.0 + std::exp(-double(gate[i]))) * up[i]);
}

void softmax(float* x, int64_t n) {
  double mx = *std::max_element(x, x + n), sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(x[i] - mx);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(std::exp(x[i] - mx) / sum);
}

void moe_gate(const float* logits, const float* bias, const gate_params& p, int32_t* ids,
              float* weights) {
  int64_t E = p.n_experts, per = E / p.n_group;
  std::vector<double> s(E), sel(E);
  for (int64_t e = 0; e < E; ++e) {
    s[e] = 1.0 / (1.0 + std::exp(-double(logits[e])));
    sel[e] = s[e] + (bias ? bias[e] : 0.0);
  }
  // group scores: sum of the top-2 selection scores per group
  std::vector<std::pair<double, int64_t>> groups;
  for (int64_t g = 0; g < p.n_group; ++g) {
    std::vector<double> v(sel.begin() + g * per, sel.begin() + (g + 1) * per);
    std::sort(v.rbegin(), v.rend());
    groups.push_back({v[0] + (per >= 2 ? v[1] : 0.0), g});
  }
  std::stable_sort(groups.begin(), groups.end(), [](auto& a, auto& b) { return a.first > b.first; });
  std::vector<bool> keep(p.n_group, p.n_group == 1);
  for (int64_t k = 0; k < p.topk_group && p.n_group > 1; ++k) keep[groups[k].second] = true;
  std::vector<std::pair<double, int64_t>> cand;
  for (int64_t e = 0; e < E; ++e)
    if (keep[e / per]) cand.push_back({sel[e], e});
  std::stable_sort(cand.begin(), cand.end(), [](auto& a, auto& b) { return a.first > b.first; });
  double total = 0;
  for (int64_t k = 0; k < p.top_k; ++k) total += s[cand[k].second];
  for (int64_t k = 0; k < p.top_k; ++k) {
    ids[k] = static_cast<int32_t>(cand[k].second);
    double w = s[cand[k].second] / (p.norm_topk_prob ? total : 1.0);
    weights[k] = static_cast<float>(w * p.routed_scaling_factor);
  }
}

void mla_attend(const float* q_lat, const float* q_pe, const kv_segment* segments,
                int n_segments, int64_t heads, int64_t r, int64_t rope, float scale,
                const float* sink, float* o_lat) {
  for (int64_t h = 0; h < heads; ++h) {
    std::vector<double> scores;
    std::vector<const float*> entries;
    for (int s = 0; s < n_segments; ++s)
      for (int64_t e = 0; e < segments[s].count; ++e) {
        const float* en = segments[s].data + e * segments[s].stride;
        double v = 0;
        for (int64_t i = 0; i < r; ++i) v += double(q_lat[h * r + i]) * en[i];
        for (int64_t i = 0; i < rope; ++i) v += double(q_pe[h * rope + i]) * en[r + i];
        scores.push_back(v * scale);
        entries.push_back(en);
      }
    double mx = sink ? sink[h] : -INFINITY;
    for (double v : scores) mx = std::max(mx, v);
    double sum = sink ? std::exp(sink[h] - mx) : 0.0;
    for (double v : scores) sum += std::exp(v - mx);
    for (int64_t i = 0; i < r; ++i) {
      double acc = 0;
      for (size_t j = 0; j < scores.size(); ++j) acc += std::exp(scores[j] - mx) / sum * entries[j][i];
      o_lat[h * r + i] = static_cast<float>(acc);
    }
  }
}

}  // namespace shoal::kernels::ref
