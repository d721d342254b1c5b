// KV cache formats: names, sizes, the entry codec (kernels/cpu/kv_codec.hpp) and the paged
// memory.
#include "model/kv_format.hpp"

#include <cstring>

#include "kernels/assert.hpp"
#include "kernels/cpu/kv_codec.hpp"
#include "kernels/cpu/mxfp8.hpp"
#include "model/forward_internal.hpp"

namespace shoal::model {

std::string_view to_string(kv_dtype d) {
  switch (d) {
    case kv_dtype::fp32: return "fp32";
    case kv_dtype::bf16: return "bf16";
    case kv_dtype::fp8: return "fp8";
  }
  return "?";
}

std::optional<kv_dtype> parse_kv_dtype(std::string_view s) {
  for (kv_dtype d : {kv_dtype::fp32, kv_dtype::bf16, kv_dtype::fp8})
    if (s == to_string(d)) return d;
  return std::nullopt;
}

size_t kv_format::entry_bytes() const { return kernels::kv_entry_bytes(detail::elem_of(dtype), latent, rope); }

std::string kv_format::describe() const {
  return std::string(to_string(dtype)) + ", " + std::to_string(latent) + " + " + std::to_string(rope) +
         " values an entry, " + std::to_string(layers) + " layers × " +
         std::to_string(per_layer) + " entries a block";
}

kv_format kv_format_of(const model_config& c, kv_dtype dtype) {
  return {dtype, static_cast<int32_t>(c.kv_lora_rank), static_cast<int32_t>(c.qk_rope_head_dim),
          static_cast<int32_t>(c.cache_layers()), static_cast<int32_t>(c.block_size / c.ratio())};
}

void write_block_header(const kv_format& f, uint8_t* out) {
  const uint16_t latent = static_cast<uint16_t>(f.latent), rope = static_cast<uint16_t>(f.rope),
                 layers = static_cast<uint16_t>(f.layers);
  const uint32_t per_layer = static_cast<uint32_t>(f.per_layer);
  std::memcpy(out, "SKV1", 4);
  out[4] = static_cast<uint8_t>(f.dtype);
  out[5] = 0;
  std::memcpy(out + 6, &latent, 2);
  std::memcpy(out + 8, &rope, 2);
  std::memcpy(out + 10, &layers, 2);
  std::memcpy(out + 12, &per_layer, 4);
}

std::optional<kv_format> read_block_header(std::span<const uint8_t> in) {
  if (in.size() < kv_block_header_bytes || std::memcmp(in.data(), "SKV1", 4) != 0 || in[4] > 2 || in[5] != 0)
    return std::nullopt;
  uint16_t latent, rope, layers;
  uint32_t per_layer;
  std::memcpy(&latent, in.data() + 6, 2);
  std::memcpy(&rope, in.data() + 8, 2);
  std::memcpy(&layers, in.data() + 10, 2);
  std::memcpy(&per_layer, in.data() + 12, 4);
  if (per_layer > (1u << 24)) return std::nullopt;
  return kv_format{static_cast<kv_dtype>(in[4]), latent, rope, layers, static_cast<int32_t>(per_layer)};
}

void round_entry(const kv_format& f, float* entry) {
  kernels::kv_round(detail::elem_of(f.dtype), entry, f.latent, f.rope);
}

void encode_entry(const kv_format& f, const float* entry, uint8_t* out) {
  kernels::kv_encode(detail::elem_of(f.dtype), entry, f.latent, f.rope, out);
}

void decode_entry(const kv_format& f, const uint8_t* in, float* entry) {
  kernels::kv_decode(detail::elem_of(f.dtype), in, f.latent, f.rope, entry);
}

kv_pages::kv_pages(const kv_format& f, int32_t num_blocks)
    : format_(f), num_blocks_(std::max(num_blocks, 0)),
      bytes_(new uint8_t[static_cast<size_t>(num_blocks_) * f.block_bytes()]()) {}

uint8_t* kv_pages::block(int32_t b) {
  SHOAL_ASSERT(b >= 0 && b < num_blocks_);
  return bytes_.get() + offset_bytes(b);
}

const uint8_t* kv_pages::block(int32_t b) const { return const_cast<kv_pages*>(this)->block(b); }

std::span<const std::byte> kv_pages::memory() const {
  return {reinterpret_cast<const std::byte*>(bytes_.get()), static_cast<size_t>(num_blocks_) * block_bytes()};
}

size_t mxfp8_bytes(int64_t n) { return kernels::mxfp8_bytes(n); }
void mxfp8_encode(const float* x, int64_t n, uint8_t* out) { kernels::mxfp8_encode(x, n, out); }
void mxfp8_decode(const uint8_t* in, int64_t n, float* x) { kernels::mxfp8_decode(in, n, x); }

}  // namespace shoal::model
