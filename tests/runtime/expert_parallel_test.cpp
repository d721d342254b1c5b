// Expert parallelism over the in-process hub: forward passes of N ranks with different
// batches give logits bit-identical to the local path (both architectures, MTP included);
// engines in lockstep (one idle) sample exactly what a single engine samples, also after a
// layout change; a lost or silent rank fails its peers' steps within the timeout and the
// survivors carry on in a new group; bad frames are rejected with an error naming the field.
#include <doctest/doctest.h>

#include <algorithm>
#include <barrier>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <thread>

#include "model/generate.hpp"
#include "model/safetensors.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/ep/expert_migration.hpp"
#include "runtime/ep/expert_residency.hpp"
#include "transport/fabric_transport.hpp"
#include "runtime/ep/expert_parallel.hpp"
#include "tests/runtime/ep_lockstep.hpp"
#include "tests/support/tiny_models.hpp"

using namespace shoal;
using runtime::engine;
using runtime::engine_config;
using runtime::ep_layout;
using ep_placement_ptr = std::shared_ptr<const runtime::ep_placement>;
using runtime::local_ep_hub;
using runtime::sampling_params;
using runtime::spec_mode;
using runtime::spec_stats;
using runtime::token_event;
using namespace std::chrono_literals;
using namespace shoal::test::ep;

namespace {

// ---- model level ----

// One rank's work: two steps over its own sequences (prefill, then one decode token each).
struct rank_batch {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int64_t> dec_from;  // per sequence (flash); ≥ prompt length: no decoder rows
  std::vector<bool> logits;
  bool full = false;              // instead: forward_full of prompts[0] (forward + mtp_last)
};

struct rank_result {
  std::vector<std::vector<float>> logits;  // per step
  std::vector<float> mtp;
  std::string error;
};

// Runs `b` with `moe` (nullptr = local) and, when set, `ex` framing each step.
rank_result run_batch(const model::model_weights& w, const rank_batch& b, runtime::ep_moe_exchange* ex) {
  rank_result res;
  model::forward_options o{true, false, ex};
  auto step = [&](auto&& body) {
    if (ex) ex->begin_step();
    body();
    if (ex)
      if (auto r = ex->end_step(); !r) res.error = r.error();
  };
  if (b.full) {
    step([&] {
      auto f = model::forward_full(w, b.prompts[0], o);
      res.logits.push_back(f.logits);
      res.mtp = f.mtp.logits;
    });
    return res;
  }
  const model::model_config& c = w.config;
  std::vector<std::unique_ptr<test::dense_cache>> caches;
  std::vector<std::vector<int32_t>> seqs = b.prompts;
  for (size_t i = 0; i < seqs.size(); ++i) caches.push_back(std::make_unique<test::dense_cache>(c, 8, model::min_ring_tokens(c) + 8));
  for (int s = 0; s < 2; ++s) {
    std::vector<model::forward_item> items;
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (s == 1) seqs[i].push_back(static_cast<int32_t>(7 + i));
      int64_t from = caches[i]->cache.computed;
      bool logits = s == 1 || b.logits[i];
      items.push_back({&caches[i]->cache, std::span<const int32_t>(seqs[i]).subspan(from), b.dec_from[i], 0,
                       logits, false, {}});
    }
    step([&] { res.logits.push_back(model::forward(w, items, o).logits); });
  }
  return res;
}

std::vector<rank_batch> batches_for(int32_t n, const model::model_config& c) {
  std::vector<rank_batch> out;
  for (int32_t r = 0; r < n; ++r) {
    rank_batch b;
    if (r == 1) {  // nothing at all this step: joins every slot empty
      out.push_back(b);
      continue;
    }
    if (r == 2) {  // forward + MTP in one step
      b.full = true;
      b.prompts = {test::random_tokens(40, 900)};
      out.push_back(b);
      continue;
    }
    for (int i = 0; i < 2 + r; ++i) {
      int64_t len = 20 + 13 * i + 5 * r;
      b.prompts.push_back(test::random_tokens(static_cast<size_t>(len), 500 + 10 * r + i));
      int64_t from = std::max<int64_t>(0, len - model::exact_decoder_tail(c));
      bool no_decoder = c.is_flash() && r == 3 && i == 0;  // no decoder rows for this one
      b.dec_from.push_back(no_decoder ? len : from);
      b.logits.push_back(!no_decoder);
    }
    out.push_back(b);
  }
  return out;
}

}  // namespace

