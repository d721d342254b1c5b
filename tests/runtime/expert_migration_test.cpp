// Live expert migration below the actors: who lends what (plan_migration), and a process
// reading the experts it gains from another process's memory over a real libfabric shm
// endpoint (expert_residency lend → fetch → hold), with every bad description and failed
// read ending in the checkpoint's weights, never in wrong ones.
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include <unistd.h>

#include "model/forward.hpp"
#include "model/generate.hpp"
#include "model/weights.hpp"
#include "runtime/ep/expert_migration.hpp"
#include "runtime/ep/expert_residency.hpp"
#include "transport/fabric_transport.hpp"

using namespace shoal;
using namespace std::chrono_literals;
using runtime::expert_part;
using runtime::expert_residency;
using runtime::ep_placement;

TEST_CASE("plan_migration: each process gains what its ranks newly compute, lent by another process's holder") {
  // 4 ranks in 2 processes; 1 slot of 8 experts; contiguous: rank r holds {2r, 2r+1}.
  const auto current = ep_placement::contiguous(1, 8, 4);
  // Next: process 0 (ranks 0, 1) takes expert 7 as a redundant copy and gives up expert 3
  // (to rank 2); process 1 gains expert 3 and keeps the rest.
  auto next = ep_placement::from_lists(1, 8, 4, 1, {{0, 1, 7}, {2}, {3, 4, 5}, {3, 6, 7}});
  REQUIRE(next.has_value());
  const auto plan = runtime::plan_migration(current, *next, {0, 0, 1, 1});
  REQUIRE(plan.gains.size() == 2);
  CHECK(plan.gains[0] == std::vector<std::pair<int32_t, int32_t>>{{0, 7}});
  CHECK(plan.gains[1] == std::vector<std::pair<int32_t, int32_t>>{{0, 3}});
  REQUIRE(plan.lends.size() == 2);
  CHECK(plan.lends[0].holder == 1);  // expert 3 was rank 1's
  CHECK(plan.lends[0].experts == std::vector<std::pair<int32_t, int32_t>>{{0, 3}});
  CHECK(plan.lends[1].holder == 3);  // expert 7 was rank 3's
  CHECK(plan.lends[1].experts == std::vector<std::pair<int32_t, int32_t>>{{0, 7}});

  // Moves inside a process (rank 0's expert going to rank 1) cost nothing: no gain.
  auto inside = ep_placement::from_lists(1, 8, 4, 1, {{1}, {0, 2, 3}, {4, 5}, {6, 7}});
  REQUIRE(inside.has_value());
  const auto none = runtime::plan_migration(current, *inside, {0, 0, 1, 1});
  CHECK(none.lends.empty());
  CHECK(none.gains[0].empty());
  CHECK(none.gains[1].empty());

  // A replicated expert is lent by its replicas in turn: process 1 gains 0, 1 held by ranks 0
  // and 1 both; the least-asked replica lends each.
  auto from = ep_placement::from_lists(1, 4, 4, 1, {{0, 1}, {0, 1}, {2}, {3}});
  auto to = ep_placement::from_lists(1, 4, 4, 2, {{0}, {1}, {0, 2}, {1, 3}});
  REQUIRE(from.has_value());
  REQUIRE(to.has_value());
  const auto spread = runtime::plan_migration(*from, *to, {0, 0, 1, 1});
  REQUIRE(spread.lends.size() == 2);
  CHECK(spread.lends[0].holder == 0);
  CHECK(spread.lends[1].holder == 1);
}

namespace {

struct two_processes {
  std::filesystem::path dir;
  std::shared_ptr<const model::model_weights> a_weights, b_weights;
  std::shared_ptr<runtime::transport> a_bulk, b_bulk;  // outlive the residencies' reads
  std::shared_ptr<expert_residency> a, b;              // the holder, the reader
  int64_t slots = 0, experts = 0;
  int holder_tag = 0, reader_tag = 0;

  // `name`: the test's own directory (ctest runs test cases in parallel).
  two_processes(const std::string& dtype, const std::string& name) {
    dir = std::filesystem::temp_directory_path() /
          ("shoal_expert_migration_" + name + "_" + dtype + "_" + std::to_string(getpid()));
    std::filesystem::remove_all(dir);
    model::generate_options o;
    o.preset = "v3-tiny", o.seed = 5, o.out_dir = dir.string(), o.dtype = dtype;
    REQUIRE(model::generate_checkpoint(o).has_value());
    model::load_options none;
    none.keep_routed_expert = [](int64_t, int64_t) { return false; };
    for (auto* w : {&a_weights, &b_weights}) {
      auto loaded = model::load_weights(dir.string(), nullptr, none);
      REQUIRE(loaded.has_value());
      *w = std::make_shared<const model::model_weights>(std::move(*loaded));
    }
    auto ra = expert_residency::open(dir.string(), a_weights);
    auto rb = expert_residency::open(dir.string(), b_weights);
    REQUIRE(ra.has_value());
    REQUIRE(rb.has_value());
    a = *ra, b = *rb;
    for (auto* t : {&a_bulk, &b_bulk}) {
      auto f = transport::fabric_transport::create({"shm", ""});
      REQUIRE_MESSAGE(f.has_value(), (f ? "" : f.error()));
      *t = std::shared_ptr<runtime::transport>(std::move(*f));
    }
    slots = model::moe_slot_count(a_weights->config);
    experts = a_weights->config.n_routed_experts;
  }
  ~two_processes() { std::filesystem::remove_all(dir); }

