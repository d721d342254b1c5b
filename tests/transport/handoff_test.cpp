// The prefill → decode handoff between two engines over libfabric (shm and tcp;ofi_rxm): the prefill engine
// samples the first token and lends its cache; the decode engine reads blocks and rings into
// its own pool and continues with tokens and logits bit-identical to one colocated engine,
// for deepseek_v3 and for shoal_flash in exact SWA mode. A read that fails its checksum (an
// injected fault) makes the decode engine recompute from the tokens, same output; a decode
// engine without room says so and reserves nothing; a malformed handoff is refused, named.
#include <doctest/doctest.h>

#include <chrono>
#include <map>
#include <thread>

#include "runtime/base/fault_points.hpp"
#include "runtime/engine/engine.hpp"
#include "tests/support/tiny_models.hpp"
#include "transport/fabric_transport.hpp"

using namespace shoal;

namespace {

std::shared_ptr<runtime::transport> fabric(const std::string& provider = "shm") {
  auto t = transport::fabric_transport::create({provider, provider == "shm" ? "" : "127.0.0.1"});
  REQUIRE_MESSAGE(t, (t ? "" : t.error()));
  return std::shared_ptr<runtime::transport>(std::move(*t));
}

runtime::sampling_params sampling(int32_t n) {
  runtime::sampling_params p;
  p.max_tokens = n;
  p.ignore_eos = true;
  p.temperature = 0.8f;  // sampled, seeded: the sampler position must carry over
  p.seed = 1234;
  return p;
}

runtime::engine_config config_for(const std::string& preset, runtime::engine_role role,
                                  std::shared_ptr<runtime::transport> bulk, int64_t blocks = 64) {
  auto c = test::exact_engine_config(blocks);
  c.role = role;
  c.bulk = std::move(bulk);
  if (preset == "tiny") c.cache.exact_swa = true;
  return c;
}

// Steps `e` until `done` or `limit` steps (a stalled engine waits on reads: 1 ms apart).
template <class Done>
void step_until(runtime::engine& e, std::vector<runtime::token_event>& out, Done done, int limit = 5000) {
  for (int i = 0; i < limit && !done(); ++i) {
    for (auto& ev : e.step()) out.push_back(std::move(ev));
    if (e.stalled()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

struct handoff_run {
  std::vector<runtime::token_event> prefill, decode;
  runtime::engine_stats decode_stats;
};

// One request through P then D; `tamper` may change the handoff on its way. With `resumed`
// the request arrives at P as a re-routed one, with output the client already has.
template <class Tamper>
handoff_run through(const std::string& preset, const std::vector<int32_t>& prompt, int32_t n, Tamper tamper,
                    const std::string& provider = "shm", std::span<const int32_t> resumed = {}) {
  auto w = test::tiny_model(preset);
  handoff_run out;
  runtime::engine p(w, config_for(preset, runtime::engine_role::prefill, fabric(provider)));
  runtime::engine d(w, config_for(preset, runtime::engine_role::decode, fabric(provider)));
  REQUIRE(p.add_request(request_id(0), prompt, sampling(n), runtime::traffic_class::chat, {}, resumed));
  std::vector<runtime::handoff_state> offered;
  step_until(p, out.prefill, [&] {
    auto h = p.take_handoffs();
    offered.insert(offered.end(), h.begin(), h.end());
    return !offered.empty();
  });
  REQUIRE(offered.size() == 1);
  CHECK(!p.has_work());  // pinned, not scheduled
  tamper(offered[0]);
  auto id = d.add_handoff(offered[0]);
  REQUIRE_MESSAGE(id, (id ? "" : id.error().message));
  step_until(d, out.decode, [&] { return !out.decode.empty() && out.decode.back().finished; });
  CHECK(p.handoff_done(offered[0].id, true));
  CHECK(p.stats().blocks_free == p.stats().blocks_total);
  CHECK(d.stats().blocks_free == d.stats().blocks_total);
  out.decode_stats = d.stats();
  return out;
}

void check_equal(const handoff_run& got, const std::vector<runtime::token_event>& ref) {
  REQUIRE(got.prefill.size() == 1);
  REQUIRE(got.prefill.size() + got.decode.size() == ref.size());
  CHECK(got.prefill[0].token == ref[0].token);
  CHECK(got.prefill[0].logits == ref[0].logits);
  for (size_t i = 0; i < got.decode.size(); ++i) {
    CAPTURE(i);
    CHECK(got.decode[i].token == ref[i + 1].token);
    CHECK(got.decode[i].logits == ref[i + 1].logits);
  }
}

}  // namespace

TEST_CASE("handoff: the decode engine continues exactly where a colocated engine would (shm, tcp/ofi_rxm)") {
  for (const std::string provider : {"shm", "tcp;ofi_rxm"})
    for (const std::string preset : {"v3-tiny", "tiny"}) {
      CAPTURE(provider);
      CAPTURE(preset);
      auto w = test::tiny_model(preset);
      auto prompt = test::random_tokens(77, 5);  // 4 full blocks and a partial one
      runtime::engine colocated(w, config_for(preset, runtime::engine_role::both, nullptr));
      const auto ref = test::run_alone(colocated, prompt, sampling(10));
      auto got = through(preset, prompt, 10, [](runtime::handoff_state&) {}, provider);
      check_equal(got, ref);
      CHECK(got.decode_stats.cache.imports == 1);
      CHECK(got.decode_stats.cache.import_failures == 0);
    }
}

TEST_CASE("handoff: a resumed request is offered after its first new token, the decode engine continues exactly") {
  for (const std::string preset : {"v3-tiny", "tiny"}) {
    CAPTURE(preset);
    auto w = test::tiny_model(preset);
    auto prompt = test::random_tokens(40, 8);
    runtime::engine colocated(w, config_for(preset, runtime::engine_role::both, nullptr));
    const auto ref = test::run_alone(colocated, prompt, sampling(12));
    std::vector<int32_t> had;  // the client had the first 5 tokens when its engine failed
    for (size_t i = 0; i < 5; ++i) had.push_back(ref[i].token);
    auto got = through(preset, prompt, 12, [](runtime::handoff_state&) {}, "shm", had);
    check_equal(got, std::vector<runtime::token_event>(ref.begin() + 5, ref.end()));
  }
}

TEST_CASE("handoff: a read that fails its checksum is recomputed on the decode engine, same output") {
  for (const std::string preset : {"v3-tiny", "tiny"}) {
    CAPTURE(preset);
    auto w = test::tiny_model(preset);
    auto prompt = test::random_tokens(50, 6);
    runtime::engine colocated(w, config_for(preset, runtime::engine_role::both, nullptr));
    const auto ref = test::run_alone(colocated, prompt, sampling(8));
    auto got = through(preset, prompt, 8, [](runtime::handoff_state& s) { s.blocks[1].crc32c ^= 1; });
    check_equal(got, ref);
    CHECK(got.decode_stats.cache.imports == 0);
    CHECK(got.decode_stats.cache.import_failures == 1);
    CHECK(got.decode_stats.cache.import_corrupt == 1);  // told apart from a slow or gone lender
    CHECK(got.decode_stats.cache.import_timeouts == 0);
  }
}

TEST_CASE("handoff: the kv_handoff fault point fails the reads, the decode engine recomputes, same output") {
  auto w = test::tiny_model("v3-tiny");
  auto prompt = test::random_tokens(50, 6);
  runtime::engine colocated(w, config_for("v3-tiny", runtime::engine_role::both, nullptr));
  const auto ref = test::run_alone(colocated, prompt, sampling(8));
  runtime::fault_plan plan;
  plan.seed = 1;
  plan[runtime::fault_point::kv_handoff] = 1.0;
  runtime::install_faults(plan);
  auto got = through("v3-tiny", prompt, 8, [](runtime::handoff_state&) {});
  const uint64_t fired = runtime::process_faults()->fired(runtime::fault_point::kv_handoff);
  runtime::install_faults({});
  check_equal(got, ref);
  CHECK(fired == 1);
  CHECK(got.decode_stats.cache.imports == 0);
  CHECK(got.decode_stats.cache.import_failures == 1);
  CHECK(got.decode_stats.cache.import_timeouts + got.decode_stats.cache.import_corrupt == 0);  // the reads themselves arrived
}

TEST_CASE("handoff: no room is said before anything is reserved, a refused handoff continues colocated") {
  auto w = test::tiny_model("v3-tiny");
  auto bulk = fabric();
  runtime::engine p(w, config_for("v3-tiny", runtime::engine_role::prefill, bulk));
  runtime::engine tight(w, config_for("v3-tiny", runtime::engine_role::decode, fabric(), 6));
  runtime::engine colocated(w, config_for("v3-tiny", runtime::engine_role::both, nullptr));
  auto prompt = test::random_tokens(77, 8);  // 5 blocks + 1 to decode into: more than 6 - 1 free
  const auto ref = test::run_alone(colocated, prompt, sampling(4));
  REQUIRE(tight.add_request(test::random_tokens(20, 9), sampling(40)));  // holds 2 blocks
  tight.step();
  REQUIRE(p.add_request(request_id(100), prompt, sampling(4)));  // ids are the caller's: not tight's 0
  std::vector<runtime::token_event> events;
  std::vector<runtime::handoff_state> offered;
  step_until(p, events, [&] { return !(offered = p.take_handoffs()).empty(); });
  REQUIRE(offered.size() == 1);
  const auto free_before = tight.stats().blocks_free;
  auto refused = tight.add_handoff(offered[0]);
  REQUIRE(!refused);
  CHECK(refused.error().code == runtime::errc::no_room);
  CHECK(tight.stats().blocks_free == free_before);
  CHECK(p.handoff_done(offered[0].id, false));  // nobody took it: P decodes it itself
  step_until(p, events, [&] { return !events.empty() && events.back().finished; });
  REQUIRE(events.size() == ref.size());
  for (size_t i = 0; i < ref.size(); ++i) CHECK(events[i].logits == ref[i].logits);
  CHECK(p.take_handoffs().empty());  // offered once only

  // Malformed handoffs (bytes from another process) are refused with what is wrong.
  auto bad = offered[0];
  bad.blocks.pop_back();
  auto r1 = tight.add_handoff(bad);
  REQUIRE(!r1);
  CHECK(r1.error().message.find("blocks for 77 positions") != std::string::npos);
  bad = offered[0];
  bad.ring_tokens += 1;
  auto r2 = tight.add_handoff(bad);
  REQUIRE(!r2);
  CHECK(r2.error().message.find("ring of") != std::string::npos);
  bad = offered[0];
  bad.tokens.back() = 1 << 30;
  auto r3 = tight.add_handoff(bad);
  REQUIRE(!r3);
  CHECK(r3.error().message.find("outside the vocabulary") != std::string::npos);
}
