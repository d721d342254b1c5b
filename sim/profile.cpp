// Profile files (profile.hpp).
#include "sim/profile.hpp"

#include <cmath>
#include <fstream>
#include <sstream>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "model/generate.hpp"

namespace shoal::sim {

using nlohmann::json;

double profile::step_seconds(const pool_profile& pool, std::span<const std::pair<int64_t, int64_t>> items) const {
  const auto& m = pool.step;
  double t = m.a(), total = 0;
  for (auto [n, p] : items) {
    const double dn = static_cast<double>(n), dp = static_cast<double>(p);
    t += m.b() * dn + m.c() * dn * dp + (pool.batch_quadratic ? 0.0 : m.d() * dn * dn);
    total += dn;
  }
  if (pool.batch_quadratic) t += m.d() * total * total;
  return std::max(t, 0.0);
}

model::model_config deepseek_v3_671b() {
  model::model_config c;
  c.architecture = model::arch::deepseek_v3;
  c.vocab_size = 129280, c.hidden_size = 7168, c.num_hidden_layers = 61, c.first_k_dense_replace = 3;
  c.num_attention_heads = 128, c.q_lora_rank = 1536, c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128, c.qk_rope_head_dim = 64, c.v_head_dim = 128;
  c.n_routed_experts = 256, c.n_shared_experts = 1, c.num_experts_per_tok = 8;
  c.intermediate_size = 18432, c.moe_intermediate_size = 2048;
  c.max_position_embeddings = 163840, c.block_size = 64;
  return c;
}

namespace {

struct reader {
  const std::string& file;
  std::string error;
  bool ok() const { return error.empty(); }
  void fail(const std::string& field, const std::string& why) {
    if (error.empty()) error = file + ": " + field + ": " + why;
  }
  // The number (T = double) or integer (T = int64_t) at `key` in [lo, hi]; `dflt` when absent
  // and optional, or wrong (the first failure is recorded).
  template <class T>
  T value(const json& j, const std::string& path, const char* key, T lo, T hi, bool required, T dflt) {
    const std::string field = path.empty() ? key : path + "." + key;
    if (!j.contains(key)) {
      if (required) fail(field, "missing");
      return dflt;
    }
    const json& v = j.at(key);
    constexpr bool integral = std::is_integral_v<T>;
    if (integral ? !v.is_number_integer() : !v.is_number()) {
      fail(field, integral ? "not an integer" : "not a number");
      return dflt;
    }
    const T d = v.get<T>();
    if (!std::isfinite(static_cast<double>(d)) || d < lo || d > hi)
      fail(field, "out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return d;
  }
  double number(const json& j, const std::string& path, const char* key, double lo, double hi, bool required = true,
                double dflt = 0) {
    return value<double>(j, path, key, lo, hi, required, dflt);
  }
  int64_t integer(const json& j, const std::string& path, const char* key, int64_t lo, int64_t hi, bool required = true,
                  int64_t dflt = 0) {
    return value<int64_t>(j, path, key, lo, hi, required, dflt);
  }
  const json* object(const json& j, const std::string& path, const char* key) {
    const std::string field = path.empty() ? key : path + "." + key;
    if (!j.contains(key) || !j.at(key).is_object()) {
      fail(field, "missing or not an object");
      return nullptr;
    }
    return &j.at(key);
  }
};

void read_pool(reader& rd, const json& j, const std::string& path, pool_profile& p) {
  const json* o = rd.object(j, "", path.c_str());
  if (!o) return;
  if (o->contains("step") && o->at("step").is_string()) {
    if (o->at("step").get<std::string>() != "fitted") rd.fail(path + ".step", "a string must be \"fitted\"");
    p.fitted = true;
  } else if (const json* s = rd.object(*o, path, "step")) {
    const std::string sp = path + ".step";
    p.step = runtime::cost_model(rd.number(*s, sp, "a", 0, 1e3), rd.number(*s, sp, "b", 0, 1),
                                 rd.number(*s, sp, "c", 0, 1), rd.number(*s, sp, "d", 0, 1));
  }
  p.kv_blocks = rd.integer(*o, path, "kv_blocks", 2, int64_t{1} << 30);
  p.token_budget = rd.integer(*o, path, "token_budget", 1, int64_t{1} << 24, false, p.token_budget);
  p.max_running = rd.integer(*o, path, "max_running", 1, 1 << 20, false, p.max_running);
  p.step_time_budget_s = rd.number(*o, path, "step_time_budget_s", 0, 1e3, false, 0);
  p.cores = rd.integer(*o, path, "cores", 0, 4096, false, 0);
}

}  // namespace

std::expected<profile, std::string> parse_profile(std::string_view text, const std::string& file) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::unexpected(file + ": not a JSON object");
  reader rd{file, {}};
  profile p;
  if (!j.contains("name") || !j.at("name").is_string()) return std::unexpected(file + ": name: missing or not a string");
  p.name = j.at("name").get<std::string>();
  if (j.contains("sources")) {
    if (!j.at("sources").is_array()) return std::unexpected(file + ": sources: not an array");
    for (const json& s : j.at("sources")) {
      if (!s.is_string()) return std::unexpected(file + ": sources: every entry must be a string");
      p.sources.push_back(s.get<std::string>());
    }
  }
  if (!j.contains("model") || !j.at("model").is_string()) return std::unexpected(file + ": model: missing or not a string");
  p.model_name = j.at("model").get<std::string>();
  if (p.model_name == "deepseek-v3-671b") {
    p.model = deepseek_v3_671b();
  } else {
    auto c = model::preset_config(p.model_name);
    if (!c) return std::unexpected(file + ": model: '" + p.model_name + "' is neither a preset nor deepseek-v3-671b");
    p.model = *c;
    if (p.model.vocab_size == 0) p.model.vocab_size = p.model_name == "small" ? 129280 : 256;
  }
  read_pool(rd, j, "prefill", p.prefill);
  read_pool(rd, j, "decode", p.decode);
  p.decode.batch_quadratic = true;
  p.kv_bytes_per_token = rd.number(j, "", "kv_bytes_per_token", 1, 1e9);
  p.handoff_gbps = rd.number(j, "", "handoff_gbps", 1e-3, 1e6);
  p.handoff_latency_s = rd.number(j, "", "handoff_latency_s", 0, 10, false, 0);
  if (const json* s = rd.object(j, "", "storage")) {
    p.storage.capacity_blocks = rd.integer(*s, "storage", "capacity_blocks", 0, int64_t{1} << 40);
    p.storage.read_latency_s = rd.number(*s, "storage", "read_latency_s", 0, 10);
    p.storage.read_gbps = rd.number(*s, "storage", "read_gbps", 1e-3, 1e6);
    p.storage.write_delay_s = rd.number(*s, "storage", "write_delay_s", 0, 60, false, 0);
    p.storage.jitter = rd.number(*s, "storage", "jitter", 0, 2, false, 0);
    p.storage.timeout_s = rd.number(*s, "storage", "timeout_s", 1e-3, 600, false, 5);
  }
  if (j.contains("speculation")) {
    if (const json* s = rd.object(j, "", "speculation")) {
      p.speculation.accept = rd.number(*s, "speculation", "accept", 0, 1);
      p.speculation.draft_factor = rd.number(*s, "speculation", "draft_factor", 0, 10);
      p.speculation.known = true;
    }
  }
  p.ep_pass_s = rd.number(j, "", "ep_pass_s", 0, 10, false, 0);
  p.step_noise = rd.number(j, "", "step_noise", 0, 0.5, false, 0);
  p.host_cores = rd.integer(j, "", "host_cores", 0, 4096, false, 0);
  if (p.host_cores > 0 && (p.prefill.cores > 0 || p.decode.cores > 0))
    rd.fail("host_cores", "give either host_cores (all ranks share them) or prefill.cores and decode.cores, not both");
  if (const json* s = rd.object(j, "", "slo")) {
    p.ttft_slo_s = rd.number(*s, "slo", "ttft_s", 1e-6, 1e5);
    p.tpot_slo_s = rd.number(*s, "slo", "tpot_s", 1e-6, 1e3);
  }
  if (!rd.ok()) return std::unexpected(rd.error);
  return p;
}

std::expected<void, std::string> apply_fitted(profile& p, const std::string& prefill_file, const std::string& decode_file) {
  auto load = [](const std::string& path) { return runtime::read_cost_model_file(path); };
  for (auto [pool, file] : {std::pair{&p.prefill, &prefill_file}, std::pair{&p.decode, decode_file.empty() ? &prefill_file : &decode_file}}) {
    if (!pool->fitted || file->empty()) continue;
    auto m = load(*file);
    if (!m) return std::unexpected(m.error());
    pool->step = *m;
    pool->fitted = false;
  }
  if (p.prefill.fitted || p.decode.fitted)
    return std::unexpected("profile '" + p.name + "' takes its step models from fitted cost models (--cost-model FILE, "
                           "--decode-cost-model FILE)");
  return {};
}

std::expected<profile, std::string> load_profile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return std::unexpected(path + ": cannot read");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_profile(ss.str(), path);
}

}  // namespace shoal::sim
