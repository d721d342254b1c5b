// Tests for the Reed-Solomon codec (storage/erasure.hpp) and crc32c: exhaustive loss patterns
// for 10+2 (every 1- and 2-loss decodes bit-exact, every 3-loss fails cleanly), flipped bits
// in headers and payloads as erasures, other k+m, and hostile bytes (truncated, garbage,
// mixed blocks/codecs) that must end as errors, never crashes.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "storage/crc32c.hpp"
#include "storage/erasure.hpp"

using namespace shoal::storage;

namespace {

using chunk_set = std::vector<std::vector<uint8_t>>;

constexpr uint64_t seed = 0x5eed'ec01;

std::vector<uint8_t> random_block(size_t n, std::mt19937_64& rng) {
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

ec_codec make_codec(int k, int m) {
  auto c = ec_codec::create(k, m);
  REQUIRE(c.has_value());
  return *c;
}

chunk_set encode_ok(const ec_codec& c, const std::vector<uint8_t>& block) {
  auto chunks = c.encode(block);
  REQUIRE(chunks.has_value());
  REQUIRE(chunks->size() == static_cast<size_t>(c.n()));
  return *chunks;
}

// All chunks except those whose bit is set in `lost` (bit i = chunk i).
std::vector<chunk_ref> refs_without(const chunk_set& chunks, uint64_t lost) {
  std::vector<chunk_ref> refs;
  for (size_t i = 0; i < chunks.size(); ++i)
    if (!(lost >> i & 1)) refs.push_back({static_cast<uint32_t>(i), chunks[i]});
  return refs;
}

std::vector<uint8_t> decode_ok(const ec_codec& c, const std::vector<chunk_ref>& refs) {
  auto out = c.decode(refs);
  if (!out) FAIL_CHECK(to_string(out.error()));
  REQUIRE(out.has_value());
  return *out;
}

void flip_bit(std::vector<uint8_t>& chunk, size_t lo, size_t hi, std::mt19937_64& rng) {
  const size_t byte = lo + rng() % (hi - lo);
  chunk[byte] ^= static_cast<uint8_t>(1u << (rng() % 8));
}

const std::vector<size_t> sizes_10_2 = {1, 10, 4096, 12345, (1u << 20) + 7};

}  // namespace

TEST_CASE("crc32c matches the standard check value and chains") {
  const std::string s = "123456789";
  CHECK(crc32c(s.data(), s.size()) == 0xE3069283u);
  CHECK(crc32c(s.data(), 0) == 0u);
  CHECK(crc32c(s.data() + 4, 5, crc32c(s.data(), 4)) == 0xE3069283u);
}

TEST_CASE("error codes have names") {
  CHECK(std::string(to_string(errc::unrecoverable)) == "unrecoverable");
  CHECK(std::string(to_string(errc::bad_checksum)) == "bad_checksum");
  CHECK(to_string(error{errc::bad_size, "chunk 3"}) == "bad_size: chunk 3");
}

TEST_CASE("10+2 chunk layout: header fields, padding, data chunks hold the block") {
  const ec_codec c = make_codec(10, 2);
  std::mt19937_64 rng(seed);
  const auto block = random_block(12345, rng);
  const chunk_set chunks = encode_ok(c, block);
  CHECK(c.payload_bytes_for(12345) == 1235);
  for (size_t i = 0; i < chunks.size(); ++i) {
    REQUIRE(chunks[i].size() == chunk_header_bytes + 1235);
    const uint8_t* p = chunks[i].data();
    CHECK(p[0] == 'S');
    CHECK(p[1] == 'H');
    CHECK(p[2] == 'E');
    CHECK(p[3] == 'C');
    auto v = verify_chunk(chunks[i]);
    REQUIRE(v.has_value());
    CHECK(v->version == 1);
    CHECK(v->k == 10);
    CHECK(v->m == 2);
    CHECK(v->index == i);
    CHECK(v->payload_bytes == 1235);
    CHECK(v->block_bytes == 12345);
    CHECK(v->block_crc == crc32c(block.data(), block.size()));
    CHECK(p[16] == (12345 & 0xff));  // little-endian block_bytes
    CHECK(p[17] == (12345 >> 8));
    CHECK(v->payload.size() == 1235);
  }
  // data chunk 9 holds the block's last 1230 bytes then 5 zero bytes of padding
  const auto& last = chunks[9];
  CHECK(std::equal(block.begin() + 9 * 1235, block.end(), last.begin() + chunk_header_bytes));
  for (size_t b = chunk_header_bytes + 1230; b < last.size(); ++b) CHECK(last[b] == 0);
}

TEST_CASE("10+2 every single and double loss decodes bit-exact") {
  const ec_codec c = make_codec(10, 2);
  std::mt19937_64 rng(seed);
  for (const size_t size : sizes_10_2) {
    CAPTURE(size);
    const auto block = random_block(size, rng);
    const chunk_set chunks = encode_ok(c, block);
    CHECK(decode_ok(c, refs_without(chunks, 0)) == block);
    int singles = 0, doubles = 0;
    for (int a = 0; a < 12; ++a) {
      CAPTURE(a);
      CHECK(decode_ok(c, refs_without(chunks, 1ull << a)) == block);
      ++singles;
      for (int b = a + 1; b < 12; ++b) {
        CAPTURE(b);
        CHECK(decode_ok(c, refs_without(chunks, (1ull << a) | (1ull << b))) == block);
        ++doubles;
      }
    }
    CHECK(singles == 12);
    CHECK(doubles == 66);
  }
}

TEST_CASE("10+2 every triple loss is unrecoverable with a message") {
  const ec_codec c = make_codec(10, 2);
  std::mt19937_64 rng(seed);
  for (const size_t size : sizes_10_2) {
    CAPTURE(size);
    const chunk_set chunks = encode_ok(c, random_block(size, rng));
    int triples = 0;
    for (int a = 0; a < 12; ++a)
      for (int b = a + 1; b < 12; ++b)
        for (int d = b + 1; d < 12; ++d) {
          auto out = c.decode(refs_without(chunks, (1ull << a) | (1ull << b) | (1ull << d)));
          REQUIRE_FALSE(out.has_value());
          CHECK(out.error().code == errc::unrecoverable);
          const std::string missing =
              "missing [" + std::to_string(a) + "," + std::to_string(b) + "," + std::to_string(d) + "]";
          CHECK(out.error().message.find("found 9 valid") != std::string::npos);
          CHECK(out.error().message.find(missing) != std::string::npos);
          ++triples;
        }
    CHECK(triples == 220);
  }
}

TEST_CASE("unrecoverable message names rejected chunks and why") {
  const ec_codec c = make_codec(10, 2);
  std::mt19937_64 rng(seed);
  chunk_set chunks = encode_ok(c, random_block(4096, rng));
  chunks[3].back() ^= 1;                    // payload
  chunks[7][5] ^= 1;                        // header (k)
  chunks[11].resize(chunks[11].size() - 1); // truncated
  auto out = c.decode(refs_without(chunks, 0));
  REQUIRE_FALSE(out.has_value());
  CHECK(out.error().code == errc::unrecoverable);
  const std::string& msg = out.error().message;
  INFO(msg);
  CHECK(msg.find("need 10 valid chunks of 12, found 9 valid [0,1,2,4,5,6,8,9,10]") != std::string::npos);
  CHECK(msg.find("rejected 3: 3 (bad_checksum: payload crc32c") != std::string::npos);
  CHECK(msg.find("7 (bad_checksum: header crc32c") != std::string::npos);
  CHECK(msg.find("11 (bad_size:") != std::string::npos);
  CHECK(msg.find("missing []") != std::string::npos);
}

TEST_CASE("10+2 flipped bits are detected and decode treats them as erasures") {
  const ec_codec c = make_codec(10, 2);
  std::mt19937_64 rng(seed);
  for (const size_t size : {size_t{1}, size_t{4096}, size_t{12345}}) {
    CAPTURE(size);
    const auto block = random_block(size, rng);
    const chunk_set clean = encode_ok(c, block);
    const size_t total = clean[0].size();
    // one flip per chunk, payload and header separately: verify_chunk catches each
    for (int i = 0; i < 12; ++i) {
      CAPTURE(i);
      chunk_set bad = clean;
      flip_bit(bad[i], chunk_header_bytes, total, rng);
      auto v = verify_chunk(bad[i]);
      REQUIRE_FALSE(v.has_value());
      CHECK(v.error().code == errc::bad_checksum);
      CHECK(decode_ok(c, refs_without(bad, 0)) == block);
      bad = clean;
      flip_bit(bad[i], 0, chunk_header_bytes, rng);
      CHECK_FALSE(verify_chunk(bad[i]).has_value());
      CHECK(decode_ok(c, refs_without(bad, 0)) == block);
    }
    // every pair corrupt (one in the header, one in the payload) still decodes
    for (int a = 0; a < 12; ++a)
      for (int b = a + 1; b < 12; ++b) {
        chunk_set bad = clean;
        flip_bit(bad[a], 0, chunk_header_bytes, rng);
        flip_bit(bad[b], chunk_header_bytes, total, rng);
        CHECK(decode_ok(c, refs_without(bad, 0)) == block);
      }
    // every triple corrupt fails cleanly
    for (int a = 0; a < 12; ++a)
      for (int b = a + 1; b < 12; ++b)
        for (int d = b + 1; d < 12; ++d) {
          chunk_set bad = clean;
          for (const int i : {a, b, d}) {
            const bool in_header = rng() % 2;
            flip_bit(bad[i], in_header ? 0 : chunk_header_bytes, in_header ? chunk_header_bytes : total, rng);
          }
          auto out = c.decode(refs_without(bad, 0));
          REQUIRE_FALSE(out.has_value());
          CHECK(out.error().code == errc::unrecoverable);
          CHECK(out.error().message.find("rejected 3") != std::string::npos);
        }
  }
}

TEST_CASE("other k+m round trip with random losses up to m") {
  std::mt19937_64 rng(seed);
  const std::vector<std::pair<int, int>> params = {{4, 2}, {6, 3}, {1, 1}, {3, 5}, {16, 4}, {200, 55}};
  for (const auto& [k, m] : params) {
    CAPTURE(k);
    CAPTURE(m);
    const ec_codec c = make_codec(k, m);
    CHECK(c.n() == k + m);
    for (int trial = 0; trial < 40; ++trial) {
      const size_t size = rng() % 3 == 0 ? rng() % 64 : rng() % 20000;
      CAPTURE(size);
      const auto block = random_block(size, rng);
      const chunk_set chunks = encode_ok(c, block);
      // lose n_lost distinct chunks (0..m), then shuffle the survivors' order
      std::vector<int> order(k + m);
      for (int i = 0; i < k + m; ++i) order[i] = i;
      std::shuffle(order.begin(), order.end(), rng);
      const int n_lost = static_cast<int>(rng() % (m + 1));
      std::vector<chunk_ref> refs;
      for (int i = n_lost; i < k + m; ++i) refs.push_back({static_cast<uint32_t>(order[i]), chunks[order[i]]});
      CHECK(decode_ok(c, refs) == block);
      refs.pop_back();  // one fewer than k when m were lost
      if (n_lost == m) {
        auto out = c.decode(refs);
        REQUIRE_FALSE(out.has_value());
        CHECK(out.error().code == errc::unrecoverable);
      }
    }
  }
}

TEST_CASE("empty block round trips") {
  const ec_codec c = make_codec(10, 2);
  const chunk_set chunks = encode_ok(c, {});
  for (const auto& ch : chunks) CHECK(ch.size() == chunk_header_bytes);
  CHECK(decode_ok(c, refs_without(chunks, 0b100000000001)).empty());
}

TEST_CASE("bad codec params are rejected") {
  const std::vector<std::pair<int, int>> bad = {{0, 2}, {10, 0}, {-1, 2}, {2, -1}, {200, 56}, {255, 1}, {1, 255}};
  for (const auto& [k, m] : bad) {
    CAPTURE(k);
    CAPTURE(m);
    auto c = ec_codec::create(k, m);
    REQUIRE_FALSE(c.has_value());
    CHECK(c.error().code == errc::bad_params);
  }
  CHECK(ec_codec::create(254, 1).has_value());
  CHECK(ec_codec::create(1, 254).has_value());
  auto d = ec_codec::create();
  REQUIRE(d.has_value());
  CHECK(d->k() == 10);
  CHECK(d->m() == 2);
}

TEST_CASE("chunks of different codecs or blocks in one decode are a mismatch") {
  std::mt19937_64 rng(seed);
  const ec_codec c10 = make_codec(10, 2);
  const ec_codec c4 = make_codec(4, 2);
  const auto a = random_block(4096, rng);
  const auto b = random_block(4096, rng);  // same length, other bytes
  const chunk_set ca = encode_ok(c10, a);
  const chunk_set cb = encode_ok(c10, b);
  const chunk_set cshort = encode_ok(c10, random_block(4000, rng));
  const chunk_set c4a = encode_ok(c4, a);

  auto refs = refs_without(ca, 0);
  refs[5].bytes = cb[5];  // another block's chunk 5
  auto out = c10.decode(refs);
  REQUIRE_FALSE(out.has_value());
  CHECK(out.error().code == errc::mismatch);
  CHECK(out.error().message.find("different blocks") != std::string::npos);

  refs = refs_without(ca, 0);
  refs[2].bytes = cshort[2];  // another length
  out = c10.decode(refs);
  REQUIRE_FALSE(out.has_value());
  CHECK(out.error().code == errc::mismatch);

  out = c10.decode(refs_without(c4a, 0));  // a 4+2 block given to a 10+2 codec
  REQUIRE_FALSE(out.has_value());
  CHECK(out.error().code == errc::mismatch);
  CHECK(out.error().message.find("4+2 codec, decoding with 10+2") != std::string::npos);

  refs = refs_without(ca, 0);
  refs[1].bytes = ca[4];  // right block, wrong slot
  out = c10.decode(refs);
  REQUIRE_FALSE(out.has_value());
  CHECK(out.error().code == errc::mismatch);
  CHECK(out.error().message.find("header says index 4") != std::string::npos);

  refs = refs_without(ca, 0);
  refs.push_back(refs[0]);
  out = c10.decode(refs);
  REQUIRE_FALSE(out.has_value());
  CHECK(out.error().code == errc::mismatch);
  CHECK(out.error().message.find("given twice") != std::string::npos);

  refs = refs_without(ca, 0);
  refs[0].index = 12;
  out = c10.decode(refs);
  REQUIRE_FALSE(out.has_value());
  CHECK(out.error().code == errc::bad_params);
}

TEST_CASE("truncated and extended chunks are bad_size and erasures") {
  std::mt19937_64 rng(seed);
  const ec_codec c = make_codec(10, 2);
  const auto block = random_block(4096, rng);
  chunk_set chunks = encode_ok(c, block);
  for (const size_t keep : {size_t{0}, size_t{1}, size_t{31}, size_t{32}, chunks[0].size() - 1}) {
    CAPTURE(keep);
    std::vector<uint8_t> t(chunks[0].begin(), chunks[0].begin() + keep);
    auto v = verify_chunk(t);
    REQUIRE_FALSE(v.has_value());
    CHECK(v.error().code == errc::bad_size);
  }
  chunks[0].resize(chunks[0].size() - 100);
  chunks[6].push_back(0);
  auto v = verify_chunk(chunks[6]);
  REQUIRE_FALSE(v.has_value());
  CHECK(v.error().message.find("trailing") != std::string::npos);
  CHECK(decode_ok(c, refs_without(chunks, 0)) == block);
}

TEST_CASE("header fields with a valid header crc but absurd values are rejected") {
  std::mt19937_64 rng(seed);
  const ec_codec c = make_codec(10, 2);
  const chunk_set chunks = encode_ok(c, random_block(4096, rng));
  // rewrites byte `at` to `value` and reseals the header crc, as a buggy or hostile peer would
  auto forged = [&](size_t at, uint8_t value) {
    std::vector<uint8_t> ch = chunks[0];
    ch[at] = value;
    const uint32_t crc = crc32c(ch.data(), 28);
    for (int i = 0; i < 4; ++i) ch[28 + i] = static_cast<uint8_t>(crc >> (8 * i));
    auto v = verify_chunk(ch);
    return v ? std::string("ok") : std::string(to_string(v.error().code));
  };
  CHECK(forged(4, 2) == "bad_format");     // version
  CHECK(forged(5, 0) == "bad_format");     // k = 0
  CHECK(forged(6, 0) == "bad_format");     // m = 0
  CHECK(forged(6, 250) == "bad_format");   // k + m > 255
  CHECK(forged(7, 12) == "bad_format");    // index >= k + m
  CHECK(forged(11, 0x7f) == "bad_size");   // payload_bytes 2 GiB
  CHECK(forged(11, 0xff) == "bad_size");   // payload_bytes > INT32_MAX
  CHECK(forged(23, 0xff) == "bad_size");   // block_bytes ~ 2^64
  REQUIRE(chunks[0][24] != 0);
  CHECK(forged(24, 0) == "bad_checksum");  // payload crc
  CHECK(forged(12, 0) == "ok");  // the block crc is checked by decode, not per chunk
}

TEST_CASE("decode checks the rebuilt block against the block crc") {
  std::mt19937_64 rng(seed);
  const ec_codec c = make_codec(10, 2);
  const auto block = random_block(4096, rng);
  chunk_set chunks = encode_ok(c, block);
  // every chunk resealed with a wrong block crc: consistent headers, wrong block
  for (auto& ch : chunks) {
    ch[12] ^= 0x01;
    const uint32_t crc = crc32c(ch.data(), 28);
    for (int i = 0; i < 4; ++i) ch[28 + i] = static_cast<uint8_t>(crc >> (8 * i));
  }
  for (const uint64_t lost : {uint64_t{0}, uint64_t{0b11}, uint64_t{0b110000000000}}) {
    CAPTURE(lost);
    auto out = c.decode(refs_without(chunks, lost));
    REQUIRE_FALSE(out.has_value());
    CHECK(out.error().code == errc::bad_checksum);
    CHECK(out.error().message.find("rebuilt block crc32c") != std::string::npos);
  }
}

TEST_CASE("magic is checked first") {
  std::mt19937_64 rng(seed);
  const ec_codec c = make_codec(10, 2);
  const chunk_set chunks = encode_ok(c, random_block(64, rng));
  auto magic = chunks[0];
  magic[0] = 'X';  // the header crc is now wrong too: a foreign buffer reads as bad_format
  auto v = verify_chunk(magic);
  REQUIRE_FALSE(v.has_value());
  CHECK(v.error().code == errc::bad_format);
  CHECK(v.error().message.find("offset 0") != std::string::npos);
}

TEST_CASE("garbage bytes never parse and never crash decode") {
  std::mt19937_64 rng(seed);
  const ec_codec c = make_codec(10, 2);
  const std::vector<uint8_t> magic = {'S', 'H', 'E', 'C'};
  chunk_set garbage;
  for (int i = 0; i < 2000; ++i) {
    auto g = random_block(rng() % 300, rng);
    if (i % 2 && g.size() >= 4) std::copy(magic.begin(), magic.end(), g.begin());  // past the magic check
    CHECK_FALSE(verify_chunk(g).has_value());
    garbage.push_back(std::move(g));
  }
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<chunk_ref> refs;
    for (uint32_t i = 0; i < 12; ++i) refs.push_back({i, garbage[rng() % garbage.size()]});
    auto out = c.decode(refs);
    REQUIRE_FALSE(out.has_value());
    CHECK(out.error().code == errc::unrecoverable);
    CHECK(out.error().message.find("found 0 valid") != std::string::npos);
  }
  auto none = c.decode({});
  REQUIRE_FALSE(none.has_value());
  CHECK(none.error().message.find("missing [0,1,2,3,4,5,6,7,8,9,10,11]") != std::string::npos);
}

