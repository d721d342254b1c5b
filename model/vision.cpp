// The vision encoder (vision.hpp): patch embedding, ViT blocks and projector over the kernels
// of kernels/cpu (GEMMs, softmax); LayerNorm and GELU are the plain loops below.
#include "model/vision.hpp"

#include <cmath>
#include <cstring>

#include "kernels/assert.hpp"
#include "kernels/cpu/ops.hpp"

namespace shoal::model {
namespace {

constexpr float ln_eps = 1e-6f;

// y (rows, n) = LayerNorm(x) · w + b, statistics in double.
void layer_norm(const float* x, const std::vector<float>& w, const std::vector<float>& b, float* y, int64_t rows,
                int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < n; ++i) mean += xr[i];
    mean /= static_cast<double>(n);
    for (int64_t i = 0; i < n; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    var /= static_cast<double>(n);
    const float inv = static_cast<float>(1.0 / std::sqrt(var + ln_eps));
    const float m = static_cast<float>(mean);
    for (int64_t i = 0; i < n; ++i) y[r * n + i] = (xr[i] - m) * inv * w[i] + b[i];
  }
}

// GELU, tanh form: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
void gelu(float* x, int64_t n) {
  constexpr float k = 0.7978845608028654f;
  for (int64_t i = 0; i < n; ++i) x[i] = 0.5f * x[i] * (1.0f + std::tanh(k * (x[i] + 0.044715f * x[i] * x[i] * x[i])));
}

// y (rows, l.out) = x · lᵀ + bias.
void affine(const linear& l, const std::vector<float>& bias, const float* x, float* y, int64_t rows, bool bi) {
  apply(l, x, y, rows, bi);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < l.out; ++i) y[r * l.out + i] += bias[i];
}

// h (n, dv) += proj(attention(LN1(h))): every patch attends to every patch of the image.
void attention_block(const vision_block_weights& b, int64_t heads, float* h, int64_t n, int64_t dv, bool bi) {
  const int64_t hd = dv / heads;
  std::vector<float> t(static_cast<size_t>(n * dv)), qkv(static_cast<size_t>(n * 3 * dv));
  layer_norm(h, b.norm1_w, b.norm1_b, t.data(), n, dv);
  affine(b.qkv, b.qkv_b, t.data(), qkv.data(), n, bi);
  std::vector<float> q(static_cast<size_t>(n * hd)), k(q.size()), vt(q.size()), s(static_cast<size_t>(n * n)),
      o(q.size());
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int64_t head = 0; head < heads; ++head) {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < hd; ++j) {
        const float* row = qkv.data() + i * 3 * dv + head * hd + j;
        q[i * hd + j] = row[0] * scale;
        k[i * hd + j] = row[dv];
        vt[j * n + i] = row[2 * dv];
      }
    kernels::matmul(q.data(), k.data(), s.data(), n, n, hd, bi);  // scores (n, n)
    for (int64_t i = 0; i < n; ++i) kernels::softmax(s.data() + i * n, n);
    kernels::matmul(s.data(), vt.data(), o.data(), n, hd, n, bi);  // (n, hd) = P · V
    for (int64_t i = 0; i < n; ++i) std::memcpy(t.data() + i * dv + head * hd, o.data() + i * hd, sizeof(float) * hd);
  }
  std::vector<float> out(static_cast<size_t>(n * dv));
  affine(b.proj, b.proj_b, t.data(), out.data(), n, bi);
  for (int64_t i = 0; i < n * dv; ++i) h[i] += out[i];
}

// h (n, dv) += fc2(GELU(fc1(LN2(h)))).
void mlp_block(const vision_block_weights& b, float* h, int64_t n, int64_t dv, bool bi) {
  std::vector<float> t(static_cast<size_t>(n * dv)), u(static_cast<size_t>(n * b.fc1.out)), out(t.size());
  layer_norm(h, b.norm2_w, b.norm2_b, t.data(), n, dv);
  affine(b.fc1, b.fc1_b, t.data(), u.data(), n, bi);
  gelu(u.data(), static_cast<int64_t>(u.size()));
  affine(b.fc2, b.fc2_b, u.data(), out.data(), n, bi);
  for (int64_t i = 0; i < n * dv; ++i) h[i] += out[i];
}

}  // namespace

int64_t image_tokens(const vision_config& v, int64_t width, int64_t height) {
  return (width / v.patch_size) * (height / v.patch_size);
}

std::string check_image(const vision_config& v, int64_t width, int64_t height, size_t rgb_bytes) {
  if (!v.present) return "the model has no vision encoder";
  auto side = [&](int64_t x, const char* name) -> std::string {
    if (x <= 0 || x % v.patch_size != 0 || x > v.image_size)
      return std::string("image ") + name + " " + std::to_string(x) + " is not a positive multiple of the patch size " +
             std::to_string(v.patch_size) + " up to " + std::to_string(v.image_size);
    return "";
  };
  if (auto e = side(width, "width"); !e.empty()) return e;
  if (auto e = side(height, "height"); !e.empty()) return e;
  if (rgb_bytes != static_cast<size_t>(width * height * 3))
    return "image of " + std::to_string(width) + "x" + std::to_string(height) + " has " + std::to_string(rgb_bytes) +
           " bytes of RGB, not " + std::to_string(width * height * 3);
  return "";
}

std::vector<float> encode_image(const model_weights& w, std::span<const uint8_t> rgb, int64_t width, int64_t height,
                                bool bi) {
  const model_config& c = w.config;
  const vision_config& v = c.vision;
  SHOAL_ASSERT(check_image(v, width, height, rgb.size()).empty());
  const int64_t p = v.patch_size, gw = width / p, gh = height / p, n = gw * gh, dv = v.hidden, d = c.hidden_size;
  const int64_t pin = p * p * 3;
  std::vector<float> patches(static_cast<size_t>(n * pin));
  for (int64_t r = 0; r < gh; ++r)
    for (int64_t col = 0; col < gw; ++col) {
      float* dst = patches.data() + (r * gw + col) * pin;
      for (int64_t i = 0; i < p; ++i)
        for (int64_t j = 0; j < p; ++j)
          for (int64_t ch = 0; ch < 3; ++ch)
            *dst++ = static_cast<float>(rgb[((r * p + i) * width + col * p + j) * 3 + ch]) / 127.5f - 1.0f;
    }
  std::vector<float> h(static_cast<size_t>(n * dv));
  affine(w.vision.patch_embed, w.vision.patch_b, patches.data(), h.data(), n, bi);
  for (int64_t r = 0; r < gh; ++r)
    for (int64_t col = 0; col < gw; ++col)
      for (int64_t i = 0; i < dv; ++i) h[(r * gw + col) * dv + i] += w.vision.pos_embed[(r * v.grid() + col) * dv + i];
  for (const auto& b : w.vision.layers) {
    attention_block(b, v.heads, h.data(), n, dv, bi);
    mlp_block(b, h.data(), n, dv, bi);
  }
  layer_norm(h.data(), w.vision.post_norm_w, w.vision.post_norm_b, h.data(), n, dv);
  std::vector<float> y(static_cast<size_t>(n * d)), out(static_cast<size_t>(n * d));
  affine(w.vision.proj1, w.vision.proj1_b, h.data(), y.data(), n, bi);
  gelu(y.data(), n * d);
  affine(w.vision.proj2, w.vision.proj2_b, y.data(), out.data(), n, bi);
  return out;
}

}  // namespace shoal::model
