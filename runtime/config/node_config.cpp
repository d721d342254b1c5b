// Parsing and validation of the shoald node config (node_config.hpp); the only file that
// includes toml++. toml++ is used as built (exceptions on, like Debian's shared library): its
// parse_error is caught at the one call that throws it, and the no-exceptions build path is
// handled too, so callers only ever see a config_error. Checks run in a fixed order (syntax,
// schema, types and ranges, required keys, cross-key rules) and the first failure is reported.
#include "runtime/config/node_config.hpp"

#include "model/backend.hpp"

#include "runtime/placement/decode_placement.hpp"
#include "runtime/placement/prefill_balancer.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <tuple>
#include <utility>

namespace shoal::runtime {
namespace {

namespace fs = std::filesystem;

constexpr int64_t hour_ms = 3'600'000;
constexpr int64_t day_ms = 24 * hour_ms;
constexpr uintmax_t max_file_bytes = 1 << 20;  // a node config is a few hundred bytes
constexpr size_t max_name_chars = 64;

struct schema_section {
  std::string_view name;
  std::vector<std::string_view> keys;
};

// Every key the format knows; anything else is an error so that typos never pass silently.
const std::vector<schema_section>& schema() {
  static const std::vector<schema_section> sections = {
      {"node", {"name", "listen", "roles", "model_dir", "drain_timeout_ms", "metrics_listen", "cpus", "state_dir"}},
      {"engine", {"ranks", "threads", "cache_mib", "kv_dtype", "device", "expert_parallel", "ep_group", "ep_group_size", "ep_frames", "ep_bulk_min_bytes", "kv_storage", "role", "transport", "handoff_timeout_ms",
                  "cost_model", "step_ms", "token_budget", "max_running", "overlap_scheduling", "swa_slots", "swa_timeout_ms", "speculative", "spec_nextn",
                  "spec_adaptive_from", "spec_auto_from", "spec_cost_model"}},
      {"gateway", {"listen", "auth_token_file", "prefill_policy", "decode_policy", "balancer_round_ms", "tier_bounds",
                   "balancer_cost_model", "max_in_flight"}},
      {"cluster", {"seeds", "heartbeat_interval_ms", "connection_timeout_ms", "request_timeout_ms", "tls_certificate",
                   "tls_key", "tls_ca_file"}},
      {"storage", {"dir", "nodes", "capacity_mib", "high_watermark_pct", "low_watermark_pct", "fsync",
                   "ttl_agent_s", "ttl_chat_s", "bulk_port"}},
      {"ve", {"transport", "cache_mib"}},
      {"eplb", {"preset", "redundant_per_rank", "period_steps", "window_steps", "interval_ms", "fetch_timeout_ms", "expert_groups"}},
      {"log", {"level", "file"}},
      {"faults", {"plan"}},
  };
  return sections;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1] ? 1 : 0)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// " (did you mean 'x'?)" for the closest candidate within 2 edits, else "".
std::string suggest(std::string_view word, const std::vector<std::string_view>& candidates) {
  std::string_view best;
  size_t best_distance = 3;
  for (std::string_view c : candidates) {
    const size_t d = edit_distance(word, c);
    if (d < best_distance) best = c, best_distance = d;
  }
  return best.empty() ? std::string() : " (did you mean '" + std::string(best) + "'?)";
}

struct position {
  int32_t line = 0;
  int32_t column = 0;
};

position at(const toml::source_region& r) {
  return {static_cast<int32_t>(r.begin.line), static_cast<int32_t>(r.begin.column)};
}

bool before(position a, position b) {
  return std::tie(a.line, a.column) < std::tie(b.line, b.column);
}

std::string type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    case toml::node_type::none: break;
  }
  return "nothing";
}

// Keeps the first error only; later checks still run but cannot overwrite it, which keeps
// the readers below free of early-return plumbing.
class error_sink {
 public:
  explicit error_sink(std::string file) : file_(std::move(file)) {}

  void fail(config_errc code, position p, std::string key, std::string message) {
    if (!first_) first_ = config_error{code, file_, p.line, p.column, std::move(key), std::move(message)};
  }
  bool failed() const { return first_.has_value(); }
  const config_error& error() const { return *first_; }

 private:
  std::string file_;
  std::optional<config_error> first_;
};

// One [section] of the file; `table` is null when the file has none.
struct section {
  std::string_view name;
  const toml::table* table = nullptr;

  const toml::node* get(std::string_view key) const { return table ? table->get(key) : nullptr; }
  std::string path(std::string_view key) const { return std::string(name) + "." + std::string(key); }
  // Where an error about `key` points: the key's value, else the section header, else nowhere.
  position pos(std::string_view key = {}) const {
    if (const toml::node* n = key.empty() ? nullptr : get(key)) return at(n->source());
    return table ? at(table->source()) : position{};
  }
};

