// OCP Microscaling MXFP8 (E4M3) codec on the CPU: blocks of 32 consecutive values share one
// UE8M0 power-of-two scale, each value is stored as one FP8 e4m3fn byte. Self-contained (its
// own e4m3 conversion) so that kernels/ depends on nothing else; the encode rule below is
// the OCP MX v1.0 one and is what the tests check bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>

namespace shoal::kernels {

inline constexpr int64_t mxfp8_block = 32;  // values per shared scale
inline constexpr uint8_t ue8m0_nan = 0xFF;  // scale byte meaning "every value of the block is NaN"

// Buffer layout for n values: the n element bytes (e4m3fn, value i at byte i), then the
// ceil(n / 32) scale bytes (UE8M0, scale of block b at byte n + b). The last block may be
// partial. Returns n + ceil(n / 32).
size_t mxfp8_bytes(int64_t n);

// Encodes x (n) into out (mxfp8_bytes(n)). Per block, with amax = max |x|:
//   scale exponent s = floor(log2(amax)) − 8 (8 = emax of e4m3), clamped to [−127, 127],
//     stored as the byte s + 127; a block of zeros gets s = −127 (byte 0);
//   element = x / 2^s rounded to nearest, ties to even, saturated to ±448 (never NaN).
// The largest value lands in [256, 512) before saturation, so values above 448·2^s (up to
// 1/8 below the block max) are clipped, as the OCP rule implies. Tiny values clamp the
// scale at 2^-127 and round to ±0 at or below 2^-137. A block holding NaN or ±inf gets scale byte
// 0xFF and element bytes 0x7F: it decodes to all NaN. Signed zeros keep their sign.
void mxfp8_encode(const float* x, int64_t n, uint8_t* out);

// Decodes in (mxfp8_bytes(n)) into x (n): e4m3(element) · 2^(scale byte − 127), NaN for a
// NaN element (0x7F / 0xFF) or a 0xFF scale. Any byte pattern is accepted.
void mxfp8_decode(const uint8_t* in, int64_t n, float* x);

// The single-value e4m3fn conversions used above: 1 sign, 4 exponent (bias 7), 3 mantissa
// bits; no infinities, S.1111.111 is NaN, max ±448, smallest subnormal 2^-9.
float e4m3_to_float(uint8_t b);
// Round to nearest, ties to even, saturating to ±448; NaN → 0x7F.
uint8_t e4m3_from_float(double v);

}  // namespace shoal::kernels
