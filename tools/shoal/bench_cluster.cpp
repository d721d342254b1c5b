// `shoal bench cluster`: replays a Mooncake trace against a real loopback cluster of engines
// (`shoal up` of a node-config directory, default config/local-disagg: a gateway, 2 prefill
// and 2 decode engines) once per balancer policy pair, and reports the serving metrics of
// sim/report.hpp for each: the balancers against round-robin in the same run. The requests
// are the simulator's (sim/workload: timestamps / --speed, lengths × --length-scale, prompt
// token ids from the trace's prefix-block hashes, max_tokens = the trace's output length,
// ignore_eos), sent on schedule as streaming completions, one client thread each. With
// --profile the simulator replays the same requests on the same shape (prefill and decode
// ranks of the config, in its expert-parallel groups of engine.ep_group_size and its engine
// processes, with its token budgets, max_running and DSpark depths; a config without decode
// nodes is colocated)
// with that profile, and prints its figures beside the cluster's.
// --cost-model also becomes the cluster's gateway.balancer_cost_model, so the real balancers
// predict with the same model as the simulated ones.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <tuple>

#include <nlohmann/json.hpp>

#include "actors/http_client.hpp"
#include "runtime/config/node_config.hpp"
#include "sim/cluster_sim.hpp"
#include "sim/report.hpp"
#include "tools/shoal/bench_util.hpp"
#include "tools/shoal/commands.hpp"

