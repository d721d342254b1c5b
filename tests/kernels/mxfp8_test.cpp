// MXFP8 codec against a straightforward reference written here (e4m3 by its formula, encode
// by exhaustive nearest search over the codes, floor(log2) by halving): identical bytes on
// random, tie, tiny and huge inputs; the encode→decode error bound; exact round-trips;
// partial blocks, zeros and non-finite blocks.
#include <doctest/doctest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/mxfp8.hpp"

using namespace shoal::kernels;

namespace ref {

// e4m3fn by its definition, in double.
double e4m3_value(uint8_t b) {
  int e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  double magnitude = e == 0 ? m / 512.0 : (1.0 + m / 8.0) * std::pow(2.0, e - 7);
  return (b & 0x80) ? -magnitude : magnitude;
}

// Nearest e4m3 code of the same sign by trying all 127 finite magnitudes; on a tie the even
// code (even mantissa) wins. Saturation falls out: nothing lies above 448.
uint8_t e4m3_nearest(double v) {
  if (std::isnan(v)) return 0x7F;
  uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  double a = std::fabs(v), best_distance = INFINITY;
  uint8_t best = 0;
  for (uint8_t c = 0; c < 0x7F; ++c) {
    double d = std::fabs(e4m3_value(c) - a);
    if (d < best_distance || (d == best_distance && c % 2 == 0)) {
      best = c;
      best_distance = d;
    }
  }
  return sign | best;
}

int floor_log2(double a) {  // a > 0, finite
  int e = 0;
  for (; a >= 2.0; a /= 2.0) ++e;
  for (; a < 1.0; a *= 2.0) --e;
  return e;
}

std::vector<uint8_t> encode(const std::vector<float>& x) {
  size_t n = x.size(), blocks = (n + 31) / 32;
  std::vector<uint8_t> out(n + blocks);
  for (size_t b = 0; b < blocks; ++b) {
    size_t start = b * 32, end = std::min(n, start + 32);
    double amax = 0;
    bool finite = true;
    for (size_t i = start; i < end; ++i) {
      finite = finite && std::isfinite(x[i]);
      amax = std::max(amax, std::fabs(double(x[i])));
    }
    if (!finite) {
      out[n + b] = 0xFF;
      for (size_t i = start; i < end; ++i) out[i] = 0x7F;
      continue;
    }
    int s = amax == 0 ? -127 : std::max(floor_log2(amax) - 8, -127);
    out[n + b] = uint8_t(s + 127);
    for (size_t i = start; i < end; ++i) out[i] = e4m3_nearest(double(x[i]) / std::pow(2.0, s));
  }
  return out;
}

}  // namespace ref

namespace {

std::vector<float> decode(const std::vector<uint8_t>& bytes, size_t n) {
  std::vector<float> x(n);
  mxfp8_decode(bytes.data(), int64_t(n), x.data());
  return x;
}

std::vector<uint8_t> encode(const std::vector<float>& x) {
  std::vector<uint8_t> out(mxfp8_bytes(int64_t(x.size())));
  mxfp8_encode(x.data(), int64_t(x.size()), out.data());
  return out;
}

// Values of mixed magnitude: per block a random exponent range, random signs, some zeros.
std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> unit(1.0, 2.0);
  std::uniform_int_distribution<int> block_exp(-140, 120), spread(0, 20), coin(0, 15);
  std::vector<float> x(n);
  for (size_t start = 0; start < n; start += 32) {
    int top = block_exp(rng), width = spread(rng);
    for (size_t i = start; i < std::min(n, start + 32); ++i) {
      int c = coin(rng);
      int e = top - std::uniform_int_distribution<int>(0, width)(rng);
      double v = c == 0 ? 0.0 : std::ldexp(unit(rng), e);
      x[i] = float(c % 2 ? -v : v);
    }
  }
  return x;
}

}  // namespace

TEST_CASE("e4m3: every code decodes by the formula and re-encodes to itself") {
  for (int c = 0; c < 256; ++c) {
    CAPTURE(c);
    double r = ref::e4m3_value(uint8_t(c));
    float f = e4m3_to_float(uint8_t(c));
    if (std::isnan(r)) {
      CHECK(std::isnan(f));
      CHECK(e4m3_from_float(f) == 0x7F);
      continue;
    }
    CHECK(double(f) == r);
    CHECK(std::signbit(f) == bool(c & 0x80));
    CHECK(e4m3_from_float(f) == c);
  }
  CHECK(e4m3_to_float(0x7E) == 448.0f);
  CHECK(e4m3_to_float(0x01) == std::ldexp(1.0f, -9));
  CHECK(e4m3_to_float(0x38) == 1.0f);
}