TEST_CASE("ep forward: N ranks with different batches give the local path's logits bit for bit") {
  for (const char* preset : {"v3-tiny", "tiny"}) {
    auto w = test::tiny_model(preset);
    for (int32_t n : {2, 3, 4}) {
      CAPTURE(preset);
      CAPTURE(n);
      auto batches = batches_for(n, w->config);
      local_ep_hub hub(n, 10s);
      std::vector<rank_result> ep(static_cast<size_t>(n));
      std::vector<std::thread> threads;
      for (int32_t r = 0; r < n; ++r)
        threads.emplace_back([&, r] {
          runtime::ep_moe_exchange ex(w, *model::make_backend("cpu", w), {r, n}, hub.transport(r), true);
          if (batches[r].prompts.empty()) {  // idle rank: two empty lockstep steps
            for (int s = 0; s < 2; ++s) {
              ex.begin_step();
              if (auto e = ex.end_step(); !e) ep[r].error = e.error();
            }
            return;
          }
          ep[r] = run_batch(*w, batches[r], &ex);
          if (batches[r].full) {  // match the two steps of the others
            ex.begin_step();
            if (auto e = ex.end_step(); !e) ep[r].error = e.error();
          }
        });
      for (auto& t : threads) t.join();
      for (int32_t r = 0; r < n; ++r) {
        CAPTURE(r);
        CHECK(ep[r].error == "");
        if (batches[r].prompts.empty()) continue;
        rank_result local = run_batch(*w, batches[r], nullptr);
        REQUIRE(ep[r].logits.size() == local.logits.size());
        for (size_t s = 0; s < local.logits.size(); ++s) {
          REQUIRE(ep[r].logits[s].size() == local.logits[s].size());
          CHECK(std::memcmp(ep[r].logits[s].data(), local.logits[s].data(), local.logits[s].size() * 4) == 0);
        }
        CHECK(ep[r].mtp == local.mtp);
        if (batches[r].full) CHECK(!local.mtp.empty());
      }
    }
  }
}

TEST_CASE("ep placement: contiguous blocks, every expert on exactly one rank, replicas agree") {
  for (int32_t size : {1, 2, 3, 4, 5, 16, 20})
    for (int64_t E : {16, 17, 32}) {
      const auto p = runtime::ep_placement::contiguous(2, E, size);
      CHECK(p.epoch() == 0);
      std::vector<int32_t> owner(static_cast<size_t>(E), -1);
      for (int32_t r = 0; r < size; ++r) {
        auto mine = p.experts_of(1, r);
        CHECK(static_cast<int64_t>(mine.size()) == (r + 1) * E / size - r * E / size);
        for (int32_t e : mine) {
          CHECK(owner[e] == -1);
          owner[e] = r;
          CHECK(p.holds(1, r, e));
        }
      }
      for (int64_t e = 0; e < E; ++e) {
        CAPTURE(e);
        CHECK(owner[e] == ((e + 1) * size - 1) / E);  // the largest r with r·E/size ≤ e
        REQUIRE(p.replicas(0, e).size() == 1);
        CHECK(p.replicas(0, e)[0] == owner[e]);
        CHECK(p.replica_for(0, e, 3, 7) == owner[e]);
      }
    }
}


TEST_CASE("ep engines in lockstep sample what one engine samples, one rank idle, then 4 to 2 ranks") {
  for (const char* preset : {"tiny", "v3-tiny"}) {
    CAPTURE(preset);
    auto w = test::tiny_model(preset);
    local_ep_hub hub(4, 10s);
    std::vector<std::unique_ptr<engine>> engines;
    for (int32_t r = 0; r < 4; ++r) engines.push_back(std::make_unique<engine>(w, ep_config(hub, r)));
    serve_and_check(engines, 4, 1, 3, w);
    uint64_t steps = engines[0]->steps_started();
    CHECK(steps > 0);
    for (auto& e : engines) {
      CHECK(e->steps_started() == steps);  // the idle rank joined every step
      CHECK(e->last_error() == "");
      CHECK(e->stats().blocks_free == e->stats().blocks_total);
    }

    // The group shrinks to ranks 0 and 1: a new layout, the step counter restarts.
    local_ep_hub pair(2, 10s);
    for (int32_t r = 0; r < 2; ++r) {
      engines[r]->set_ep_group({r, 2}, pair.transport(r));
      CHECK(engines[r]->steps_started() == 0);
    }
    serve_and_check(engines, 2, 77, -1, w);
    CHECK(engines[0]->steps_started() == engines[1]->steps_started());
  }
}

