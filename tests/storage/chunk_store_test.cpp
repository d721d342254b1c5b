// Chunk store: round trips, restart, exact usage, corruption, full disk (simulated) and bad input.
// Every case runs on its own temp directory with a fake clock.
#include "storage/chunk_store.hpp"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "runtime/base/fault_points.hpp"
#include "storage/chunk_file.hpp"
#include "tests/storage/store_fixture.hpp"

using namespace shoal::storage;
using namespace shoal::storage::test;
namespace runtime = shoal::runtime;

TEST_CASE("chunk file header round trips and rejects a flipped bit") {
  chunk_header h{chunk_key{{.lo = 0xfedcba9876543210ull, .hi = 0x0123456789abcdefull}, 7}, traffic_class::chat,
                 123456789, 4096, 0xdeadbeef};
  auto b = encode_header(h);
  const auto d = decode_header(b);
  REQUIRE(d);
  CHECK(d->key == h.key);
  CHECK(d->cls == traffic_class::chat);
  CHECK(d->put_ms == 123456789);
  CHECK(d->payload_bytes == 4096);
  CHECK(d->payload_crc == 0xdeadbeef);
  for (size_t i = 0; i < b.size(); ++i) {
    auto c = b;
    c[i] ^= std::byte{0x10};
    CHECK_FALSE(decode_header(c));
  }
  CHECK(to_string(h.key) == "0123456789abcdeffedcba9876543210-07");
  CHECK(parse_chunk_name("0123456789abcdeffedcba9876543210-07.chk") == h.key);
  CHECK_FALSE(parse_chunk_name("0123456789abcdeffedcba9876543210-07.tmp"));
  CHECK_FALSE(parse_chunk_name(".tmp-0123456789abcdeffedcba9876543210-07.1.2"));
  // Standard CRC32C check value.
  const std::string s = "123456789";
  CHECK(crc32c(std::as_bytes(std::span(s))) == 0xE3069283u);
}

TEST_CASE("put get exists remove round trip with exact usage") {
  temp_dir d;
  fake_clock c;
  auto s = open_ok(options_for(d, c, 1 << 20));
  const auto a = key_of(1), b = key_of(2), a1 = key_of(1, 1);
  REQUIRE(s->put(a, payload_of(a, 0, 100), traffic_class::agent));
  REQUIRE(s->put(b, payload_of(b, 0, 250), traffic_class::chat));
  REQUIRE(s->put(a1, payload_of(a1, 0, 1), traffic_class::agent));
  s->check_invariants();
  CHECK(s->usage_bytes() == 351);
  CHECK(s->capacity_bytes() == 1 << 20);
  CHECK(*s->get(a) == payload_of(a, 0, 100));
  CHECK(*s->get(b) == payload_of(b, 0, 250));
  CHECK(*s->get(a1) == payload_of(a1, 0, 1));
  const std::vector<chunk_key> q{a, key_of(3), b, key_of(2, 1), a1};
  CHECK(s->exists(q) == std::vector<bool>{true, false, true, false, true});

  // Replace: usage follows the new size, the new bytes are served.
  REQUIRE(s->put(a, payload_of(a, 1, 40), traffic_class::chat));
  CHECK(s->usage_bytes() == 291);
  CHECK(*s->get(a) == payload_of(a, 1, 40));
  CHECK(s->meta(a)->cls == traffic_class::chat);

  REQUIRE(s->remove(b));
  CHECK(s->usage_bytes() == 41);
  CHECK(s->get(b).error().code == store_errc::not_found);
  CHECK(s->remove(b).error().code == store_errc::not_found);
  CHECK(s->exists(q) == std::vector<bool>{true, false, false, false, true});
  const auto st = s->stats();
  CHECK(st.chunks == 2);
  CHECK(st.puts == 4);
  CHECK(st.gets == 5);
  CHECK(st.get_hits == 4);
  CHECK(st.removes == 1);
  CHECK(st.put_seconds > 0);  // each put wrote and renamed a file: time passed
  CHECK(st.get_seconds > 0);
  CHECK(count_files(d.path, ".tmp-") == 0);
  s->check_invariants();
}

