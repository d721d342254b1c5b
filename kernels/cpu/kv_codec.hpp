// Stored forms of one latent KV-cache entry (c ‖ k_pe: r latent values, then rope values), as
// the paged cache and its copies hold them. The attention kernels read these forms directly,
// one entry at a time into a small buffer (never a widened copy of the cache).
//   f32:      r + rope fp32 values.
//   bf16:     r + rope bf16 values (round to nearest, ties to even).
//   e4m3_mx:  the latent as MXFP8 (mxfp8.hpp: r e4m3 bytes, then ceil(r / 32) UE8M0 scale
//             bytes), padded to an even size, then the rope part as bf16.
#pragma once

#include <cstddef>
#include <cstdint>

namespace shoal::kernels {

enum class kv_elem : uint8_t { f32, bf16, e4m3_mx };

// Bytes of one entry in `elem`.
size_t kv_entry_bytes(kv_elem elem, int64_t r, int64_t rope);
// out (kv_entry_bytes) = x (r + rope) in `elem`.
void kv_encode(kv_elem elem, const float* x, int64_t r, int64_t rope, uint8_t* out);
// x (r + rope) = the values `in` holds (exact: every stored value is an fp32 value).
void kv_decode(kv_elem elem, const uint8_t* in, int64_t r, int64_t rope, float* x);
// x = decode(encode(x)), in place: the values a cache in `elem` would give back.
void kv_round(kv_elem elem, float* x, int64_t r, int64_t rope);

// bf16 ⇄ fp32: round to nearest, ties to even (NaN stays NaN); widening is exact.
uint16_t bf16_from_float(float x);
float bf16_to_float(uint16_t b);

}  // namespace shoal::kernels