// Rejects sections and keys outside the schema, reporting the first one in file order
// (toml++ tables iterate by name, so every offender is looked at and the earliest kept).
void check_schema(error_sink& sink, const toml::table& root) {
  std::optional<config_error> first;
  auto note = [&](config_errc code, position p, std::string key, std::string message) {
    if (!first || before(p, {first->line, first->column}))
      first = config_error{code, "", p.line, p.column, std::move(key), std::move(message)};
  };
  std::vector<std::string_view> section_names;
  for (const schema_section& s : schema()) section_names.push_back(s.name);
  for (auto&& [key, value] : root) {
    const auto known = std::ranges::find(schema(), key.str(), &schema_section::name);
    if (known == schema().end()) {
      note(config_errc::unknown_key, at(key.source()), std::string(key.str()),
           value.is_table() ? "unknown section" + suggest(key.str(), section_names)
                            : "unknown key; every key belongs in a section such as [node]");
      continue;
    }
    const toml::table* table = value.as_table();
    if (!table) {
      note(config_errc::wrong_type, at(value.source()), std::string(key.str()),
           "expected a table ([" + std::string(key.str()) + "]), got " + type_name(value));
      continue;
    }
    for (auto&& [inner, inner_value] : *table) {
      if (std::ranges::find(known->keys, inner.str()) != known->keys.end()) continue;
      note(config_errc::unknown_key, at(inner.source()),
           std::string(key.str()) + "." + std::string(inner.str()),
           "unknown key" + suggest(inner.str(), known->keys));
    }
  }
  if (first) sink.fail(first->code, {first->line, first->column}, first->key, first->message);
}

// The string at `key`: nullopt when absent, or when not a string (an error is recorded).
std::optional<std::string> read_string(error_sink& sink, const section& s, std::string_view key) {
  const toml::node* n = s.get(key);
  if (!n) return std::nullopt;
  if (const toml::value<std::string>* v = n->as_string()) return v->get();
  sink.fail(config_errc::wrong_type, at(n->source()), s.path(key),
            "expected a string, got " + type_name(*n));
  return std::nullopt;
}

std::optional<int64_t> read_integer(error_sink& sink, const section& s, std::string_view key,
                                    int64_t lo, int64_t hi) {
  const toml::node* n = s.get(key);
  if (!n) return std::nullopt;
  const toml::value<int64_t>* v = n->as_integer();
  if (!v) {
    sink.fail(config_errc::wrong_type, at(n->source()), s.path(key),
              "expected an integer, got " + type_name(*n));
    return std::nullopt;
  }
  const int64_t x = v->get();
  if (x < lo || x > hi) {
    const std::string bound = x < lo ? "must be ≥ " + std::to_string(lo) : "must be ≤ " + std::to_string(hi);
    sink.fail(config_errc::bad_value, at(n->source()), s.path(key), bound + ", got " + std::to_string(x));
    return std::nullopt;
  }
  return x;
}

// The integers in [lo, hi] of the array at `key`, each checked by `ok` against those before
// it: nullopt when absent or wrong (an error naming the element is recorded, with `rule`).
std::optional<std::vector<int64_t>> read_integer_array(
    error_sink& sink, const section& s, std::string_view key, int64_t lo, int64_t hi, const std::string& rule,
    const std::function<bool(const std::vector<int64_t>&, int64_t)>& ok) {
  const toml::node* n = s.get(key);
  if (!n) return std::nullopt;
  const toml::array* array = n->as_array();
  if (!array) {
    sink.fail(config_errc::wrong_type, at(n->source()), s.path(key), "expected an array of integers, got " + type_name(*n));
    return std::nullopt;
  }
  std::vector<int64_t> out;
  for (const toml::node& e : *array) {
    const toml::value<int64_t>* v = e.as_integer();
    if (!v || v->get() < lo || v->get() > hi || !ok(out, v->get())) {
      sink.fail(config_errc::bad_value, at(e.source()), s.path(key), "expected " + rule);
      return std::nullopt;
    }
    out.push_back(v->get());
  }
  return out;
}

std::optional<bool> read_bool(error_sink& sink, const section& s, std::string_view key) {
  const toml::node* n = s.get(key);
  if (!n) return std::nullopt;
  if (const toml::value<bool>* v = n->as_boolean()) return v->get();
  sink.fail(config_errc::wrong_type, at(n->source()), s.path(key), "expected true or false, got " + type_name(*n));
  return std::nullopt;
}

std::optional<host_port> read_host_port(error_sink& sink, const section& s, std::string_view key,
                                        bool allow_port_zero) {
  const std::optional<std::string> text = read_string(sink, s, key);
  if (!text) return std::nullopt;
  std::expected<host_port, std::string> a = parse_host_port(*text, allow_port_zero);
  if (!a) sink.fail(config_errc::bad_value, s.pos(key), s.path(key), a.error());
  return a ? std::optional<host_port>(*a) : std::nullopt;
}

// A non-empty path; relative ones resolve against `base` (the config file's directory).
std::optional<fs::path> read_path(error_sink& sink, const section& s, std::string_view key,
                                  const fs::path& base) {
  const std::optional<std::string> text = read_string(sink, s, key);
  if (!text) return std::nullopt;
  if (text->empty()) {
    sink.fail(config_errc::bad_value, s.pos(key), s.path(key), "must not be empty");
    return std::nullopt;
  }
  const fs::path p(*text);
  return (p.is_absolute() || base.empty() ? p : base / p).lexically_normal();
}