TEST_CASE("restart serves the same chunks with the same metadata") {
  temp_dir d;
  fake_clock c;
  const auto o = options_for(d, c, 1 << 20);
  uint64_t usage = 0;
  {
    auto s = open_ok(o);
    for (uint64_t i = 0; i < 40; ++i) {
      const auto k = key_of(i, uint8_t(i % 12));
      REQUIRE(s->put(k, payload_of(k, 0, 10 + i * 7), i % 2 ? traffic_class::chat : traffic_class::agent));
      usage += 10 + i * 7;
      c.advance(5);
    }
    REQUIRE(s->remove(key_of(3, 3)));
    usage -= 10 + 3 * 7;
    CHECK(s->usage_bytes() == usage);
  }
  auto s = open_ok(o);
  s->check_invariants();
  CHECK(s->usage_bytes() == usage);
  CHECK(s->stats().chunks == 39);
  CHECK(s->stats().corrupt_removed == 0);
  for (uint64_t i = 0; i < 40; ++i) {
    const auto k = key_of(i, uint8_t(i % 12));
    const auto g = s->get(k);
    if (i == 3) {
      CHECK(g.error().code == store_errc::not_found);
      continue;
    }
    REQUIRE(g);
    CHECK(*g == payload_of(k, 0, 10 + i * 7));
    const auto m = s->meta(k);
    CHECK(m->cls == (i % 2 ? traffic_class::chat : traffic_class::agent));
    CHECK(m->put_ms == 1'000'000 + int64_t(i) * 5);
  }
}

TEST_CASE("a flipped byte on disk is corrupt on get and quarantined on reopen") {
  temp_dir d;
  fake_clock c;
  const auto o = options_for(d, c, 1 << 20);
  const auto a = key_of(10), b = key_of(11), e = key_of(12);
  const auto flip = [&](const chunk_key& k, off_t off) {
    const std::string p = chunk_path(d.path, k);
    const int fd = ::open(p.c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    unsigned char ch = 0;
    REQUIRE(::pread(fd, &ch, 1, off) == 1);
    ch ^= 0x01;
    REQUIRE(::pwrite(fd, &ch, 1, off) == 1);
    ::close(fd);
  };
  {
    auto s = open_ok(o);
    for (const auto& k : {a, b, e}) REQUIRE(s->put(k, payload_of(k, 0, 500), traffic_class::agent));
    flip(a, file_header_bytes + 100);  // payload byte
    const auto g = s->get(a);
    REQUIRE_FALSE(g);
    CHECK(g.error().code == store_errc::corrupt);
    CHECK(s->stats().corrupt_removed == 1);
    CHECK(s->get(a).error().code == store_errc::not_found);  // corruption became an erasure
    CHECK(s->usage_bytes() == 1000);
    flip(b, 30);  // header byte (put_ms)
    ::truncate(chunk_path(d.path, e).c_str(), file_header_bytes + 499);  // torn tail
  }
  auto s = open_ok(o);
  CHECK(s->stats().corrupt_removed == 2);
  CHECK(s->stats().chunks == 0);
  CHECK(s->usage_bytes() == 0);
  CHECK(s->get(b).error().code == store_errc::not_found);
  CHECK(s->get(e).error().code == store_errc::not_found);
  CHECK(count_files(d.path, "") == 0);
  s->check_invariants();
}

TEST_CASE("leftover temp files are removed at open") {
  temp_dir d;
  fake_clock c;
  const auto o = options_for(d, c, 1 << 20);
  { auto s = open_ok(o); }
  std::filesystem::create_directories(shard_dir(d.path, 7));
  const std::string tmp = shard_dir(d.path, 7) + "/.tmp-junk.1.2";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::write(fd, "half", 4) == 4);
  ::close(fd);
  auto s = open_ok(o);
  CHECK(s->stats().temp_removed == 1);
  CHECK(count_files(d.path, ".tmp-") == 0);
}

