// MXFP8 (E4M3) encode and decode, scalar. The e4m3 rounding works on the exact double
// quotient x / 2^s (a power-of-two scaling, so nothing is rounded before the one RNE step),
// and decode goes through a 256-entry table times an exact power of two.
#include "kernels/cpu/mxfp8.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/assert.hpp"

namespace shoal::kernels {

namespace {

constexpr int e4m3_emax = 8;      // largest normal exponent: 448 = 1.75 · 2^8
constexpr int e4m3_emin = -6;     // smallest normal exponent; subnormals step by 2^-9
constexpr uint8_t e4m3_max = 0x7E;  // S.1111.110 = 448
constexpr uint8_t e4m3_nan = 0x7F;  // S.1111.111
constexpr int ue8m0_bias = 127;

const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b) t[size_t(b)] = e4m3_to_float(uint8_t(b));
    return t;
  }();
  return table;
}

// 2^e as a double, exactly, for |e| ≤ 1022.
double pow2(int e) { return std::bit_cast<double>(uint64_t(1023 + e) << 52); }

void encode_block(const float* x, int64_t len, uint8_t* elements, uint8_t* scale) {
  float amax = 0.0f;
  bool finite = true;
  for (int64_t i = 0; i < len; ++i) {
    float a = std::fabs(x[i]);
    finite &= a <= FLT_MAX;  // false for NaN and ±inf
    amax = std::max(amax, a);
  }
  if (!finite) {
    *scale = ue8m0_nan;
    std::memset(elements, e4m3_nan, size_t(len));
    return;
  }
  // ilogb is exact floor(log2) for normal and subnormal floats alike.
  int s = amax == 0.0f ? -ue8m0_bias : std::clamp(std::ilogb(amax) - e4m3_emax, -ue8m0_bias, ue8m0_bias);
  *scale = uint8_t(s + ue8m0_bias);
  double inverse = pow2(-s);
  for (int64_t i = 0; i < len; ++i) elements[i] = e4m3_from_float(double(x[i]) * inverse);
}

}  // namespace

size_t mxfp8_bytes(int64_t n) {
  SHOAL_ASSERT(n >= 0);
  return size_t(n + (n + mxfp8_block - 1) / mxfp8_block);
}

float e4m3_to_float(uint8_t b) {
  int exponent = (b >> 3) & 0xF, mantissa = b & 0x7;
  if (exponent == 0xF && mantissa == 0x7) return std::numeric_limits<float>::quiet_NaN();
  float magnitude = exponent == 0 ? std::ldexp(float(mantissa), -9)  // subnormal: m · 2^-9
                                  : std::ldexp(float(8 + mantissa), exponent - 10);  // 1.m · 2^(e−7)
  return (b & 0x80) ? -magnitude : magnitude;
}

uint8_t e4m3_from_float(double v) {
  if (std::isnan(v)) return e4m3_nan;
  uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  double a = std::fabs(v);
  if (a >= 448.0) return sign | e4m3_max;  // saturate (also what would round up to 480)
  // Quantum of a's binade is 2^(e−3), with subnormals sharing the e = −6 quantum 2^-9.
  int e = a < pow2(e4m3_emin) ? e4m3_emin : int((std::bit_cast<uint64_t>(a) >> 52) & 0x7FF) - 1023;
  int q = int(std::nearbyint(a * pow2(3 - e)));  // in [0, 16]; ties to even
  // Code = ((e + 6) << 3) + q: q in [8, 16] carries into the exponent field on its own
  // (q = 16 is the next binade's 1.000) and q < 8 with e = −6 is a subnormal.
  return sign | uint8_t(((e - e4m3_emin) << 3) + q);
}

void mxfp8_encode(const float* x, int64_t n, uint8_t* out) {
  SHOAL_ASSERT(n >= 0);
  uint8_t* scales = out + n;
  for (int64_t start = 0, b = 0; start < n; start += mxfp8_block, ++b)
    encode_block(x + start, std::min(mxfp8_block, n - start), out + start, scales + b);
}

void mxfp8_decode(const uint8_t* in, int64_t n, float* x) {
  SHOAL_ASSERT(n >= 0);
  const auto& table = e4m3_table();
  const uint8_t* scales = in + n;
  for (int64_t start = 0, b = 0; start < n; start += mxfp8_block, ++b) {
    int64_t end = std::min(start + mxfp8_block, n);
    if (scales[b] == ue8m0_nan) {
      std::fill(x + start, x + end, std::numeric_limits<float>::quiet_NaN());
      continue;
    }
    // 2^(byte − 127) is a float (2^-127 a subnormal), and e4m3 · 2^k is exact unless it
    // overflows, which only foreign bytes can ask for (→ ±inf).
    float scale = std::ldexp(1.0f, int(scales[b]) - ue8m0_bias);
    for (int64_t i = start; i < end; ++i) x[i] = table[in[i]] * scale;
  }
}

}  // namespace shoal::kernels
