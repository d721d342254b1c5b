// On-disk format of one chunk file and the POSIX helpers the chunk store writes it with. A chunk
// file is a fixed 48-byte header followed by the payload; the header carries the key, traffic
// class, put time, payload length and two CRC32Cs (payload, header), so a torn or corrupt file is
// recognised on read and on restart without any other metadata.
//
// Header (little-endian, packed, 48 bytes):
//   0  u32 magic 'SHCK' (0x4b434853)    4  u16 version (1)   6 u8 traffic_class   7 u8 chunk index
//   8  u64 key.hi                      16  u64 key.lo       24 i64 put_ms
//   32 u64 payload_bytes               40  u32 payload crc32c
//   44 u32 header crc32c over bytes [0, 44)
#pragma once

#include <array>
#include <bit>
#include <compare>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "storage/ttl.hpp"

#include "runtime/base/block_key.hpp"

namespace shoal::storage {

static_assert(std::endian::native == std::endian::little, "chunk files are little-endian");

// A chunk's identity: the block's key (the engine's own key type) and the chunk's index within
// its stripe. Ordered lexicographically (key.hi, key.lo, index); that order is the final GC
// tie-break.
struct chunk_key {
  runtime::block_key block;
  uint8_t index = 0;
  auto operator<=>(const chunk_key&) const = default;
};
std::string to_string(const chunk_key& k);  // "<32 hex>-<2 hex>", also the file name stem

// Standard CRC32C (Castagnoli) via ISA-L.
uint32_t crc32c(std::span<const std::byte> bytes);

inline constexpr uint32_t file_magic = 0x4b434853;  // "SHCK"
inline constexpr uint16_t file_version = 1;
inline constexpr size_t file_header_bytes = 48;

struct chunk_header {
  chunk_key key;
  traffic_class cls = traffic_class::agent;
  int64_t put_ms = 0;
  uint64_t payload_bytes = 0;
  uint32_t payload_crc = 0;
};

std::array<std::byte, file_header_bytes> encode_header(const chunk_header& h);
// nullopt when the magic, version, class byte or header crc is wrong.
std::optional<chunk_header> decode_header(std::span<const std::byte, file_header_bytes> bytes);

// Layout under the store root:
//   <root>/chunks/<hh>/<32 hex key>-<2 hex index>.chk   hh = top byte of key.hi (2 lowercase hex):
//                                                      up to 256 shard dirs, each made on first put
//   <root>/chunks/<hh>/.tmp-<name>.<pid>.<seq>          a write in progress (removed at open)
inline constexpr int n_shards = 256;
inline constexpr std::string_view chunk_suffix = ".chk";
inline constexpr std::string_view temp_prefix = ".tmp-";
std::string shard_dir(const std::string& root, int shard);
int shard_of(const chunk_key& k);
std::string chunk_path(const std::string& root, const chunk_key& k);
// Parses "<32 hex>-<2 hex>.chk"; nullopt for anything else.
std::optional<chunk_key> parse_chunk_name(std::string_view file_name);

// Small POSIX wrappers: 0 on success, else an errno value.
int write_all(int fd, std::span<const std::byte> bytes);
int read_all(int fd, std::span<std::byte> bytes);  // EIO on a short read (file shorter than asked)
int fsync_path(const std::string& path, bool directory);

}  // namespace shoal::storage
