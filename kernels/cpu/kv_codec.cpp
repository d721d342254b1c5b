// KV entry forms: bf16 rounding, the MXFP8 latent (mxfp8.hpp's codec) with a bf16 rope part,
// and the decode the attention kernels call per entry.
#include "kernels/cpu/kv_codec.hpp"

#include <bit>
#include <cmath>
#include <cstring>

#include "kernels/assert.hpp"
#include "kernels/cpu/mxfp8.hpp"

namespace shoal::kernels {

namespace {

size_t latent_bytes(int64_t r) { return (mxfp8_bytes(r) + 1) & ~size_t{1}; }

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
      mxfp8_decode(in, r, x);
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
