// `shoal bench ep-fault`: one process of an expert-parallel group is lost under load, and what
// the clients see is measured. The cluster is `shoal up` of a node-config directory (default
// config/deepseek-shape: a prefill group of 2 ranks on 2 processes, a decode group of 4 ranks
// on 2 processes), with an empty storage tier. Each trial streams --streams greedy completions
// of --tokens tokens at once; once every stream has its first tokens, the victim process is
// killed (SIGKILL) or stopped (SIGSTOP). Per trial it reports:
// - the time from the fault to the next token of every stream still running (p50, max), and,
//   since tokens computed before the fault may still be on their way then, each stream's
//   stall: its first gap between tokens from the fault on that is longer than twice the usual
//   (see stall_of), and the time from the fault to the token that ends it (p50, max), beside
//   the median gap of the run without a fault: the group's unavailability as a client sees it;
// - each stream's extra time to its last token against a run of the same streams without a
//   fault (p50, max): what re-routed and recomputed requests cost;
// - the routed-expert bytes the surviving processes of the group adopted while it re-formed, by
//   source (memory: another rank of the process held them; a holder process over the bulk
//   transport; the checkpoint), from their /metrics;
// - for a kill, the restart (`shoal up --node`) and the time until every surviving process's
//   group is whole again; for a stop, SIGCONT after the streams ended and the same time.
// - the first token of --late requests with longer prompts sent right after the fault, against
//   the same wave sent at the same point of a run without a fault: how long the cluster takes
//   new requests (a prefill group that lost a process) after the fault.
// Streams that fail are counted and the first error printed. Records go to --out (JSONL).
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <regex>
#include <thread>

#include <signal.h>

#include <nlohmann/json.hpp>

#include "actors/http_client.hpp"
#include "runtime/config/node_config.hpp"
#include "tools/shoal/bench_util.hpp"
#include "tools/shoal/commands.hpp"

namespace shoal::tools {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct fault_args {
  std::string config = "config/deepseek-shape";
  int64_t streams = 30, tokens = 64;
  int64_t late = 8;  // streams started right after the fault (their first token)
  std::vector<std::string> faults = {"decode-b:kill", "decode-b:stop", "prefill-b:kill", "prefill-b:stop"};
  std::string out = "bench/results/ep_fault.jsonl";
  std::string logs;  // where the nodes' logs go at the end (empty: nowhere)
};

// The engine nodes of a config: their EP group, its configured size and their metrics port.
struct engine_node {
  std::string name, group;
  int64_t group_size = 0;
  std::optional<runtime::host_port> metrics;
};
struct cluster_view {
  runtime::host_port http;
  std::string model;  // the gateway's model name
  std::vector<engine_node> engines;
};

std::expected<cluster_view, std::string> read_cluster(const fs::path& dir) {
  cluster_view v;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".toml") continue;
    auto c = runtime::load_node_config(e.path());
    if (!c) return std::unexpected(runtime::to_string(c.error()));
    if (c->http_listen) v.http = *c->http_listen, v.model = c->model_dir.filename().string();
    if (c->has_role(runtime::role::engine) && c->expert_parallel)
      v.engines.push_back({c->name, c->ep_group, std::max<int64_t>(c->ep_group_size, c->ranks), c->metrics_listen});
  }
  if (v.http.port == 0) return std::unexpected(dir.string() + ": no gateway with a fixed gateway.listen port");
  for (const auto& n : v.engines)
    if (!n.metrics) return std::unexpected(dir.string() + ": engine node '" + n.name + "' has no node.metrics_listen");
  return v;
}

// One value of a labelled series in a Prometheus text body (0 when absent).
double series(const std::string& body, const std::string& name, const std::string& labels) {
  std::smatch m;
  const std::regex re(name + "\\{" + labels + "\\} ([0-9.e+-]+)");
  return std::regex_search(body, m, re) ? std::stod(m[1]) : 0.0;
}

std::string metrics_of(const engine_node& n) {
  actors::http_call_options o;
  o.timeout = std::chrono::seconds(3);
  auto r = actors::http_call(n.metrics->host, n.metrics->port, "GET", "/metrics", "", o);
  return r && r->status == 200 ? r->body : std::string();
}

