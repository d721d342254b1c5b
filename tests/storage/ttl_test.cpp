// TTL by traffic class with a fake clock: defaults (agent 3 days, chat 7 days), configured values,
// expired chunks hidden from get/exists before any sweep, sweep removing them with exact counters.
#include "storage/ttl.hpp"

#include <doctest/doctest.h>

#include "storage/chunk_store.hpp"
#include "tests/storage/store_fixture.hpp"

using namespace shoal::storage;
using namespace shoal::storage::test;

TEST_CASE("ttl policy arithmetic") {
  const ttl_policy p;
  CHECK(p.ttl_ms(traffic_class::agent) == 3 * ms_per_day);
  CHECK(p.ttl_ms(traffic_class::chat) == 7 * ms_per_day);
  CHECK_FALSE(p.expired(0, traffic_class::agent, 3 * ms_per_day - 1));
  CHECK(p.expired(0, traffic_class::agent, 3 * ms_per_day));
  CHECK(p.expires_at_ms(INT64_MAX - 5, traffic_class::chat) == INT64_MAX);  // saturates
  CHECK(std::string(to_string(traffic_class::chat)) == "chat");
  CHECK_FALSE(traffic_class_from_byte(2));
}

TEST_CASE("default ttl agent 3 days chat 7 days hidden before sweep") {
  temp_dir d;
  fake_clock c;
  auto s = open_ok(options_for(d, c, 1 << 20));
  const auto a = key_of(1), ch = key_of(2);
  REQUIRE(s->put(a, payload_of(a, 0, 100), traffic_class::agent));
  REQUIRE(s->put(ch, payload_of(ch, 0, 30), traffic_class::chat));
  const std::vector q{a, ch};
  c.advance(3 * ms_per_day - 1);
  CHECK(s->exists(q) == std::vector<bool>{true, true});
  REQUIRE(s->get(a));  // a read does not extend the ttl
  c.advance(1);
  CHECK(s->exists(q) == std::vector<bool>{false, true});
  CHECK(s->get(a).error().code == store_errc::not_found);
  CHECK(s->usage_bytes() == 130);  // still on disk until the sweep
  CHECK(s->sweep() == 1);
  CHECK(s->usage_bytes() == 30);
  c.advance(4 * ms_per_day - 1);
  CHECK(*s->get(ch) == payload_of(ch, 0, 30));
  c.advance(1);
  CHECK(s->exists(q) == std::vector<bool>{false, false});
  CHECK(s->sweep() == 1);
  const auto st = s->stats();
  CHECK(st.sweeps == 2);
  CHECK(st.expired_chunks == 2);
  CHECK(st.expired_bytes == 130);
  CHECK(st.chunks == 0);
  CHECK(count_files(d.path, "") == 0);
  s->check_invariants();
}

TEST_CASE("configured ttl values are honoured and survive restart") {
  temp_dir d;
  fake_clock c;
  auto o = options_for(d, c, 1 << 20);
  o.ttl.agent_ms = 1000;
  o.ttl.chat_ms = 5000;
  const auto a = key_of(1), ch = key_of(2);
  {
    auto s = open_ok(o);
    REQUIRE(s->put(a, payload_of(a, 0, 10), traffic_class::agent));
    REQUIRE(s->put(ch, payload_of(ch, 0, 10), traffic_class::chat));
  }
  c.advance(999);
  auto s = open_ok(o);  // put time and class come back from the file header
  CHECK(s->exists(std::vector{a, ch}) == std::vector<bool>{true, true});
  c.advance(1);
  CHECK(s->exists(std::vector{a, ch}) == std::vector<bool>{false, true});
  {
    const auto l = s->acquire(a);  // a leased expired chunk stays hidden and is not swept
    CHECK(s->sweep() == 0);
  }
  CHECK(s->sweep() == 1);
  c.advance(4000);
  CHECK_FALSE(s->get(ch));
  CHECK(s->sweep() == 1);
  CHECK(s->stats().expired_chunks == 2);
}

TEST_CASE("a put over capacity sweeps expired chunks before evicting live ones") {
  temp_dir d;
  fake_clock c;
  auto o = options_for(d, c, 1000);
  o.ttl.agent_ms = 100;
  auto s = open_ok(o);
  const auto live = key_of(1), dead = key_of(2), x = key_of(3);
  REQUIRE(s->put(live, payload_of(live, 0, 400), traffic_class::chat));
  c.advance(1);
  REQUIRE(s->put(dead, payload_of(dead, 0, 500), traffic_class::agent));
  c.advance(100);
  REQUIRE(s->put(x, payload_of(x, 0, 300), traffic_class::agent));
  CHECK(s->exists(std::vector{live, dead, x}) == std::vector<bool>{true, false, true});
  CHECK(s->stats().expired_chunks == 1);
  CHECK(s->stats().evicted_chunks == 0);
  CHECK(s->usage_bytes() == 700);
}
