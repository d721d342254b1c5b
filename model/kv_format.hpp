// The stored form of the paged KV cache (engine.kv_dtype) and the memory that holds it. A
// cache entry is the latent c (kv_lora_rank values) ‖ the roped key k_pe (qk_rope_head_dim):
//   fp32: every value fp32 (the exact reference mode);
//   bf16: every value bf16;
//   fp8:  the latent as MXFP8 (e4m3 values, one power-of-two scale per 32), the rope part
//         bf16 (kernels/cpu/kv_codec.hpp has the byte layout).
// A block is (cache_layers, block_size / ratio) entries, contiguous: one block is one range
// for a handoff read or a storage write. The format travels with the bytes (handoffs, storage
// chunks): a reader holding another format treats them as a miss.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "model/config.hpp"

namespace shoal::model {

enum class kv_dtype : uint8_t { fp32 = 0, bf16 = 1, fp8 = 2 };
std::string_view to_string(kv_dtype d);
// "fp32" | "bf16" | "fp8"; nullopt otherwise.
std::optional<kv_dtype> parse_kv_dtype(std::string_view s);

struct kv_format {
  kv_dtype dtype = kv_dtype::fp32;
  int32_t latent = 0;   // values of c per entry
  int32_t rope = 0;     // values of k_pe per entry
  int32_t layers = 0;     // cache layers per block
  int32_t per_layer = 0;  // entries per layer per block: block_size / ratio
  int64_t entries() const { return int64_t{layers} * per_layer; }
  size_t entry_bytes() const;
  size_t block_bytes() const { return entry_bytes() * static_cast<size_t>(entries()); }
  // "bf16, 256 + 64 values an entry, 6 layers × 64 entries a block"
  std::string describe() const;
  bool operator==(const kv_format&) const = default;
};
kv_format kv_format_of(const model_config& c, kv_dtype dtype);

// A stored block names its format in a header before its bytes (storage chunks): the magic
// "SKV1", dtype, latent, rope, layers and per_layer, little-endian.
inline constexpr size_t kv_block_header_bytes = 16;
void write_block_header(const kv_format& f, uint8_t* out);
// The format a header names; nullopt when `in` does not start with one.
std::optional<kv_format> read_block_header(std::span<const uint8_t> in);

// In place: the values an entry (latent + rope) reads back as from a cache in `f`'s form.
void round_entry(const kv_format& f, float* entry);
// One entry to and from its stored form (entry_bytes()).
void encode_entry(const kv_format& f, const float* entry, uint8_t* out);
void decode_entry(const kv_format& f, const uint8_t* in, float* entry);

// The paged cache memory of one engine, as the compute backend creates it: num_blocks blocks
// of format().block_bytes(), block b at b · block_bytes. Sequences name blocks by id.
class kv_pages {
 public:
  kv_pages(const kv_format& f, int32_t num_blocks);
  const kv_format& format() const { return format_; }
  int32_t num_blocks() const { return num_blocks_; }
  size_t block_bytes() const { return format_.block_bytes(); }
  uint8_t* block(int32_t b);
  const uint8_t* block(int32_t b) const;
  size_t offset_bytes(int32_t b) const { return static_cast<size_t>(b) * block_bytes(); }
  // Every block's bytes (registered once for remote reads).
  std::span<const std::byte> memory() const;

 private:
  kv_format format_;
  int32_t num_blocks_;
  std::unique_ptr<uint8_t[]> bytes_;
};

// The SWA snapshot codec (MXFP8 over a whole entry, fp32 when configured so).
size_t mxfp8_bytes(int64_t n);
void mxfp8_encode(const float* x, int64_t n, uint8_t* out);
void mxfp8_decode(const uint8_t* in, int64_t n, float* x);

}  // namespace shoal::model
