// A re-formed expert-parallel group's placement (runtime/placement/regroup.hpp): survivors keep
// their experts, a lost rank's only copies go to holders, a joining rank takes its share (what
// its process still holds first), the newest basis wins, the group frames are checked field by
// field; and engines of partitioned processes losing a rank and taking it back read only what
// no process holds, computing exactly what one engine computes.
#include <doctest/doctest.h>

#include <filesystem>
#include <set>

#include "model/generate.hpp"
#include "model/safetensors.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/ep/expert_parallel.hpp"
#include "runtime/ep/expert_residency.hpp"
#include "runtime/placement/regroup.hpp"
#include "tests/runtime/ep_lockstep.hpp"

using namespace shoal;
using runtime::ep_placement;
using runtime::group_view;
using runtime::local_ep_hub;
using namespace std::chrono_literals;
using namespace shoal::test::ep;

namespace {

// 3 slots × 12 experts over 4 ranks, with redundant copies: rank r holds block r plus one
// expert of the next rank's block (its hot one).
ep_placement redundant_four(uint64_t epoch) {
  std::vector<std::vector<int32_t>> lists(3 * 4);
  for (int64_t s = 0; s < 3; ++s)
    for (int32_t r = 0; r < 4; ++r) {
      auto& l = lists[s * 4 + r];
      for (int32_t e = 3 * r; e < 3 * r + 3; ++e) l.push_back(e);
      l.push_back(static_cast<int32_t>((3 * (r + 1) + s) % 12));
      std::sort(l.begin(), l.end());
      l.erase(std::unique(l.begin(), l.end()), l.end());
    }
  return *ep_placement::from_lists(3, 12, 4, epoch, std::move(lists));
}

std::vector<group_view> views_from(const ep_placement& p, const std::vector<int32_t>& moved, int32_t ranks) {
  std::vector<group_view> v;
  for (int32_t r = 0; r < ranks; ++r) v.push_back(runtime::view_of(p, moved, ranks));
  return v;
}

}  // namespace

TEST_CASE("regroup: a lost rank's survivors keep every expert, its redundantly copied experts are not moved, "
          "its only copies go to the least busy survivor") {
  const ep_placement before = redundant_four(5);
  // Rank 2 lost: 0, 1, 3 become 0, 1, 2.
  auto out = runtime::regroup_placement(3, 12, 3, views_from(before, {0, 1, -1, 2}, 3));
  REQUIRE(out.has_value());
  const ep_placement& p = out->placement;
  CHECK(p.epoch() == 6);
  CHECK(out->basis_rank == 0);
  CHECK(out->moved_to_new == 0);
  int64_t orphans = 0;
  for (int64_t s = 0; s < 3; ++s) {
    const int32_t old_of[3] = {0, 1, 3};
    for (int32_t n = 0; n < 3; ++n)
      for (int32_t e : before.experts_of(s, old_of[n])) CHECK(p.holds(s, n, e));
    for (int32_t e : before.experts_of(s, 2)) {
      auto reps = before.replicas(s, e);
      const bool copied = std::any_of(reps.begin(), reps.end(), [](int32_t r) { return r != 2; });
      if (copied) {  // kept where its copy is, and nowhere else
        for (int32_t n = 0; n < 3; ++n) CHECK(p.holds(s, n, e) == before.holds(s, old_of[n], e));
      } else {
        ++orphans;
        CHECK(p.replicas(s, e).size() == 1);
      }
    }
  }
  CHECK(out->orphans == orphans);
  CHECK(orphans == 3 * 2);  // per slot, 2 of rank 2's 4 experts are its only copies (the others have copies on ranks 1 and 3)
  // The orphans spread over the ranks computing the fewest: no rank ends with two more than another.
  for (int64_t s = 0; s < 3; ++s) {
    size_t lo = 99, hi = 0;
    for (int32_t n = 0; n < 3; ++n) lo = std::min(lo, p.experts_of(s, n).size()), hi = std::max(hi, p.experts_of(s, n).size());
    CHECK(hi - lo <= 1);
  }
}