  expert_residency::expert_set set(std::vector<std::pair<int32_t, int32_t>> pairs) const {
    expert_residency::expert_set out(static_cast<size_t>(slots));
    for (auto [s, e] : pairs) out[s].push_back(e);
    for (auto& v : out) std::sort(v.begin(), v.end());
    return out;
  }
  // Every expert of `want` in memory at the reader (fetched, or read from the checkpoint).
  void wait_ready(const expert_residency::expert_set& want) const {
    b->wait_ready(want);  // the residency's own wait (a hang is the case's ctest timeout)
    REQUIRE(b->ready(want));
  }
  static std::expected<void, std::string> held(expert_residency& r, const void* tag,
                                               const expert_residency::expert_set& experts) {
    r.wait_ready(experts);
    return r.hold(tag, experts);
  }
};

// Every array of a linear, as bytes (whatever storage it has).
std::vector<std::vector<uint8_t>> bytes_of(const model::linear& l) {
  auto raw = [](const auto& v) {
    auto p = reinterpret_cast<const uint8_t*>(v.data());
    return std::vector<uint8_t>(p, p + v.size() * sizeof(v[0]));
  };
  return {raw(l.w), raw(l.w_bf16), raw(l.w_fp8.codes), raw(l.w_fp8.scales), raw(l.w_fp8.row_scales)};
}

bool same_expert(const model::model_weights& x, const model::model_weights& y, int64_t s, int64_t e) {
  auto& xe = model::routed_expert_weights(const_cast<model::model_weights&>(x), s, e);
  auto& ye = model::routed_expert_weights(const_cast<model::model_weights&>(y), s, e);
  return !xe.gate_up.empty() && bytes_of(xe.gate_up) == bytes_of(ye.gate_up) && bytes_of(xe.down) == bytes_of(ye.down) &&
         xe.gate_up.out == ye.gate_up.out && xe.down.in == ye.down.in && xe.gate_up.w_fp8.block_in == ye.gate_up.w_fp8.block_in;
}

}  // namespace

TEST_CASE("expert migration over libfabric shm: lent experts arrive bit-identical, even after the holder dropped them") {
  for (const std::string dtype : {"fp8", "bf16"}) {
    CAPTURE(dtype);
    two_processes p(dtype, "lend");
    const auto mine = p.set({{0, 0}, {0, 1}, {1, 2}});
    REQUIRE(p.held(*p.a, &p.holder_tag, mine).has_value());
    REQUIRE(p.held(*p.b, &p.reader_tag, p.set({{0, 3}})).has_value());  // the reader's own expert: the storage to expect

    auto parts = p.a->lend(1, {{0, 1}, {1, 2}}, *p.a_bulk, 30s);
    REQUIRE_MESSAGE(parts.has_value(), (parts ? "" : parts.error().message));
    CHECK(p.a->migration().lent_experts == 2);
    CHECK(p.a->migration().lent_bytes > 0);
    // The holder moves on (its placement no longer has them) before the reader reads: the
    // loan keeps the memory.
    REQUIRE(p.held(*p.a, &p.holder_tag, p.set({{0, 0}})).has_value());
    CHECK(p.a->resident_experts() == 1);

    const auto gained = p.set({{0, 1}, {0, 3}, {1, 2}});
    auto started = p.b->fetch(1, *parts, p.b_bulk, 10s);
    REQUIRE_MESSAGE(started.has_value(), (started ? "" : started.error().message));
    p.wait_ready(gained);
    const auto before = p.b->migration();
    REQUIRE(p.held(*p.b, &p.reader_tag, gained).has_value());
    const auto after = p.b->migration();
    CHECK(after.fetched_experts - before.fetched_experts == 2);
    CHECK(after.checkpoint_experts == before.checkpoint_experts);  // nothing read from the checkpoint
    CHECK(after.fetch_failures == 0);
    CHECK(after.fetched_bytes == p.a->migration().lent_bytes);

    // The same bytes a load from the checkpoint gives.
    auto full = model::load_weights(p.dir.string());
    REQUIRE(full.has_value());
    CHECK(same_expert(*p.b_weights, *full, 0, 1));
    CHECK(same_expert(*p.b_weights, *full, 1, 2));
    p.a->end_loans(1);
  }
}