TEST_CASE("ep partitioned weights: each rank reads only its own experts, reads more when the group shrinks, "
          "samples what full weights sample") {
  for (const char* preset : {"tiny", "v3-tiny"}) {
    CAPTURE(preset);
    const auto dir = std::filesystem::temp_directory_path() / (std::string("shoal_ep_partitioned_") + preset);
    std::filesystem::remove_all(dir);
    model::generate_options o;
    o.preset = preset, o.seed = 5, o.out_dir = dir.string();
    REQUIRE(model::generate_checkpoint(o).has_value());
    auto full = model::load_weights(dir.string());
    REQUIRE(full.has_value());
    auto full_w = std::make_shared<model::model_weights>(std::move(*full));
    const int64_t E = full_w->config.n_routed_experts, slots = model::moe_slot_count(full_w->config);
    REQUIRE(E >= 4);
    int64_t all_expert_bytes = 0;
    for (int64_t s = 0; s < slots; ++s)
      for (int64_t e = 0; e < E; ++e) {
        const auto& x = model::routed_expert_weights(*full_w, s, e);
        all_expert_bytes += static_cast<int64_t>(x.gate_up.bytes() + x.down.bytes());
      }

    // Four ranks as four processes: each its own weights, loaded without routed experts.
    model::load_options none;
    none.keep_routed_expert = [](int64_t, int64_t) { return false; };
    local_ep_hub hub(4, 10s);
    std::vector<std::shared_ptr<runtime::expert_residency>> held;
    std::vector<std::unique_ptr<engine>> engines;
    for (int32_t r = 0; r < 4; ++r) {
      auto part = model::load_weights(dir.string(), nullptr, none);
      REQUIRE(part.has_value());
      for (int64_t e = 0; e < E; ++e) CHECK(model::routed_expert_weights(*part, 0, e).gate_up.empty());
      auto w = std::make_shared<const model::model_weights>(std::move(*part));
      auto residency = runtime::expert_residency::open(dir.string(), w);
      REQUIRE(residency.has_value());
      CHECK((*residency)->resident_experts() == 0);
      engine_config c = ep_config(hub, r);
      c.experts = *residency;
      held.push_back(*residency);
      engines.push_back(std::make_unique<engine>(w, c));
    }
    serve_and_check(engines, 4, 3, 1, full_w);
    int64_t bytes = 0;
    for (int32_t r = 0; r < 4; ++r) {
      CAPTURE(r);
      CHECK(engines[r]->last_error() == "");
      const auto own = runtime::ep_placement::contiguous(slots, E, 4).experts_of(0, r);
      CHECK(held[r]->resident_experts() == slots * static_cast<int64_t>(own.size()));  // the idle rank 1 too
      bytes += held[r]->resident_bytes();
    }
    CHECK(bytes == all_expert_bytes);  // every expert once across the group

    // Ranks 2 and 3 leave: 0 and 1 take their experts, read from the checkpoint.
    local_ep_hub pair(2, 10s);
    for (int32_t r = 0; r < 2; ++r) engines[r]->set_ep_group({r, 2}, pair.transport(r));
    engines.resize(2);  // ranks 2 and 3 end: their residencies drop their experts
    CHECK(held[2]->resident_experts() == 0);
    serve_and_check(engines, 2, 41, -1, full_w);
    for (int32_t r = 0; r < 2; ++r) {
      const auto own = runtime::ep_placement::contiguous(slots, E, 2).experts_of(0, r);
      CHECK(held[r]->resident_experts() == slots * static_cast<int64_t>(own.size()));
    }
    CHECK(held[0]->resident_bytes() + held[1]->resident_bytes() == all_expert_bytes);
    std::filesystem::remove_all(dir);
  }
}

TEST_CASE("ep partitioned weights: an expert the checkpoint cannot give is an error naming its tensor, nothing half-read stays") {
  const auto dir = std::filesystem::temp_directory_path() / "shoal_ep_partitioned_bad";
  std::filesystem::remove_all(dir);
  model::generate_options o;
  o.preset = "v3-tiny", o.seed = 5, o.out_dir = dir.string();
  REQUIRE(model::generate_checkpoint(o).has_value());
  model::load_options none;
  none.keep_routed_expert = [](int64_t, int64_t) { return false; };
  auto part = model::load_weights(dir.string(), nullptr, none);
  REQUIRE(part.has_value());
  auto w = std::make_shared<const model::model_weights>(std::move(*part));
  // In the reader's place a checkpoint with the same config whose one file has routed expert
  // 0's gate of the wrong shape (and nothing else).
  const auto other = std::filesystem::temp_directory_path() / "shoal_ep_partitioned_other";
  std::filesystem::remove_all(other);
  std::filesystem::create_directories(other);
  std::filesystem::copy_file(dir / "config.json", other / "config.json");
  const model::model_config& c = w->config;
  const std::string gate =
    "model.layers." + std::to_string(c.first_k_dense_replace) + ".mlp.experts.0.gate_proj.weight";
  std::vector<float> values(static_cast<size_t>(c.moe_intermediate_size * (c.hidden_size + 1)), 0.5f);
  REQUIRE(model::write_safetensors((other / "model.safetensors").string(),
                                   {{gate, {c.moe_intermediate_size, c.hidden_size + 1}, values.data()}})
            .has_value());
  auto residency = runtime::expert_residency::open(other.string(), w);
  REQUIRE(residency.has_value());
  runtime::expert_residency::expert_set want(static_cast<size_t>(model::moe_slot_count(c)));
  want[0] = {0};
  (*residency)->wait_ready(want);  // the read, on the residency's thread, failed
  auto r = (*residency)->hold(nullptr, want);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().find("routed expert 0 of MoE slot 0") != std::string::npos);
  CAPTURE(r.error());
  CHECK(r.error().find(gate) != std::string::npos);
  CHECK((*residency)->resident_experts() == 0);  // nothing half-read stays
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(other);
}

