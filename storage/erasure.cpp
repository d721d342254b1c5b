// Reed-Solomon encode/decode over ISA-L (erasure.hpp): chunk header writing and checking,
// parity generation, and rebuilding lost data chunks from any k survivors by inverting the
// survivors' rows of the encode matrix. The fast path (all data chunks intact) does no GF
// math; every decode ends by checking the rebuilt block against the block crc.
#include "storage/erasure.hpp"

#include <isa-l/erasure_code.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "storage/crc32c.hpp"

namespace shoal::storage {

namespace {

// -- little-endian fields --

void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{p[i]} << (8 * i);
  return v;
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

std::unexpected<error> fail(errc code, std::string message) {
  return std::unexpected(error{code, std::move(message)});
}

// A broken invariant of this file (not bad input): print and abort, like SHOAL_ASSERT, which
// lives in kernels/ and is not ours to include.
[[noreturn]] void invariant_failed(const char* what) {
  std::fprintf(stderr, "storage/erasure.cpp: invariant failed: %s\n", what);
  std::abort();
}

// Writes the 32-byte header described in erasure.hpp in front of an already filled payload.
void write_header(uint8_t* chunk, const chunk_view& h) {
  put_u32(chunk + 0, chunk_magic);
  chunk[4] = h.version;
  chunk[5] = h.k;
  chunk[6] = h.m;
  chunk[7] = h.index;
  put_u32(chunk + 8, h.payload_bytes);
  put_u32(chunk + 12, h.block_crc);
  put_u64(chunk + 16, h.block_bytes);
  put_u32(chunk + 24, h.payload_crc);
  put_u32(chunk + 28, crc32c(chunk, 28));
}

uint64_t ceil_div(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

}  // namespace

std::expected<chunk_view, error> parse_chunk(std::span<const uint8_t> bytes) {
  if (bytes.size() < chunk_header_bytes)
    return fail(errc::bad_size, "chunk is " + std::to_string(bytes.size()) +
                                    " bytes, shorter than the 32-byte header");
  const uint8_t* p = bytes.data();
  if (const uint32_t magic = get_u32(p); magic != chunk_magic)
    return fail(errc::bad_format, "magic " + hex32(magic) + " at offset 0, want " + hex32(chunk_magic));
  if (const uint32_t want = crc32c(p, 28), got = get_u32(p + 28); want != got)
    return fail(errc::bad_checksum, "header crc32c " + hex32(want) + " != stored " + hex32(got) + " at offset 28");
  chunk_view v;
  v.version = p[4];
  v.k = p[5];
  v.m = p[6];
  v.index = p[7];
  v.payload_bytes = get_u32(p + 8);
  v.block_crc = get_u32(p + 12);
  v.block_bytes = get_u64(p + 16);
  v.payload_crc = get_u32(p + 24);
  if (v.version != chunk_format_version)
    return fail(errc::bad_format, "version " + std::to_string(v.version) + " at offset 4, want " +
                                      std::to_string(chunk_format_version));
  if (v.k < 1 || v.m < 1 || int{v.k} + v.m > max_chunks)
    return fail(errc::bad_format, "k=" + std::to_string(v.k) + " m=" + std::to_string(v.m) +
                                      " at offsets 5-6 outside k,m >= 1, k + m <= 255");
  if (v.index >= v.k + v.m)
    return fail(errc::bad_format, "index " + std::to_string(v.index) + " at offset 7 >= k + m = " +
                                      std::to_string(v.k + v.m));
  if (v.payload_bytes > INT32_MAX || v.payload_bytes != ceil_div(v.block_bytes, v.k))
    return fail(errc::bad_size, "payload_bytes " + std::to_string(v.payload_bytes) +
                                    " at offset 8 != ceil(block_bytes " + std::to_string(v.block_bytes) +
                                    " / k " + std::to_string(v.k) + ")");
  if (bytes.size() - chunk_header_bytes != v.payload_bytes)
    return fail(errc::bad_size, "chunk is " + std::to_string(bytes.size()) + " bytes, header says 32 + " +
                                    std::to_string(v.payload_bytes) +
                                    (bytes.size() - chunk_header_bytes < v.payload_bytes ? " (truncated)"
                                                                                          : " (trailing bytes)"));
  v.payload = bytes.subspan(chunk_header_bytes);
  return v;
}

std::expected<chunk_view, error> verify_chunk(std::span<const uint8_t> bytes) {
  auto v = parse_chunk(bytes);
  if (!v) return v;
  if (const uint32_t got = crc32c(v->payload.data(), v->payload.size()); got != v->payload_crc)
    return fail(errc::bad_checksum, "payload crc32c " + hex32(got) + " != header " + hex32(v->payload_crc));
  return v;
}

// -- ec_codec --

std::expected<ec_codec, error> ec_codec::create(int k, int m) {
  if (k < 1 || m < 1 || k + m > max_chunks)
    return fail(errc::bad_params, "k=" + std::to_string(k) + " m=" + std::to_string(m) +
                                      ": need k >= 1, m >= 1, k + m <= 255");
  return ec_codec(k, m);
}

ec_codec::ec_codec(int k, int m)
    : k_(k),
      m_(m),
      encode_matrix_(static_cast<size_t>(k + m) * k),
      encode_tables_(static_cast<size_t>(32) * k * m) {
  gf_gen_cauchy1_matrix(encode_matrix_.data(), k + m, k);
  ec_init_tables(k, m, encode_matrix_.data() + static_cast<size_t>(k) * k, encode_tables_.data());
}

uint64_t ec_codec::payload_bytes_for(uint64_t block_bytes) const { return ceil_div(block_bytes, k_); }

std::expected<std::vector<std::vector<uint8_t>>, error> ec_codec::encode(
    std::span<const uint8_t> block) const {
  const uint64_t len = payload_bytes_for(block.size());
  if (len > INT32_MAX)
    return fail(errc::bad_size, "block of " + std::to_string(block.size()) + " bytes needs " +
                                    std::to_string(len) + "-byte chunks, above INT32_MAX");
  std::vector<std::vector<uint8_t>> chunks(n(), std::vector<uint8_t>(chunk_header_bytes + len, 0));
  std::vector<uint8_t*> payloads(n());
  for (int i = 0; i < n(); ++i) payloads[i] = chunks[i].data() + chunk_header_bytes;
  for (int i = 0; i < k_; ++i) {
    const uint64_t begin = std::min<uint64_t>(block.size(), i * len);
    const uint64_t end = std::min<uint64_t>(block.size(), begin + len);
    if (end > begin) std::memcpy(payloads[i], block.data() + begin, end - begin);  // rest stays 0
  }
  if (len > 0)
    ec_encode_data(static_cast<int>(len), k_, m_, const_cast<uint8_t*>(encode_tables_.data()),
                   payloads.data(), payloads.data() + k_);
  chunk_view h;
  h.version = chunk_format_version;
  h.k = static_cast<uint8_t>(k_);
  h.m = static_cast<uint8_t>(m_);
  h.payload_bytes = static_cast<uint32_t>(len);
  h.block_crc = crc32c(block.data(), block.size());
  h.block_bytes = block.size();
  for (int i = 0; i < n(); ++i) {
    h.index = static_cast<uint8_t>(i);
    h.payload_crc = crc32c(payloads[i], len);
    write_header(chunks[i].data(), h);
  }
  return chunks;
}

namespace {

// The chunks of one decode after checking: the valid view per index (empty payload and
// k == 0 when absent) and a line per rejected chunk.
struct survivors {
  std::vector<chunk_view> valid;   // (k + m) indexed by chunk index
  std::vector<bool> present;       // (k + m) a valid chunk holds this index
  std::vector<bool> given;         // (k + m) the caller passed this index
  std::string rejected;            // "3 (bad_checksum: ...), 7 (bad_size: ...)"
  int n_valid = 0;
  int n_rejected = 0;
};

std::expected<survivors, error> check_chunks(std::span<const chunk_ref> chunks, int k, int m, bool verified) {
  const int n = k + m;
  survivors s{std::vector<chunk_view>(n), std::vector<bool>(n), std::vector<bool>(n), {}, 0, 0};
  const chunk_view* first = nullptr;
  for (const chunk_ref& c : chunks) {
    if (c.index >= static_cast<uint32_t>(n))
      return fail(errc::bad_params, "chunk index " + std::to_string(c.index) + " >= k + m = " + std::to_string(n));
    if (s.given[c.index])
      return fail(errc::mismatch, "chunk index " + std::to_string(c.index) + " given twice");
    s.given[c.index] = true;
    auto v = verified ? parse_chunk(c.bytes) : verify_chunk(c.bytes);
    if (!v) {  // damaged in flight or at rest: an erasure
      s.rejected += (s.n_rejected++ ? ", " : "") + std::to_string(c.index) + " (" + to_string(v.error()) + ")";
      continue;
    }
    const std::string who = "chunk " + std::to_string(c.index) + ": ";
    if (v->k != k || v->m != m)
      return fail(errc::mismatch, who + "made by a " + std::to_string(v->k) + "+" + std::to_string(v->m) +
                                      " codec, decoding with " + std::to_string(k) + "+" + std::to_string(m));
    if (v->index != c.index)
      return fail(errc::mismatch, who + "header says index " + std::to_string(v->index));
    if (first && (v->block_bytes != first->block_bytes || v->block_crc != first->block_crc))
      return fail(errc::mismatch, who + "block of " + std::to_string(v->block_bytes) + " bytes crc " +
                                      hex32(v->block_crc) + ", chunk " + std::to_string(first->index) +
                                      ": block of " + std::to_string(first->block_bytes) + " bytes crc " +
                                      hex32(first->block_crc) + " (chunks of different blocks)");
    s.valid[c.index] = *v;
    s.present[c.index] = true;
    ++s.n_valid;
    if (!first) first = &s.valid[c.index];
  }
  return s;
}

std::string unrecoverable_message(const survivors& s, int k) {
  const int n = static_cast<int>(s.present.size());
  std::string valid, missing;
  for (int i = 0; i < n; ++i) {
    if (s.present[i]) valid += (valid.empty() ? "" : ",") + std::to_string(i);
    if (!s.given[i]) missing += (missing.empty() ? "" : ",") + std::to_string(i);
  }
  return "need " + std::to_string(k) + " valid chunks of " + std::to_string(n) + ", found " +
         std::to_string(s.n_valid) + " valid [" + valid + "]; rejected " + std::to_string(s.n_rejected) +
         (s.n_rejected ? ": " + s.rejected : "") + "; missing [" + missing + "]";
}

// Data chunk i holds block bytes [i·len, (i+1)·len) ∩ [0, block_bytes): intact ones are
// copied into `out`, lost ones rebuilt straight into it (only the last, zero-padded one
// through a chunk-sized scratch buffer); then the rebuilt block's crc is checked.
std::expected<void, error> rebuild_into(const survivors& s, int k, const std::vector<uint8_t>& encode_matrix,
                                        std::span<uint8_t> out) {
  const int n = static_cast<int>(s.present.size());
  const chunk_view& any = s.valid[std::find(s.present.begin(), s.present.end(), true) - s.present.begin()];
  const size_t len = any.payload_bytes;
  auto span_of = [&](int i) {  // the block bytes of data chunk i
    const size_t from = std::min(out.size(), static_cast<size_t>(i) * len);
    return out.subspan(from, std::min(len, out.size() - from));
  };
  std::vector<uint8_t*> lost_out;  // where each lost data chunk is rebuilt
  std::vector<int> lost;
  std::vector<uint8_t> scratch;    // a lost chunk that runs past block_bytes
  for (int i = 0; i < k; ++i) {
    auto dst = span_of(i);
    if (s.present[i]) {
      if (!dst.empty()) std::memcpy(dst.data(), s.valid[i].payload.data(), dst.size());
    } else if (dst.size() == len) {
      lost.push_back(i);
      lost_out.push_back(dst.data());
    } else {
      lost.push_back(i);
      scratch.resize(scratch.size() + len);
      lost_out.push_back(nullptr);  // set below, once scratch stops growing
    }
  }
  for (size_t e = 0, used = 0; e < lost.size(); ++e)
    if (!lost_out[e]) lost_out[e] = scratch.data() + len * used++;
  if (!lost.empty() && len > 0) {
    // Survivors: intact data chunks first (identity rows), then parity, k in all.
    std::vector<int> use;
    for (int i = 0; i < n && static_cast<int>(use.size()) < k; ++i)
      if (s.present[i]) use.push_back(i);
    std::vector<uint8_t> rows(static_cast<size_t>(k) * k), inverse(rows.size());
    for (int r = 0; r < k; ++r)
      std::memcpy(rows.data() + r * k, encode_matrix.data() + static_cast<size_t>(use[r]) * k, k);
    if (gf_invert_matrix(rows.data(), inverse.data(), k) != 0)
      invariant_failed("k rows of a Cauchy encode matrix are singular");
    // Lost data chunk i = row i of the inverse applied to the survivors.
    std::vector<uint8_t> decode_rows(lost.size() * k), tables(32 * lost.size() * k);
    for (size_t e = 0; e < lost.size(); ++e)
      std::memcpy(decode_rows.data() + e * k, inverse.data() + static_cast<size_t>(lost[e]) * k, k);
    std::vector<uint8_t*> sources(k);
    for (int r = 0; r < k; ++r)  // ISA-L only reads the sources
      sources[r] = const_cast<uint8_t*>(s.valid[use[r]].payload.data());
    ec_init_tables(k, static_cast<int>(lost.size()), decode_rows.data(), tables.data());
    ec_encode_data(static_cast<int>(len), k, static_cast<int>(lost.size()), tables.data(), sources.data(),
                   lost_out.data());
    for (size_t e = 0; e < lost.size(); ++e)  // the partial chunk's block bytes
      if (auto dst = span_of(lost[e]); dst.size() != len && !dst.empty())
        std::memcpy(dst.data(), lost_out[e], dst.size());
  }
  if (const uint32_t got = crc32c(out.data(), out.size()); got != any.block_crc)
    return fail(errc::bad_checksum, "rebuilt block crc32c " + hex32(got) + " != header " + hex32(any.block_crc) +
                                        " (" + std::to_string(lost.size()) + " data chunks rebuilt)");
  return {};
}

std::expected<survivors, error> checked_survivors(std::span<const chunk_ref> chunks, int k, int m, bool verified) {
  auto checked = check_chunks(chunks, k, m, verified);
  if (checked && checked->n_valid < k) return fail(errc::unrecoverable, unrecoverable_message(*checked, k));
  return checked;
}

uint64_t block_bytes_of(const survivors& s) {
  return s.valid[std::find(s.present.begin(), s.present.end(), true) - s.present.begin()].block_bytes;
}

}  // namespace

std::expected<std::vector<uint8_t>, error> ec_codec::decode(std::span<const chunk_ref> chunks,
                                                           bool payloads_verified) const {
  auto s = checked_survivors(chunks, k_, m_, payloads_verified);
  if (!s) return std::unexpected(std::move(s.error()));
  std::vector<uint8_t> out(block_bytes_of(*s));
  if (auto r = rebuild_into(*s, k_, encode_matrix_, out); !r) return std::unexpected(std::move(r.error()));
  return out;
}

std::expected<void, error> ec_codec::decode_into(std::span<const chunk_ref> chunks, std::span<uint8_t> dst,
                                                 bool payloads_verified) const {
  auto s = checked_survivors(chunks, k_, m_, payloads_verified);
  if (!s) return std::unexpected(std::move(s.error()));
  if (const uint64_t bytes = block_bytes_of(*s); bytes != dst.size())
    return fail(errc::bad_size, "block of " + std::to_string(bytes) + " bytes, destination of " +
                                    std::to_string(dst.size()));
  return rebuild_into(*s, k_, encode_matrix_, dst);
}

}  // namespace shoal::storage