namespace shoal::tools {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct cluster_args {
  std::string trace = conversation_trace_path();
  std::string config = "config/local-disagg";
  double speed = 0.25, length_scale = 1.0 / 32;
  int64_t requests = 60;
  std::vector<std::string> policies = {"tiered+decode_balancer", "round_robin+round_robin"};
  std::string profile, cost_model, decode_cost_model;
  int64_t max_input = 1024;  // inside the range bench fit-cost measures
  uint64_t seed = 1;
  std::string out = "bench/results/cluster.jsonl";
  std::string records;  // per-request JSONL, real and simulated (empty: none)
};

// One line per request of a run: where the tail of TTFT or TPOT comes from.
void append_records(const std::string& file, const std::string& kind, const std::string& policy,
                    const std::vector<sim::request_record>& recs) {
  if (file.empty()) return;
  for (const auto& r : recs) {
    const double tpot = r.output > 1 ? (r.finish_s - r.first_token_s) / static_cast<double>(r.output - 1) : 0;
    append_jsonl(file, json{{"kind", kind}, {"policy", policy}, {"id", r.id}, {"arrival_s", r.arrival_s},
                            {"ttft_s", r.first_token_s >= 0 ? r.first_token_s - r.arrival_s : -1.0}, {"tpot_s", tpot},
                            {"input", r.input}, {"output", r.output}, {"prefill_rank", r.prefill_rank},
                            {"decode_rank", r.decode_rank}});
  }
}

// The gateway section of a node config names the policies (and the balancers' cost model).
bool set_policies(std::string& text, const sim::policy_pair& p, const std::string& cost_model) {
  auto at = text.find("\n[gateway]\n");
  if (at == std::string::npos) return false;
  for (const char* key : {"\nprefill_policy = ", "\ndecode_policy = ", "\nbalancer_cost_model = "})
    for (size_t k; (k = text.find(key)) != std::string::npos;) text.erase(k, text.find('\n', k + 1) - k);
  at = text.find("\n[gateway]\n");
  std::string keys = fmt::format("prefill_policy = \"{}\"\ndecode_policy = \"{}\"\n", runtime::to_string(p.prefill), p.decode);
  if (!cost_model.empty()) keys += fmt::format("balancer_cost_model = \"{}\"\n", fs::absolute(cost_model).string());
  text.insert(at + 11, keys);
  return true;
}

// A copy of the node configs beside the original (relative paths keep resolving) whose
// gateway section names the policies, and whose storage tier (if any) starts empty in the copy.
std::expected<fs::path, std::string> policy_config(const fs::path& dir, const sim::policy_pair& p,
                                                   const std::string& cost_model) {
  bool gateway = false;
  auto out = fresh_config_copy(dir, [&](std::string& text) { gateway = set_policies(text, p, cost_model) || gateway; });
  if (out && !gateway) return std::unexpected(dir.string() + ": no node config with a [gateway] section");
  return out;
}

struct shape {
  std::string http_host;
  uint16_t http_port = 0;
  int64_t prefill = 0, decode = 0;
  int64_t prefill_ep = 1, decode_ep = 1;  // expert-parallel group sizes (engine.ep_group_size)
  int64_t prefill_drafts = 0, decode_drafts = 0;  // DSpark drafts per step (engine.spec_nextn when speculating)
  // The engines' scheduler limits per pool (engine.token_budget, engine.max_running), for the simulator.
  int64_t prefill_budget = 0, prefill_running = 0, decode_budget = 0, decode_running = 0;
  std::vector<int64_t> prefill_processes, decode_processes;  // ranks of each engine node, per pool
  std::string model_id;
  std::vector<std::pair<bool, runtime::host_port>> metrics;  // (decode pool?, node.metrics_listen) of engine nodes
};

// A pool's steps over a run: how many, their wall time, the tokens they computed (prefill:
// non-cached prompt tokens; decode: output tokens). Read from the engines' Prometheus counters
// for the real cluster, from the simulator's pools for the simulated one, so both print
// the same mean step time and tokens per step.
struct pool_steps {
  double steps = 0, seconds = 0, tokens = 0;
  double verified = 0, accepted = 0;  // DSpark drafts
  bool known = false;
  std::string line() const {
    if (!known || steps <= 0) return "n/a";
    std::string l = fmt::format("{:.0f} steps, {:.3f} s/step, {:.1f} tokens/step", steps, seconds / steps, tokens / steps);
    if (verified > 0) l += fmt::format(", drafts accepted {:.0f} of {:.0f} ({:.2f})", accepted, verified, accepted / verified);
    return l;
  }
};

// The engines' step counters now; a node that does not answer leaves its pool unknown.
std::pair<pool_steps, pool_steps> scrape_steps(const shape& sh) {
  pool_steps pre, dec;
  bool ok_pre = true, ok_dec = true;
  for (const auto& [decode, hp] : sh.metrics) {
    actors::http_call_options o;
    o.timeout = std::chrono::seconds(5);
    auto resp = actors::http_call(hp.host, hp.port, "GET", "/metrics", "", o);
    pool_steps& p = decode ? dec : pre;
    if (!resp || resp->status != 200) {
      (decode ? ok_dec : ok_pre) = false;
      continue;
    }
    p.steps += counter_sum(resp->body, "shoal_engine_steps_total");
    p.seconds += counter_sum(resp->body, "shoal_engine_step_seconds_total");
    p.tokens += counter_sum(resp->body, decode ? "shoal_engine_decode_tokens_total" : "shoal_engine_prefill_tokens_total");
    p.verified += counter_sum(resp->body, "shoal_engine_spec_verified_total");
    p.accepted += counter_sum(resp->body, "shoal_engine_spec_accepted_total");
    p.known = true;
  }
  pre.known = pre.known && ok_pre, dec.known = dec.known && ok_dec;
  return {pre, dec};
}

std::expected<shape, std::string> cluster_shape(const fs::path& dir) {
  shape s;
  std::vector<fs::path> files;  // in name order: the engine processes' order in the simulator
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".toml") files.push_back(e.path());
  std::ranges::sort(files);
  for (const fs::path& file : files) {
    auto c = runtime::load_node_config(file);
    if (!c) return std::unexpected(runtime::to_string(c.error()));
    if (c->http_listen) {
      s.http_host = c->http_listen->host, s.http_port = c->http_listen->port;
      s.model_id = c->model_dir.filename().string();
    }
    if (c->has_role(runtime::role::engine)) {
      const bool decode = c->disagg_role == runtime::engine_role::decode;
      (decode ? s.decode : s.prefill) += c->ranks;
      (decode ? s.decode_processes : s.prefill_processes).push_back(c->ranks);
      if (c->expert_parallel) (decode ? s.decode_ep : s.prefill_ep) = std::max<int64_t>(c->ep_group_size, c->ranks);
      if (c->speculative != "off") (decode ? s.decode_drafts : s.prefill_drafts) = c->spec_nextn;
      (decode ? s.decode_budget : s.prefill_budget) = c->token_budget;
      (decode ? s.decode_running : s.prefill_running) = c->max_running;
      if (c->metrics_listen) s.metrics.emplace_back(decode, *c->metrics_listen);
    }
  }
  if (s.http_port == 0) return std::unexpected(dir.string() + ": no gateway with a fixed gateway.listen port");
  return s;
}

