// The Reed-Solomon codec of the KV-cache storage cluster: a block of bytes becomes k data
// chunks plus m parity chunks (ISA-L Cauchy matrix, default 10+2), each with a checksummed
// header, and any k intact chunks give the block back bit-exact. Chunks travel between
// processes and sit on disks, so every header field is checked before it is trusted and a
// damaged chunk counts as an erasure, never as data.
#pragma once

#include <cstdint>
#include <expected>
#include <span>
#include <string>
#include <vector>

#include "storage/error.hpp"

namespace shoal::storage {

// Chunk = 32-byte header + payload. All fields little-endian, fixed width:
//
//   offset size field
//   0      4    magic            0x43454853, i.e. the bytes "SHEC"
//   4      1    version          chunk_format_version (1)
//   5      1    k                data chunks of the block's codec, 1..254
//   6      1    m                parity chunks, 1..254, k + m <= 255
//   7      1    index            this chunk, 0..k+m-1; 0..k-1 data, k..k+m-1 parity
//   8      4    payload_bytes    = ceil(block_bytes / k) <= INT32_MAX; the chunk is exactly
//                                32 + payload_bytes bytes long
//   12     4    block_crc        crc32c of the whole original block (unpadded): ties the
//                                chunks of one block together and checks a decode end to end
//   16     8    block_bytes      true length of the block; decode trims the zero padding
//   24     4    payload_crc      crc32c of the payload bytes (32 .. 32+payload_bytes)
//   28     4    header_crc       crc32c of header bytes 0..27
//
// Data chunk i holds block bytes [i*payload_bytes, (i+1)*payload_bytes), the last ones
// zero-padded past block_bytes; parity chunk k+j is row j of the Cauchy part of ISA-L's
// gf_gen_cauchy1_matrix(k+m, k) applied to the data chunks.
inline constexpr uint32_t chunk_magic = 0x43454853;
inline constexpr uint8_t chunk_format_version = 1;
inline constexpr size_t chunk_header_bytes = 32;
inline constexpr int max_chunks = 255;  // k + m, so that an index fits its byte

// A chunk's header fields, parsed and checked, and its payload (points into the bytes given
// to parse_chunk/verify_chunk; valid while they are).
struct chunk_view {
  uint8_t version = 0;
  uint8_t k = 0;
  uint8_t m = 0;
  uint8_t index = 0;
  uint32_t payload_bytes = 0;
  uint32_t block_crc = 0;
  uint64_t block_bytes = 0;
  uint32_t payload_crc = 0;
  std::span<const uint8_t> payload;  // (payload_bytes)
};

// Checks the header only: length >= 32, magic, header crc, version, k/m/index ranges,
// payload_bytes == ceil(block_bytes / k) and == bytes.size() - 32. Does not read the payload.
std::expected<chunk_view, error> parse_chunk(std::span<const uint8_t> bytes);

// parse_chunk plus the payload crc: what a storage node runs on every read and write.
std::expected<chunk_view, error> verify_chunk(std::span<const uint8_t> bytes);

// One chunk given to decode: `index` is where the caller got it from (which node / slot),
// so a chunk whose header is unreadable can still be named in the error.
struct chunk_ref {
  uint32_t index = 0;
  std::span<const uint8_t> bytes;  // header + payload as received
};

// k data + m parity chunks. Immutable after create(): encode/decode are const and may run
// concurrently from several threads on one codec.
class ec_codec {
 public:
  // k >= 1, m >= 1, k + m <= 255 (ISA-L's Cauchy matrix stays MDS there); else bad_params.
  static std::expected<ec_codec, error> create(int k = 10, int m = 2);

  int k() const { return k_; }
  int m() const { return m_; }
  int n() const { return k_ + m_; }

  // Payload length of each chunk for a block of `block_bytes`: ceil(block_bytes / k).
  uint64_t payload_bytes_for(uint64_t block_bytes) const;

  // k + m chunks, index order. An empty block gives k + m header-only chunks. bad_size when a
  // chunk payload would exceed INT32_MAX bytes (the block is > k * 2 GiB).
  std::expected<std::vector<std::vector<uint8_t>>, error> encode(
      std::span<const uint8_t> block) const;

  // The original block from any k valid chunks among `chunks` (any order, missing ones just
  // absent). Chunks failing verify_chunk are erasures. Errors:
  //   bad_params    a caller index >= k + m;
  //   mismatch      a caller index given twice, or a valid chunk whose k/m differ from this
  //                 codec, whose header index differs from the caller's, or whose block
  //                 (length, crc) differs from another valid chunk's;
  //   unrecoverable fewer than k valid chunks; the message says how many were valid, which
  //                 were rejected and why, and which were missing;
  //   bad_checksum  the rebuilt block fails the header's block crc (should never happen).
  // payloads_verified: the caller ran verify_chunk on every chunk given (e.g. as each arrived),
  // so only headers are parsed here; the rebuilt block's crc is checked either way.
  std::expected<std::vector<uint8_t>, error> decode(std::span<const chunk_ref> chunks,
                                                    bool payloads_verified = false) const;
  // decode straight into the caller's buffer (no block-sized copy): dst must be exactly the
  // block's length (else bad_size, dst untouched). On any error dst may be partly written.
  std::expected<void, error> decode_into(std::span<const chunk_ref> chunks, std::span<uint8_t> dst,
                                         bool payloads_verified = false) const;

 private:
  ec_codec(int k, int m);

  int k_ = 0;
  int m_ = 0;
  std::vector<uint8_t> encode_matrix_;  // (k + m, k): identity on top, Cauchy rows below
  std::vector<uint8_t> encode_tables_;  // (32 * k * m): ec_init_tables of the Cauchy rows
};

}  // namespace shoal::storage
