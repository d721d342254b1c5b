#include "runtime/base/fault_points.hpp"

#include <charconv>
#include <mutex>
#include <vector>

namespace shoal::runtime {

namespace {

constexpr std::array<const char*, fault_point_count> names = {
    "storage_read", "storage_write", "disk_full",        "storage_corrupt",  "kv_handoff",
    "swa_fetch",    "balancer_message", "kv_handoff_delay", "message_dup"};

// SplitMix64's finaliser: a bijection of 64 bits with full avalanche.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::atomic<fault_injector*> current{nullptr};
std::mutex installed_mutex;
// Every injector installed stays alive until exit: a thread may still hold the previous one.
std::vector<std::unique_ptr<fault_injector>>& installed() {
  static std::vector<std::unique_ptr<fault_injector>> v;
  return v;
}

}  // namespace

const char* fault_point_name(fault_point p) {
  const auto i = static_cast<size_t>(p);
  return i < names.size() ? names[i] : "?";
}

bool fault_point_in_daemons(fault_point p) {
  return p != fault_point::kv_handoff_delay && p != fault_point::message_dup;
}

std::optional<fault_point> fault_point_named(std::string_view name) {
  for (size_t i = 0; i < names.size(); ++i)
    if (name == names[i]) return static_cast<fault_point>(i);
  return std::nullopt;
}

bool fault_plan::any() const {
  for (double p : probability)
    if (p > 0) return true;
  return false;
}

std::expected<fault_plan, std::string> fault_plan::parse(std::string_view text, bool daemon) {
  fault_plan plan;
  while (!text.empty()) {
    const size_t comma = text.find(',');
    std::string_view item = trim(text.substr(0, comma));
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos)
      return std::unexpected("fault plan item '" + std::string(item) + "' is not name=value");
    const std::string_view name = trim(item.substr(0, eq)), value = trim(item.substr(eq + 1));
    if (name == "seed") {
      uint64_t seed = 0;
      auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), seed);
      if (ec != std::errc{} || end != value.data() + value.size())
        return std::unexpected("fault plan seed '" + std::string(value) + "' is not an unsigned integer");
      plan.seed = seed;
      continue;
    }
    auto point = fault_point_named(name);
    if (!point) {
      std::string known;
      for (const char* n : names) known += std::string(known.empty() ? "" : ", ") + n;
      return std::unexpected("unknown fault point '" + std::string(name) + "' (known: " + known + ")");
    }
    if (daemon && !fault_point_in_daemons(*point))
      return std::unexpected("fault point " + std::string(name) + " is reached in the simulator only");
    double p = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), p);
    if (ec != std::errc{} || end != value.data() + value.size() || !(p >= 0 && p <= 1))
      return std::unexpected("fault point " + std::string(name) + ": probability '" + std::string(value) +
                             "' is not a number in [0, 1]");
    plan[*point] = p;
  }
  return plan;
}

std::string fault_plan::to_string() const {
  std::string s = "seed=" + std::to_string(seed);
  for (size_t i = 0; i < fault_point_count; ++i)
    if (probability[i] > 0) {
      char buf[32];
      auto [end, ec] = std::to_chars(buf, buf + sizeof buf, probability[i]);
      s += ",";
      s += names[i];
      s += "=";
      s.append(buf, end);
    }
  return s;
}

fault_injector::fault_injector(fault_plan plan) : plan_(plan) {}

double fault_injector::draw(fault_point p, uint64_t n) const {
  const uint64_t x = mix(mix(plan_.seed ^ 0x5ea1f0a17ull) ^ mix(static_cast<uint64_t>(p) + 1) ^ n);
  return static_cast<double>(x >> 11) * 0x1.0p-53;
}

bool fault_injector::fire(fault_point p) {
  const size_t i = static_cast<size_t>(p);
  const double prob = plan_.probability[i];
  const uint64_t n = visits_[i].fetch_add(1, std::memory_order_relaxed);
  if (prob <= 0 || draw(p, n) >= prob) return false;
  fired_[i].fetch_add(1, std::memory_order_relaxed);
  return true;
}

double fault_injector::uniform(fault_point p) {
  // Its own counter, on the upper half of the stream, so choices never shift the fire draws.
  const size_t i = static_cast<size_t>(p);
  return draw(p, draws_[i].fetch_add(1, std::memory_order_relaxed) | (1ull << 63));
}

void install_faults(const fault_plan& plan) {
  std::lock_guard lock(installed_mutex);
  if (!plan.any()) {
    current.store(nullptr, std::memory_order_release);
    return;
  }
  installed().push_back(std::make_unique<fault_injector>(plan));
  current.store(installed().back().get(), std::memory_order_release);
}

fault_injector* process_faults() { return current.load(std::memory_order_acquire); }

}  // namespace shoal::runtime