// The simulator's cluster as the config's: ranks, EP groups, engine processes, DSpark depths
// and scheduler limits (into the profile's pools).
void into_sim(const shape& sh, sim::sim_config& c) {
  c.prefill_ranks = sh.prefill, c.prefill_ep = sh.prefill_ep, c.decode_ranks = sh.decode, c.decode_ep = sh.decode_ep;
  c.prefill_drafts = sh.prefill_drafts, c.decode_drafts = sh.decode_drafts;
  c.prefill_processes = sh.prefill_processes, c.decode_processes = sh.decode_processes;
  for (auto [pool, budget, running] : {std::tuple{&c.prof.prefill, sh.prefill_budget, sh.prefill_running},
                                       std::tuple{&c.prof.decode, sh.decode_budget, sh.decode_running}})
    if (budget > 0) pool->token_budget = budget, pool->max_running = running;
}

std::vector<sim::request_record> replay(const shape& sh, const std::vector<sim::sim_request>& work, int64_t vocab,
                                        int& failed, std::string& first_error) {
  std::vector<sim::request_record> recs(work.size());
  std::mutex mu;
  std::vector<std::thread> clients;
  const double t0 = now_s() + 0.5;
  for (size_t i = 0; i < work.size(); ++i)
    clients.emplace_back([&, i] {
      const sim::sim_request& w = work[i];
      sim::request_record& r = recs[i];
      r.id = w.id, r.arrival_s = w.arrival_s, r.input = w.input_len;
      const double wait = t0 + w.arrival_s - now_s();
      if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
      json body = {{"model", sh.model_id}, {"prompt", sim::prompt_tokens(w, vocab)}, {"max_tokens", w.output_len},
                   {"temperature", 0}, {"ignore_eos", true}, {"stream", true},
                   {"stream_options", {{"include_usage", true}}}};
      double first = -1, last = 0;
      actors::http_call_options o;
      o.timeout = std::chrono::seconds(600);
      o.on_body = [&](std::string_view chunk) {
        if (first < 0 && chunk.find("\"text\"") != std::string_view::npos) first = now_s();
        last = now_s();
      };
      auto resp = actors::http_call(sh.http_host, sh.http_port, "POST", "/v1/completions", body.dump(), o);
      std::lock_guard lock(mu);
      if (!resp || resp->status != 200 || first < 0) {
        if (failed++ == 0)
          first_error = !resp ? resp.error() : fmt::format("HTTP {}: {}", resp->status, resp->body.substr(0, 300));
        return;
      }
      for (const auto& d : actors::sse_data(resp->body)) {
        if (d == "[DONE]") continue;
        json j = json::parse(d, nullptr, false);
        if (!j.is_object() || !j.contains("usage") || !j["usage"].is_object()) continue;
        r.output = j["usage"].value("completion_tokens", 0);
        if (j["usage"].contains("prompt_tokens_details") && j["usage"]["prompt_tokens_details"].is_object())
          r.cached_tokens = j["usage"]["prompt_tokens_details"].value("cached_tokens", 0);
      }
      r.first_token_s = first - t0, r.finish_s = last - t0;
    });
  for (auto& c : clients) c.join();
  return recs;
}

// The simulator's figures against the real cluster's, and each pool's steps.
void print_prediction(const sim::serving_metrics& r, const sim::serving_metrics& m,
                      const std::pair<pool_steps, pool_steps>& real, const std::pair<pool_steps, pool_steps>& simulated) {
  auto ratio = [](double sim, double real) { return real > 0 ? sim / real : 0.0; };
  fmt::print("{}: simulated / real TTFT p50 {:.2f} p99 {:.2f}, TPOT p50 {:.2f} p99 {:.2f}, completed {:.2f}\n", r.policy,
             ratio(m.ttft_p50, r.ttft_p50), ratio(m.ttft_p99, r.ttft_p99), ratio(m.tpot_p50, r.tpot_p50),
             ratio(m.tpot_p99, r.tpot_p99), ratio(static_cast<double>(m.finished), static_cast<double>(r.finished)));
  fmt::print("  prefill pool: real {}; simulated {}\n", real.first.line(), simulated.first.line());
  fmt::print("  decode pool:  real {}; simulated {}\n", real.second.line(), simulated.second.line());
}