TEST_CASE("capacity full after gc cannot free enough") {
  temp_dir d;
  fake_clock c;
  auto s = open_ok(options_for(d, c, 1000));
  const auto a = key_of(1), b = key_of(2), x = key_of(3);
  REQUIRE(s->put(a, payload_of(a, 0, 600), traffic_class::agent));
  c.advance(1);
  REQUIRE(s->put(b, payload_of(b, 0, 300), traffic_class::agent));
  {
    const auto la = s->acquire(a);
    const auto lb = s->acquire(b);
    const auto r = s->put(x, payload_of(x, 0, 200), traffic_class::agent);
    REQUIRE_FALSE(r);
    CHECK(r.error().code == store_errc::full);
    CHECK(s->usage_bytes() == 900);
    CHECK(s->stats().put_failures == 1);
    CHECK(count_files(d.path, ".tmp-") == 0);
  }
  // Unleased, the put evicts in LRU order until usage ≤ min(low watermark 700, 1000 − 200):
  // a (older) goes, 300 ≤ 700 stops it.
  REQUIRE(s->put(x, payload_of(x, 0, 200), traffic_class::agent));
  CHECK(s->exists(std::vector{a, b, x}) == std::vector<bool>{false, true, true});
  CHECK(s->usage_bytes() == 500);
  CHECK(s->stats().evicted_chunks == 1);
  CHECK(s->stats().evicted_bytes == 600);
  // Larger than the whole capacity: full, nothing evicted.
  const auto y = key_of(4);
  CHECK(s->put(y, payload_of(y, 0, 1001), traffic_class::agent).error().code == store_errc::full);
  CHECK(s->usage_bytes() == 500);
  s->check_invariants();
}

TEST_CASE("simulated full disk fails cleanly and recovers after space is freed") {
  temp_dir d;
  fake_clock c;
  auto o = options_for(d, c, 1 << 20);
  // Room for two 100-byte chunks with headers (2 × 148) and part of a third.
  o.simulated_disk_bytes = 2 * (file_header_bytes + 100) + 60;
  auto s = open_ok(o);
  const auto a = key_of(1), b = key_of(2), x = key_of(3);
  REQUIRE(s->put(a, payload_of(a, 0, 100), traffic_class::agent));
  REQUIRE(s->put(b, payload_of(b, 0, 100), traffic_class::agent));
  const auto r = s->put(x, payload_of(x, 0, 100), traffic_class::chat);
  REQUIRE_FALSE(r);
  CHECK(r.error().code == store_errc::disk_full);
  CHECK(r.error().detail.find("No space left on device") != std::string::npos);
  CHECK(to_string(r.error()).starts_with("disk_full: write "));
  CHECK(count_files(d.path, ".tmp-") == 0);  // no partial file
  CHECK(count_files(d.path, "") == 2);
  CHECK_FALSE(s->exists(std::vector{x})[0]);
  CHECK(s->usage_bytes() == 200);
  CHECK(*s->get(a) == payload_of(a, 0, 100));  // still serving
  REQUIRE(s->remove(a));                        // frees space on the (simulated) disk
  REQUIRE(s->put(x, payload_of(x, 0, 100), traffic_class::chat));
  CHECK(*s->get(x) == payload_of(x, 0, 100));
  CHECK(s->stats().put_failures == 1);
  s->check_invariants();
}

TEST_CASE("bad input and bad config are clear errors") {
  temp_dir d;
  fake_clock c;
  auto o = options_for(d, c, 1 << 20);
  o.max_chunk_bytes = 1000;
  auto s = open_ok(o);
  const auto k = key_of(1);
  const auto e = s->put(k, {}, traffic_class::agent);
  CHECK(e.error().code == store_errc::empty_chunk);
  const auto big = s->put(k, payload_of(k, 0, 1001), traffic_class::agent);
  CHECK(big.error().code == store_errc::chunk_too_large);
  CHECK(big.error().detail.find("1001 bytes > max_chunk_bytes 1000") != std::string::npos);
  CHECK(s->put(k, payload_of(k, 0, 1000), traffic_class::agent));
  CHECK(s->usage_bytes() == 1000);

  auto bad = o;
  bad.capacity_bytes = 0;
  CHECK(chunk_store::open(bad).error().code == store_errc::bad_config);
  bad = o;
  bad.now_ms = nullptr;
  CHECK(chunk_store::open(bad).error().code == store_errc::bad_config);
  bad = o;
  bad.gc_low_watermark = 0.95;
  CHECK(chunk_store::open(bad).error().detail.starts_with("gc watermarks"));
  bad = o;
  bad.root = chunk_path(d.path, k) + "/sub";  // under a regular file
  CHECK(chunk_store::open(bad).error().code == store_errc::io);
}