namespace {

// Every MoE layer's gate bias (the MTP layer's too) raised for experts 0-3, expert group 0
// of v3-tiny: routing as skewed as a narrow domain's (a few hot experts, as in the ESFT
// traces), all of it landing on rank 0 under contiguous blocks.
void skew_routing(model::model_weights& w) {
  auto skew = [](model::ffn_weights& f) {
    for (size_t e = 0; e < 4 && f.moe && e < f.router_bias.size(); ++e) f.router_bias[e] += 0.25f;
  };
  for (auto& l : w.layers) skew(l.ffn);
  for (auto& m : w.mtp) skew(m.layer.ffn);
}

// Slowest rank / mean of the pairs each rank computed since `before`.
double rank_imbalance(const std::vector<std::unique_ptr<engine>>& engines, const std::vector<int64_t>& before) {
  std::vector<double> d;
  for (size_t r = 0; r < engines.size(); ++r)
    d.push_back(static_cast<double>(engines[r]->expert_exchange()->pairs_computed() - before[r]));
  double mean = 0;
  for (double x : d) mean += x / static_cast<double>(d.size());
  return *std::max_element(d.begin(), d.end()) / mean;
}

std::vector<int64_t> pairs_now(const std::vector<std::unique_ptr<engine>>& engines) {
  std::vector<int64_t> out;
  for (auto& e : engines) out.push_back(e->expert_exchange()->pairs_computed());
  return out;
}

}  // namespace