json steps_json(const pool_steps& p) {
  return p.known ? json{{"steps", p.steps}, {"seconds", p.seconds}, {"tokens", p.tokens}, {"spec_verified", p.verified},
                        {"spec_accepted", p.accepted}}
                 : json(nullptr);
}

int run_cluster_bench(const cluster_args& a) {
  sim::workload_options wo;
  wo.speed = a.speed, wo.length_scale = a.length_scale, wo.max_requests = a.requests, wo.max_input = a.max_input;
  auto work = sim::mooncake_workload(a.trace, wo);
  if (!work) {
    fmt::print(stderr, "shoal bench cluster: {}\n", work.error());
    return 2;
  }
  auto sh = cluster_shape(a.config);
  if (!sh) {
    fmt::print(stderr, "shoal bench cluster: {}\n", sh.error());
    return 2;
  }
  std::vector<sim::policy_pair> pols;
  for (const auto& n : a.policies) {
    auto p = sim::policy_named(n);
    if (!p) {
      fmt::print(stderr, "shoal bench cluster: {}\n", p.error());
      return 2;
    }
    pols.push_back(*p);
  }
  std::optional<sim::profile> prof;
  if (!a.profile.empty()) {
    auto p = sim::load_profile(a.profile);
    if (!p) {
      fmt::print(stderr, "shoal bench cluster: {}\n", p.error());
      return 2;
    }
    if (auto ok = sim::apply_fitted(*p, a.cost_model, a.decode_cost_model); !ok) {
      fmt::print(stderr, "shoal bench cluster: {}\n", ok.error());
      return 2;
    }
    prof = *p;
  }
  // Prompt ids below every DeepSeek-V3 tokenizer's size (128,815; the embedding is padded to
  // 129,280, and the gateway refuses ids past the tokenizer's).
  const int64_t vocab = 128000;
  fmt::print("trace {} ({} requests, speed {}, length scale {}), cluster {}: {} prefill + {} decode ranks\n",
             fs::path(a.trace).filename().string(), work->size(), a.speed, a.length_scale, a.config, sh->prefill, sh->decode);
  std::vector<sim::serving_metrics> real, simulated;
  std::vector<std::pair<pool_steps, pool_steps>> real_steps, sim_steps;
  const double ttft_slo = prof ? prof->ttft_slo_s : 0, tpot_slo = prof ? prof->tpot_slo_s : 0;
  for (const auto& p : pols) {
    auto dir = policy_config(a.config, p, a.cost_model);
    if (!dir) {
      fmt::print(stderr, "shoal bench cluster: {}\n", dir.error());
      return 2;
    }
    const fs::path state = *dir / "state";
    if (cluster_up(*dir, state, 300) != 0) return 1;
    int failed = 0;
    std::string first_error;
    auto recs = replay(*sh, *work, vocab, failed, first_error);
    real_steps.push_back(scrape_steps(*sh));
    cluster_down(state, 60);
    sim::serving_metrics m = sim::serving_from_records(p.name, recs, sh->prefill, ttft_slo, tpot_slo);
    fmt::print("policy {}: {} finished, {} failed{}\n", p.name, m.finished, failed,
               failed ? " (first: " + first_error + ")" : std::string());
    json rec = json::parse(sim::to_jsonl(m, "cluster", ""));
    rec["failed"] = failed, rec["trace"] = a.trace, rec["speed"] = a.speed, rec["length_scale"] = a.length_scale;
    rec["machine"] = machine_facts();
    rec["prefill_steps"] = steps_json(real_steps.back().first), rec["decode_steps"] = steps_json(real_steps.back().second);
    append_jsonl(a.out, rec);
    append_records(a.records, "cluster", p.name, recs);
    real.push_back(m);
    std::error_code ec;
    fs::remove_all(*dir, ec);
    if (prof) {
      sim::sim_config c;
      c.prof = *prof;
      c.seed = a.seed;
      into_sim(*sh, c);
      auto r = sim::run_cluster(c, *work, p);
      if (!r) {
        fmt::print(stderr, "shoal bench cluster: {}\n", r.error());
        return 2;
      }
      simulated.push_back(sim::summarize(*r, c));
      append_records(a.records, "sim", p.name, r->requests);
      auto pool = [&](const sim::pool_summary& p, bool drafts) {
        const double v = drafts ? static_cast<double>(r->spec_verified) : 0, acc = drafts ? static_cast<double>(r->spec_accepted) : 0;
        return pool_steps{static_cast<double>(p.all_steps), p.all_busy_s, p.tokens, v, acc, true};
      };
      // The drafts are the decode pool's, or the colocated ranks'.
      sim_steps.emplace_back(pool(r->prefill, sh->decode == 0), pool(r->decode, sh->decode > 0));
      json s = json::parse(sim::to_jsonl(simulated.back(), "sim", ""));
      s["prefill_steps"] = steps_json(sim_steps.back().first), s["decode_steps"] = steps_json(sim_steps.back().second);
      s["trace"] = a.trace, s["speed"] = a.speed, s["length_scale"] = a.length_scale, s["profile"] = prof->name;
      s["machine"] = machine_facts();
      append_jsonl(a.out, s);
    }
  }
  fmt::print("real cluster:\n{}", sim::format_table(real));
  if (prof) {
    fmt::print("simulator ({}):\n{}", prof->name, sim::format_table(simulated));
    for (size_t i = 0; i < real.size(); ++i) print_prediction(real[i], simulated[i], real_steps[i], sim_steps[i]);
  }
  return 0;
}

}  // namespace

