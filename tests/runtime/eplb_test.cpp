// EPLB placement against DeepSeek's: the EPLB README example exactly, and on the real ESFT
// routing counts (../shared/traces/esft-expert-routing) the per-GPU max/mean load of every
// layer that deepseek-ai/EPLB computed (eplb_golden.json), for the hierarchical and the global
// policy; placements may differ only where loads tie.
#include <doctest/doctest.h>

#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "runtime/placement/eplb.hpp"

using namespace shoal::runtime;
using json = nlohmann::json;

namespace {

const std::string esft = std::string(SHOAL_SHARED_DIR) + "/traces/esft-expert-routing";

json golden() {
  std::ifstream f(esft + "/eplb_golden.json");
  REQUIRE(f.good());
  return json::parse(f);
}

// token_counts.csv: header, then one row per MoE layer: layer, 64 counts.
std::vector<double> token_counts(const std::string& task, int64_t& layers) {
  std::ifstream f(esft + "/" + task + "/token_counts.csv");
  REQUIRE(f.good());
  std::string line;
  std::getline(f, line);
  std::vector<double> w;
  layers = 0;
  while (std::getline(f, line)) {
    std::stringstream s(line);
    std::string cell;
    std::getline(s, cell, ',');
    while (std::getline(s, cell, ',')) w.push_back(std::stod(cell));
    ++layers;
  }
  return w;
}

template <class T>
std::vector<T> flat(const json& j) {
  std::vector<T> out;
  for (const auto& r : j)
    for (const auto& v : r) {
      if (v.is_array())
        for (const auto& x : v) out.push_back(x.get<T>());
      else
        out.push_back(v.get<T>());
    }
  return out;
}

}  // namespace

TEST_CASE("eplb: the EPLB README example, exactly") {
  const json g = golden()["readme_example"];
  const auto w = flat<double>(g["weight"]);
  eplb_shape sh{2, 12, 16, 4, 2, 8};
  auto p = rebalance_experts(w, sh);
  REQUIRE_MESSAGE(p, p.error());
  CHECK(p->hierarchical);
  CHECK(p->phy2log == flat<int32_t>(g["phy2log"]));
  CHECK(p->logcnt == flat<int32_t>(g["logcnt"]));
  CHECK(p->max_replicas == 2);
  CHECK(p->log2phy == flat<int32_t>(g["log2phy"]));
}

TEST_CASE("eplb: on ESFT routing, every layer's GPU max/mean equals deepseek-ai/EPLB's, hierarchical and global") {
  const json g = golden();
  int compared = 0, same_placement = 0, layers_total = 0;
  for (const char* task : {"intent", "law", "summary", "translation"}) {
    int64_t layers = 0;
    const auto w = token_counts(task, layers);
    REQUIRE(layers == 26);
    for (const char* cfg : {"hier_r80_g8_n2_gpu8", "global_r80_g1_n2_gpu8", "global_r72_g1_n1_gpu8"}) {
      const json& e = g[std::string(task) + "/" + cfg];
      eplb_shape sh{layers, 64, e["num_replicas"].get<int64_t>(), e["num_groups"].get<int64_t>(),
                    e["num_nodes"].get<int64_t>(), e["num_gpus"].get<int64_t>()};
      auto p = rebalance_experts(w, sh);
      REQUIRE_MESSAGE(p, p.error());
      CHECK(p->hierarchical == (sh.groups % sh.nodes == 0));  // one group on one node: the two policies agree
      const auto before = gpu_max_over_mean(w, sh, nullptr), after = gpu_max_over_mean(w, sh, &*p);
      const auto want_phy = flat<int32_t>(e["phy2log"]);
      for (int64_t l = 0; l < layers; ++l) {
        CAPTURE(task);
        CAPTURE(cfg);
        CAPTURE(l);
        CHECK(before[l] == doctest::Approx(e["gpu_max_over_mean_before"][l].get<double>()).epsilon(1e-9));
        CHECK(after[l] == doctest::Approx(e["gpu_max_over_mean_after"][l].get<double>()).epsilon(1e-6));
        same_placement += std::equal(p->phy2log.begin() + l * sh.physical, p->phy2log.begin() + (l + 1) * sh.physical,
                                     want_phy.begin() + l * sh.physical);
        ++layers_total;
      }
      // Every logical expert keeps at least one slot, and each slot's replica is listed.
      for (int64_t l = 0; l < layers; ++l)
        for (int64_t x = 0; x < 64; ++x) {
          const int32_t n = p->logcnt[l * 64 + x];
          REQUIRE(n >= 1);
          for (int32_t r = 0; r < n; ++r) {
            const int32_t s = p->log2phy[(l * 64 + x) * p->max_replicas + r];
            REQUIRE(s >= 0);
            CHECK(p->phy2log[l * sh.physical + s] == x);
          }
        }
      ++compared;
    }
  }
  CHECK(compared == 12);
  MESSAGE(same_placement << " of " << layers_total << " layers place every slot as EPLB does (the rest differ on tied loads)");
}