TEST_CASE("decode_into rebuilds straight into the caller's buffer, every single and double loss") {
  const ec_codec c = make_codec(10, 2);
  std::mt19937_64 rng(seed + 7);
  for (const size_t size : {size_t{1}, size_t{9}, size_t{1000}, size_t{1001}, size_t{65'543}}) {
    CAPTURE(size);
    const auto block = random_block(size, rng);
    const chunk_set chunks = encode_ok(c, block);
    for (int a = 0; a < 12; ++a)
      for (int b = a; b < 12; ++b) {
        CAPTURE(a);
        CAPTURE(b);
        std::vector<uint8_t> dst(size, 0xa5);  // stale bytes must all be overwritten
        auto done = c.decode_into(refs_without(chunks, (1ull << a) | (1ull << b)), dst);
        REQUIRE_MESSAGE(done, (done ? "" : to_string(done.error())));
        CHECK(dst == block);
      }
  }
}

TEST_CASE("decode_into refuses a buffer of another length and leaves it untouched") {
  const ec_codec c = make_codec(10, 2);
  std::mt19937_64 rng(seed + 8);
  const auto block = random_block(4096, rng);
  const chunk_set chunks = encode_ok(c, block);
  for (size_t n : {size_t{0}, size_t{4095}, size_t{4097}}) {
    std::vector<uint8_t> dst(n, 0x11);
    auto done = c.decode_into(refs_without(chunks, 0b11), dst);
    REQUIRE(!done);
    CHECK(done.error().code == errc::bad_size);
    CHECK(done.error().message.find("block of 4096 bytes, destination of " + std::to_string(n)) != std::string::npos);
    CHECK(dst == std::vector<uint8_t>(n, 0x11));
  }
  std::vector<uint8_t> dst(4096);
  auto lost = c.decode_into(refs_without(chunks, 0b111), dst);  // three lost: unrecoverable
  REQUIRE(!lost);
  CHECK(lost.error().code == errc::unrecoverable);
}
