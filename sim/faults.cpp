#include "sim/faults.hpp"

#include <algorithm>
#include <random>

namespace shoal::sim {

const char* fault_kind_name(fault_kind k) {
  switch (k) {
    case fault_kind::crash: return "crash";
    case fault_kind::hang: return "hang";
    case fault_kind::partition: return "partition";
    case fault_kind::slow: return "slow";
    case fault_kind::disk_full: return "disk_full";
    case fault_kind::corrupt: return "corrupt";
    case fault_kind::rank_crash: return "rank_crash";
    case fault_kind::rank_hang: return "rank_hang";
  }
  return "?";
}

runtime::fault_plan fault_options::default_messages() {
  runtime::fault_plan p;
  p[runtime::fault_point::kv_handoff] = 0.03;
  p[runtime::fault_point::kv_handoff_delay] = 0.05;
  p[runtime::fault_point::message_dup] = 0.03;
  p[runtime::fault_point::disk_full] = 0.01;
  p[runtime::fault_point::storage_corrupt] = 0.01;
  return p;
}

std::vector<fault_event> make_fault_schedule(uint64_t seed, int count, double span_s, std::span<const int32_t> group_sizes,
                                             int rank_faults) {
  const auto groups = static_cast<int32_t>(group_sizes.size());
  // Raw 64-bit draws turned into doubles here (not std::uniform_real_distribution, whose
  // output is the library's choice), so a seed names the same schedule everywhere.
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + 0xfa017ull);
  auto u = [&] { return static_cast<double>(rng() >> 11) * 0x1.0p-53; };
  auto between = [&](double lo, double hi) { return lo + (hi - lo) * u(); };
  std::vector<fault_event> out;
  const double span = std::max(span_s, 1.0);
  for (int i = 0; i < count; ++i) {
    fault_event f;
    f.kind = static_cast<fault_kind>(rng() % 6);
    f.group = groups > 0 ? static_cast<int32_t>(rng() % static_cast<uint64_t>(groups)) : -1;
    f.start_s = between(0.02, 0.8) * span;
    switch (f.kind) {
      case fault_kind::crash: f.duration_s = between(0.5, 6); break;
      case fault_kind::hang: f.duration_s = between(0.2, 6); break;  // beyond detect_s: declared down
      case fault_kind::partition: f.duration_s = between(1, 8); break;
      case fault_kind::slow: f.duration_s = between(2, 10), f.factor = between(2, 6); break;
      case fault_kind::disk_full: f.group = -1, f.duration_s = between(2, 15); break;
      case fault_kind::corrupt: f.group = -1, f.factor = static_cast<double>(1 + rng() % 20); break;
      case fault_kind::rank_crash:
      case fault_kind::rank_hang: break;  // drawn below
    }
    out.push_back(f);
  }
  std::vector<int32_t> wide;  // groups a rank fault can hit
  for (int32_t g = 0; g < groups; ++g)
    if (group_sizes[static_cast<size_t>(g)] >= 2) wide.push_back(g);
  for (int i = 0; i < rank_faults && !wide.empty(); ++i) {
    fault_event f;
    f.kind = rng() % 2 ? fault_kind::rank_hang : fault_kind::rank_crash;
    f.group = wide[rng() % wide.size()];
    f.rank = static_cast<int32_t>(rng() % static_cast<uint64_t>(group_sizes[static_cast<size_t>(f.group)]));
    f.start_s = between(0.02, 0.8) * span;
    f.duration_s = f.kind == fault_kind::rank_crash ? between(0.5, 6) : between(0.2, 6);
    out.push_back(f);
  }
  std::stable_sort(out.begin(), out.end(), [](const fault_event& a, const fault_event& b) { return a.start_s < b.start_s; });
  return out;
}

}  // namespace shoal::sim