TEST_CASE("concurrent puts gets removes and gc keep the index consistent") {
  temp_dir d;
  fake_clock c;
  auto s = open_ok(options_for(d, c, 64 * 200));  // forces puts to evict as they go
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t i = 0; i < 300; ++i) {
        const auto k = key_of((i * 7 + uint64_t(t)) % 96);
        switch ((i + uint64_t(t)) % 4) {
          case 0:
          case 1: {
            const auto r = s->put(k, payload_of(k, 0, 100 + k.block.lo), traffic_class::agent);
            if (!r && r.error().code != store_errc::full) ++bad;
            break;
          }
          case 2: {
            const auto g = s->get(k);  // any served bytes must be exactly what was put
            if (g ? *g != payload_of(k, 0, 100 + k.block.lo) : g.error().code != store_errc::not_found)
              ++bad;
            break;
          }
          default:
            (void)s->remove(k);
            s->run_gc();
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(bad.load() == 0);
  CHECK(s->usage_bytes() <= s->capacity_bytes());
  CHECK(count_files(d.path, ".tmp-") == 0);
  s->check_invariants();
  const auto before = s->stats();
  s.reset();
  auto r = open_ok(options_for(d, c, 64 * 200));
  CHECK(r->stats().chunks == before.chunks);
  CHECK(r->usage_bytes() == before.usage_bytes);
}

TEST_CASE("fault points: a full disk and a failed write leave nothing behind, a failed or damaged read is an error, the damaged chunk dropped") {
  temp_dir d;
  fake_clock c;
  auto s = open_ok(options_for(d, c, 1 << 20));
  const auto a = key_of(1), b = key_of(2);
  REQUIRE(s->put(a, payload_of(a, 0, 300), traffic_class::agent));
  auto with = [](runtime::fault_point p) {
    runtime::fault_plan plan;
    plan.seed = 3;
    plan[p] = 1.0;
    runtime::install_faults(plan);
  };
  for (auto [point, code] : {std::pair{runtime::fault_point::disk_full, store_errc::disk_full},
                             std::pair{runtime::fault_point::storage_write, store_errc::io}}) {
    with(point);
    auto r = s->put(b, payload_of(b, 0, 200), traffic_class::agent);
    runtime::install_faults({});
    REQUIRE(!r);
    CHECK(r.error().code == code);
    CHECK(r.error().detail.find("write") != std::string::npos);
    CHECK(count_files(d.path, ".tmp-") == 0);  // no partial file
    CHECK(s->usage_bytes() == 300);
    CHECK(s->exists(std::vector<chunk_key>{b}) == std::vector<bool>{false});
    s->check_invariants();
  }
  with(runtime::fault_point::storage_read);
  auto r = s->get(a);
  runtime::install_faults({});
  REQUIRE(!r);
  CHECK(r.error().code == store_errc::io);
  CHECK(*s->get(a) == payload_of(a, 0, 300));  // an I/O error does not drop the chunk
  with(runtime::fault_point::storage_corrupt);
  r = s->get(a);
  runtime::install_faults({});
  REQUIRE(!r);
  CHECK(r.error().code == store_errc::corrupt);  // the crc check caught the damaged bytes
  CHECK(s->exists(std::vector<chunk_key>{a}) == std::vector<bool>{false});  // dropped: an erasure now
  s->check_invariants();
}
