// `shoal bench disagg`: colocated vs disaggregated serving on the same load, in one run. The
// load is the Mooncake conversation trace (its first N requests) with lengths divided by
// --length-scale (a trace block of 512 tokens becomes 512 / scale tokens, shared prefixes stay
// shared) and timestamps rescaled so the offered load is --load × what one engine serves
// running one request at a time (its service time measured first, on this machine: two
// engines of a small machine share its cores, so one engine's rate is the honest unit). Colocated: two engines (role
// both), each request to the one with fewer in flight. Disaggregated: one prefill and one
// decode engine, each on its own thread, the handoff over the real libfabric transport
// (--provider) as in a cluster: offer, reserve, one-sided reads, release. Prints TTFT and
// TPOT p50/p99 of both, the handoffs' read throughput against a raw fi_read loop over ranges
// of the same size on the same provider, the SWA slot fetch latency from another machine's
// store against the bounded replay it replaces (bench_swa.cpp: --swa-provider, --swa-preset),
// and appends a JSON record.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>

#include <nlohmann/json.hpp>

#include "model/generate.hpp"
#include "runtime/engine/engine.hpp"
#include "sim/prefix_trace.hpp"
#include "tools/shoal/bench_swa.hpp"
#include "tools/shoal/bench_util.hpp"
#include "tools/shoal/commands.hpp"
#include "transport/fabric_transport.hpp"


