// Expert-parallel frames over a bulk transport: two ranks, each with its own libfabric
// endpoint (shm and tcp;ofi_rxm on loopback), exchange frames large enough to travel as
// one-sided reads of the sender's registered memory while small ones stay inline in the CAF
// message; every payload arrives intact through many exchanges (the two send regions in
// turn). A described frame a rank cannot read is an error naming why, not data.
#include <doctest/doctest.h>

#include <future>
#include <random>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/send.hpp>

#include "actors/rank_actor.hpp"
#include "transport/fabric_transport.hpp"

using namespace shoal;
using namespace std::chrono_literals;
using actors::caf_ep_transport;
using runtime::ep_payloads;

namespace {

struct bulk_config : caf::actor_system_config {
  bulk_config() {
    actors::add_message_types(*this);
    set("scheduler.max-threads", size_t{2});
  }
};

// An engine that ignores the joins its rank actor asks for (the test steps by hand).
caf::behavior idle_engine() {
  return {[](lockstep_atom, uint64_t, uint64_t) {}, [](lockstep_atom, uint64_t, int32_t, std::vector<caf::actor>&) {}};
}

std::vector<uint8_t> payload(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(n);
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  return out;
}

}  // namespace

TEST_CASE("caf_ep_transport over libfabric: large frames read one-sided, small ones inline, all intact") {
  for (const std::string provider : {"shm", "tcp;ofi_rxm"}) {
    CAPTURE(provider);
    bulk_config cfg;
    caf::actor_system sys{cfg};
    std::vector<std::shared_ptr<caf_ep_transport>> t;
    std::vector<actors::rank_actor> ranks;
    std::vector<caf::actor> spawned;  // ended before the actor system is
    struct stop_all {
      std::vector<caf::actor>& a;
      ~stop_all() {
        for (auto& x : a) caf::anon_send_exit(x, caf::exit_reason::user_shutdown);
      }
    } stop{spawned};
    for (int r = 0; r < 2; ++r) {
      auto fabric = transport::fabric_transport::create({provider, provider == "shm" ? "" : "127.0.0.1"});
      if (!fabric) {
        MESSAGE("NOT RUN for " << provider << ": " << fabric.error());
        break;
      }
      actors::ep_bulk_options o;
      o.transport = std::shared_ptr<runtime::transport>(std::move(*fabric));
      o.region_bytes = 1 << 20;
      o.bulk_from = 4096;
      t.push_back(std::make_shared<caf_ep_transport>(10s, o));
      spawned.push_back(sys.spawn(idle_engine));
      ranks.push_back(actors::spawn_rank(sys, t.back(), caf::actor_cast<actors::engine_actor>(spawned.back()), "both"));
      spawned.push_back(caf::actor_cast<caf::actor>(ranks.back()));
    }
    if (t.size() < 2) continue;
    for (int r = 0; r < 2; ++r) CHECK_FALSE(t[r]->set_group(42, r, ranks));

    // 40 exchanges: both regions in turn many times; sizes below, at and above the inline
    // limit, and one above the region (inline again).
    const std::vector<size_t> sizes{100, 4096, 70'000, 300'000, (1 << 20) + 1, 0};
    for (uint64_t step = 0; step < 20; ++step)
      for (int32_t phase = 0; phase < 2; ++phase) {
        const size_t n = sizes[(step + phase) % sizes.size()];
        auto mine = [&](int r, int to) { return payload(n + r, static_cast<uint32_t>(step * 10 + phase * 4 + r * 2 + to)); };
        auto run = [&](int r) { return t[r]->exchange(step, 0, phase, {mine(r, 0), mine(r, 1)}); };
        auto other = std::async(std::launch::async, run, 1);
        auto in0 = run(0);
        auto in1 = other.get();
        CAPTURE(step);
        CAPTURE(n);
        REQUIRE_MESSAGE(in0.has_value(), in0.error());
        REQUIRE_MESSAGE(in1.has_value(), in1.error());
        CHECK((*in0)[1] == mine(1, 0));  // what rank 1 sent rank 0
        CHECK((*in1)[0] == mine(0, 1));
        CHECK((*in0)[0] == mine(0, 0));  // the own entry stays local
      }
    for (int r = 0; r < 2; ++r) {
      CHECK(t[r]->frames_bulk() >= 10);    // 70 KB and 300 KB frames (and the 4096 one)
      CHECK(t[r]->frames_inline() >= 10);  // 100 B, 0 B and the one over the region
    }
  }
}

TEST_CASE("caf_ep_transport: a frame described over a bulk transport this rank lacks is an error, not data") {
  caf_ep_transport t(2s);
  std::vector<actors::rank_actor> nobody(2);
  CHECK_FALSE(t.set_group(5, 1, nobody));
  actors::ep_frame f{5, 0, 0, 0, 0, {}, runtime::remote_memory{{1, 2, 3}, 4096, 7, 100, 0}, 1};
  t.deliver(f);
  auto in = t.exchange(0, 0, 0, {{}, {}});
  REQUIRE_FALSE(in.has_value());
  CHECK(in.error().find("reading rank 0's frame") != std::string::npos);
  CHECK(in.error().find("bulk transport this rank does not have") != std::string::npos);
}

namespace {

// A bulk transport whose reads never end by themselves (an owner stopped mid-read, as with
// SIGSTOP over tcp): the test ends them.
struct stalled_transport final : runtime::transport {
  std::vector<std::shared_ptr<runtime::transfer>> reads;
  std::string name() const override { return "stalled"; }
  std::vector<uint8_t> address() const override { return {1}; }
  std::expected<std::unique_ptr<runtime::registered_memory>, std::string> register_memory(
      std::span<const std::byte>) override {
    return std::unexpected("no registrations here");
  }
  std::shared_ptr<runtime::transfer> read(const runtime::remote_memory&, std::span<std::byte>,
                                          std::chrono::milliseconds) override {
    return reads.emplace_back(std::make_shared<runtime::transfer>());
  }
};

}  // namespace

TEST_CASE("caf_ep_transport: a group change ends an exchange waiting for a peer's frame being read, at once") {
  auto stalled = std::make_shared<stalled_transport>();
  actors::ep_bulk_options o;
  o.transport = stalled;
  caf_ep_transport t(60s, o);
  CHECK_FALSE(t.set_group(5, 1, std::vector<actors::rank_actor>(2)));
  t.deliver(actors::ep_frame{5, 0, 0, 0, 0, {}, runtime::remote_memory{{1}, 4096, 7, 100, 0}, 1});
  REQUIRE(stalled->reads.size() == 1);
  auto pending = std::async(std::launch::async, [&] { return t.exchange(0, 0, 0, {{}, {}}); });
  CHECK(pending.wait_for(300ms) == std::future_status::timeout);  // waiting for the read
  const auto t0 = std::chrono::steady_clock::now();
  t.interrupt("expert-parallel group changed (now 1 ranks)");
  REQUIRE(pending.wait_for(10s) == std::future_status::ready);  // not the read's 60 s
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  auto in = pending.get();
  REQUIRE_FALSE(in.has_value());
  CHECK(in.error() == "expert-parallel group changed (now 1 ranks)");
  stalled->reads[0]->fail(runtime::errc::timed_out, "ended by the test");  // the retired read ends
}