// The strings of the array at `key`, each with its position; absent → empty.
std::vector<std::pair<std::string, position>> read_string_array(error_sink& sink, const section& s,
                                                                 std::string_view key) {
  std::vector<std::pair<std::string, position>> items;
  const toml::node* n = s.get(key);
  if (!n) return items;
  const toml::array* array = n->as_array();
  if (!array) {
    sink.fail(config_errc::wrong_type, at(n->source()), s.path(key),
              "expected an array of strings, got " + type_name(*n));
    return items;
  }
  for (const toml::node& element : *array) {
    if (const toml::value<std::string>* v = element.as_string()) {
      items.emplace_back(v->get(), at(element.source()));
    } else {
      sink.fail(config_errc::wrong_type, at(element.source()), s.path(key),
                "expected an array of strings, got " + type_name(element) + " in it");
    }
  }
  return items;
}

// [gateway] balancer keys: policy names, round, tier bounds (ascending positive integers).
void read_balancers(error_sink& sink, const section& g, const fs::path& base, node_config& c) {
  if (std::optional<std::string> v = read_string(sink, g, "prefill_policy")) {
    if (runtime::prefill_policy_named(*v)) c.prefill_policy = *v;
    else sink.fail(config_errc::bad_value, g.pos("prefill_policy"), g.path("prefill_policy"),
                   "expected tiered, untiered, round_robin, least_requests, cache_aware or dynamo, got \"" + *v + "\"");
  }
  if (std::optional<std::string> v = read_string(sink, g, "decode_policy")) {
    if (runtime::make_decode_placement(*v)) c.decode_policy = *v;
    else sink.fail(config_errc::bad_value, g.pos("decode_policy"), g.path("decode_policy"),
                   "expected decode_balancer, least_loaded, least_kv or round_robin, got \"" + *v + "\"");
  }
  if (auto ms = read_integer(sink, g, "balancer_round_ms", 1, 24 * 3'600'000)) c.balancer_round_ms = *ms;
  if (auto n = read_integer(sink, g, "max_in_flight", 1, 65'536)) c.max_in_flight = static_cast<int32_t>(*n);
  c.balancer_cost_model = read_path(sink, g, "balancer_cost_model", base);
  auto ascending = [](const std::vector<int64_t>& before, int64_t x) { return before.empty() || x > before.back(); };
  if (auto b = read_integer_array(sink, g, "tier_bounds", 1, int64_t{1} << 40, "ascending positive integers (prompt tokens)",
                                  ascending))
    c.tier_bounds = std::move(*b);
}

std::optional<role> role_named(std::string_view name) {
  for (role r : {role::gateway, role::engine, role::storage, role::directory, role::ve})
    if (name == to_string(r)) return r;
  return std::nullopt;
}

std::vector<role> read_roles(error_sink& sink, const section& s) {
  std::vector<role> roles;
  const auto names = read_string_array(sink, s, "roles");
  if (names.empty() && s.get("roles") && s.get("roles")->is_array())
    sink.fail(config_errc::bad_value, s.pos("roles"), s.path("roles"), "must list at least one role");
  for (const auto& [name, pos] : names) {
    const std::optional<role> r = role_named(name);
    if (!r) {
      sink.fail(config_errc::bad_value, pos, s.path("roles"),
                "unknown role '" + name + "' (expected gateway, engine, storage, directory or ve)");
    } else if (std::ranges::find(roles, *r) != roles.end()) {
      sink.fail(config_errc::bad_value, pos, s.path("roles"), "role '" + name + "' listed twice");
    } else {
      roles.push_back(*r);
    }
  }
  return roles;
}

std::optional<log_level> read_log_level(error_sink& sink, const section& s) {
  const std::optional<std::string> name = read_string(sink, s, "level");
  if (!name) return std::nullopt;
  for (log_level l : {log_level::trace, log_level::debug, log_level::info, log_level::warn, log_level::error})
    if (*name == to_string(l)) return l;
  sink.fail(config_errc::bad_value, s.pos("level"), s.path("level"),
            "unknown level '" + *name + "' (expected trace, debug, info, warn or error)");
  return std::nullopt;
}

bool valid_node_name(std::string_view name) {
  return !name.empty() && name.size() <= max_name_chars &&
         std::ranges::all_of(name, [](char c) { return is_ascii_alnum(c) || c == '.' || c == '_' || c == '-'; });
}

struct sections {
  section node{"node"}, engine{"engine"}, gateway{"gateway"}, cluster{"cluster"}, storage{"storage"}, ve{"ve"},
      eplb{"eplb"}, log{"log"}, faults{"faults"};

  explicit sections(const toml::table& root) {
    for (section* s : {&node, &engine, &gateway, &cluster, &storage, &ve, &eplb, &log, &faults})
      s->table = root[s->name].as_table();
  }
};

void read_node(error_sink& sink, const section& s, const fs::path& base, node_config& c) {
  if (std::optional<std::string> name = read_string(sink, s, "name")) {
    if (!valid_node_name(*name))
      sink.fail(config_errc::bad_value, s.pos("name"), s.path("name"),
                "must be 1.." + std::to_string(max_name_chars) + " characters of [A-Za-z0-9._-], got '" +
                    *name + "'");
    c.name = std::move(*name);
  }
  if (std::optional<host_port> a = read_host_port(sink, s, "listen", true)) c.listen = *a;
  c.metrics_listen = read_host_port(sink, s, "metrics_listen", true);
  if (auto dir = read_path(sink, s, "state_dir", base)) {
    c.state_dir = *dir;
  } else if (const char* xdg = std::getenv("XDG_STATE_HOME"); xdg && *xdg == '/') {
    c.state_dir = fs::path(xdg) / "shoal";
  } else if (const char* home = std::getenv("HOME"); home && *home == '/') {
    c.state_dir = fs::path(home) / ".local" / "state" / "shoal";
  } else {
    c.state_dir = "/tmp/shoal-state";
  }
  c.roles = read_roles(sink, s);
  if (std::optional<fs::path> p = read_path(sink, s, "model_dir", base)) c.model_dir = *p;
  if (std::optional<int64_t> ms = read_integer(sink, s, "drain_timeout_ms", 0, day_ms)) c.drain_timeout_ms = *ms;
  auto unique = [](const std::vector<int64_t>& before, int64_t x) { return std::ranges::find(before, x) == before.end(); };
  if (auto cpus = read_integer_array(sink, s, "cpus", 0, 1023, "distinct CPU numbers 0..1023 (as lscpu lists them)", unique)) {
    if (cpus->empty()) sink.fail(config_errc::bad_value, s.pos("cpus"), s.path("cpus"), "expected at least one CPU");
    c.cpus.assign(cpus->begin(), cpus->end());
  }
}

void read_storage(error_sink& sink, const section& s, const fs::path& base, node_config& c) {
  constexpr int64_t ten_years_s = 10LL * 366 * 24 * 3600;
  c.storage_dir = read_path(sink, s, "dir", base);
  if (auto n = read_integer(sink, s, "nodes", 1, 64)) c.storage_nodes = static_cast<int32_t>(*n);
  if (auto n = read_integer(sink, s, "capacity_mib", 1, int64_t{1} << 24)) c.storage_capacity_mib = *n;
  if (auto n = read_integer(sink, s, "high_watermark_pct", 1, 100)) c.storage_high_watermark_pct = static_cast<int32_t>(*n);
  if (auto n = read_integer(sink, s, "low_watermark_pct", 0, 99)) c.storage_low_watermark_pct = static_cast<int32_t>(*n);
  if (auto n = read_integer(sink, s, "ttl_agent_s", 1, ten_years_s)) c.storage_ttl_agent_s = *n;
  if (auto n = read_integer(sink, s, "ttl_chat_s", 1, ten_years_s)) c.storage_ttl_chat_s = *n;
  if (auto n = read_integer(sink, s, "bulk_port", 0, 65535)) c.storage_bulk_port = static_cast<int32_t>(*n);
  if (std::optional<std::string> v = read_string(sink, s, "fsync")) {
    if (*v == "always" || *v == "never") c.storage_fsync = *v == "always";
    else sink.fail(config_errc::bad_value, s.pos("fsync"), s.path("fsync"), "expected \"always\" or \"never\", got \"" + *v + "\"");
  }
}

// [engine]: ranks, threads, cache, expert parallelism, disaggregation and its transport.
void read_engine(error_sink& sink, const section& e, node_config& c) {
  if (std::optional<int64_t> n = read_integer(sink, e, "ranks", 1, 1024)) c.ranks = static_cast<int32_t>(*n);
  if (std::optional<int64_t> n = read_integer(sink, e, "threads", 0, 1024)) c.threads = static_cast<int32_t>(*n);
  if (std::optional<int64_t> n = read_integer(sink, e, "cache_mib", 16, 1 << 20)) c.cache_mib = *n;
  if (std::optional<std::string> v = read_string(sink, e, "kv_dtype")) {
    if (auto d = model::parse_kv_dtype(*v)) c.kv_dtype = *d;
    else sink.fail(config_errc::bad_value, e.pos("kv_dtype"), e.path("kv_dtype"),
                   "expected \"bf16\", \"fp8\" or \"fp32\", got \"" + *v + "\"");
  }
  if (std::optional<std::string> v = read_string(sink, e, "device")) {
    const auto names = model::backend_names();
    if (std::find(names.begin(), names.end(), *v) != names.end()) {
      c.device = *v;
    } else {
      std::string known;
      for (const auto& n : names) known += (known.empty() ? "\"" : ", \"") + n + "\"";
      sink.fail(config_errc::bad_value, e.pos("device"), e.path("device"),
                "expected a compute backend of this build (" + known + "), got \"" + *v + "\"");
    }
  }
  if (std::optional<bool> b = read_bool(sink, e, "expert_parallel")) c.expert_parallel = *b;
  if (std::optional<std::string> v = read_string(sink, e, "ep_group")) {
    const bool ok = !v->empty() && v->size() <= 64 &&
                    std::all_of(v->begin(), v->end(), [](char ch) { return is_ascii_alnum(ch) || ch == '-' || ch == '_'; });
    if (ok) c.ep_group = *v;
    else sink.fail(config_errc::bad_value, e.pos("ep_group"), e.path("ep_group"),
                   "expected a group name of 1 to 64 letters, digits, '-' or '_', got \"" + *v + "\"");
  }
  if (auto n = read_integer(sink, e, "ep_group_size", 1, 4096)) c.ep_group_size = static_cast<int32_t>(*n);
  if (auto n = read_integer(sink, e, "ep_bulk_min_bytes", 0, int64_t{1} << 30)) c.ep_bulk_min_bytes = *n;
  if (std::optional<std::string> v = read_string(sink, e, "ep_frames")) {
    if (*v == "transport" || *v == "caf") c.ep_frames = *v;
    else sink.fail(config_errc::bad_value, e.pos("ep_frames"), e.path("ep_frames"),
                   "expected \"transport\" or \"caf\", got \"" + *v + "\"");
  }
  if (std::optional<bool> b = read_bool(sink, e, "kv_storage")) c.kv_storage = *b;
  if (std::optional<std::string> v = read_string(sink, e, "role")) {
    if (*v == "both") c.disagg_role = engine_role::both;
    else if (*v == "prefill") c.disagg_role = engine_role::prefill;
    else if (*v == "decode") c.disagg_role = engine_role::decode;
    else
      sink.fail(config_errc::bad_value, e.pos("role"), e.path("role"),
                "expected \"both\", \"prefill\" or \"decode\", got \"" + *v + "\"");
  }
  if (std::optional<std::string> v = read_string(sink, e, "transport")) {
    if (!v->empty()) c.transport = *v;
    else sink.fail(config_errc::bad_value, e.pos("transport"), e.path("transport"),
                   "expected a libfabric provider such as \"shm\" or \"tcp;ofi_rxm\", got \"\"");
  }
  if (auto ms = read_integer(sink, e, "handoff_timeout_ms", 1, hour_ms)) c.handoff_timeout_ms = *ms;
  if (c.expert_parallel && c.ep_group.empty()) c.ep_group = to_string(c.disagg_role);  // a group per role
}

// [engine]: the step-time model, the SWA tier and speculative decoding.
void read_engine_compute(error_sink& sink, const section& e, const fs::path& base, node_config& c) {
  c.cost_model = read_path(sink, e, "cost_model", base);
  if (auto ms = read_integer(sink, e, "step_ms", 1, 60'000)) c.step_ms = *ms;
  if (auto n = read_integer(sink, e, "token_budget", 1, int64_t{1} << 24)) c.token_budget = *n;
  if (auto n = read_integer(sink, e, "max_running", 1, 1 << 16)) c.max_running = *n;
  if (std::optional<bool> b = read_bool(sink, e, "overlap_scheduling")) c.overlap_scheduling = *b;
  if (auto n = read_integer(sink, e, "swa_slots", 0, 1 << 20)) c.swa_slots = *n;
  if (auto ms = read_integer(sink, e, "swa_timeout_ms", 1, hour_ms)) c.swa_timeout_ms = *ms;
  if (std::optional<std::string> v = read_string(sink, e, "speculative")) {
    if (*v == "off" || *v == "fixed" || *v == "adaptive" || *v == "auto") c.speculative = *v;
    else sink.fail(config_errc::bad_value, e.pos("speculative"), e.path("speculative"),
                   "expected \"off\", \"fixed\", \"adaptive\" or \"auto\", got \"" + *v + "\"");
  }
  if (auto n = read_integer(sink, e, "spec_nextn", 1, 8)) c.spec_nextn = *n;
  if (auto n = read_integer(sink, e, "spec_adaptive_from", 0, 1 << 20)) c.spec_adaptive_from = *n;
  if (auto n = read_integer(sink, e, "spec_auto_from", 0, 1 << 20)) c.spec_auto_from = *n;
  c.spec_cost_model = read_path(sink, e, "spec_cost_model", base);
}

void read_ve(error_sink& sink, const section& vs, node_config& c) {
  if (std::optional<std::string> v = read_string(sink, vs, "transport")) {
    if (!v->empty()) c.ve_transport = *v;
    else sink.fail(config_errc::bad_value, vs.pos("transport"), vs.path("transport"),
                   "expected a libfabric provider such as \"tcp;ofi_rxm\", got \"\"");
  }
  if (auto n = read_integer(sink, vs, "cache_mib", 1, 1 << 20)) c.ve_cache_mib = *n;
}

// [eplb]: a preset, then the keys that override it.
void read_eplb(error_sink& sink, const section& e, node_config& c) {
  // Without a preset, the engine role's: DeepSeek's prefill values for prefill groups.
  std::optional<std::string> v = read_string(sink, e, "preset");
  if (!v && !e.get("preset")) v = c.disagg_role == engine_role::prefill ? "prefill" : "decode";
  if (v) {
    if (*v == "decode" || *v == "prefill") {
      c.eplb_preset = *v;
      const bool prefill = *v == "prefill";
      c.eplb_redundant_per_rank = prefill ? 4 : 1;
      c.eplb_period_steps = prefill ? 1'000 : 10'000;
      c.eplb_window_steps = prefill ? 100 : 1'000;
    } else {
      sink.fail(config_errc::bad_value, e.pos("preset"), e.path("preset"),
                "expected \"decode\" or \"prefill\", got \"" + *v + "\"");
    }
  }
  if (auto n = read_integer(sink, e, "redundant_per_rank", 0, 1024)) c.eplb_redundant_per_rank = *n;
  if (auto n = read_integer(sink, e, "period_steps", 1, int64_t{1} << 40)) c.eplb_period_steps = *n;
  if (auto n = read_integer(sink, e, "window_steps", 1, 1'000'000)) c.eplb_window_steps = *n;
  if (auto n = read_integer(sink, e, "interval_ms", 10, hour_ms)) c.eplb_interval_ms = *n;
  if (auto n = read_integer(sink, e, "fetch_timeout_ms", 100, hour_ms)) c.eplb_fetch_timeout_ms = *n;
  if (auto n = read_integer(sink, e, "expert_groups", 1, 1 << 16)) c.eplb_expert_groups = *n;
}

// [cluster]: seeds, the failure detector, TLS.
void read_cluster(error_sink& sink, const section& cl, const fs::path& base, node_config& c) {
  for (const auto& [text, pos] : read_string_array(sink, cl, "seeds")) {
    std::expected<host_port, std::string> a = parse_host_port(text, false);
    if (a) c.seeds.push_back(*a);
    else sink.fail(config_errc::bad_value, pos, cl.path("seeds"), a.error());
  }
  if (auto ms = read_integer(sink, cl, "heartbeat_interval_ms", 1, hour_ms)) c.heartbeat_interval_ms = *ms;
  if (auto ms = read_integer(sink, cl, "connection_timeout_ms", 1, day_ms)) c.connection_timeout_ms = *ms;
  if (auto ms = read_integer(sink, cl, "request_timeout_ms", 1, day_ms)) c.request_timeout_ms = *ms;
  c.tls_certificate = read_path(sink, cl, "tls_certificate", base);
  c.tls_key = read_path(sink, cl, "tls_key", base);
  c.tls_ca_file = read_path(sink, cl, "tls_ca_file", base);
}

void read_sections(error_sink& sink, const sections& f, const fs::path& base, node_config& c) {
  read_node(sink, f.node, base, c);
  read_engine(sink, f.engine, c);
  read_ve(sink, f.ve, c);
  read_eplb(sink, f.eplb, c);
  read_engine_compute(sink, f.engine, base, c);
  c.http_listen = read_host_port(sink, f.gateway, "listen", true);
  c.auth_token_file = read_path(sink, f.gateway, "auth_token_file", base);
  read_balancers(sink, f.gateway, base, c);
  read_cluster(sink, f.cluster, base, c);
  read_storage(sink, f.storage, base, c);
  if (std::optional<log_level> l = read_log_level(sink, f.log)) c.level = *l;
  c.log_file = read_path(sink, f.log, "file", base);
  if (std::optional<std::string> plan = read_string(sink, f.faults, "plan")) {
    if (auto p = fault_plan::parse(*plan, true)) c.faults = *p;
    else sink.fail(config_errc::bad_value, f.faults.pos("plan"), f.faults.path("plan"), p.error());
  }
}

void check_required(error_sink& sink, const sections& f) {
  for (std::string_view key : {"name", "listen", "roles"})
    if (!f.node.get(key))
      sink.fail(config_errc::missing_key, f.node.pos(), f.node.path(key), "required key missing");
}

// Sections that match the roles, and the keys a role needs (model_dir, listen, storage.dir).
void check_roles(error_sink& sink, const sections& f, const node_config& c) {
  const bool gateway = c.has_role(role::gateway);
  const bool engine = c.has_role(role::engine);
  const bool storage = c.has_role(role::storage);
  const bool ve = c.has_role(role::ve);
  for (auto [s, needed] : {std::pair{&f.engine, engine}, std::pair{&f.gateway, gateway}, std::pair{&f.storage, storage},
                           std::pair{&f.ve, ve}}) {
    if (s->table && !needed)
      sink.fail(config_errc::bad_value, s->pos(), std::string(s->name),
                "section [" + std::string(s->name) + "] given but node.roles has no '" +
                    std::string(s->name) + "'");
  }
  if (gateway && !c.http_listen)
    sink.fail(config_errc::missing_key, f.gateway.table ? f.gateway.pos() : f.node.pos("roles"),
              "gateway.listen", "required with the gateway role");
  if (storage && !c.storage_dir)
    sink.fail(config_errc::missing_key, f.storage.table ? f.storage.pos() : f.node.pos("roles"), "storage.dir",
              "required with the storage role");
  if (storage && c.storage_bulk_port > 0 && c.storage_bulk_port + c.storage_nodes - 1 > 65535)
    sink.fail(config_errc::bad_value, f.storage.pos("bulk_port"), "storage.bulk_port",
              "ports " + std::to_string(c.storage_bulk_port) + ".." +
                std::to_string(c.storage_bulk_port + c.storage_nodes - 1) + " for " +
                std::to_string(c.storage_nodes) + " storage nodes run past 65535");
  if (storage && c.storage_low_watermark_pct >= c.storage_high_watermark_pct)
    sink.fail(config_errc::bad_value, f.storage.pos("low_watermark_pct"), "storage.low_watermark_pct",
              "must be below storage.high_watermark_pct (" + std::to_string(c.storage_high_watermark_pct) + ")");
  if ((gateway || engine || ve) && c.model_dir.empty())
    sink.fail(config_errc::missing_key, f.node.pos(), "node.model_dir",
              "required with the gateway, engine or ve role");
  if (!gateway && !engine && !ve && f.node.get("model_dir"))
    sink.fail(config_errc::bad_value, f.node.pos("model_dir"), "node.model_dir",
              "only the gateway, engine and ve roles use a model");
}

// Cluster TLS's three files together, the failure detector's timeout above its heartbeat.
void check_cluster(error_sink& sink, const sections& f, const node_config& c) {
  // Cluster TLS: the three files together (a certificate without its key or CA is no credential).
  const int tls_keys = (c.tls_certificate ? 1 : 0) + (c.tls_key ? 1 : 0) + (c.tls_ca_file ? 1 : 0);
  if (tls_keys > 0 && tls_keys < 3)
    for (const char* key : {"tls_certificate", "tls_key", "tls_ca_file"})
      if (!f.cluster.get(key))
        sink.fail(config_errc::missing_key, f.cluster.pos(), f.cluster.path(key),
                  "cluster TLS needs tls_certificate, tls_key and tls_ca_file together");
  if (c.connection_timeout_ms <= c.heartbeat_interval_ms) {
    const bool blame_timeout = f.cluster.get("connection_timeout_ms") != nullptr;
    const std::string other = blame_timeout ? "heartbeat_interval_ms" : "connection_timeout_ms";
    const int64_t other_ms = blame_timeout ? c.heartbeat_interval_ms : c.connection_timeout_ms;
    const std::string key = blame_timeout ? "connection_timeout_ms" : "heartbeat_interval_ms";
    sink.fail(config_errc::bad_value, f.cluster.pos(key), f.cluster.path(key),
              std::string(blame_timeout ? "must exceed" : "must be below") + " cluster." + other + " (" +
                  std::to_string(other_ms) + (f.cluster.get(other) ? "" : ", the default") + ")");
  }
}

// Engine keys that only apply with others: expert-parallel frames and the balancer,
// speculation, step budgets, handoffs.
void check_engine(error_sink& sink, const sections& f, const node_config& c) {
  for (const char* key : {"ep_frames", "ep_bulk_min_bytes"})
    if (f.engine.get(key) && !c.expert_parallel)
      sink.fail(config_errc::bad_value, f.engine.pos(key), f.engine.path(key),
                "given but engine.expert_parallel is not true (no expert frames to move)");
  const std::string caf_frames = std::string("given but engine.ep_frames is \"caf\"") +
                                 (f.engine.get("ep_frames") ? "" : " (the default under cluster TLS)");
  if (f.engine.get("ep_bulk_min_bytes") && c.ep_frames == "caf")
    sink.fail(config_errc::bad_value, f.engine.pos("ep_bulk_min_bytes"), f.engine.path("ep_bulk_min_bytes"),
              caf_frames + ": every frame travels inside the CAF messages");
  if (f.eplb.get("fetch_timeout_ms") && c.ep_frames == "caf")
    sink.fail(config_errc::bad_value, f.eplb.pos("fetch_timeout_ms"), f.eplb.path("fetch_timeout_ms"),
              caf_frames + ": the experts a rank gains are read from the checkpoint, not from their holders over "
                           "the transport");
  if (f.eplb.table && !c.expert_parallel)
    sink.fail(config_errc::bad_value, f.eplb.pos(), "eplb",
              "section [eplb] given but engine.expert_parallel is not true (the balancer places experts of an "
              "expert-parallel group)");
  for (const char* key : {"ep_group", "ep_group_size"})
    if (f.engine.get(key) && !c.expert_parallel)
      sink.fail(config_errc::bad_value, f.engine.pos(key), f.engine.path(key),
                "given but engine.expert_parallel is not true (only expert-parallel ranks form groups)");
  if (c.speculative != "off" && c.disagg_role == engine_role::prefill)
    sink.fail(config_errc::bad_value, f.engine.pos("speculative"), "engine.speculative",
              "prefill engines hand every request off after its first token: nothing to speculate on");
  if (c.speculative == "adaptive" && !c.spec_cost_model)
    sink.fail(config_errc::missing_key, f.engine.pos("speculative"), "engine.spec_cost_model",
              "required with engine.speculative = \"adaptive\" (shoal bench fit-cost --decode)");
  for (const char* key : {"spec_nextn", "spec_adaptive_from", "spec_auto_from", "spec_cost_model"})
    if (c.speculative == "off" && f.engine.get(key))
      sink.fail(config_errc::bad_value, f.engine.pos(key), f.engine.path(key),
                "only used with engine.speculative = \"fixed\", \"adaptive\" or \"auto\"");
  // The keys of one mode only (with another they would be read and ignored).
  for (const auto& [key, mode] : {std::pair{"spec_adaptive_from", "adaptive"}, std::pair{"spec_cost_model", "adaptive"},
                                  std::pair{"spec_auto_from", "auto"}})
    if (f.engine.get(key) && c.speculative != "off" && c.speculative != mode)
      sink.fail(config_errc::bad_value, f.engine.pos(key), f.engine.path(key),
                std::string("only used with engine.speculative = \"") + mode + "\"");
  if (c.disagg_role == engine_role::both && f.engine.get("handoff_timeout_ms"))
    sink.fail(config_errc::bad_value, f.engine.pos("handoff_timeout_ms"), f.engine.path("handoff_timeout_ms"),
              "only prefill and decode engines move handoffs (engine.role is \"both\")");
}

// Distinct listen addresses.
void check_addresses(error_sink& sink, const sections& f, const node_config& c) {
  if (c.metrics_listen && c.metrics_listen->port != 0 &&
      (*c.metrics_listen == c.listen || (c.http_listen && *c.metrics_listen == *c.http_listen)))
    sink.fail(config_errc::bad_value, f.node.pos("metrics_listen"), "node.metrics_listen",
              "same address as " + std::string(*c.metrics_listen == c.listen ? "node.listen" : "gateway.listen") + " (" +
                  to_string(*c.metrics_listen) + ")");
  if (c.http_listen && c.http_listen->port != 0 && *c.http_listen == c.listen)
    sink.fail(config_errc::bad_value, f.gateway.pos("listen"), "gateway.listen",
              "same address as node.listen (" + to_string(c.listen) + ")");
}

// Rules between keys (each group above).
void check_consistency(error_sink& sink, const sections& f, const node_config& c) {
  check_roles(sink, f, c);
  check_cluster(sink, f, c);
  check_engine(sink, f, c);
  check_addresses(sink, f, c);
}

config_error syntax_error(const std::string& file, const toml::parse_error& e) {
  const position p = at(e.source());
  return config_error{config_errc::syntax, file, p.line, p.column, "", std::string(e.description())};
}

std::expected<node_config, config_error> parse_with_base(std::string_view text, const std::string& file,
                                                         const fs::path& base) {
  toml::table root;
#if TOML_EXCEPTIONS
  try {
    root = toml::parse(text, file);
  } catch (const toml::parse_error& e) {
    return std::unexpected(syntax_error(file, e));
  }
#else
  toml::parse_result parsed = toml::parse(text, file);
  if (!parsed) return std::unexpected(syntax_error(file, parsed.error()));
  root = std::move(parsed).table();
#endif
  error_sink sink(file);
  check_schema(sink, root);
  if (sink.failed()) return std::unexpected(sink.error());
  const sections f(root);
  node_config c;
  read_sections(sink, f, base, c);
  check_required(sink, f);
  // libfabric moves bytes unencrypted: under cluster TLS the expert frames (and the experts a
  // rank gains) stay in the (encrypted) CAF messages unless the file asks for the transport.
  if (c.tls_certificate && !f.engine.get("ep_frames")) c.ep_frames = "caf";
  if (!sink.failed()) check_consistency(sink, f, c);
  if (sink.failed()) return std::unexpected(sink.error());
  return c;
}

}  // namespace

const char* to_string(log_level l) {
  switch (l) {
    case log_level::trace: return "trace";
    case log_level::debug: return "debug";
    case log_level::info: return "info";
    case log_level::warn: return "warn";
    case log_level::error: return "error";
  }
  return "?";
}

const char* to_string(config_errc e) {
  switch (e) {
    case config_errc::io: return "io";
    case config_errc::syntax: return "syntax";
    case config_errc::unknown_key: return "unknown_key";
    case config_errc::wrong_type: return "wrong_type";
    case config_errc::bad_value: return "bad_value";
    case config_errc::missing_key: return "missing_key";
  }
  return "?";
}

std::string to_string(const config_error& e) {
  std::string s = e.file;
  if (e.line > 0) s += ":" + std::to_string(e.line) + ":" + std::to_string(e.column);
  s += ": ";
  if (!e.key.empty()) s += "key '" + e.key + "': ";
  return s + e.message;
}

bool node_config::has_role(role r) const { return std::ranges::find(roles, r) != roles.end(); }

std::expected<node_config, config_error> parse_node_config(std::string_view toml_text,
                                                           const std::string& file) {
  return parse_with_base(toml_text, file, fs::path(file).parent_path());
}

std::expected<node_config, config_error> load_node_config(const fs::path& path) {
  const auto io_error = [&](std::string message) {
    return std::unexpected(config_error{config_errc::io, path.string(), 0, 0, "", std::move(message)});
  };
  std::error_code ec;
  if (fs::is_directory(path, ec)) return io_error("is a directory, not a config file");
  const uintmax_t size = fs::file_size(path, ec);
  if (!ec && size > max_file_bytes) return io_error("larger than 1 MiB; not a node config");
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error(std::string("cannot open: ") + std::strerror(errno));
  std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) return io_error("read failed");
  const fs::path absolute = fs::absolute(path, ec);
  return parse_with_base(text, path.string(), (ec ? path : absolute).parent_path());
}

}  // namespace shoal::runtime