std::expected<std::filesystem::path, std::string> fresh_config_copy(const std::filesystem::path& dir,
                                                                   const std::function<void(std::string&)>& edit) {
  fs::path out = dir.parent_path() / (".bench-cluster-" + dir.filename().string());
  std::error_code ec;
  fs::remove_all(out, ec);
  fs::create_directories(out, ec);
  if (ec) return std::unexpected("cannot create " + out.string() + ": " + ec.message());
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".toml") continue;
    std::string text = read_text(e.path());
    if (edit) edit(text);
    // A storage tier of its own, empty: blocks an earlier run (or policy) wrote are no hits here.
    if (auto at = text.find("\n[storage]\n"); at != std::string::npos) {
      const size_t end = text.find("\n[", at + 1);
      const size_t k = text.find("\ndir = ", at);
      if (k != std::string::npos && k < end)
        text.replace(k, text.find('\n', k + 1) - k, fmt::format("\ndir = \"{}\"", fs::absolute(out / "chunks").string()));
    }
    std::ofstream(out / e.path().filename()) << text;
  }
  return out;
}

std::expected<void, std::string> sim_shape_from_config(const std::string& dir, sim::sim_config& c) {
  auto sh = cluster_shape(dir);
  if (!sh) return std::unexpected(sh.error());
  into_sim(*sh, c);
  return {};
}

void add_cluster_bench(CLI::App& bench) {
  auto a = std::make_shared<cluster_args>();
  auto* c = bench.add_subcommand("cluster", "a trace against a real loopback cluster, per balancer policy");
  c->add_option("--trace", a->trace, "Mooncake JSONL trace")->capture_default_str();
  c->add_option("--config", a->config, "node-config directory of the cluster")->capture_default_str();
  c->add_option("--speed", a->speed, "arrival rate × this")->capture_default_str();
  c->add_option("--length-scale", a->length_scale, "input and output lengths × this")->capture_default_str();
  c->add_option("--requests", a->requests, "first N requests of the trace")->capture_default_str();
  c->add_option("--max-input", a->max_input, "cut longer prompts to this many tokens")->capture_default_str();
  c->add_option("--policies", a->policies, "PREFILL+DECODE pairs or shoal sim's names")->delimiter(',')->capture_default_str();
  c->add_option("--profile", a->profile, "also simulate the same requests with this profile (config/sim/*.json)");
  c->add_option("--cost-model", a->cost_model, "fitted cost model for a profile whose step is \"fitted\" (also the gateway's balancer_cost_model)");
  c->add_option("--decode-cost-model", a->decode_cost_model, "fitted decode steps (shoal bench fit-cost --decode) for the simulated decode pool");
  c->add_option("--seed", a->seed, "simulator seed")->capture_default_str();
  c->add_option("--out", a->out, "JSONL records")->capture_default_str();
  c->add_option("--records", a->records, "also one JSONL line per request (TTFT, TPOT, lengths, ranks), real and simulated");
  c->callback([a] { set_exit_code(run_cluster_bench(*a)); });
}

}  // namespace shoal::tools