TEST_CASE("e4m3: rounding to nearest even, saturation, and the exhaustive reference") {
  CHECK(e4m3_from_float(1.0625) == 0x38);          // tie 1 | 1.125 → even 1
  CHECK(e4m3_from_float(1.1875) == 0x3A);          // tie 1.125 | 1.25 → even 1.25
  CHECK(e4m3_from_float(std::ldexp(1.5, -9)) == 0x02);  // subnormal tie → even
  CHECK(e4m3_from_float(std::ldexp(0.5, -9)) == 0x00);  // tie with zero → zero
  CHECK(e4m3_from_float(-std::ldexp(0.5, -9)) == 0x80);
  CHECK(e4m3_from_float(std::ldexp(15.5, -10)) == 0x08);  // 7.75 · 2^-9 → 2^-6, the first normal
  CHECK(e4m3_from_float(464.0) == 0x7E);  // would round to 480, which does not exist
  CHECK(e4m3_from_float(1e30) == 0x7E);
  CHECK(e4m3_from_float(-INFINITY) == 0xFE);
  CHECK(e4m3_from_float(NAN) == 0x7F);
  // Dense check: every midpoint and its neighbours, plus random values across the range.
  std::vector<double> probes;
  for (int c = 0; c < 0x7E; ++c) {
    double mid = (ref::e4m3_value(uint8_t(c)) + ref::e4m3_value(uint8_t(c + 1))) / 2;
    for (double v : {mid, std::nextafter(mid, 0.0), std::nextafter(mid, 1e9)}) {
      probes.push_back(v);
      probes.push_back(-v);
    }
  }
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> log_mag(-14.0, 9.5);
  for (int i = 0; i < 20000; ++i) probes.push_back((i % 2 ? -1 : 1) * std::exp2(log_mag(rng)));
  for (double v : probes) {
    CAPTURE(v);
    CHECK(e4m3_from_float(v) == ref::e4m3_nearest(v));
  }
}

TEST_CASE("mxfp8_bytes: elements then one scale per started block") {
  CHECK(mxfp8_bytes(0) == 0);
  CHECK(mxfp8_bytes(1) == 2);
  CHECK(mxfp8_bytes(32) == 33);
  CHECK(mxfp8_bytes(33) == 35);
  CHECK(mxfp8_bytes(70) == 73);
  CHECK(mxfp8_bytes(7168) == 7168 + 224);
}

TEST_CASE("encode is byte-identical to the exhaustive reference on random inputs") {
  for (size_t n : {1u, 31u, 32u, 33u, 100u, 1031u, 4096u}) {
    for (uint32_t seed = 0; seed < 3; ++seed) {
      CAPTURE(n);
      CAPTURE(seed);
      auto x = random_values(n, seed * 1000 + uint32_t(n));
      CHECK(encode(x) == ref::encode(x));
    }
  }
  // Gaussian activations, like the ones the codec is for.
  std::mt19937 rng(11);
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::vector<float> g(2048);
  for (auto& v : g) v = d(rng);
  CHECK(encode(g) == ref::encode(g));
}