TEST_CASE("regroup: an orphan goes to a rank whose process still holds it, a joining rank takes back its share "
          "from what its process holds, the newest basis wins") {
  const ep_placement before = redundant_four(5);
  SUBCASE("a survivor whose process held the lost rank's experts (another rank of the same process) takes them") {
    auto views = views_from(before, {0, 1, -1, 2}, 3);
    for (int64_t s = 0; s < 3; ++s) {
      auto e = before.experts_of(s, 2);
      views[2].holds[s].assign(e.begin(), e.end());  // rank 3 (now 2) shared rank 2's process
    }
    auto out = runtime::regroup_placement(3, 12, 3, views);
    REQUIRE(out.has_value());
    for (int64_t s = 0; s < 3; ++s)
      for (int32_t e : before.experts_of(s, 2))
        if (before.replicas(s, e).size() == 1) CHECK(out->placement.holds(s, 2, e));
  }
  SUBCASE("the rank back (resumed, stale epoch 5) rejoins the survivors' epoch-6 group: it gets its own experts back") {
    auto shrunk = runtime::regroup_placement(3, 12, 3, views_from(before, {0, 1, -1, 2}, 3));
    REQUIRE(shrunk.has_value());
    // New group: 0, 1, back, 2 → ranks 0..3. Survivors bring epoch 6; the resumed rank its stale epoch 5.
    auto views = views_from(shrunk->placement, {0, 1, 3}, 4);
    views[2] = runtime::view_of(before, {0, 1, 2, 3}, 4);
    for (int64_t s = 0; s < 3; ++s) {
      auto e = before.experts_of(s, 2);
      views[2].holds[s].assign(e.begin(), e.end());
    }
    auto out = runtime::regroup_placement(3, 12, 4, views);
    REQUIRE(out.has_value());
    CHECK(out->basis_rank == 0);
    CHECK(out->placement.epoch() == 7);
    for (int64_t s = 0; s < 3; ++s) {
      // Its share (the expert count balanced) from what it holds: its own orphans came back.
      size_t total = 0;
      for (int32_t n = 0; n < 4; ++n) total += out->placement.experts_of(s, n).size();
      CHECK(out->placement.experts_of(s, 2).size() == total / 4);
      for (int32_t e : out->placement.experts_of(s, 2)) CHECK(before.holds(s, 2, e));
      for (int32_t n : {0, 1, 3})  // the others gave up only what the joiner took
        for (int32_t e : shrunk->placement.experts_of(s, n == 3 ? 2 : n))
          CHECK((out->placement.holds(s, n, e) || out->placement.holds(s, 2, e)));
    }
    CHECK(out->moved_to_new == 3 * 3);
  }
  SUBCASE("a fresh rank (nothing held) takes its share from the fullest ranks; without any basis, contiguous blocks") {
    auto views = views_from(before, {0, 1, 2, 3, -1}, 5);
    views[4] = runtime::fresh_view(3);
    auto out = runtime::regroup_placement(3, 12, 5, views);
    REQUIRE(out.has_value());
    for (int64_t s = 0; s < 3; ++s) {
      size_t total = 0;
      for (int32_t n = 0; n < 5; ++n) total += out->placement.experts_of(s, n).size();
      CHECK(out->placement.experts_of(s, 4).size() == total / 5);
    }
    std::vector<group_view> fresh(3, runtime::fresh_view(3));
    auto none = runtime::regroup_placement(3, 12, 3, fresh);
    REQUIRE(none.has_value());
    CHECK(none->basis_rank == -1);
    CHECK(none->placement.same_experts(ep_placement::contiguous(3, 12, 3)));
    CHECK(none->placement.epoch() == 0);
  }
}