namespace shoal::tools {

namespace {

using nlohmann::json;

struct disagg_args {
  std::string trace = conversation_trace_path();
  std::string preset = "v3-tiny";
  int requests = 48;
  int length_scale = 32;
  int max_output = 24;
  double load = 0.7;
  std::string provider = "shm";
  std::string swa_provider = "tcp;ofi_rxm";  // the SWA slot fetch (another machine's store)
  std::string swa_preset = "small";
  std::string out = "bench/results/disagg.jsonl";
  std::vector<std::string> kv_dtypes = {"bf16", "fp32"};  // the first is the TTFT/TPOT run's
};

struct job {
  double arrival = 0;  // seconds from the start
  std::vector<int32_t> prompt;
  int32_t output = 0;
};

// When each request's tokens came (seconds from the start).
struct timeline {
  std::mutex mu;
  std::vector<double> first, last;
  std::vector<int32_t> tokens;
  explicit timeline(size_t n) : first(n, -1), last(n, -1), tokens(n, 0) {}
  void token(size_t i, double t) {
    std::lock_guard lock(mu);
    if (first[i] < 0) first[i] = t;
    last[i] = t;
    ++tokens[i];
  }
};

// One engine on its own thread: runs posted tasks between steps, steps while it has work.
class engine_thread {
 public:
  using on_events = std::function<void(runtime::engine&, std::vector<runtime::token_event>&)>;
  engine_thread(std::shared_ptr<const model::model_weights> w, runtime::engine_config c, on_events cb)
      : engine_(std::move(w), c), cb_(std::move(cb)), thread_([this] { loop(); }) {}
  ~engine_thread() {
    post({});
    thread_.join();
  }
  void post(std::function<void(runtime::engine&)> task) {
    {
      std::lock_guard lock(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
  }

 private:
  void loop() {
    for (;;) {
      std::deque<std::function<void(runtime::engine&)>> tasks;
      {
        std::unique_lock lock(mu_);
        if (!engine_.has_work()) cv_.wait(lock, [&] { return !tasks_.empty(); });
        tasks.swap(tasks_);
      }
      for (auto& t : tasks) {
        if (!t) return;  // the destructor's stop
        t(engine_);
      }
      if (!engine_.has_work()) continue;
      auto events = engine_.step();
      cb_(engine_, events);
      if (engine_.stalled()) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  runtime::engine engine_;
  on_events cb_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void(runtime::engine&)>> tasks_;
  std::thread thread_;
};

runtime::sampling_params params_for(const job& j) {
  runtime::sampling_params p;
  p.max_tokens = j.output;
  p.ignore_eos = true;
  return p;
}

void wait_until(double t0, double t) {
  const double now = now_s() - t0;
  if (t > now) std::this_thread::sleep_for(std::chrono::duration<double>(t - now));
}

// The request-level figures of one run.
struct run_result {
  std::vector<double> ttft, tpot;
  double wall = 0;
};

run_result summarise(const std::vector<job>& jobs, timeline& tl, double wall) {
  run_result r;
  r.wall = wall;
  for (size_t i = 0; i < jobs.size(); ++i) {
    r.ttft.push_back(tl.first[i] - jobs[i].arrival);
    if (tl.tokens[i] > 1) r.tpot.push_back((tl.last[i] - tl.first[i]) / (tl.tokens[i] - 1));
  }
  return r;
}

void wait_all(timeline& tl, const std::vector<job>& jobs) {
  for (;;) {
    {
      std::lock_guard lock(tl.mu);
      bool done = true;
      for (size_t i = 0; i < jobs.size(); ++i) done = done && tl.tokens[i] >= jobs[i].output;
      if (done) return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

run_result run_colocated(std::shared_ptr<const model::model_weights> w, const runtime::engine_config& c,
                         const std::vector<job>& jobs, int engines) {
  timeline tl(jobs.size());
  std::vector<int> in_flight(static_cast<size_t>(engines), 0);
  std::mutex load_mu;
  const double t0 = now_s();
  std::vector<std::unique_ptr<engine_thread>> es;
  std::vector<std::map<int64_t, size_t>> index(static_cast<size_t>(engines));  // per engine: engine id → job
  for (int e = 0; e < engines; ++e)
    es.push_back(std::make_unique<engine_thread>(w, c, [&, e](runtime::engine& en, std::vector<runtime::token_event>& evs) {
      for (auto& ev : evs) {
        const size_t i = index[static_cast<size_t>(e)].at(ev.id.value);
        tl.token(i, now_s() - t0);
        if (ev.finished) {
          en.forget(ev.id);
          std::lock_guard lock(load_mu);
          --in_flight[static_cast<size_t>(e)];
        }
      }
    }));
  for (size_t i = 0; i < jobs.size(); ++i) {
    wait_until(t0, jobs[i].arrival);
    size_t e = 0;
    {
      std::lock_guard lock(load_mu);
      e = static_cast<size_t>(std::min_element(in_flight.begin(), in_flight.end()) - in_flight.begin());
      ++in_flight[e];
    }
    es[e]->post([&, i, e](runtime::engine& en) {
      auto id = en.add_request(jobs[i].prompt, params_for(jobs[i]));
      if (!id) throw std::runtime_error(id.error().message);
      index[e][id->value] = i;
    });
  }
  wait_all(tl, jobs);
  return summarise(jobs, tl, now_s() - t0);
}

struct handoff_figures {
  double bytes = 0, read_s = 0;
  uint64_t block_bytes = 0, blocks = 0, reads = 0;
  int64_t taken = 0, kept = 0, failed = 0;
};

run_result run_disagg(std::shared_ptr<const model::model_weights> w, runtime::engine_config c,
                      const std::vector<job>& jobs, const std::string& provider, handoff_figures& hf) {
  auto make = [&]() -> std::shared_ptr<runtime::transport> {
    auto t = transport::fabric_transport::create({provider, provider == "shm" ? "" : "127.0.0.1"});
    if (!t) throw std::runtime_error(t.error());
    return std::shared_ptr<runtime::transport>(std::move(*t));
  };
  timeline tl(jobs.size());
  const double t0 = now_s();
  runtime::engine_config pc = c, dc = c;
  pc.role = runtime::engine_role::prefill;
  pc.bulk = make();
  dc.role = runtime::engine_role::decode;
  dc.bulk = make();
  std::mutex fig_mu;  // request id = job index, on both engines
  std::unique_ptr<engine_thread> p, d;
  d = std::make_unique<engine_thread>(w, dc, [&](runtime::engine& en, std::vector<runtime::token_event>& evs) {
    for (auto& ev : evs) {
      tl.token(static_cast<size_t>(ev.id.value), now_s() - t0);
      if (ev.finished) en.forget(ev.id);
    }
    auto stats = en.stats();
    {
      std::lock_guard lock(fig_mu);
      hf.bytes = static_cast<double>(stats.cache.import_bytes);
      hf.read_s = stats.cache.import_read_s;
      hf.reads = stats.cache.import_reads;
      hf.failed = static_cast<int64_t>(stats.cache.import_failures);
    }
    for (request_id id : en.take_imports_over()) {
      p->post([id](runtime::engine& pe) {
        pe.handoff_done(id, true);
        pe.forget(id);
      });
    }
  });
  p = std::make_unique<engine_thread>(w, pc, [&](runtime::engine& en, std::vector<runtime::token_event>& evs) {
    for (auto& ev : evs) {
      tl.token(static_cast<size_t>(ev.id.value), now_s() - t0);
      if (ev.finished) en.forget(ev.id);
    }
    for (auto& h : en.take_handoffs()) {
      if (!h.blocks.empty()) hf.block_bytes = h.blocks[0].length;
      hf.blocks += h.blocks.size() + h.rings.size();
      d->post([&, h](runtime::engine& de) {
        auto id = de.add_handoff(h);
        if (!id) {  // no room: the prefill engine decodes it
          p->post([id = h.id](runtime::engine& pe) { pe.handoff_done(id, false); });
          std::lock_guard lock(fig_mu);
          ++hf.kept;
          return;
        }
        std::lock_guard lock(fig_mu);
        ++hf.taken;
      });
    }
  });
  for (size_t i = 0; i < jobs.size(); ++i) {
    wait_until(t0, jobs[i].arrival);
    p->post([&, i](runtime::engine& en) {
      auto id = en.add_request(request_id(static_cast<int64_t>(i)), jobs[i].prompt, params_for(jobs[i]));
      if (!id) throw std::runtime_error(id.error().message);
    });
  }
  wait_all(tl, jobs);
  auto r = summarise(jobs, tl, now_s() - t0);
  d.reset();  // the decode engine first: its reads end before the prefill engine's memory goes
  p.reset();
  return r;
}

// A raw fi_read loop over ranges of `block_bytes` (as many as fit `total`), all in flight.
double raw_gbps(const std::string& provider, uint64_t block_bytes, double total) {
  transport::fabric_config cfg{provider, provider == "shm" ? "" : "127.0.0.1"};
  auto owner = transport::fabric_transport::create(cfg);
  if (!owner || block_bytes == 0) return 0;
  const auto n = static_cast<size_t>(std::clamp(total / static_cast<double>(block_bytes), 1.0, 4096.0));
  std::vector<std::byte> src(n * block_bytes, std::byte{7}), dst(src.size());
  auto reg = (*owner)->register_memory(src);
  if (!reg) return 0;
  std::vector<runtime::remote_memory> ranges;
  for (size_t i = 0; i < n; ++i) ranges.push_back((*reg)->describe(i * block_bytes, block_bytes));
  std::vector<double> s;
  for (int rep = 0; rep < 3; ++rep) {
    auto t = transport::raw_read_seconds(cfg, ranges, dst, std::min<size_t>(n, 16));
    if (!t) return 0;
    s.push_back(*t);
  }
  return static_cast<double>(src.size()) / median(s) / 1e9;
}

// Bytes moved per handed-off request and per block in each KV format, against fp32's when it
// ran; the records of the JSON line.
json print_handoff_formats(const std::vector<std::pair<std::string, handoff_figures>>& per_format) {
  json formats = json::array();
  const handoff_figures* fp32 = nullptr;
  for (const auto& [name, h] : per_format)
    if (name == "fp32") fp32 = &h;
  for (const auto& [name, h] : per_format) {
    const double per_request = h.taken > 0 ? h.bytes / static_cast<double>(h.taken) : 0;
    const double fp32_per_request = fp32 && fp32->taken > 0 ? fp32->bytes / static_cast<double>(fp32->taken) : 0;
    fmt::print("  KV {:>4}: {} handoffs, {:.0f} bytes moved per handed-off request, {} bytes per block{}\n", name,
               h.taken, per_request, h.block_bytes,
               fp32_per_request > 0 ? fmt::format(" ({:.4f}x fp32's per request, {:.4f}x per block)",
                                                  per_request / fp32_per_request,
                                                  static_cast<double>(h.block_bytes) / static_cast<double>(fp32->block_bytes))
                                    : std::string());
    formats.push_back({{"kv_dtype", name}, {"handoffs", h.taken}, {"bytes_per_request", per_request},
                       {"block_bytes", h.block_bytes}, {"read_gbps", h.read_s > 0 ? h.bytes / h.read_s / 1e9 : 0.0}});
  }
  return formats;
}

int run_disagg_bench(const disagg_args& a) {
  json base = machine_facts();  // popen: before any thread of ours exists
  auto trace = sim::load_mooncake_trace(a.trace);
  if (!trace) throw std::runtime_error(trace.error());
  auto cfg = model::preset_config(a.preset);
  if (!cfg) throw std::runtime_error(cfg.error().message);
  auto wm = std::make_shared<model::model_weights>();
  wm->config = *cfg;
  if (wm->config.is_flash()) wm->config.swa_mode = "exact";
  if (wm->config.vocab_size == 0) {  // presets take their vocabulary from a tokenizer: the test one's
    wm->config.vocab_size = 300;
    wm->config.bos_token_id = 256;
    wm->config.eos_token_id = 257;
  }
  model::init_random(*wm, 1);
  std::shared_ptr<const model::model_weights> w = wm;
  runtime::engine_config c;
  c.cache.num_blocks = 4096;
  c.cache.exact_swa = w->config.is_flash();
  c.cache.swa_slots = c.sched.max_running;
  c.batch_invariant = true;

  // Jobs: a trace block of 512 tokens becomes 512 / scale tokens drawn from its hash id.
  const int64_t per_block = std::max(1, 512 / a.length_scale);
  const int64_t vocab = w->config.vocab_size, limit = w->config.max_position_embeddings;
  std::vector<job> jobs;
  for (const auto& r : *trace) {
    if (static_cast<int>(jobs.size()) == a.requests) break;
    job j;
    j.output = static_cast<int32_t>(std::clamp<int64_t>(r.output_length / a.length_scale, 2, a.max_output));
    const int64_t len = std::clamp<int64_t>(r.input_length / a.length_scale, 4, limit - j.output);
    for (int64_t b = 0; static_cast<int64_t>(j.prompt.size()) < len; ++b) {
      const uint64_t h = b < static_cast<int64_t>(r.hash_ids.size()) ? static_cast<uint64_t>(r.hash_ids[b]) : splitmix64((jobs.size() + 1) << 20 | static_cast<uint64_t>(b));
      for (int64_t t = 0; t < per_block && static_cast<int64_t>(j.prompt.size()) < len; ++t)
        j.prompt.push_back(static_cast<int32_t>(splitmix64(h * 1315423911ull + static_cast<uint64_t>(t)) % static_cast<uint64_t>(vocab)));
    }
    j.arrival = static_cast<double>(r.timestamp_ms - trace->front().timestamp_ms) / 1000.0;
    jobs.push_back(std::move(j));
  }
  if (jobs.size() < 2) throw std::runtime_error("the trace has fewer than 2 requests");

  // Timestamps to the machine: the mean service time of one request alone on one engine.
  std::vector<double> service;
  {
    runtime::engine probe(w, c);
    for (size_t i = 0; i < std::min<size_t>(jobs.size(), 6); ++i) {
      double t = now_s();
      if (!probe.add_request(jobs[i].prompt, params_for(jobs[i]))) throw std::runtime_error("probe request refused");
      probe.run_to_completion();
      service.push_back(now_s() - t);
    }
  }
  const double mean_service = std::accumulate(service.begin(), service.end(), 0.0) / static_cast<double>(service.size());
  const double span = jobs.back().arrival;
  const double wanted_span = static_cast<double>(jobs.size()) * mean_service / a.load;
  const double time_scale = span > 0 ? wanted_span / span : 1.0;
  for (auto& j : jobs) j.arrival *= time_scale;

  c.cache.kv_dtype = *model::parse_kv_dtype(a.kv_dtypes.front());
  auto colo = run_colocated(w, c, jobs, 2);
  handoff_figures hf;
  auto dis = run_disagg(w, c, jobs, a.provider, hf);
  // The same handoffs in the other formats: bytes moved per handed-off request and per block.
  std::vector<std::pair<std::string, handoff_figures>> per_format = {{a.kv_dtypes.front(), hf}};
  for (size_t i = 1; i < a.kv_dtypes.size(); ++i) {
    runtime::engine_config ci = c;
    ci.cache.kv_dtype = *model::parse_kv_dtype(a.kv_dtypes[i]);
    handoff_figures h;
    run_disagg(w, ci, jobs, a.provider, h);
    per_format.emplace_back(a.kv_dtypes[i], h);
  }
  const double handoff_gbps = hf.read_s > 0 ? hf.bytes / hf.read_s / 1e9 : 0;
  const double raw = raw_gbps(a.provider, hf.block_bytes, hf.bytes / std::max<int64_t>(hf.taken, 1));

  fmt::print("disagg: {} requests of the Mooncake conversation trace, lengths / {}, load {:.2f} of one engine "
             "(mean service {:.1f} ms, time scale {:.4f}), preset {}, provider {}\n",
             jobs.size(), a.length_scale, a.load, mean_service * 1e3, time_scale, a.preset, a.provider);
  for (const auto& [name, r] : {std::pair{"colocated (2 x both)", &colo}, std::pair{"disaggregated (1 P + 1 D)", &dis}})
    fmt::print("  {:26} TTFT p50 {:7.1f} ms p99 {:7.1f} ms   TPOT p50 {:6.2f} ms p99 {:6.2f} ms   wall {:.2f} s\n",
               name, percentile(r->ttft, 0.5) * 1e3, percentile(r->ttft, 0.99) * 1e3, percentile(r->tpot, 0.5) * 1e3,
               percentile(r->tpot, 0.99) * 1e3, r->wall);
  fmt::print("  handoffs: {} taken ({} recomputed), {} kept on the prefill engine; reads {:.3f} GB/s vs raw fi_read "
             "{:.3f} GB/s over {}-byte ranges (ratio {:.2f})\n",
             hf.taken, hf.failed, hf.kept, handoff_gbps, raw, hf.block_bytes, raw > 0 ? handoff_gbps / raw : 0.0);
  fmt::print("  handoff ranges {} in {} reads (adjacent blocks coalesced)\n", hf.blocks, hf.reads);
  json formats = print_handoff_formats(per_format);
  json swa = swa_fetch_vs_replay(a.swa_provider, a.swa_preset, 50, 3);  // prints its own lines

  json r = base;
  r["bench"] = "disagg";
  r["preset"] = a.preset;
  r["provider"] = a.provider;
  r["requests"] = jobs.size();
  r["length_scale"] = a.length_scale;
  r["load"] = a.load;
  r["time_scale"] = time_scale;
  r["mean_service_ms"] = mean_service * 1e3;
  for (const auto& [name, res] : {std::pair{"colocated", &colo}, std::pair{"disagg", &dis}}) {
    r[name] = {{"ttft_p50_ms", percentile(res->ttft, 0.5) * 1e3}, {"ttft_p99_ms", percentile(res->ttft, 0.99) * 1e3},
               {"tpot_p50_ms", percentile(res->tpot, 0.5) * 1e3}, {"tpot_p99_ms", percentile(res->tpot, 0.99) * 1e3},
               {"wall_s", res->wall}};
  }
  r["handoffs_taken"] = hf.taken;
  r["handoffs_kept"] = hf.kept;
  r["handoff_gbps"] = handoff_gbps;
  r["raw_gbps"] = raw;
  r["handoff_vs_raw"] = raw > 0 ? handoff_gbps / raw : 0.0;
  r["handoff_ranges"] = hf.blocks;
  r["handoff_reads"] = hf.reads;
  r["swa"] = swa;
  r["kv_dtype"] = a.kv_dtypes.front();
  r["kv_formats"] = formats;
  append_jsonl(a.out, r);
  return 0;
}

}  // namespace

void add_disagg_bench(CLI::App& bench) {
  auto* b = bench.add_subcommand("disagg", "colocated vs disaggregated (prefill + decode engine, libfabric handoff) "
                                           "TTFT/TPOT on a scaled Mooncake trace, handoff GB/s vs raw fi_read");
  auto a = std::make_shared<disagg_args>();
  b->add_option("--trace", a->trace, "Mooncake trace (JSON Lines)")->capture_default_str();
  b->add_option("--preset", a->preset, "model preset (random weights): v3-tiny, tiny (exact SWA), small")
    ->capture_default_str();
  b->add_option("--requests", a->requests, "the first N requests of the trace")->capture_default_str()->check(
    CLI::Range(2, 100000));
  b->add_option("--length-scale", a->length_scale, "trace lengths are divided by this")->capture_default_str()->check(
    CLI::Range(1, 512));
  b->add_option("--max-output", a->max_output, "cap on generated tokens per request")->capture_default_str()->check(
    CLI::Range(2, 4096));
  b->add_option("--load", a->load, "offered load, as a fraction of one engine's service rate (one request at a time)")
    ->capture_default_str()
    ->check(CLI::Range(0.01, 10.0));
  b->add_option("--provider", a->provider, "libfabric provider of the handoff (shm, tcp;ofi_rxm on loopback)")
    ->capture_default_str();
  b->add_option("--kv-dtypes", a->kv_dtypes,
                "KV formats: the first runs colocated vs disaggregated, each handed off once more for its bytes")
    ->capture_default_str()
    ->check(CLI::IsMember({"fp32", "bf16", "fp8"}));
  b->add_option("--swa-provider", a->swa_provider, "libfabric provider of the SWA slot fetch")->capture_default_str();
  b->add_option("--swa-preset", a->swa_preset, "shoal_flash preset of the slot fetch vs replay figure (tiny, small)")
    ->capture_default_str();
  b->add_option("--out", a->out, "JSONL output")->capture_default_str();
  b->callback([a] { run_then_exit("disagg", [&] { return run_disagg_bench(*a); }); });
}

}  // namespace shoal::tools