TEST_CASE("eplb: shapes it cannot place are refused, naming the rule") {
  std::vector<double> w(12, 1.0);
  CHECK(rebalance_experts(w, {1, 12, 10, 4, 2, 8}).error().find("physical") != std::string::npos);
  CHECK(rebalance_experts(w, {1, 12, 16, 5, 1, 8}).error().find("groups") != std::string::npos);
  CHECK(rebalance_experts(w, {1, 12, 16, 4, 3, 8}).error().find("multiple of the nodes") != std::string::npos);
  CHECK(rebalance_experts(w, {2, 12, 16, 4, 2, 8}).error().find("loads") != std::string::npos);
}

TEST_CASE("eplb: the refined placement is never worse than EPLB's on any layer, and moves fewer experts from a running one") {
  // A DeepSeek-V2-Lite routed expert (the ESFT model): gate, up and down of 2048 × 1408, bf16.
  const double expert_bytes = 3.0 * 2048 * 1408 * 2;
  const json g = golden();
  std::map<std::string, std::vector<double>> loads;
  for (const char* task : {"intent", "law", "summary", "translation"}) {
    int64_t layers = 0;
    loads[task] = token_counts(task, layers);
  }
  for (const char* cfg : {"hier_r80_g8_n2_gpu8", "global_r80_g1_n2_gpu8", "global_r72_g1_n1_gpu8"}) {
    const json& e = g[std::string("intent/") + cfg];
    eplb_shape sh{26, 64, e["num_replicas"].get<int64_t>(), e["num_groups"].get<int64_t>(), e["num_nodes"].get<int64_t>(),
                  e["num_gpus"].get<int64_t>()};
    double sum_eplb = 0, sum_refined = 0;
    int64_t moved_eplb = 0, moved_refined = 0;
    const char* prev_task = "translation";
    for (const char* task : {"intent", "law", "summary", "translation"}) {
      const auto& w = loads[task];
      auto p = rebalance_experts(w, sh);
      REQUIRE(p);
      // The placement running before: EPLB's for the previous task's load.
      auto prev = rebalance_experts(loads[prev_task], sh);
      REQUIRE(prev);
      auto r = refine_placement(w, *p, &*prev);
      const auto a = gpu_max_over_mean(w, sh, &*p), b = gpu_max_over_mean(w, sh, &r.plan);
      for (int64_t l = 0; l < 26; ++l) {
        CAPTURE(task);
        CAPTURE(cfg);
        CAPTURE(l);
        CHECK(b[l] <= a[l] + 1e-12);
        sum_eplb += a[l], sum_refined += b[l];
        // The same replicas (counts per expert), and under the hierarchical policy the same
        // experts on each node.
        for (int64_t x = 0; x < 64; ++x) {
          int64_t n = 0;
          for (int64_t s = 0; s < sh.physical; ++s) n += r.plan.phy2log[l * sh.physical + s] == x;
          CHECK(n == p->logcnt[l * 64 + x]);
        }
        if (p->hierarchical) {
          const int64_t half = sh.physical / sh.nodes;
          for (int64_t node = 0; node < sh.nodes; ++node) {
            std::vector<int32_t> x(p->phy2log.begin() + l * sh.physical + node * half,
                                   p->phy2log.begin() + l * sh.physical + (node + 1) * half);
            std::vector<int32_t> y(r.plan.phy2log.begin() + l * sh.physical + node * half,
                                   r.plan.phy2log.begin() + l * sh.physical + (node + 1) * half);
            std::sort(x.begin(), x.end());
            std::sort(y.begin(), y.end());
            CHECK(x == y);
          }
        }
      }
      for (int64_t m : experts_moved(*prev, *p)) moved_eplb += m;
      for (int64_t m : r.moved) moved_refined += m;
      prev_task = task;
    }
    CHECK(sum_refined <= sum_eplb);
    CHECK(moved_refined <= moved_eplb);
    MESSAGE(std::string(cfg) << ": mean GPU max/mean EPLB " << sum_eplb / 104 << ", refined " << sum_refined / 104
                << "; from the previous task's placement EPLB moves " << moved_eplb << " expert weights ("
                << moved_eplb * expert_bytes / 1e9 << " GB), refined " << moved_refined << " ("
                << moved_refined * expert_bytes / 1e9 << " GB)");
  }
}