TEST_CASE("expert migration: bad descriptions and failed reads end in the checkpoint's weights") {
  two_processes p("fp8", "bad");
  REQUIRE(p.held(*p.a, &p.holder_tag, p.set({{0, 0}, {0, 1}, {0, 2}})).has_value());
  auto parts = p.a->lend(1, {{0, 0}, {0, 1}, {0, 2}}, *p.a_bulk, 30s);
  REQUIRE(parts.has_value());

  // Lending what is not held, or does not exist, lends nothing.
  auto absent = p.a->lend(1, {{0, 0}, {1, 5}}, *p.a_bulk, 30s);
  REQUIRE_FALSE(absent.has_value());
  CHECK(absent.error().code == runtime::errc::not_found);
  CHECK(absent.error().message.find("routed expert 5 of MoE slot 1 is not held here") != std::string::npos);
  auto outside = p.a->lend(1, {{0, static_cast<int32_t>(p.experts)}}, *p.a_bulk, 30s);
  REQUIRE_FALSE(outside.has_value());
  CHECK(outside.error().code == runtime::errc::invalid_argument);
  CHECK(outside.error().message.find("does not exist") != std::string::npos);

  // A slot this model lacks: refused as a whole, nothing read.
  auto wrong_slot = *parts;
  wrong_slot[0].slot = static_cast<int32_t>(p.slots);
  auto r = p.b->fetch(1, wrong_slot, p.b_bulk, 10s);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == runtime::errc::invalid_argument);
  CHECK(r.error().message.find("which this model does not have") != std::string::npos);

  // Expert 0: one array of the wrong length (a model of other sizes) → not read.
  // Expert 1: a checksum that does not match the bytes (a torn or stale read) → read, refused.
  // Expert 2: intact.
  auto mixed = *parts;
  for (auto& part : mixed) {
    if (part.expert == 0 && part.tensor == 1 && part.field == static_cast<int32_t>(runtime::expert_field::fp8_codes))
      part.memory.length /= 2;
    if (part.expert == 1 && part.tensor == 0) part.memory.crc32c ^= 1;
  }
  r = p.b->fetch(1, mixed, p.b_bulk, 10s);
  REQUIRE_FALSE(r.has_value());
  INFO(r.error().message);
  CHECK(r.error().code == runtime::errc::invalid_argument);
  CHECK(r.error().message.find("routed expert 0 of MoE slot 0 does not fit this model: down: field 2") != std::string::npos);
  const auto want = p.set({{0, 0}, {0, 1}, {0, 2}});
  p.wait_ready(want);
  REQUIRE(p.held(*p.b, &p.reader_tag, want).has_value());
  const auto m = p.b->migration();
  CHECK(m.fetched_experts == 1);     // expert 2
  CHECK(m.checkpoint_experts == 2);  // experts 0 and 1
  CHECK(m.fetch_failures == 2);
  CHECK(m.last_failure.find("routed expert 1 of MoE slot 0 from its holder") != std::string::npos);
  auto full = model::load_weights(p.dir.string());
  REQUIRE(full.has_value());
  for (int64_t e = 0; e < 3; ++e) CHECK(same_expert(*p.b_weights, *full, 0, e));

  // A plan dropped while its reads run: they are discarded, nothing is installed.
  p.b->release(&p.reader_tag);
  CHECK(p.b->resident_experts() == 0);
  REQUIRE(p.b->fetch(2, *parts, p.b_bulk, 10s).has_value());
  p.b->drop_fetches();
  // A bounded wait names what it still waits for; nothing read is not yet a read started.
  CHECK(p.b->not_ready(p.set({{0, 3}})) == "routed expert 3 of MoE slot 0 (no read started)");
  CHECK_FALSE(p.b->wait_ready(p.set({{0, 3}}), 0ms));  // starts the checkpoint read, does not wait for it
  const auto waiting = p.b->not_ready(p.set({{0, 3}}));
  CHECK((waiting.empty() || waiting == "routed expert 3 of MoE slot 0 (being read from the checkpoint)"));
  CHECK(p.b->wait_ready(p.set({{0, 3}}), 60s));
  CHECK(p.b->not_ready(p.set({{0, 3}})).empty());
  // Holding what is not in memory yet installs nothing: it starts the checkpoint read.
  auto early = p.b->hold(&p.reader_tag, p.set({{0, 2}}));
  REQUIRE_FALSE(early.has_value());
  CHECK(early.error().find("routed expert 2 of MoE slot 0 is not in memory yet") != std::string::npos);
  CHECK(p.b->resident_experts() == 0);
  p.wait_ready(p.set({{0, 2}}));
  REQUIRE(p.b->hold(&p.reader_tag, p.set({{0, 2}})).has_value());
  CHECK(p.b->migration().fetched_experts == 1);  // read from the checkpoint again, not installed from the dropped read
}