TEST_CASE("encode→decode error: within half an e4m3 ulp at the block scale, unless saturated") {
  // Asserted per element, with X = 2^s the block scale and y = x / X:
  //   |y| ≤ 464 (not clipped): |decoded − x| ≤ ½ quantum(|y|) · X, where quantum = 2^(e − 3),
  //     e = max(floor(log2 |y|), −6); i.e. relative ≤ 2^-4 for |y| ≥ 2^-6 and absolute
  //     ≤ 2^-10 · X below (the subnormal steps);
  //   |y| > 464 (OCP rule clips the top of [256, 512)): decoded = ±448 · X, relative < 1/8.
  // And unclamped blocks put their max at |y| in [256, 512).
  for (uint32_t seed = 0; seed < 4; ++seed) {
    auto x = random_values(3001, 50 + seed);
    auto bytes = encode(x);
    auto y = decode(bytes, x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      CAPTURE(i);
      CAPTURE(x[i]);
      int s = int(bytes[x.size() + i / 32]) - 127;
      double scale = std::ldexp(1.0, s), yi = std::fabs(double(x[i])) / scale;
      double err = std::fabs(double(y[i]) - double(x[i]));
      if (yi <= 464.0) {
        int e = yi > 0 ? std::max(ref::floor_log2(yi), -6) : -6;
        CHECK(err <= std::ldexp(scale, e - 4));
        if (yi >= 0x1p-6) CHECK(err <= std::fabs(double(x[i])) * 0x1p-4);
      } else {
        CHECK(std::fabs(double(y[i])) == 448.0 * scale);
        CHECK(err < std::fabs(double(x[i])) / 8);
      }
      CHECK(std::signbit(y[i]) == std::signbit(x[i]));
    }
    for (size_t b = 0; b * 32 < x.size(); ++b) {
      int s = int(bytes[x.size() + b]) - 127;
      double amax = 0;
      for (size_t i = b * 32; i < std::min(x.size(), b * 32 + 32); ++i)
        amax = std::max(amax, std::fabs(double(x[i])));
      if (s > -127 && amax > 0) {
        CHECK(amax / std::ldexp(1.0, s) >= 256.0);
        CHECK(amax / std::ldexp(1.0, s) < 512.0);
      }
    }
  }
}

TEST_CASE("values already on the MXFP8 grid round-trip exactly, bytes included") {
  std::mt19937 rng(21);
  std::uniform_int_distribution<int> code(0, 0xFE), top(0x78, 0x7E), scale_exp(-127, 119), pos(0, 31);
  for (int trial = 0; trial < 50; ++trial) {
    size_t n = 32 * 8 + size_t(trial % 32);  // with a partial last block half the time
    std::vector<uint8_t> bytes(mxfp8_bytes(int64_t(n)));
    for (size_t b = 0; b * 32 < n; ++b) {
      size_t start = b * 32, end = std::min(n, start + 32);
      for (size_t i = start; i < end; ++i) {
        int c = code(rng);
        bytes[i] = uint8_t(c == 0x7F ? 0x00 : c);  // no NaN
      }
      // One element in the top binade [256, 448] fixes the scale the encoder will choose.
      size_t anchor = start + size_t(pos(rng)) % (end - start);
      bytes[anchor] = uint8_t(top(rng) | (rng() % 2 ? 0x80 : 0x00));
      bytes[n + b] = uint8_t(scale_exp(rng) + 127);
    }
    auto x = decode(bytes, n);
    CHECK(encode(x) == bytes);
    auto again = decode(encode(x), n);
    CHECK(std::memcmp(again.data(), x.data(), n * sizeof(float)) == 0);  // bitwise, −0 included
  }
}

TEST_CASE("partial last block: own scale, layout, nothing written past mxfp8_bytes") {
  std::vector<float> x(70);
  for (size_t i = 0; i < 64; ++i) x[i] = float(i) - 20.0f;  // blocks 0, 1: amax 19, 43
  for (size_t i = 64; i < 70; ++i) x[i] = 0.001f * float(i - 63);  // block 2: 6 small values
  std::vector<uint8_t> bytes(mxfp8_bytes(70) + 8, 0xA5);  // canary tail
  mxfp8_encode(x.data(), 70, bytes.data());
  for (size_t i = 73; i < bytes.size(); ++i) CHECK(bytes[i] == 0xA5);
  CHECK(bytes[70] == 127 + 4 - 8);  // floor(log2 20) = 4
  CHECK(bytes[71] == 127 + 5 - 8);  // floor(log2 43) = 5
  CHECK(bytes[72] == 127 - 8 - 8);  // floor(log2 0.006) = −8
  std::vector<uint8_t> exact(bytes.begin(), bytes.begin() + 73);
  CHECK(exact == ref::encode(x));
  auto y = decode(exact, 70);
  for (size_t i = 0; i < 70; ++i) {
    CAPTURE(i);
    if (i < 64 && std::fabs(x[i]) <= 16.0f) CHECK(y[i] == x[i]);  // ≤ 4 significant bits
    CHECK(y[i] == doctest::Approx(x[i]).epsilon(1.0 / 16));
  }
}

