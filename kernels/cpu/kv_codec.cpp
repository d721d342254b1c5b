// KV entry forms: bf16 rounding, the MXFP8 latent with a bf16 rope part, and the decode loops
// the attention kernels call per entry.
#include "kernels/cpu/kv_codec.hpp"

#include <array>
#include <bit>
#include <cmath>
#include <cstring>

#include "kernels/assert.hpp"
#include "kernels/cpu/mxfp8.hpp"

namespace shoal::kernels {

namespace {

size_t latent_bytes(int64_t r) { return (mxfp8_bytes(r) + 1) & ~size_t{1}; }

const std::array<float, 256>& e4m3_values() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b) t[size_t(b)] = e4m3_to_float(uint8_t(b));
    return t;
  }();
  return table;
}

void bf16_encode(const float* x, int64_t n, uint8_t* out) {
  for (int64_t i = 0; i < n; ++i) {
    uint16_t b = bf16_from_float(x[i]);
    std::memcpy(out + 2 * i, &b, 2);
  }
}

void bf16_decode(const uint8_t* in, int64_t n, float* x) {
  for (int64_t i = 0; i < n; ++i) {
    uint16_t b;
    std::memcpy(&b, in + 2 * i, 2);
    x[i] = bf16_to_float(b);
  }
}

// mxfp8_decode's values (e4m3 times an exact power of two), through a table.
void mx_decode(const uint8_t* in, int64_t n, float* x) {
  const auto& t = e4m3_values();
  const uint8_t* scales = in + n;
  for (int64_t b0 = 0, blk = 0; b0 < n; b0 += mxfp8_block, ++blk) {
    const uint8_t s = scales[blk];
    const float scale = s == ue8m0_nan ? NAN : std::ldexp(1.0f, int(s) - 127);
    const int64_t b1 = std::min(n, b0 + mxfp8_block);
    for (int64_t i = b0; i < b1; ++i) x[i] = t[in[i]] * scale;
  }
}

}  // namespace

uint16_t bf16_from_float(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  if (std::isnan(x)) return uint16_t((u >> 16) | 0x40);  // quiet, sign kept
  u += 0x7FFF + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}

float bf16_to_float(uint16_t b) { return std::bit_cast<float>(uint32_t(b) << 16); }

size_t kv_entry_bytes(kv_elem elem, int64_t r, int64_t rope) {
  switch (elem) {
    case kv_elem::f32: return sizeof(float) * size_t(r + rope);
    case kv_elem::bf16: return 2 * size_t(r + rope);
    case kv_elem::e4m3_mx: return latent_bytes(r) + 2 * size_t(rope);
  }
  SHOAL_ASSERT(false);
  return 0;
}

void kv_encode(kv_elem elem, const float* x, int64_t r, int64_t rope, uint8_t* out) {
  switch (elem) {
    case kv_elem::f32: std::memcpy(out, x, sizeof(float) * size_t(r + rope)); return;
    case kv_elem::bf16: bf16_encode(x, r + rope, out); return;
    case kv_elem::e4m3_mx: {
      mxfp8_encode(x, r, out);
      const size_t lat = latent_bytes(r);
      if (lat > mxfp8_bytes(r)) out[lat - 1] = 0;
      bf16_encode(x + r, rope, out + lat);
      return;
    }
  }
}

void kv_decode(kv_elem elem, const uint8_t* in, int64_t r, int64_t rope, float* x) {
  switch (elem) {
    case kv_elem::f32: std::memcpy(x, in, sizeof(float) * size_t(r + rope)); return;
    case kv_elem::bf16: bf16_decode(in, r + rope, x); return;
    case kv_elem::e4m3_mx:
      mx_decode(in, r, x);
      bf16_decode(in + latent_bytes(r), rope, x + r);
      return;
  }
}

void kv_round(kv_elem elem, float* x, int64_t r, int64_t rope) {
  if (elem == kv_elem::f32) return;
  uint8_t buf[4096];
  const size_t bytes = kv_entry_bytes(elem, r, rope);
  SHOAL_ASSERT(bytes <= sizeof buf);
  kv_encode(elem, x, r, rope, buf);
  kv_decode(elem, buf, r, rope, x);
}

}  // namespace shoal::kernels