TEST_CASE("regroup: group frames round-trip, and bad views or bytes are errors naming what is wrong") {
  const ep_placement before = redundant_four(5);
  group_view v = runtime::view_of(before, {0, 1, -1, 2}, 3);
  v.holds[1] = {2, 7};
  auto bytes = runtime::encode_group(v, 0, 1, 3, 3, 12);
  auto back = runtime::decode_group(bytes, 0, 1, 3, 3, 12);
  REQUIRE(back.has_value());
  CHECK(back->has_basis);
  CHECK(back->epoch == 5);
  CHECK(back->known == v.known);
  CHECK(back->lists == v.lists);
  CHECK(back->holds == v.holds);
  auto wrong_source = runtime::decode_group(bytes, 0, 2, 3, 3, 12);
  REQUIRE(!wrong_source.has_value());
  CHECK(wrong_source.error().find("source rank") != std::string::npos);
  auto wrong_shape = runtime::decode_group(bytes, 0, 1, 3, 4, 12);
  REQUIRE(!wrong_shape.has_value());
  CHECK(wrong_shape.error().find("ranks") != std::string::npos);
  bytes.resize(bytes.size() - 3);
  auto cut = runtime::decode_group(bytes, 0, 1, 3, 3, 12);
  REQUIRE(!cut.has_value());
  CHECK(cut.error().find("group frame") != std::string::npos);

  group_view fresh = runtime::fresh_view(3);
  fresh.epoch = 3;  // no basis, yet an epoch
  auto lying = runtime::decode_group(runtime::encode_group(fresh, 0, 0, 3, 3, 12), 0, 0, 3, 3, 12);
  REQUIRE(!lying.has_value());
  CHECK(lying.error().find("no basis") != std::string::npos);

  auto views = views_from(before, {0, 1, -1, 2}, 3);
  views[1].lists[2 * 3 + 0] = {4, 3};
  auto bad = runtime::regroup_placement(3, 12, 3, views);
  REQUIRE(!bad.has_value());
  CHECK(bad.error().find("rank 1's view") != std::string::npos);
  CHECK(bad.error().find("ascending") != std::string::npos);
  views = views_from(before, {0, 1, -1, 2}, 3);
  views[0].holds[0] = {12};
  bad = runtime::regroup_placement(3, 12, 3, views);
  REQUIRE(!bad.has_value());
  CHECK(bad.error().find("outside [0, 12)") != std::string::npos);
}

namespace {

struct process {
  std::shared_ptr<runtime::expert_residency> experts;
  std::unique_ptr<runtime::engine> engine;
};

// One rank's process over `dir`: weights without routed experts, its own residency.
process start_process(const std::filesystem::path& dir, local_ep_hub& hub, int32_t rank) {
  model::load_options none;
  none.keep_routed_expert = [](int64_t, int64_t) { return false; };
  auto part = model::load_weights(dir.string(), nullptr, none);
  REQUIRE(part.has_value());
  auto w = std::make_shared<const model::model_weights>(std::move(*part));
  auto residency = runtime::expert_residency::open(dir.string(), w);
  REQUIRE(residency.has_value());
  runtime::engine_config c = ep_config(hub, rank);
  c.experts = *residency;
  return {*residency, std::make_unique<runtime::engine>(w, c)};
}

int64_t checkpoint_reads(const std::vector<process>& ps) {
  int64_t n = 0;
  for (const auto& p : ps) n += p.experts->migration().checkpoint_experts;
  return n;
}

}  // namespace