TEST_CASE("ep rebalance live: skewed routing, a new placement with redundant experts adopted mid-stream, "
          "outputs unchanged, imbalance down, each process holds only its ranks' experts, and when the other "
          "process is lost what it held is taken over from memory") {
  const auto dir = std::filesystem::temp_directory_path() / "shoal_ep_rebalance";
  std::filesystem::remove_all(dir);
  model::generate_options o;
  o.preset = "v3-tiny", o.seed = 9, o.out_dir = dir.string();
  REQUIRE(model::generate_checkpoint(o).has_value());
  auto full = model::load_weights(dir.string());
  REQUIRE(full.has_value());
  skew_routing(*full);
  auto full_w = std::make_shared<model::model_weights>(std::move(*full));
  const int64_t E = full_w->config.n_routed_experts, slots = model::moe_slot_count(full_w->config);

  // Two processes of two ranks each: one set of weights without routed experts and one
  // residency per process.
  model::load_options none;
  none.keep_routed_expert = [](int64_t, int64_t) { return false; };
  local_ep_hub hub(4, 10s);
  std::vector<std::shared_ptr<runtime::transport>> bulk;  // each process's libfabric shm endpoint
  std::vector<std::shared_ptr<runtime::expert_residency>> process;
  std::vector<std::unique_ptr<engine>> engines;
  for (int32_t p = 0; p < 2; ++p) {
    auto fabric = transport::fabric_transport::create({"shm", ""});
    REQUIRE_MESSAGE(fabric.has_value(), (fabric ? "" : fabric.error()));
    bulk.push_back(std::shared_ptr<runtime::transport>(std::move(*fabric)));
    auto part = model::load_weights(dir.string(), nullptr, none);
    REQUIRE(part.has_value());
    skew_routing(*part);
    auto w = std::make_shared<const model::model_weights>(std::move(*part));
    auto residency = runtime::expert_residency::open(dir.string(), w);
    REQUIRE(residency.has_value());
    process.push_back(*residency);
    for (int32_t r = 2 * p; r < 2 * p + 2; ++r) {
      engine_config c = ep_config(hub, r);
      c.ep->load_window_steps = 100;
      c.ep->bulk = bulk[p];
      c.experts = *residency;
      engines.push_back(std::make_unique<engine>(w, c));
    }
  }
  auto holds_exactly = [&](int32_t p, const ep_placement_ptr& place) {
    int64_t want = 0;
    for (int64_t s = 0; s < slots; ++s) {
      auto a = place->experts_of(s, 2 * p), b = place->experts_of(s, 2 * p + 1);
      std::vector<int32_t> both(a.begin(), a.end());
      both.insert(both.end(), b.begin(), b.end());
      std::sort(both.begin(), both.end());
      want += std::unique(both.begin(), both.end()) - both.begin();
    }
    CHECK(process[p]->resident_experts() == want);
  };

  // Before: contiguous blocks, everything hot on rank 0.
  auto start = pairs_now(engines);
  serve_and_check(engines, 4, 11, -1, full_w);
  const double before = rank_imbalance(engines, start);
  CHECK(before > 1.5);
  for (int32_t p = 0; p < 2; ++p) holds_exactly(p, engines[0]->expert_exchange()->placement());

  // The group's loads over the window (each rank counted the pairs of its own rows).
  std::vector<double> loads(static_cast<size_t>(slots * E), 0.0);
  for (auto& e : engines) {
    auto t = e->expert_exchange()->loads().totals();
    for (size_t i = 0; i < t.size(); ++i) loads[i] += t[i];
  }
  auto plan = runtime::plan_placement(loads, *engines[0]->expert_exchange()->placement(), {1, 100, 100, 1, 1});
  REQUIRE(plan.has_value());
  CHECK(plan->experts_moved > 0);
  auto next = std::make_shared<const runtime::ep_placement>(plan->placement);

  // Each process reads what it gains from the other's memory over shm (what the balancer
  // asks the holders for and hands to every rank with the offer).
  const auto migration = runtime::plan_migration(*engines[0]->expert_exchange()->placement(), *next, {0, 0, 1, 1});
  std::vector<std::vector<runtime::expert_part>> sources(2);
  for (const auto& lend : migration.lends) {
    auto parts = engines[lend.holder]->lend_experts(next->epoch(), lend.experts, 60s);
    REQUIRE_MESSAGE(parts.has_value(), (parts ? "" : parts.error().message));
    sources[1 - lend.holder / 2].insert(sources[1 - lend.holder / 2].end(), parts->begin(), parts->end());
  }
  CHECK(!sources[0].empty());
  const int64_t from_checkpoint[2] = {process[0]->migration().checkpoint_experts,
                                      process[1]->migration().checkpoint_experts};

  // During: offered at each rank's third step with requests mid-stream; the switch happens at
  // a step boundary agreed in the frames, and every token stays what one engine samples.
  serve_and_check(engines, 4, 12, -1, full_w, [&](size_t r, int step) {
    if (step == 2) CHECK(engines[r]->offer_placement(next, sources[r / 2]).has_value());
    if (step == 3) {  // one offer at a time
      auto again = engines[r]->offer_placement(next);
      REQUIRE_FALSE(again.has_value());
      CHECK(again.error().code == runtime::errc::refused);  // the first is still being adopted
      CHECK(again.error().message.find("epoch 1") != std::string::npos);
    }
  });
  for (auto& e : engines) {
    CHECK(e->last_error() == "");
    CHECK(e->expert_exchange()->switches() == 1);
    CHECK(e->expert_exchange()->placement()->epoch() == 1);
    CHECK(e->expert_exchange()->offered() == nullptr);
  }
  for (int32_t p = 0; p < 2; ++p) {
    holds_exactly(p, next);  // the old-only experts were dropped
    const auto m = process[p]->migration();
    INFO(m.last_failure);
    CHECK(m.fetched_experts == static_cast<int64_t>(migration.gains[p].size()));  // every gain from the holder
    CHECK(m.checkpoint_experts == from_checkpoint[p]);
    CHECK(m.fetch_failures == 0);
  }

  // After: the same skew spread over the replicas.
  start = pairs_now(engines);
  serve_and_check(engines, 4, 13, -1, full_w);
  const double after = rank_imbalance(engines, start);
  MESSAGE("slowest rank / mean: " << before << " before, " << after << " after");
  CHECK(after < before);
  CHECK(after < 1.35);

  // A group change aborts an offered plan.
  auto again = runtime::plan_placement(loads, *next, {1, 100, 100, 1, 1});
  REQUIRE(again.has_value());
  auto third = std::make_shared<const runtime::ep_placement>(again->placement);
  REQUIRE(engines[0]->offer_placement(third).has_value());
  // Process 1 is lost. What process 0 holds under `next`: its ranks' experts, redundant copies
  // of process 1's hot experts among them.
  std::set<std::pair<int64_t, int32_t>> held0, held1;
  for (int64_t s = 0; s < slots; ++s)
    for (int32_t r = 0; r < 4; ++r)
      for (int32_t e : next->experts_of(s, r)) (r < 2 ? held0 : held1).insert({s, e});
  int64_t copies = 0, not_held = 0;  // process 1's experts process 0 holds a copy of; those it does not hold
  for (const auto& x : held1) copies += held0.contains(x);
  for (int64_t s = 0; s < slots; ++s)
    for (int32_t e = 0; e < E; ++e) not_held += !held0.contains({s, e});
  CHECK(copies > 0);
  const auto moved_before = process[0]->migration();
  local_ep_hub pair(2, 10s);
  SUBCASE("the survivors bring their placement: they keep it, the lost process's only copies come from the checkpoint") {
    for (int32_t r = 0; r < 2; ++r) engines[r]->set_ep_group({r, 2}, pair.transport(r), {0, 1, -1, -1});
    CHECK(engines[0]->expert_exchange()->offered() == nullptr);
    engines.resize(2);
    serve_and_check(engines, 2, 14, -1, full_w);
    const auto& agreed = engines[0]->expert_exchange()->placement();
    CHECK(engines[1]->expert_exchange()->placement()->same_experts(*agreed));
    CHECK(agreed->epoch() == next->epoch() + 1);
    holds_exactly(0, agreed);
    for (int64_t s = 0; s < slots; ++s)
      for (int32_t r = 0; r < 2; ++r)
        for (int32_t e : next->experts_of(s, r)) CHECK(agreed->holds(s, r, e));  // no survivor lost an expert
    CHECK(engines[0]->stats().regroup_orphans == not_held);
    const auto moved = process[0]->migration();
    MESSAGE("re-formed over process 0: " << copies << " redundant copies of the lost process's experts kept, "
                                         << moved.checkpoint_experts - moved_before.checkpoint_experts
                                         << " from the checkpoint, " << moved.kept_experts - moved_before.kept_experts
                                         << " moved between its ranks");
    CHECK(moved.kept_experts == moved_before.kept_experts);  // nothing moved
    CHECK(moved.checkpoint_experts - moved_before.checkpoint_experts == not_held);
    CHECK(moved.fetched_experts == moved_before.fetched_experts);
  }
  SUBCASE("ranks that bring no placement: contiguous blocks, what the process holds taken over from memory") {
    for (int32_t r = 0; r < 2; ++r) engines[r]->set_ep_group({r, 2}, pair.transport(r));
    CHECK(engines[0]->expert_exchange()->offered() == nullptr);
    engines.resize(2);
    serve_and_check(engines, 2, 14, -1, full_w);
    CHECK(engines[0]->expert_exchange()->placement()->epoch() == 0);
    holds_exactly(0, engines[0]->expert_exchange()->placement());
    CHECK(process[1]->resident_experts() == 0);
    const auto fresh = runtime::ep_placement::contiguous(slots, E, 2);
    int64_t from_memory = 0;
    for (int64_t s = 0; s < slots; ++s)
      for (int32_t r = 0; r < 2; ++r)
        for (int32_t e : fresh.experts_of(s, r)) from_memory += !next->holds(s, r, e) && held0.contains({s, e});
    const auto moved = process[0]->migration();
    CHECK(moved.kept_experts - moved_before.kept_experts == from_memory);
    CHECK(moved.checkpoint_experts - moved_before.checkpoint_experts == not_held);
    CHECK(moved.fetched_experts == moved_before.fetched_experts);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("ep failure: a lost or silent rank fails its peers' steps twice in one group, their requests end, survivors regroup") {
  auto w = test::tiny_model("v3-tiny");
  for (bool silent : {false, true}) {
    CAPTURE(silent);
    local_ep_hub hub(4, silent ? 300ms : 5s);
    std::vector<std::unique_ptr<engine>> engines;
    std::vector<std::vector<job>> jobs;
    std::vector<std::map<int64_t, size_t>> ids;
    for (int32_t r = 0; r < 4; ++r) {
      engines.push_back(std::make_unique<engine>(w, ep_config(hub, r)));
      jobs.push_back(jobs_for(r, 5, -1));
      for (auto& j : jobs[r]) j.params.max_tokens = 40;
      ids.push_back(add_jobs(*engines[r], jobs[r]));
    }
    std::vector<std::vector<token_event>> events(3);
    auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (int32_t r = 0; r < 4; ++r)
      threads.emplace_back([&, r] {
        if (r == 3) {  // three steps, then lost (fail) or gone quiet
          for (int s = 0; s < 3; ++s) engines[r]->step();
          if (!silent) hub.fail(3);
          return;
        }
        for (int s = 0; s < 1000 && engines[r]->has_work(); ++s)
          for (auto& ev : engines[r]->step()) events[r].push_back(std::move(ev));
      });
    for (auto& t : threads) t.join();
    CHECK(std::chrono::steady_clock::now() - t0 < 30s);
    for (int32_t r = 0; r < 3; ++r) {
      CAPTURE(r);
      int errors = 0;
      for (auto& ev : events[r])
        if (ev.finished) {
          CHECK(ev.reason == runtime::finish_reason::error);
          CHECK(ev.token == -1);
          ++errors;
        }
      CHECK(errors == 3);
      CHECK(engines[r]->stats().failed_steps >= 1);
      CHECK(engines[r]->last_error().find(silent ? "timed out" : "rank 3 lost") != std::string::npos);
      CHECK(engines[r]->stats().blocks_free == engines[r]->stats().blocks_total);
      CHECK_FALSE(engines[r]->has_work());
    }
    // Survivors 0…2 regroup and compute exactly again.
    local_ep_hub trio(3, 10s);
    jobs.clear();
    ids.clear();
    for (int32_t r = 0; r < 3; ++r) {
      engines[r]->set_ep_group({r, 3}, trio.transport(r));
      jobs.push_back(jobs_for(r, 9, -1));
      ids.push_back(add_jobs(*engines[r], jobs[r]));
    }
    auto after = run_lockstep({engines[0].get(), engines[1].get(), engines[2].get()});
    check_against(after, ids, reference(w, jobs));
  }
}

TEST_CASE("ep failure: the failed step's requests stay and the re-formed group computes them exactly") {
  // Nothing of a failed step is committed, and what it wrote past `computed` is written again
  // (deepseek_v3: by position; shoal_flash: decode steps within the ring's slack): after rank
  // 3 is lost, each survivor's step in flight fails once, its requests stay (none ends with an
  // error), and the group of the three survivors computes them on, token for token and logit
  // for logit the single engine's.
  for (const char* preset : {"v3-tiny", "tiny"}) {
    CAPTURE(preset);
    auto w = test::tiny_model(preset);
    local_ep_hub hub(4, 5s);
    std::vector<std::unique_ptr<engine>> engines;
    std::vector<std::vector<job>> jobs;
    std::vector<std::map<int64_t, size_t>> ids;
    std::vector<std::vector<std::string>> notices(4);  // each written by its engine's thread only
    for (int32_t r = 0; r < 4; ++r) {
      auto c = ep_config(hub, r);
      c.ep->notice = [&notices, r](const std::string& line) { notices[r].push_back(line); };
      engines.push_back(std::make_unique<engine>(w, c));
      jobs.push_back(jobs_for(r, 21, -1));
      for (auto& j : jobs[r]) j.params.max_tokens = 30;
      ids.push_back(add_jobs(*engines[r], jobs[r]));
    }
    std::vector<std::vector<token_event>> events(3);
    std::vector<std::thread> threads;
    for (int32_t r = 0; r < 4; ++r)
      threads.emplace_back([&, r] {
        if (r == 3) {  // three steps, then lost
          for (int s = 0; s < 3; ++s) engines[r]->step();
          hub.fail(3);
          return;
        }
        for (int s = 0; s < 1000 && engines[r]->stats().recomputed_steps == 0; ++s)
          for (auto& ev : engines[r]->step()) events[r].push_back(std::move(ev));
      });
    for (auto& t : threads) t.join();
    for (int32_t r = 0; r < 3; ++r) {
      CAPTURE(r);
      CHECK(engines[r]->stats().recomputed_steps == 1);
      CHECK(engines[r]->last_error().find("rank 3 lost") != std::string::npos);
      CHECK(engines[r]->has_work());
      for (const auto& ev : events[r]) CHECK(ev.reason != runtime::finish_reason::error);
    }
    local_ep_hub trio(3, 10s);
    for (int32_t r = 0; r < 3; ++r) engines[r]->set_ep_group({r, 3}, trio.transport(r));
    auto after = run_lockstep({engines[0].get(), engines[1].get(), engines[2].get()});
    for (int32_t r = 0; r < 3; ++r) {
      events[r].insert(events[r].end(), after[r].begin(), after[r].end());
      CHECK(engines[r]->stats().recomputed_steps == 1);
      // The node log's lines: the failure once (with why), the new group, its placement, the recovery.
      std::string all;
      for (const auto& line : notices[r]) all += line + "\n";
      INFO(all);
      REQUIRE(notices[r].size() == 5);
      CHECK(notices[r][0].find("EP rank " + std::to_string(r) + "/4 (step 0): placement agreed: epoch 0") == 0);
      CHECK(notices[r][1].find("EP rank " + std::to_string(r) + "/4") == 0);
      CHECK(notices[r][1].find("step failed: ") != std::string::npos);
      CHECK(notices[r][1].find("rank 3 lost") != std::string::npos);
      CHECK(notices[r][2].find("EP rank " + std::to_string(r) + "/3 (step 0): adopted a group of 3 rank(s)") == 0);
      CHECK(notices[r][3].find("placement agreed: epoch 0") != std::string::npos);
      CHECK(notices[r][4].find("steps succeed again, after 1 failed") != std::string::npos);
    }
    jobs.resize(3);
    ids.resize(3);
    check_against(events, ids, reference(w, jobs));
  }
}

namespace {

// A transport that hands each incoming dispatch frame to `corrupt` first (group of one).
struct corrupting_transport final : runtime::expert_transport {
  std::shared_ptr<runtime::expert_transport> inner;
  std::function<void(std::vector<uint8_t>&)> corrupt;
  std::expected<runtime::ep_payloads, std::string> exchange(uint64_t step, int32_t slot, int32_t phase,
                                                            runtime::ep_payloads out) override {
    auto in = inner->exchange(step, slot, phase, std::move(out));
    if (in && phase == 0)
      for (auto& p : *in) corrupt(p);
    return in;
  }
};

}  // namespace

TEST_CASE("ep frames: bad bytes are errors naming what is wrong") {
  // rank 1 of 4 computes experts [4, 8) of 16 in every slot
  const auto place = runtime::ep_placement::contiguous(3, 16, 4);
  runtime::dispatch_frame f;
  f.step = 7, f.slot = 2, f.source = 3, f.hidden = 8, f.rows = 2;
  f.xn.assign(16, 0.5f);
  f.pair_row = {0, 1, 1};
  f.pair_expert = {4, 5, 7};
  auto good = runtime::encode_dispatch(f);
  auto decode = [&](const std::vector<uint8_t>& b, int64_t hidden = 8, uint64_t step = 7) {
    return runtime::decode_dispatch(b, step, 2, 3, place, 1, hidden, 4);
  };
  auto round = decode(good);
  REQUIRE(round.has_value());
  CHECK(round->xn == f.xn);
  CHECK(round->pair_expert == f.pair_expert);
  auto expect_error = [](const auto& r, const char* needle) {
    REQUIRE_FALSE(r.has_value());
    CAPTURE(r.error());
    CHECK(r.error().find(needle) != std::string::npos);
  };
  for (size_t cut : {size_t(0), size_t(1), size_t(12), good.size() / 2, good.size() - 1}) {
    CAPTURE(cut);
    auto r = decode(std::vector<uint8_t>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(cut)));
    expect_error(r, cut == 0 ? "empty" : "not valid msgpack");
  }
  expect_error(decode(good, 16), "hidden size");
  expect_error(decode(good, 8, 8), "step");
  auto trailing = good;
  trailing.push_back(0xc0);
  expect_error(decode(trailing), "trailing");
  {
    auto foreign = f;
    foreign.pair_expert[1] = 9;
    expect_error(decode(runtime::encode_dispatch(foreign)), "expert 9 is not computed by rank 1 in slot 2");
    foreign.pair_expert[1] = -3;
    expect_error(decode(runtime::encode_dispatch(foreign)), "expert -3");
    auto bad_row = f;
    bad_row.pair_row[2] = 2;
    expect_error(decode(runtime::encode_dispatch(bad_row)), "row 2 outside");
    auto other_epoch = f;  // routed by a placement the receiver is not on
    other_epoch.epoch = other_epoch.ready = 1;
    expect_error(decode(runtime::encode_dispatch(other_epoch)), "field 7 (epoch) is 1, expected 0");
    auto too_ready = f;
    too_ready.ready = 2;
    expect_error(decode(runtime::encode_dispatch(too_ready)), "field 8 (ready) is 2, above the limit 1");
    auto ready = f;
    ready.ready = 1;
    CHECK(decode(runtime::encode_dispatch(ready)).value().ready == 1);
  }
  {
    std::mt19937 rng(3);
    for (int i = 0; i < 200; ++i) {  // garbage: never a crash, always an error
      std::vector<uint8_t> junk(rng() % 200);
      for (auto& b : junk) b = static_cast<uint8_t>(rng());
      CHECK_FALSE(decode(junk).has_value());
    }
    auto flipped = good;  // a bin length pointing past the end
    for (size_t i = 0; i + 2 < flipped.size(); ++i)
      if (flipped[i] == 0xc4 && flipped[i + 1] == 64) flipped[i + 1] = 200;
    CHECK_FALSE(decode(flipped).has_value());
  }
  std::vector<float> out(24, 1.0f);
  auto comb = runtime::encode_combine(7, 2, 1, 8, out.data(), 3);
  CHECK(runtime::decode_combine(comb, 7, 2, 1, 8, 3).value() == out);
  expect_error(runtime::decode_combine(comb, 7, 2, 1, 8, 2), "pairs");
  expect_error(runtime::decode_combine(comb, 7, 2, 0, 8, 3), "source rank");
  expect_error(runtime::decode_combine(good, 7, 2, 3, 8, 3), "fields");

  // Through the engine: a corrupted frame fails the step with the decoder's message; a
  // second failure in the same group ends the request.
  auto w = test::tiny_model("v3-tiny");
  local_ep_hub hub(1, 5s);
  for (auto [name, corrupt] :
       std::vector<std::pair<const char*, std::function<void(std::vector<uint8_t>&)>>>{
           {"not valid msgpack", [](std::vector<uint8_t>& b) { b.resize(b.size() / 2); }},
           {"is not a msgpack array", [](std::vector<uint8_t>& b) { b.assign(1, 0x05); }}}) {
    CAPTURE(name);
    auto t = std::make_shared<corrupting_transport>();
    t->inner = hub.transport(0);
    t->corrupt = corrupt;
    engine_config cfg = base_config();
    cfg.ep = engine_config::ep_config{};
    cfg.ep->transport = t;
    engine e(w, cfg);
    auto id = e.add_request(test::random_tokens(20, 1), jobs_for(0, 1, -1)[0].params);
    CHECK(e.step().empty());  // kept once, for a group that may re-form
    CHECK(e.stats().recomputed_steps == 1);
    auto events = e.step();  // the same group fails it again: it ends
    REQUIRE(events.size() == 1);
    CHECK(events[0].id == *id);
    CHECK(events[0].reason == runtime::finish_reason::error);
    CHECK(e.last_error().find(name) != std::string::npos);
    CHECK(e.stats().blocks_free == e.stats().blocks_total);
  }
}