// Requests the node's ranks were computing (shoal_engine_requests_running, summed over them):
// at the fault, the streams whose engine it kills or stops (re-routed, or waiting for it).
double running_on(const engine_node& n) {
  const std::string body = metrics_of(n);
  static const std::regex re("shoal_engine_requests_running\\{[^}]*\\} ([0-9.e+-]+)");
  double sum = 0;
  for (auto it = std::sregex_iterator(body.begin(), body.end(), re); it != std::sregex_iterator(); ++it)
    sum += std::stod((*it)[1]);
  return sum;
}

// Expert bytes adopted by the survivors of `victim`'s group: from memory, from holders, from
// the checkpoint.
struct expert_sources {
  double memory = 0, holder = 0, checkpoint = 0;
};
expert_sources expert_bytes(const cluster_view& v, const engine_node& victim) {
  expert_sources b;
  for (const auto& n : v.engines) {
    if (n.name == victim.name || n.group != victim.group) continue;
    const std::string body = metrics_of(n);
    b.memory += series(body, "shoal_ep_expert_bytes_read_total", "source=\"memory\"");
    b.holder += series(body, "shoal_ep_expert_bytes_read_total", "source=\"holder\"");
    b.checkpoint += series(body, "shoal_ep_expert_bytes_read_total", "source=\"checkpoint\"");
  }
  return b;
}

// Whether every node of `group` reports the group at its configured size.
bool group_whole(const cluster_view& v, const std::string& group) {
  for (const auto& n : v.engines)
    if (n.group == group &&
        series(metrics_of(n), "shoal_ep_group_ranks", "actor=\"node\"") != static_cast<double>(n.group_size))
      return false;
  return true;
}

// What the clients saw: each stream's token arrival times (s from the start), its error;
// the late wave's streams follow the first `streams` ones, sent at `late_at`.
struct streams_seen {
  std::vector<std::vector<double>> tokens;
  std::vector<std::string> errors;
  double fault_at = -1, late_at = -1;
};

// --streams greedy streams at once; `fault` runs once every stream has two tokens (or after
// 30 s), and right after it --late streams of longer prompts start (their first token: how
// long the cluster takes new requests after the fault; with a `fault` that does nothing, the
// same without one).
streams_seen run_streams(const fault_args& a, const cluster_view& v, const std::function<void()>& fault) {
  const auto n = static_cast<size_t>(a.streams), late = fault ? static_cast<size_t>(a.late) : 0;
  streams_seen seen;
  seen.tokens.resize(n + late);
  seen.errors.resize(n + late);
  std::mutex mu;
  std::atomic<size_t> started{0}, ended{0};
  const double t0 = now_s();
  std::vector<std::thread> clients;
  auto launch = [&](size_t i, std::string prompt, int64_t tokens) {
    clients.emplace_back([&, i, prompt = std::move(prompt), tokens] {
      json body = {{"model", v.model}, {"prompt", prompt}, {"max_tokens", tokens}, {"temperature", 0},
                   {"ignore_eos", true}, {"stream", true}};
      actors::http_call_options o;
      o.timeout = std::chrono::seconds(180);
      size_t got = 0;
      o.on_body = [&](std::string_view piece) {
        std::lock_guard lock(mu);
        for (size_t at = piece.find("data: {"); at != std::string_view::npos; at = piece.find("data: {", at + 1)) {
          seen.tokens[i].push_back(now_s() - t0);
          if (++got == 2 && i < n) ++started;
        }
      };
      auto r = actors::http_call(v.http.host, v.http.port, "POST", "/v1/completions", body.dump(), o);
      std::lock_guard lock(mu);
      if (!r) seen.errors[i] = r.error();
      else if (r->status != 200) seen.errors[i] = fmt::format("HTTP {}: {}", r->status, r->body);
      else if (auto e = r->body.find("\"error\""); e != std::string::npos) seen.errors[i] = r->body.substr(e, 200);
      ++ended;
    });
  };
  for (size_t i = 0; i < n; ++i) launch(i, fmt::format("stream {} asks the harbour master about the tides", i), a.tokens);
  if (fault) {
    while (started < n && ended == 0 && now_s() - t0 < 30) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    seen.fault_at = now_s() - t0;
    fault();
    seen.late_at = now_s() - t0;
    for (size_t i = n; i < n + late; ++i) {
      std::string prompt = fmt::format("late stream {} writes to the harbour master:", i);
      for (int k = 0; k < 12; ++k) prompt += " the berths, the cranes, the pilots and the tides of the coming season;";
      launch(i, std::move(prompt), 8);
    }
  }
  for (auto& c : clients) c.join();
  return seen;
}