TEST_CASE("regroup, engines of partitioned processes: a lost rank's survivors read only its only copies, the "
          "rank back takes its share from what it holds (resumed) or reads just that share (restarted), "
          "outputs equal one engine's throughout") {
  const auto dir = std::filesystem::temp_directory_path() / "shoal_ep_regroup";
  std::filesystem::remove_all(dir);
  model::generate_options o;
  o.preset = "v3-tiny", o.seed = 21, o.out_dir = dir.string();
  REQUIRE(model::generate_checkpoint(o).has_value());
  auto full = model::load_weights(dir.string());
  REQUIRE(full.has_value());
  auto full_w = std::make_shared<model::model_weights>(std::move(*full));
  const int64_t E = full_w->config.n_routed_experts, slots = model::moe_slot_count(full_w->config);
  REQUIRE(E >= 6);

  local_ep_hub trio(3, 10s);
  std::vector<process> ps;
  for (int32_t r = 0; r < 3; ++r) ps.push_back(start_process(dir, trio, r));
  auto engines_of = [&](std::initializer_list<int32_t> order) {
    std::vector<std::unique_ptr<runtime::engine>> out;
    for (int32_t p : order) out.push_back(std::move(ps[p].engine));
    return out;
  };
  auto give_back = [&](std::vector<std::unique_ptr<runtime::engine>>& es, std::initializer_list<int32_t> order) {
    size_t i = 0;
    for (int32_t p : order) ps[p].engine = std::move(es[i++]);
  };
  {
    auto es = engines_of({0, 1, 2});
    serve_and_check(es, 3, 5, -1, full_w);
    give_back(es, {0, 1, 2});
  }
  const auto first = ep_placement::contiguous(slots, E, 3);
  const int64_t start_reads = checkpoint_reads(ps);
  CHECK(start_reads == slots * E);  // every expert once, at the group's start

  // Process 1 is lost: 0 and 2 re-form as ranks 0 and 1 and keep their blocks.
  local_ep_hub pair(2, 10s);
  ps[0].engine->set_ep_group({0, 2}, pair.transport(0), {0, -1, 1});
  ps[2].engine->set_ep_group({1, 2}, pair.transport(1), {0, -1, 1});
  {
    auto es = engines_of({0, 2});
    serve_and_check(es, 2, 6, -1, full_w);
    give_back(es, {0, 2});
  }
  const auto shrunk = ps[0].engine->expert_exchange()->placement();
  CHECK(shrunk->epoch() == 1);
  const int64_t block1 = slots * static_cast<int64_t>(first.experts_of(0, 1).size());
  CHECK(ps[0].engine->stats().regroup_orphans == block1);
  CHECK(checkpoint_reads(ps) - start_reads == block1);  // the lost block only, once
  for (int64_t s = 0; s < slots; ++s)
    for (int32_t e : first.experts_of(s, 0)) CHECK(shrunk->holds(s, 0, e));

  const int64_t survivors_before = ps[0].experts->migration().checkpoint_experts + ps[2].experts->migration().checkpoint_experts;
  const int64_t joiner_before = ps[1].experts->migration().checkpoint_experts;
  bool resumed = false;
  local_ep_hub back(3, 10s);
  ps[0].engine->set_ep_group({0, 3}, back.transport(0), {0, 2});
  ps[2].engine->set_ep_group({2, 3}, back.transport(2), {0, 2});
  SUBCASE("resumed: the stopped process brings its stale placement and still holds its block") {
    ps[1].engine->set_ep_group({1, 3}, back.transport(1), {0, 1, 2});
    resumed = true;
  }
  SUBCASE("restarted: a fresh process with nothing in memory") {
    ps[1] = start_process(dir, back, 1);
  }
  auto es = engines_of({0, 1, 2});
  serve_and_check(es, 3, 7, -1, full_w);
  give_back(es, {0, 1, 2});
  const auto grown = ps[0].engine->expert_exchange()->placement();
  CHECK(grown->epoch() == 2);
  int64_t total = 0, joiner = 0;
  for (int64_t s = 0; s < slots; ++s) {
    for (int32_t r = 0; r < 3; ++r) total += static_cast<int64_t>(grown->experts_of(s, r).size());
    joiner += static_cast<int64_t>(grown->experts_of(s, 1).size());
    for (int32_t r : {0, 2})  // survivors gained nothing
      for (int32_t e : grown->experts_of(s, r)) CHECK(shrunk->holds(s, r == 0 ? 0 : 1, e));
  }
  CHECK(joiner == slots * (total / slots / 3));
  CHECK(ps[1].engine->stats().regroup_moved_to_new == joiner);
  const int64_t survivors_read = ps[0].experts->migration().checkpoint_experts +
                                 ps[2].experts->migration().checkpoint_experts - survivors_before;
  const int64_t joiner_read = ps[1].experts->migration().checkpoint_experts - (resumed ? joiner_before : 0);
  MESSAGE(std::string(resumed ? "resumed" : "restarted") << ": the rank back took " << joiner << " experts, read "
                                              << joiner_read << " from the checkpoint");
  CHECK(survivors_read == 0);
  CHECK(joiner_read == (resumed ? 0 : joiner));
  std::filesystem::remove_all(dir);
}
