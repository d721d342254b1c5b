#include "sim/campaign.hpp"

#include <fmt/format.h>

namespace shoal::sim {

namespace {

// Prompts open with one of five shared two-block prefixes (hash ids shared across requests),
// so the storage tier has blocks to serve, to lose to a full disk and to damage.
std::vector<sim_request> campaign_work() {
  std::vector<sim_request> w;
  for (int64_t i = 0; i < 48; ++i) {
    sim_request r;
    r.id = i;
    r.arrival_s = 0.25 * static_cast<double>(i);
    r.input_len = 600 + (i * 7919) % 3000;
    r.output_len = 30 + (i * 104729) % 150;
    r.hash_block = 512;
    for (int64_t b = 0; b * 512 < r.input_len; ++b) r.hash_ids.push_back(b < 2 ? (i % 5) * 100 + b : 100000 + i * 64 + b);
    w.push_back(r);
  }
  return w;
}

}  // namespace

std::expected<fault_campaign, std::string> make_fault_campaign(const std::string& profile_path, uint64_t seed,
                                                               planted_bug bug) {
  auto prof = load_profile(profile_path);
  if (!prof) return std::unexpected(prof.error());
  fault_campaign fc;
  fc.config.prof = *prof;
  fc.config.prof.step_noise = 0.05;
  fc.config.prefill_ranks = 4, fc.config.prefill_ep = 2, fc.config.decode_ranks = 4, fc.config.decode_ep = 2;
  fc.config.seed = seed;
  fc.config.prefill_balancer.round_s = 2;
  fc.config.faults.enabled = true;
  fc.config.faults.planted = bug;
  fc.work = campaign_work();
  fc.policy = *policy_named("shoal");
  return fc;
}

std::expected<planted_bug, std::string> planted_bug_named(const std::string& name) {
  if (name == "none") return planted_bug::none;
  if (name == "place_on_dead") return planted_bug::place_on_dead;
  if (name == "skip_checksum") return planted_bug::skip_checksum;
  if (name == "repeat_tokens") return planted_bug::repeat_tokens;
  if (name == "lease_never_expires") return planted_bug::lease_never_expires;
  if (name == "route_to_lost") return planted_bug::route_to_lost;
  return std::unexpected("unknown planted bug '" + name +
                         "' (none, place_on_dead, skip_checksum, repeat_tokens, lease_never_expires, route_to_lost)");
}

std::string describe_faults(uint64_t seed, const fault_outcome& f) {
  std::string s = fmt::format("seed {}: {}", seed, f.ok() ? "ok" : "FAILED");
  for (const auto& v : f.violations) s += "; " + v;
  s += "; faults:";
  for (const auto& e : f.schedule) {
    if (e.kind == fault_kind::corrupt)
      s += fmt::format(" corrupt({} chunks at {:.2f} s)", e.factor, e.start_s);
    else if (e.kind == fault_kind::disk_full)
      s += fmt::format(" disk_full(at {:.2f} s for {:.2f} s)", e.start_s, e.duration_s);
    else if (e.kind == fault_kind::rank_crash || e.kind == fault_kind::rank_hang)
      s += fmt::format(" {}(group {} rank {} at {:.2f} s for {:.2f} s{})", fault_kind_name(e.kind), e.group, e.rank, e.start_s,
                       e.duration_s, e.skipped ? ", skipped: its group's last rank" : "");
    else if (e.kind == fault_kind::slow)
      s += fmt::format(" slow(group {} x{:.1f} at {:.2f} s for {:.2f} s)", e.group, e.factor, e.start_s, e.duration_s);
    else
      s += fmt::format(" {}(group {} at {:.2f} s for {:.2f} s)", fault_kind_name(e.kind), e.group, e.start_s, e.duration_s);
  }
  return s;
}

}  // namespace shoal::sim