// The late wave's time to first token (s), one per stream that got one.
std::vector<double> late_ttft(const streams_seen& s, size_t n) {
  std::vector<double> out;
  for (size_t i = n; i < s.tokens.size(); ++i)
    if (!s.tokens[i].empty()) out.push_back(s.tokens[i].front() - s.late_at);
  return out;
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

// Each stream's token arrival times from 1 s before the fault to 20 s after it, relative to the
// fault (ms): where the gap is, and whether tokens come one by one or in bursts.
json tokens_around(const streams_seen& s, size_t n) {
  json out = json::array();
  for (size_t i = 0; i < n; ++i) {
    json times = json::array();
    for (double t : s.tokens[i])
      if (t >= s.fault_at - 1 && t <= s.fault_at + 20) times.push_back(std::lround((t - s.fault_at) * 1000));
    out.push_back(std::move(times));
  }
  return out;
}

double waited_until(const std::function<bool()>& done, double limit_s) {
  const double t0 = now_s();
  while (!done() && now_s() - t0 < limit_s) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  return done() ? now_s() - t0 : -1;
}

// A stream's stall at a fault at `from`: the first gap between consecutive tokens that ends
// after `from`, begins no later than 10 s after it and is longer than twice `normal` (the
// median gap without a fault); without one (the stream did not stall) the gap before its
// first token after `from`. Returns the gap and when the token that ends it came.
std::pair<double, double> stall_of(const std::vector<double>& t, double from, double normal) {
  std::optional<std::pair<double, double>> first;
  for (size_t j = 1; j < t.size() && t[j - 1] <= from + 10; ++j) {
    if (t[j] <= from) continue;
    if (!first) first = {t[j] - t[j - 1], t[j]};
    if (t[j] - t[j - 1] > 2 * normal) return {t[j] - t[j - 1], t[j]};
  }
  return first.value_or(std::pair<double, double>{0, from});
}

// The median gap between consecutive tokens over every stream of a run.
double median_gap(const streams_seen& s, size_t n) {
  std::vector<double> gaps;
  for (size_t i = 0; i < n && i < s.tokens.size(); ++i)
    for (size_t j = 1; j < s.tokens[i].size(); ++j) gaps.push_back(s.tokens[i][j] - s.tokens[i][j - 1]);
  return quantile(gaps, 0.5);
}

// The trial's record as three lines of text.
void print_trial(const json& r) {
  auto q = [&](const char* k, const char* f) { return r[k][f].get<double>(); };
  const auto& b = r["expert_bytes_read"];
  fmt::print("{:<10} {:<5} next token after the fault: p50 {:.2f} s, max {:.2f} s ({} streams running, {} on the "
             "victim); extra to the last token p50 {:.2f} s, max {:.2f} s; {} failed{}\n"
             "           stall (first gap over twice the usual from the fault on): p50 {:.2f} s, max {:.2f} s (gap without a fault p50 "
             "{:.2f} s); the token ending it came p50 {:.2f} s, max {:.2f} s after the fault\n"
             "           experts the survivors adopted: {:.1f} MiB from memory, {:.1f} MiB from holders, {:.1f} MiB from "
             "the checkpoint; group whole again {:.1f} s after the {}\n"
             "           {} requests sent right after the fault: first token p50 {:.2f} s, max {:.2f} s (without a fault "
             "p50 {:.2f} s, max {:.2f} s)\n",
             r["victim"].get<std::string>(), r["fault"].get<std::string>(), q("fault_to_next_token_s", "p50"),
             q("fault_to_next_token_s", "max"), r["fault_to_next_token_s"]["streams"].get<size_t>(),
             r["running_on_victim"].get<double>(), q("extra_to_last_token_s", "p50"), q("extra_to_last_token_s", "max"),
             r["failed"].get<int>(), r["failed"].get<int>() ? " (first: " + r["first_error"].get<std::string>() + ")" : "",
             q("stall_s", "p50"), q("stall_s", "max"), q("stall_s", "baseline_gap_p50"), q("fault_to_resumed_token_s", "p50"),
             q("fault_to_resumed_token_s", "max"), b["memory"].get<double>() / (1 << 20), b["holder"].get<double>() / (1 << 20),
             b["checkpoint"].get<double>() / (1 << 20), r["group_whole_after_s"].get<double>(),
             r["fault"] == "kill" ? "restart" : "SIGCONT", r["late_ttft_s"]["streams"].get<size_t>(), q("late_ttft_s", "p50"),
             q("late_ttft_s", "max"), q("late_ttft_s", "baseline_p50"), q("late_ttft_s", "baseline_max"));
}

// One trial: victim "NAME:kill" or "NAME:stop", against the same streams' baseline.
json run_trial(const fault_args& a, const fs::path& dir, const fs::path& state, const cluster_view& v,
               const std::string& spec, const streams_seen& base) {
  const auto colon = spec.find(':');
  const std::string victim = spec.substr(0, colon), how = colon == std::string::npos ? "kill" : spec.substr(colon + 1);
  json rec = {{"fault", how}, {"victim", victim}, {"streams", a.streams}, {"tokens", a.tokens}};
  auto node = std::find_if(v.engines.begin(), v.engines.end(), [&](const engine_node& n) { return n.name == victim; });
  const auto pids = cluster_pids(state);
  const pid_t pid = pids.contains(victim) ? pids.at(victim) : -1;
  if (node == v.engines.end() || pid <= 0 || (how != "kill" && how != "stop")) {
    rec["error"] = "not an expert-parallel engine node of the running cluster, or not kill|stop";
    return rec;
  }
  const auto before = expert_bytes(v, *node);
  double on_victim = 0;
  auto seen = run_streams(a, v, [&] {
    on_victim = running_on(*node);
    ::kill(pid, how == "kill" ? SIGKILL : SIGSTOP);
  });
  std::vector<double> gaps, extra, stalls, resumed;
  int failed = 0;
  std::string first_error;
  const auto n = static_cast<size_t>(a.streams);
  const double base_gap = median_gap(base, n);
  for (size_t i = 0; i < seen.tokens.size(); ++i) {
    if (!seen.errors[i].empty() && failed++ == 0) first_error = seen.errors[i];
    if (i >= n) continue;  // the late wave: its first tokens, below
    const auto& t = seen.tokens[i];
    auto next = std::upper_bound(t.begin(), t.end(), seen.fault_at);
    if (next != t.end() && next != t.begin()) {  // running at the fault
      gaps.push_back(*next - seen.fault_at);
      const auto [gap, end] = stall_of(t, seen.fault_at, base_gap);
      stalls.push_back(gap), resumed.push_back(end - seen.fault_at);
    }
    if (!t.empty() && !base.tokens[i].empty()) extra.push_back(t.back() - base.tokens[i].back());
  }
  const auto after = expert_bytes(v, *node);
  rec["tokens_around_fault"] = tokens_around(seen, n);
  if (how == "kill") {
    rec["restart_rc"] = cluster_start_node(dir, state, victim, 120);
  } else {
    ::kill(pid, SIGCONT);
  }
  const double whole_s = waited_until([&] { return group_whole(v, node->group); }, 120);
  // One more request through every group: the grown group steps and reads what its ranks
  // gained before the next trial counts.
  {
    fault_args one = a;
    one.streams = 1, one.tokens = 4;
    run_streams(one, v, {});
  }
  rec["failed"] = failed, rec["first_error"] = first_error, rec["running_on_victim"] = on_victim;
  rec["fault_to_next_token_s"] = {{"p50", quantile(gaps, 0.5)}, {"max", quantile(gaps, 1.0)}, {"streams", gaps.size()}};
  rec["stall_s"] = {{"p50", quantile(stalls, 0.5)}, {"max", quantile(stalls, 1.0)}, {"baseline_gap_p50", base_gap}};
  rec["fault_to_resumed_token_s"] = {{"p50", quantile(resumed, 0.5)}, {"max", quantile(resumed, 1.0)}};
  rec["extra_to_last_token_s"] = {{"p50", quantile(extra, 0.5)}, {"max", quantile(extra, 1.0)}};
  const expert_sources moved{after.memory - before.memory, after.holder - before.holder, after.checkpoint - before.checkpoint};
  rec["expert_bytes_read"] = {{"memory", moved.memory}, {"holder", moved.holder}, {"checkpoint", moved.checkpoint}};
  rec["group_whole_after_s"] = whole_s;
  const auto late = late_ttft(seen, n), late_base = late_ttft(base, n);
  rec["late_ttft_s"] = {{"p50", quantile(late, 0.5)}, {"max", quantile(late, 1.0)}, {"streams", late.size()},
                        {"baseline_p50", quantile(late_base, 0.5)}, {"baseline_max", quantile(late_base, 1.0)}};
  print_trial(rec);
  return rec;
}

int run_fault_bench(const fault_args& a) {
  auto dir = fresh_config_copy(a.config, {});
  if (!dir) {
    fmt::print(stderr, "shoal bench ep-fault: {}\n", dir.error());
    return 2;
  }
  auto v = read_cluster(*dir);
  if (!v) {
    fmt::print(stderr, "shoal bench ep-fault: {}\n", v.error());
    return 2;
  }
  const fs::path state = *dir / "state";
  if (cluster_up(*dir, state, 300) != 0) return 1;
  fmt::print("cluster {}: {} streams of {} tokens per trial\n", a.config, a.streams, a.tokens);
  run_streams(a, *v, {});  // warm-up: every rank has stepped, cost models collect
  const streams_seen base = run_streams(a, *v, [] {});  // the same load, the late wave at the same point, no fault
  for (const auto& e : base.errors)
    if (!e.empty()) {
      fmt::print(stderr, "shoal bench ep-fault: a stream of the run without a fault failed: {}\n", e);
      cluster_down(state, 60);
      return 1;
    }
  for (const auto& n : v->engines)
    if (!group_whole(*v, n.group)) {
      fmt::print(stderr, "shoal bench ep-fault: group '{}' does not report its {} ranks (shoal_ep_group_ranks)\n", n.group,
                 n.group_size);
      cluster_down(state, 60);
      return 1;
    }
  std::vector<double> last;
  for (size_t i = 0; i < static_cast<size_t>(a.streams); ++i) last.push_back(base.tokens[i].empty() ? 0 : base.tokens[i].back());
  fmt::print("baseline (no fault): last token p50 {:.2f} s, max {:.2f} s\n", quantile(last, 0.5), quantile(last, 1.0));
  int rc = 0;
  for (const auto& spec : a.faults) {
    json rec = run_trial(a, *dir, state, *v, spec, base);
    rec["config"] = a.config, rec["machine"] = machine_facts();
    if (rec.contains("error")) {
      fmt::print(stderr, "shoal bench ep-fault: {}: {}\n", spec, rec["error"].get<std::string>());
      rc = 2;
      break;
    }
    append_jsonl(a.out, rec);
  }
  cluster_down(state, 60);
  std::error_code ec;
  if (!a.logs.empty()) {
    fs::create_directories(a.logs, ec);
    for (const auto& e : fs::directory_iterator(state, ec))
      if (e.path().extension() == ".log") fs::copy_file(e.path(), fs::path(a.logs) / e.path().filename(), fs::copy_options::overwrite_existing, ec);
  }
  fs::remove_all(*dir, ec);
  return rc;
}

}  // namespace

void add_ep_fault_bench(CLI::App& bench) {
  auto a = std::make_shared<fault_args>();
  auto* c = bench.add_subcommand("ep-fault", "kill -9 / SIGSTOP of one process of an expert-parallel group under streams: "
                                             "fault to next token, extra latency, expert bytes by source, rejoin time");
  c->add_option("--config", a->config, "node-config directory of the cluster")->capture_default_str();
  c->add_option("--streams", a->streams, "concurrent streams per trial")->capture_default_str();
  c->add_option("--tokens", a->tokens, "tokens per stream")->capture_default_str();
  c->add_option("--late", a->late, "streams of longer prompts started right after the fault")->capture_default_str();
  c->add_option("--faults", a->faults, "NODE:kill or NODE:stop, one trial each")->delimiter(',')->capture_default_str();
  c->add_option("--out", a->out, "JSONL records")->capture_default_str();
  c->add_option("--logs", a->logs, "copy the nodes' logs here at the end");
  c->callback([a] { set_exit_code(run_fault_bench(*a)); });
}

}  // namespace shoal::tools
