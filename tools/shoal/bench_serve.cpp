// `shoal bench serve`: the serving path measured against the engine alone, in one run.
// Through a running cluster's gateway (shoal up): requests/s, TTFT and TPOT p50/p99 at each
// concurrency (streaming clients over HTTP); the same prompts through one offline engine in
// this process at the same concurrency; their ratio is the serving overhead. Then actor
// messaging: request/response latency and pipelined throughput in-process and to a remote
// node agent over the middleman.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/http_client.hpp"
#include "actors/interfaces.hpp"
#include "runtime/engine/engine_setup.hpp"
#include "tools/shoal/bench_util.hpp"
#include "tools/shoal/commands.hpp"
#include "tools/shoald/engine_options.hpp"

namespace shoal::tools {

namespace {

using nlohmann::json;

struct serve_args {
  std::string http = "127.0.0.1:8000";  // the gateway's HTTP endpoint
  std::string node = "127.0.0.1:7100";  // a node agent, for cross-process messaging
  std::string model_dir = "models/small";
  std::vector<int> concurrency = {1, 8, 32};
  int requests = 0;  // per level; 0 = max(2 × concurrency, 4)
  int max_tokens = 32;
  int msg_reps = 2000;
  std::string out = "bench/results/serve.jsonl";
};

struct request_times {
  double ttft = 0, tpot = 0;
};

struct level_result {
  double wall_s = 0;
  std::vector<request_times> times;
  int64_t tokens = 0;
  int failed = 0;
};

std::string prompt_text(int i) {
  static const char* words[] = {"river", "stone", "engine", "cloud", "garden", "signal", "harbor", "lantern"};
  std::string s = "Request " + std::to_string(i) + ":";
  for (int w = 0; w < 40; ++w) s += std::string(" ") + words[(i * 7 + w * 3) % 8];
  return s;
}

std::pair<std::string, uint16_t> split_host_port(const std::string& hp) {
  auto c = hp.rfind(':');
  return {hp.substr(0, c), static_cast<uint16_t>(std::stoi(hp.substr(c + 1)))};
}

// The gateway's model id: the checkpoint directory's name.
std::string model_id(const std::string& dir) {
  std::filesystem::path p = std::filesystem::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

level_result run_gateway(const serve_args& a, int conc, int n) {
  auto [host, port] = split_host_port(a.http);
  level_result res;
  std::mutex mu;
  std::atomic<int> next{0};
  double t0 = now_s();
  std::vector<std::thread> clients;
  for (int t = 0; t < conc; ++t)
    clients.emplace_back([&] {
      for (int i; (i = next++) < n;) {
        json body = {{"model", model_id(a.model_dir)},  {"prompt", prompt_text(i)}, {"max_tokens", a.max_tokens},
                     {"temperature", 0},  {"ignore_eos", true},       {"stream", true},
                     {"stream_options", {{"include_usage", true}}}};
        double start = now_s(), first = -1, last = start;
        actors::http_call_options o;
        o.timeout = std::chrono::seconds(600);
        o.on_body = [&](std::string_view chunk) {
          if (first < 0 && chunk.find("\"text\"") != std::string_view::npos) first = now_s();
          last = now_s();
        };
        auto r = actors::http_call(host, port, "POST", "/v1/completions", json(body).dump(), o);
        std::lock_guard lock(mu);
        if (!r || r->status != 200 || first < 0) {
          ++res.failed;
          continue;
        }
        int64_t toks = 0;
        for (const auto& d : actors::sse_data(r->body))
          if (d != "[DONE]") {
            json j = json::parse(d, nullptr, false);
            if (j.is_object() && j.contains("usage") && j["usage"].is_object()) toks = j["usage"]["completion_tokens"];
          }
        res.tokens += toks;
        res.times.push_back({first - start, toks > 1 ? (last - first) / static_cast<double>(toks - 1) : 0});
      }
    });
  for (auto& c : clients) c.join();
  res.wall_s = now_s() - t0;
  return res;
}

level_result run_offline(const runtime::loaded_model& m, const serve_args& a, int conc, int n) {
  runtime::engine e(m.weights, shoald::engine_config_for(m.weights->config));
  runtime::sampling_params p;
  p.max_tokens = a.max_tokens;
  p.ignore_eos = true;
  level_result res;
  struct track {
    double start, first = -1;
    int64_t tokens = 0;
  };
  std::map<int64_t, track> live;
  int next = 0;
  double t0 = now_s();
  auto admit = [&] {
    while (static_cast<int>(live.size()) < conc && next < n) {
      auto id = e.add_request(runtime::encode_prompt(*m.tokenizer, prompt_text(next++)), p);
      if (!id) throw std::runtime_error(id.error().message);
      live[id->value] = {now_s()};
    }
  };
  admit();
  while (!live.empty()) {
    for (const auto& ev : e.step()) {
      auto& t = live.at(ev.id.value);
      double now = now_s();
      if (ev.token >= 0) {
        if (t.first < 0) t.first = now;
        ++t.tokens;
      }
      if (ev.finished) {
        res.tokens += t.tokens;
        res.times.push_back({t.first - t.start, t.tokens > 1 ? (now - t.first) / static_cast<double>(t.tokens - 1) : 0});
        e.forget(ev.id);
        live.erase(ev.id.value);
      }
    }
    admit();
  }
  res.wall_s = now_s() - t0;
  return res;
}

json summarize(const level_result& r, int n) {
  std::vector<double> ttft, tpot;
  for (const auto& t : r.times) {
    ttft.push_back(t.ttft);
    tpot.push_back(t.tpot);
  }
  return {{"requests", n},
          {"failed", r.failed},
          {"wall_s", r.wall_s},
          {"requests_per_s", static_cast<double>(r.times.size()) / r.wall_s},
          {"tokens_per_s", static_cast<double>(r.tokens) / r.wall_s},
          {"ttft_p50_ms", percentile(ttft, 0.5) * 1e3},
          {"ttft_p99_ms", percentile(ttft, 0.99) * 1e3},
          {"tpot_p50_ms", percentile(tpot, 0.5) * 1e3},
          {"tpot_p99_ms", percentile(tpot, 0.99) * 1e3}};
}

// Request/response round trips to `target` from a scoped actor: latency p50/p99 (µs) one at a
// time, then `reps` requests in flight at once (messages/s).
template <class Reply, class Handle, class... Ts>
json messaging(caf::actor_system& sys, const Handle& target, int reps, Ts... xs) {
  caf::scoped_actor self{sys};
  std::vector<double> lat;
  for (int i = 0; i < reps; ++i) {
    double t = now_s();
    self->request(target, std::chrono::seconds(10), xs...).receive([](Reply&) {}, [](caf::error&) {});
    lat.push_back((now_s() - t) * 1e6);
  }
  double t0 = now_s();
  for (int i = 0; i < reps; ++i) self->send(caf::actor_cast<caf::actor>(target), xs...);
  int got = 0;
  self->receive_for(got, reps)([](Reply&) {});
  double thr = reps / (now_s() - t0);
  return {{"reps", reps}, {"latency_us_p50", percentile(lat, 0.5)}, {"latency_us_p99", percentile(lat, 0.99)}, {"msgs_per_s", thr}};
}

caf::behavior echo(caf::event_based_actor*) {
  return {[](caf::ok_atom) { return caf::ok_atom_v; }};
}

int run_serve_bench(const serve_args& a) {
  auto m = runtime::load_model_dir(a.model_dir, false);
  if (!m) {
    fmt::print(stderr, "shoal bench serve: {}\n", m.error().message);
    return 1;
  }
  json base = machine_facts();
  base["bench"] = "serve";
  base["model_dir"] = a.model_dir;
  base["max_tokens"] = a.max_tokens;
  fmt::print("{:>5} {:>6} | {:>9} {:>9} {:>6} | {:>9} {:>9} {:>9} {:>9} | {:>9} {:>9} {:>9} {:>9}\n", "conc", "reqs",
             "gw req/s", "eng req/s", "ratio", "gw ttft50", "gw ttft99", "gw tpot50", "gw tpot99", "en ttft50",
             "en ttft99", "en tpot50", "en tpot99");
  for (int c : a.concurrency) {
    int n = a.requests > 0 ? a.requests : std::max(2 * c, 4);
    json gw = summarize(run_gateway(a, c, n), n);
    json en = summarize(run_offline(*m, a, c, n), n);
    double ratio = gw["requests_per_s"].get<double>() / en["requests_per_s"].get<double>();
    fmt::print("{:>5} {:>6} | {:>9.2f} {:>9.2f} {:>6.3f} | {:>9.1f} {:>9.1f} {:>9.1f} {:>9.1f} | {:>9.1f} {:>9.1f} {:>9.1f} {:>9.1f}{}\n",
               c, n, gw["requests_per_s"].get<double>(), en["requests_per_s"].get<double>(), ratio,
               gw["ttft_p50_ms"].get<double>(), gw["ttft_p99_ms"].get<double>(), gw["tpot_p50_ms"].get<double>(),
               gw["tpot_p99_ms"].get<double>(), en["ttft_p50_ms"].get<double>(), en["ttft_p99_ms"].get<double>(),
               en["tpot_p50_ms"].get<double>(), en["tpot_p99_ms"].get<double>(),
               gw["failed"].get<int>() ? fmt::format("  ({} failed)", gw["failed"].get<int>()) : "");
    json rec = base;
    rec["point"] = "serve";
    rec["concurrency"] = c;
    rec["gateway"] = gw;
    rec["engine"] = en;
    rec["throughput_ratio"] = ratio;
    append_jsonl(a.out, rec);
  }

  caf::actor_system_config cfg;
  cfg.load<caf::io::middleman>();
  actors::add_message_types(cfg);
  caf::actor_system sys{cfg};
  json local = messaging<caf::ok_atom>(sys, sys.spawn(echo), a.msg_reps, caf::ok_atom_v);
  auto [host, port] = split_host_port(a.node);
  json remote;
  if (auto agent = sys.middleman().remote_actor<actors::node_agent_actor>(host, port))
    remote = messaging<actors::membership>(sys, *agent, a.msg_reps, members_atom_v);
  fmt::print("\nactor messaging (request/response, {} reps)\n", a.msg_reps);
  fmt::print("  in-process echo:          p50 {:8.1f} us  p99 {:8.1f} us  pipelined {:10.0f} msg/s\n",
             local["latency_us_p50"].get<double>(), local["latency_us_p99"].get<double>(), local["msgs_per_s"].get<double>());
  if (!remote.is_null())
    fmt::print("  remote node agent ({}):  p50 {:8.1f} us  p99 {:8.1f} us  pipelined {:10.0f} msg/s\n", a.node,
               remote["latency_us_p50"].get<double>(), remote["latency_us_p99"].get<double>(),
               remote["msgs_per_s"].get<double>());
  else
    fmt::print("  remote node agent ({}): unreachable\n", a.node);
  json rec = base;
  rec["point"] = "messaging";
  rec["in_process"] = local;
  rec["remote"] = remote;
  append_jsonl(a.out, rec);
  std::fflush(stdout);
  std::_Exit(0);  // CAF 0.17's teardown can block once a remote node was connected
}

}  // namespace

void add_serve_bench(CLI::App& bench) {
  auto* b = bench.add_subcommand("serve", "gateway vs offline engine (req/s, TTFT, TPOT) and actor messaging; "
                                          "needs a running cluster (shoal up)");
  auto a = std::make_shared<serve_args>();
  b->add_option("--http", a->http, "gateway HTTP host:port")->capture_default_str();
  b->add_option("--node", a->node, "a node's node.listen host:port")->capture_default_str();
  b->add_option("--model", a->model_dir, "the cluster's checkpoint (for the offline engine)")->capture_default_str();
  b->add_option("--concurrency", a->concurrency, "concurrent streams")->capture_default_str();
  b->add_option("--requests", a->requests, "requests per level (0 = max(2 x concurrency, 4))");
  b->add_option("--max-tokens", a->max_tokens, "tokens per request")->capture_default_str();
  b->add_option("--msg-reps", a->msg_reps, "messaging round trips")->capture_default_str();
  b->add_option("--out", a->out, "JSONL output")->capture_default_str();
  b->callback([a] {
    try {
      set_exit_code(run_serve_bench(*a));
    } catch (const std::exception& e) {
      fmt::print(stderr, "shoal bench serve: {}\n", e.what());
      set_exit_code(1);
    }
  });
}

}  // namespace shoal::tools