TEST_CASE("zeros: scale byte 0 (2^-127), elements ±0, exact decode") {
  std::vector<float> z(40, 0.0f);
  z[3] = -0.0f;
  auto bytes = encode(z);
  CHECK(bytes[40] == 0);
  CHECK(bytes[41] == 0);
  CHECK(bytes[3] == 0x80);
  auto y = decode(bytes, 40);
  for (size_t i = 0; i < 40; ++i) {
    CHECK(y[i] == 0.0f);
    CHECK(std::signbit(y[i]) == (i == 3));
  }
  // A zero inside a non-zero block stays exactly zero.
  z[35] = 5.0f;
  auto y2 = decode(encode(z), 40);
  CHECK(y2[34] == 0.0f);
  CHECK(y2[35] == 5.0f);
}

TEST_CASE("large and small magnitudes: scale bytes and error inside the UE8M0 range") {
  auto one_block = [](float v) {
    std::vector<float> x{v, -v / 3, v / 1000, 0.0f};
    return std::pair{x, encode(x)};
  };
  {
    auto [x, bytes] = one_block(1e-20f);  // floor(log2 1e-20) = −67
    CHECK(bytes[4] == 127 - 67 - 8);
    auto y = decode(bytes, 4);
    CHECK(y[0] == doctest::Approx(1e-20).epsilon(1.0 / 16));
    CHECK(y[1] == doctest::Approx(-1e-20 / 3).epsilon(1.0 / 16));
  }
  {
    auto [x, bytes] = one_block(1e20f);  // floor(log2 1e20) = 66
    CHECK(bytes[4] == 127 + 66 - 8);
    auto y = decode(bytes, 4);
    CHECK(y[0] == doctest::Approx(1e20).epsilon(1.0 / 16));
    CHECK(y[2] == doctest::Approx(1e17).epsilon(1.0 / 16));
  }
  {
    auto [x, bytes] = one_block(FLT_MAX);  // floor(log2) = 127 → s = 119; FLT_MAX / 2^119 ≈ 512 clips
    CHECK(bytes[4] == 127 + 119);
    CHECK(decode(bytes, 4)[0] == std::ldexp(448.0f, 119));
  }
  {
    auto [x, bytes] = one_block(1e-40f);  // subnormal float: s = −141 clamps to −127
    CHECK(bytes[4] == 0);
    CHECK(decode(bytes, 4)[0] == doctest::Approx(1e-40).epsilon(1.0 / 16));
    CHECK(bytes == ref::encode(x));
  }
  {
    auto [x, bytes] = one_block(-std::ldexp(1.0f, -149));  // 2^-149 · 2^127 = 2^-22 → −0
    CHECK(bytes[4] == 0);
    CHECK(bytes[0] == 0x80);
    CHECK(bytes == ref::encode(x));
  }
}

TEST_CASE("a block with NaN or inf decodes to NaN, other blocks are untouched") {
  std::vector<float> x(96, 1.5f);
  x[5] = NAN;
  x[40] = -INFINITY;
  auto bytes = encode(x);
  CHECK(bytes == ref::encode(x));
  CHECK(bytes[96] == ue8m0_nan);
  CHECK(bytes[97] == ue8m0_nan);
  CHECK(bytes[98] == 127 + 0 - 8);
  auto y = decode(bytes, 96);
  for (size_t i = 0; i < 64; ++i) CHECK(std::isnan(y[i]));
  for (size_t i = 64; i < 96; ++i) CHECK(y[i] == 1.5f);
}

TEST_CASE("decode: every scale byte × every element code against the formula") {
  std::vector<uint8_t> bytes(256 + 8);
  for (int c = 0; c < 256; ++c) bytes[size_t(c)] = uint8_t(c);
  for (int s = 0; s < 256; ++s) {
    CAPTURE(s);
    std::fill(bytes.begin() + 256, bytes.end(), uint8_t(s));
    auto y = decode(bytes, 256);
    for (int c = 0; c < 256; ++c) {
      double r = ref::e4m3_value(uint8_t(c)) * std::pow(2.0, s - 127);
      if (s == 255 || std::isnan(r)) {
        CHECK(std::isnan(y[size_t(c)]));
      } else if (std::fabs(r) > FLT_MAX) {
        CHECK(std::isinf(y[size_t(c)]));  // foreign bytes beyond float range
      } else {
        CHECK(double(y[size_t(c)]) == r);
      }
    }
  }
}
