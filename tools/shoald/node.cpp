// The node's life: actor system (middleman with heartbeats and connection timeout), the
// roles' actors, the node agent published on node.listen, the join through the seeds, and
// the drain. Leaves with _Exit (see the end of run_node).
#include "tools/shoald/node.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <atomic>
#include <thread>
#include <vector>

#include <fmt/ranges.h>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/exit_reason.hpp>
#include <caf/io/middleman.hpp>
#include <caf/io/publish.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include "actors/cluster_tls.hpp"
#include "actors/engine_actor.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "actors/gateway_actor.hpp"
#include "actors/http_server.hpp"
#include "actors/interfaces.hpp"
#include "actors/kv_block_store.hpp"
#include "actors/swa_tier.hpp"
#include "actors/node_agent_actor.hpp"
#include "actors/rank_actor.hpp"
#include "actors/balancer_actors.hpp"
#include "actors/storage_node_actor.hpp"
#include "model/config.hpp"
#include "runtime/engine/engine_setup.hpp"
#include "runtime/ep/expert_residency.hpp"
#include "actors/eplb_actor.hpp"
#include "runtime/serve/metric_families.hpp"
#include "tools/shoald/engine_options.hpp"
#include "transport/dual_transport.hpp"
#include "actors/ve_actors.hpp"
#include "runtime/vision/ve_worker.hpp"

namespace shoal::tools::shoald {

namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;
constexpr int exit_failure = 1;
constexpr auto join_deadline = 60s;

struct node_parts {
  std::vector<actors::engine_actor> engines;  // by rank
  std::vector<actors::rank_actor> ranks;      // by rank, with expert parallelism
  std::vector<actors::storage_node_actor> storage;  // by index, storage role
  std::shared_ptr<actors::kv_block_store> kv;       // engine.kv_storage: the ranks' remote tier
  caf::actor kv_watcher;                            // feeds it the storage nodes
  std::optional<actors::gateway_actor> gateway;
  std::optional<actors::balancers> balancers;
  std::shared_ptr<actors::swa_fetcher> swa_fetcher;    // shoal_flash: other machines' SWA slots
  std::optional<actors::swa_store_actor> swa_store;    // this machine's
  std::optional<actors::swa_directory_actor> swa_directory;  // directory role
  std::optional<actors::ve_worker_actor> ve_worker;          // ve role
  std::shared_ptr<runtime::expert_residency> experts;        // engine.expert_parallel: the ranks' routed experts
  std::shared_ptr<actors::eplb_board> eplb;                  // engine.expert_parallel: the group's balancer
  std::vector<std::shared_ptr<actors::caf_ep_transport>> ep_transports;  // by rank, with expert parallelism
  std::vector<std::shared_ptr<runtime::transport>> bulk;     // the engine ranks' bulk transports (engine.transport)
};

actors::tls_files tls_of(const runtime::node_config& cfg) {
  if (!cfg.tls_certificate || !cfg.tls_key || !cfg.tls_ca_file) return {};
  return {cfg.tls_certificate->string(), cfg.tls_key->string(), cfg.tls_ca_file->string()};
}

struct system_config : caf::actor_system_config {
  explicit system_config(const runtime::node_config& cfg) {
    load<caf::io::middleman>();
    actors::add_message_types(*this);
    set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds(cfg.heartbeat_interval_ms)});
    set("middleman.connection-timeout", caf::timespan{std::chrono::milliseconds(cfg.connection_timeout_ms)});
    // No automatic connections: with them CAF 0.17 opens a second BASP port on every interface
    // (a node told to listen on 127.0.0.1 was reachable on *:<random>, outside TLS), and a
    // node learnt through the seed got a second connection racing the explicit one. Members
    // connect to each other explicitly (join_cluster, heal_membership).
    set("middleman.enable-automatic-connections", false);
    // A shared job queue whose idle workers wait on a condition variable: CAF's work-stealing
    // default parks idle workers in 10 ms sleeps, which every remote round trip then waits out
    // (storage puts through 12 storage shoalds: 50 blocks/s → see the storage cluster test).
    set("scheduler.policy", caf::atom("sharing"));
    if (const actors::tls_files tls = tls_of(cfg); tls.enabled()) actors::use_tls(*this, tls);
  }
};

std::vector<std::string> role_names(const runtime::node_config& cfg) {
  std::vector<std::string> out;
  for (runtime::role r : cfg.roles) out.emplace_back(runtime::to_string(r));
  return out;
}

// "<prefix><i>" → i when i < count, else -1.
int index_of(const std::string& name, const std::string& prefix, size_t count) {
  if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size() || name.size() > prefix.size() + 4) return -1;
  for (size_t i = prefix.size(); i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return -1;
  int r = std::atoi(name.c_str() + prefix.size());
  return r >= 0 && static_cast<size_t>(r) < count ? r : -1;
}

int rank_of(const std::string& name, size_t ranks) { return index_of(name, "rank", ranks); }

std::string describe_engine(caf::actor_system& sys, const actors::engine_actor& e, int rank) {
  caf::scoped_actor self{sys};
  std::string out = "rank" + std::to_string(rank) + ": no answer";
  self->request(e, 5s, stats_atom_v)
    .receive(
      [&](const actors::engine_stats_snapshot& s) {
        out = fmt::format("rank{}: running={} steps={} prefill_tokens={} decode_tokens={} generated={} "
                          "prefix_hit_tokens={} blocks_free={}/{} waiting_for_remote={} remote_hit_tokens={} "
                          "remote_timeouts={}",
                          rank, s.requests_running, s.steps, s.prefill_tokens, s.decode_tokens, s.generated,
                          s.prefix_hit_tokens, s.blocks_free, s.blocks_total, s.waiting_for_remote,
                          s.remote_hit_tokens, s.remote_timeouts);
        if (s.remote_lookups > 0)
          out += fmt::format(" remote_lookups={} remote_fetch_failures={}", s.remote_lookups, s.remote_fetch_failures);
        if (!s.remote_last_error.empty()) out += fmt::format(" remote_last_error=\"{}\"", s.remote_last_error);
        if (s.role != "both")
          out += fmt::format(" role={} handoffs_offered={} handoffs_placed={} handoffs_kept={} handoffs_taken={} "
                             "handoff_failures={}",
                             s.role, s.handoffs_offered, s.handoffs_placed, s.handoffs_kept, s.handoffs_taken,
                             s.handoff_failures);
        // Requests by their one id: routed here now, and the last that left (how they ended).
        std::vector<std::string> running, recent;
        for (request_id id : s.running) running.push_back(to_string(id));
        for (const auto& r : s.recent) recent.push_back(to_string(r.id) + ":" + runtime::to_string(r.reason));
        if (!running.empty()) out += fmt::format(" running=[{}]", fmt::join(running, ","));
        if (!recent.empty()) out += fmt::format(" recent=[{}]", fmt::join(recent, ","));
        if (s.images_encoded + s.image_cache_hits + s.image_rows_read > 0)
          out += fmt::format(" images_encoded={} image_patches_encoded={} image_cache_hits={} image_rows_read={} "
                             "image_row_read_failures={}",
                             s.images_encoded, s.image_patches_encoded, s.image_cache_hits, s.image_rows_read,
                             s.image_row_read_failures);
      },
      [&](caf::error& err) { out = "rank" + std::to_string(rank) + ": " + sys.render(err); });
  return out;
}

template <class Handle, class T>
std::optional<T> ask(caf::actor_system& sys, const Handle& h, std::chrono::milliseconds timeout, auto... xs) {
  caf::scoped_actor self{sys};
  std::optional<T> out;
  self->request(h, timeout, xs...).receive([&](T& x) { out = std::move(x); }, [&](caf::error&) {});
  return out;
}

// node.metrics_listen: the Prometheus text of this node's engine ranks and storage nodes,
// read from their stats at each scrape (an actor that does not answer within 2 s keeps its
// last values).
struct node_metrics_server {
  runtime::metrics_registry registry;
  runtime::node_metrics m = runtime::add_node_metrics(registry);
  std::mutex mu;  // one scrape at a time
  std::unique_ptr<actors::http_server> server;
};

void scrape(caf::actor_system& sys, const node_parts& parts, node_metrics_server& s) {
  std::lock_guard lock(s.mu);
  for (size_t r = 0; r < parts.engines.size(); ++r) {
    auto st = ask<actors::engine_actor, actors::engine_stats_snapshot>(sys, parts.engines[r], 2s, stats_atom_v);
    if (!st) continue;
    const std::string a = "rank" + std::to_string(r);
    const auto& m = s.m;
    m.running.set(static_cast<double>(std::max<int64_t>(0, st->requests_running - st->waiting - st->waiting_for_remote)), a);
    m.waiting.set(static_cast<double>(st->waiting), a);
    m.waiting_for_remote.set(static_cast<double>(st->waiting_for_remote), a);
    m.blocks_used.set(static_cast<double>(st->blocks_total - st->blocks_free), a);
    m.blocks_free.set(static_cast<double>(st->blocks_free), a);
    m.prefix_queries.advance_to(static_cast<double>(st->prefix_lookups), a);
    m.hit_tokens.advance_to(static_cast<double>(st->prefix_hit_tokens), a);
    m.storage_hit_tokens.advance_to(static_cast<double>(st->remote_hit_tokens), a);
    m.steps.advance_to(static_cast<double>(st->steps), a);
    m.step_seconds.advance_to(st->forward_s, a);
    m.prefill_tokens.advance_to(static_cast<double>(st->prefill_tokens), a);
    m.decode_tokens.advance_to(static_cast<double>(st->decode_tokens), a);
    m.images_encoded.advance_to(static_cast<double>(st->images_encoded), a);
    m.image_cache_hits.advance_to(static_cast<double>(st->image_cache_hits), a);
  }
  if (parts.experts) {
    s.m.experts_resident.set(static_cast<double>(parts.experts->resident_experts()), "node");
    s.m.experts_resident_bytes.set(static_cast<double>(parts.experts->resident_bytes()), "node");
    double bulk = 0, inline_ = 0;
    for (const auto& t : parts.ep_transports) bulk += static_cast<double>(t->frames_bulk()), inline_ += static_cast<double>(t->frames_inline());
    s.m.ep_frames_sent.advance_to(bulk, "bulk");
    s.m.ep_frames_sent.advance_to(inline_, "inline");
    const auto moved = parts.experts->migration();
    s.m.ep_expert_bytes_read.advance_to(static_cast<double>(moved.fetched_bytes), "holder");
    s.m.ep_expert_bytes_read.advance_to(static_cast<double>(moved.checkpoint_bytes), "checkpoint");
    s.m.ep_expert_read_failures.advance_to(static_cast<double>(moved.fetch_failures), "node");
  }
  s.m.process_resident.set(static_cast<double>(runtime::process_resident_bytes()));
  double shm_reads = 0, network_reads = 0;
  bool dual = false;
  for (const auto& t : parts.bulk)
    if (const auto* d = dynamic_cast<const transport::dual_transport*>(t.get())) {
      dual = true;
      shm_reads += static_cast<double>(d->reads_local());
      network_reads += static_cast<double>(d->reads_remote());
    }
  if (dual) {
    s.m.transport_reads.advance_to(shm_reads, "shm");
    s.m.transport_reads.advance_to(network_reads, "network");
  }
  for (size_t i = 0; i < parts.storage.size(); ++i) {
    auto st = ask<actors::storage_node_actor, actors::storage_stats_snapshot>(sys, parts.storage[i], 2s, stats_atom_v);
    if (!st) continue;
    const std::string a = "storage" + std::to_string(i);
    const auto& m = s.m;
    m.storage_usage.set(static_cast<double>(st->usage_bytes), a);
    m.storage_capacity.set(static_cast<double>(st->capacity_bytes), a);
    m.storage_chunks.set(static_cast<double>(st->chunks), a);
    m.storage_puts.advance_to(static_cast<double>(st->puts), a);
    m.storage_gets.advance_to(static_cast<double>(st->gets), a);
    m.storage_gc_evicted.advance_to(static_cast<double>(st->evicted_chunks), a);
    m.storage_ttl_expired.advance_to(static_cast<double>(st->expired_chunks), a);
    m.storage_put_seconds.advance_to(st->put_seconds, a);
    m.storage_get_seconds.advance_to(st->get_seconds, a);
    m.storage_get_hits.advance_to(static_cast<double>(st->get_hits), a);
  }
  if (parts.balancers) {
    const auto& m = s.m;
    if (auto r = ask<actors::prefill_balancer_actor, actors::balancer_report>(sys, parts.balancers->prefill, 2s, stats_atom_v)) {
      for (const auto& e : r->engines) m.prefill_placements.advance_to(static_cast<double>(e.placed), e.engine);
      for (size_t t = 0; t < r->tier_placements.size(); ++t)
        m.prefill_tier_placements.advance_to(static_cast<double>(r->tier_placements[t]), std::to_string(t));
    }
    if (auto r = ask<actors::decode_balancer_actor, actors::balancer_report>(sys, parts.balancers->decode, 2s, stats_atom_v)) {
      for (const auto& e : r->engines) m.decode_placements.advance_to(static_cast<double>(e.placed), e.engine);
      m.decode_balance.set(r->balance_now, "now");
      m.decode_balance.set(r->balance_window, "minute");
    }
  }
}

actors::node_hooks make_hooks(caf::actor_system& sys, node_parts& parts, logger& log) {
  actors::node_hooks h;
  h.gateway = parts.gateway;
  h.describe = [&sys, &parts](const std::string& actor) -> std::optional<std::string> {
    if (int r = rank_of(actor, parts.engines.size()); r >= 0) return describe_engine(sys, parts.engines[r], r);
    if (int i = index_of(actor, "storage", parts.storage.size()); i >= 0) {
      auto st = ask<actors::storage_node_actor, actors::storage_stats_snapshot>(sys, parts.storage[i], 5s, stats_atom_v);
      if (!st) return actor + ": no answer";
      return fmt::format("{}: chunks={} usage={}/{} bytes watermarks={}%/{}% puts={} gets={} hits={} gc_runs={} "
                         "evicted={} expired={} corrupt_removed={}",
                         actor, st->chunks, st->usage_bytes, st->capacity_bytes, st->high_watermark_pct,
                         st->low_watermark_pct, st->puts, st->gets, st->get_hits, st->gc_runs, st->evicted_chunks,
                         st->expired_chunks, st->corrupt_removed);
    }
    if (actor == "gateway" && parts.gateway)
      return ask<actors::gateway_actor, std::string>(sys, *parts.gateway, 5s, describe_atom_v);
    return std::nullopt;
  };
  h.requests = [&sys, &parts] {
    if (!parts.gateway) return std::vector<std::string>{};
    return ask<actors::gateway_actor, std::vector<std::string>>(sys, *parts.gateway, 5s, requests_atom_v)
      .value_or(std::vector<std::string>{});
  };
  h.drain = [&parts] {
    for (auto& e : parts.engines) caf::anon_send(e, drain_atom_v);
    if (parts.gateway) caf::anon_send(*parts.gateway, drain_atom_v);
  };
  if (parts.eplb)
    h.eplb = [&sys, &parts](const std::string& command) -> std::string {
      if (command == "status") return parts.eplb->read();
      caf::scoped_actor self{sys};
      std::string out = "no answer from the balancer\n";
      self->request(parts.eplb->actor, std::chrono::seconds(5), eplb_atom_v, command)
        .receive([&](std::string& text) { out = std::move(text); }, [&](caf::error& e) { out = to_string(e) + "\n"; });
      return out;
    };
  h.kill_actor = [&parts, &log](const std::string& actor) {
    if (int i = index_of(actor, "storage", parts.storage.size()); i >= 0) {
      log.warn("killing storage{} on request", i);
      caf::anon_send_exit(parts.storage[i], caf::exit_reason::kill);
      return true;
    }
    int r = rank_of(actor, parts.engines.size());
    if (r < 0) return false;
    log.warn("killing rank{} on request", r);
    caf::anon_send_exit(parts.engines[r], caf::exit_reason::kill);
    return true;
  };
  h.kill_node = [&log] {
    log.warn("killing this node on request");
    std::thread([] {
      std::this_thread::sleep_for(100ms);  // lets the reply leave
      std::_Exit(137);
    }).detach();
  };
  return h;
}

// Requests still running on this node's engines and gateway; -1 when one did not answer.
int64_t running_here(caf::actor_system& sys, const node_parts& parts) {
  int64_t total = 0;
  for (const auto& e : parts.engines) {
    auto s = ask<actors::engine_actor, actors::engine_stats_snapshot>(sys, e, 5s, stats_atom_v);
    if (!s) return -1;
    total += s->requests_running;
  }
  if (parts.gateway) {
    auto n = ask<actors::gateway_actor, int64_t>(sys, *parts.gateway, 5s, stats_atom_v);
    if (!n) return -1;
    total += *n;
  }
  return total;
}

void drain(caf::actor_system& sys, const actors::node_agent_actor& agent, const node_parts& parts,
           std::chrono::milliseconds budget, logger& log) {
  ask<actors::node_agent_actor, bool>(sys, agent, 5s, drain_atom_v);
  auto deadline = clock_type::now() + budget;
  int64_t left = 0;
  while ((left = running_here(sys, parts)) > 0 && clock_type::now() < deadline) {
    log.debug("draining: {} request(s) running", left);
    std::this_thread::sleep_for(20ms);
  }
  if (left > 0) log.warn("drain timeout: abandoning {} running request(s)", left);
  else if (left < 0) log.warn("drain: an actor stopped answering");
  else log.info("drained: no request running");
}

std::optional<actors::membership> join(caf::actor_system& sys, const runtime::node_config& cfg,
                                       const actors::node_agent_actor& agent, logger& log) {
  std::vector<actors::seed_address> seeds;
  for (const auto& s : cfg.seeds) seeds.push_back({s.host, s.port});
  auto deadline = clock_type::now() + join_deadline;
  std::string error;
  for (int attempt = 1;; ++attempt) {
    auto m = actors::join_cluster(sys, agent, seeds, std::chrono::milliseconds(cfg.request_timeout_ms), error);
    if (m) {
      if (!error.empty()) log.warn("joined, but: {}", error);
      return m;
    }
    if (clock_type::now() >= deadline) {
      log.error("cannot join the cluster through any seed within {} s: {}", join_deadline.count(), error);
      return std::nullopt;
    }
    log.info("join attempt {} failed ({}); retrying", attempt, error);
    std::this_thread::sleep_for(500ms);
  }
}

}  // namespace

sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

int run_node(const runtime::node_config& cfg, logger& log) {
  // CPUs and compute threads first: every thread started from here on inherits the mask.
  if (!cfg.cpus.empty()) {
    if (std::string e = kernels::pin_to_cpus(cfg.cpus); !e.empty()) {
      log.error("key 'node.cpus': {}", e);
      return exit_failure;
    }
  }
  if (cfg.threads > 0) kernels::set_num_threads(cfg.threads);
  if (cfg.has_role(runtime::role::engine))
    log.info("compute threads: {} on {} CPU{}", kernels::num_threads(), kernels::available_cpus(),
             kernels::available_cpus() == 1 ? "" : "s");
  // Everything the node needs from its model directory, before any actor exists.
  std::shared_ptr<const model::model_weights> weights;
  std::shared_ptr<const model::tokenizer> tok;
  std::optional<model::model_config> mcfg;
  if (cfg.has_role(runtime::role::engine) || cfg.has_role(runtime::role::ve)) {
    log.info("loading model {}", cfg.model_dir.string());
    // Expert-parallel ranks read their routed experts when they adopt a group (expert_residency).
    model::load_options options;
    if (cfg.has_role(runtime::role::engine) && cfg.expert_parallel)
      options.keep_routed_expert = [](int64_t, int64_t) { return false; };
    auto m = runtime::load_model_dir(cfg.model_dir.string(), false, options);
    if (!m) {
      log.error("cannot load model dir {}: {}", cfg.model_dir.string(), m.error().message);
      return exit_failure;
    }
    weights = m->weights;
    tok = m->tokenizer;
    mcfg = weights->config;
    if (cfg.has_role(runtime::role::ve) && !mcfg->vision.present) {
      log.error("node.roles has 've' but the model in {} has no vision encoder (config.json \"vision\")",
                cfg.model_dir.string());
      return exit_failure;
    }
  } else if (cfg.has_role(runtime::role::gateway)) {
    auto c = model::load_config(cfg.model_dir.string());
    auto t = c ? model::tokenizer::load((cfg.model_dir / "tokenizer.json").string())
               : model::result<model::tokenizer>(std::unexpected(c.error()));
    if (!t) {
      log.error("cannot load model dir {}: {}", cfg.model_dir.string(), t.error().message);
      return exit_failure;
    }
    mcfg = *c;
    tok = std::make_shared<const model::tokenizer>(std::move(*t));
  }

  if (const actors::tls_files tls = tls_of(cfg); tls.enabled()) {
    if (std::string bad = actors::check_tls_files(tls); !bad.empty()) {
      log.error("[cluster] {}", bad);
      return exit_failure;
    }
    log.info("cluster traffic is TLS: certificate {}, CA {}", tls.certificate, tls.ca_file);
  }
  system_config sys_cfg(cfg);
  caf::actor_system sys{sys_cfg};
  node_parts parts;
  actors::node_info me{cfg.name, cfg.listen.host, cfg.listen.port, role_names(cfg), {}, {}, {}, false, {}, "both", {}, {}, {}, {}};

  if (cfg.has_role(runtime::role::engine)) {
    runtime::engine_config ecfg = engine_config_for(weights->config, static_cast<double>(cfg.cache_mib));
    me.engine_role = runtime::to_string(cfg.disagg_role);
    if (cfg.cost_model) {  // prefill chunks sized so a step takes about engine.step_ms
      auto cm = runtime::read_cost_model_file(cfg.cost_model->string());
      if (!cm) {
        log.error("key 'engine.cost_model': {}", cm.error());
        return exit_failure;
      }
      if (cm->machine() != runtime::machine_id())
        log.warn("engine.cost_model was fitted on {}, this machine is {}: its step times may be off", cm->machine(),
                 runtime::machine_id());
      ecfg.sched.cost = *cm;
      ecfg.sched.step_time_budget_s = static_cast<double>(cfg.step_ms) / 1000.0;
      log.info("prefill chunks from cost model {} (step budget {} ms)", cfg.cost_model->string(), cfg.step_ms);
    }
    if (cfg.speculative != "off") {  // DSpark: MTP drafts verified each decode step
      if (weights->mtp.empty()) {
        log.error("key 'engine.speculative': the model in {} has no MTP module (num_nextn_predict_layers = 0) to draft with",
                  cfg.model_dir.string());
        return exit_failure;
      }
      ecfg.spec.mode = *runtime::spec_mode_from(cfg.speculative);
      ecfg.spec.nextn = cfg.spec_nextn;
      ecfg.spec.adaptive_from = cfg.spec_adaptive_from;
      if (cfg.spec_cost_model) {
        auto cm = runtime::read_cost_model_file(cfg.spec_cost_model->string());
        if (!cm) {
          log.error("key 'engine.spec_cost_model': {}", cm.error());
          return exit_failure;
        }
        ecfg.spec.cost = *cm;
      }
      if (auto bad = runtime::validate(ecfg.spec, runtime::max_backtrack(weights->config, ecfg.cache))) {
        log.error("key 'engine.speculative': {}", *bad);
        return exit_failure;
      }
      log.info("speculative decoding: {} with {} MTP drafts per step", cfg.speculative, cfg.spec_nextn);
    }
    const bool swa_tier = weights->config.is_flash() && cfg.swa_slots > 0;
    const bool vision = weights->config.vision.present;  // reads rows the VE workers encoded
    if (!weights->config.is_flash()) {  // keys that only shoal_flash models use: said, not silently dropped
      const runtime::node_config defaults;
      if (cfg.swa_slots != defaults.swa_slots || cfg.swa_timeout_ms != defaults.swa_timeout_ms)
        log.warn("engine.swa_slots / engine.swa_timeout_ms unused: {} has no SWA window (shoal_flash only)",
                 cfg.model_dir.string());
      if (cfg.disagg_role == runtime::engine_role::both && !vision && !cfg.expert_parallel &&
          cfg.transport != defaults.transport)
        log.warn("engine.transport unused: a colocated deepseek_v3 engine without vision or expert parallelism "
                 "moves no handoffs, reads no encoder rows, has no SWA slots and sends no expert frames");
    }
    std::shared_ptr<runtime::transport> bulk;
    if (cfg.disagg_role != runtime::engine_role::both || swa_tier || vision) {
      // Handoff bytes, SWA slots and the encoder rows of vision-encoder workers: one libfabric
      // endpoint for the node's ranks, bound to the listen host (shm needs no address).
      auto t = transport::open_transport(cfg.transport, cfg.listen.host);
      if (!t) {
        log.error("key 'engine.transport' (\"{}\"): {}", cfg.transport, t.error());
        return exit_failure;
      }
      bulk = std::shared_ptr<runtime::transport>(std::move(*t));
      parts.bulk.push_back(bulk);
    }
    if (swa_tier) {
      // The machine's SWA slot store, shared by its ranks, and the reads of other machines'.
      auto store = std::make_shared<runtime::swa_store>(
          cfg.swa_slots, runtime::swa_snapshot_bytes(weights->config, ecfg.cache.snapshot_storage));
      const auto timeout = std::chrono::milliseconds(cfg.swa_timeout_ms);
      parts.swa_fetcher = std::make_shared<actors::swa_fetcher>(sys, bulk, cfg.name, timeout);
      auto a = actors::spawn_swa_store(sys, {cfg.name, store, bulk, parts.swa_fetcher});
      if (!a) {
        log.error("key 'engine.swa_slots' ({}): {}", cfg.swa_slots, a.error());
        return exit_failure;
      }
      parts.swa_store = *a;
      me.swa_store = caf::actor_cast<caf::actor>(*a);
      ecfg.cache.swa_machine_store = store;
      ecfg.cache.swa_remote = parts.swa_fetcher;
      ecfg.cache.swa_timeout_s = std::chrono::duration<double>(timeout).count();
      log.info("SWA store: {} slots of {} bytes, slot reads over {}", store->capacity(), store->slot_bytes(),
               bulk->name());
    }
    if (cfg.disagg_role != runtime::engine_role::both) {
      ecfg.role = cfg.disagg_role;
      ecfg.bulk = bulk;
      ecfg.handoff_read_timeout = std::chrono::milliseconds(cfg.handoff_timeout_ms);
      log.info("{} engine: handoffs over {}", me.engine_role, ecfg.bulk->name());
    } else if (vision) {
      ecfg.bulk = bulk;
      ecfg.handoff_read_timeout = std::chrono::milliseconds(cfg.handoff_timeout_ms);
      log.info("engine: encoder rows of vision-encoder workers over {}", ecfg.bulk->name());
    }
    if (cfg.kv_storage) {
      actors::kv_client_config kc;
      kc.timeout = std::chrono::milliseconds(std::min<int64_t>(cfg.request_timeout_ms, 5000));
      auto client = actors::kv_client::create(sys, kc);
      if (!client) {
        log.error("{}", client.error());
        std::_Exit(exit_failure);
      }
      parts.kv = std::make_shared<actors::kv_block_store>(std::move(*client));
      parts.kv_watcher = actors::spawn_storage_watcher(sys, parts.kv);
      ecfg.cache.remote = parts.kv;
      ecfg.cache.remote_timeout_s = std::chrono::duration<double>(kc.timeout).count();  // then recompute
    }
    // A silent peer fails an expert-parallel exchange after this long at the latest (a dead
    // one sooner: the membership change interrupts it).
    auto ep_timeout = std::chrono::milliseconds(std::max<int64_t>(2 * cfg.connection_timeout_ms, 5000));
    if (cfg.expert_parallel) {
      auto residency = runtime::expert_residency::open(cfg.model_dir.string(), weights);
      if (!residency) {
        log.error("cannot open model dir {} for its routed experts: {}", cfg.model_dir.string(), residency.error());
        return exit_failure;
      }
      ecfg.experts = *residency;
      parts.experts = *residency;
      // the transport is the rank's own, set by spawn_engine; the load window is the balancer's
      ecfg.ep = runtime::engine_config::ep_config{};
      ecfg.ep->load_window_steps = cfg.eplb_window_steps;
      log.info("routed experts: each rank reads its own when it joins a group (none read yet)");
    }
    // Expert-parallel frames: control over CAF, the bytes over libfabric (engine.transport),
    // read one-sided from the sender's registered memory.
    actors::caf_ep_transport::bulk_options ep_bulk;
    if (cfg.expert_parallel && cfg.ep_frames == "transport") {
      if (bulk) {
        ep_bulk.transport = bulk;
      } else {
        auto t = transport::open_transport(cfg.transport, cfg.listen.host);
        if (!t) {
          log.error("key 'engine.transport' (\"{}\"): {}", cfg.transport, t.error());
          return exit_failure;
        }
        ep_bulk.transport = std::shared_ptr<runtime::transport>(std::move(*t));
        parts.bulk.push_back(ep_bulk.transport);
      }
      ep_bulk.bulk_from = static_cast<size_t>(cfg.ep_bulk_min_bytes);
      if (cfg.tls_certificate)
        log.warn("engine.ep_frames = \"transport\" under cluster TLS: expert frames travel unencrypted over {}",
                 cfg.transport);
      log.info("expert-parallel frames from {} bytes over {}, control over CAF", ep_bulk.bulk_from,
               ep_bulk.transport->name());
      // The experts a rank gains from the balancer's plans move over the same transport.
      ecfg.ep->bulk = ep_bulk.transport;
      ecfg.ep->fetch_timeout = std::chrono::milliseconds(cfg.eplb_fetch_timeout_ms);
    }
    for (int32_t r = 0; r < cfg.ranks; ++r) {
      std::shared_ptr<actors::caf_ep_transport> ep;
      if (cfg.expert_parallel) {
        ep = std::make_shared<actors::caf_ep_transport>(ep_timeout, ep_bulk);
        parts.ep_transports.push_back(ep);
      }
      parts.engines.push_back(actors::spawn_engine(sys, weights, ecfg, /*detached=*/true, ep, tok));
      caf::actor rank;
      if (ep) {
        parts.ranks.push_back(actors::spawn_rank(sys, ep, parts.engines.back()));
        rank = caf::actor_cast<caf::actor>(parts.ranks.back());
      }
      me.ranks.push_back({r, caf::actor_cast<caf::actor>(parts.engines.back()), rank});
    }
    log.info("{} engine rank(s), {} cache blocks each, batch-invariant{}", cfg.ranks, ecfg.cache.num_blocks,
             cfg.expert_parallel ? ", expert-parallel" : "");
    if (cfg.expert_parallel) {
      parts.eplb = std::make_shared<actors::eplb_board>();
      const runtime::eplb_policy policy{cfg.eplb_redundant_per_rank, cfg.eplb_period_steps, cfg.eplb_window_steps,
                                        cfg.eplb_expert_groups, 1};  // nodes: the group's processes
      actors::spawn_eplb(sys, cfg.name, policy, std::chrono::milliseconds(cfg.eplb_interval_ms),
                         std::chrono::milliseconds(cfg.eplb_fetch_timeout_ms), parts.eplb);
      log.info("expert-parallel balancer: {} preset, {} redundant expert(s) per rank, a plan every {} steps",
               cfg.eplb_preset, policy.redundant_per_rank, policy.period_steps);
    }
  }
  if (cfg.has_role(runtime::role::storage)) {
    for (int32_t i = 0; i < cfg.storage_nodes; ++i) {
      actors::storage_node_config sc;
      sc.store.root = (*cfg.storage_dir / std::to_string(i)).string();
      std::error_code ec;
      std::filesystem::create_directories(sc.store.root, ec);
      if (ec) {
        log.error("key 'storage.dir': cannot create {}: {}", sc.store.root, ec.message());
        std::_Exit(exit_failure);
      }
      sc.store.capacity_bytes = static_cast<uint64_t>(cfg.storage_capacity_mib) << 20;
      sc.store.gc_high_watermark = cfg.storage_high_watermark_pct / 100.0;
      sc.store.gc_low_watermark = cfg.storage_low_watermark_pct / 100.0;
      sc.store.sync = cfg.storage_fsync ? storage::sync_policy::always : storage::sync_policy::never;
      sc.store.ttl.agent_ms = cfg.storage_ttl_agent_s * 1000;
      sc.store.ttl.chat_ms = cfg.storage_ttl_chat_s * 1000;
      sc.store.now_ms = [] {
        return std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::system_clock::now().time_since_epoch())
          .count();
      };
      sc.bulk_host = cfg.listen.host;
      sc.bulk_port = cfg.storage_bulk_port > 0 ? static_cast<uint16_t>(cfg.storage_bulk_port + i) : uint16_t{0};
      auto node = actors::spawn_storage_node(sys, sc);
      if (!node) {
        log.error("{}", node.error());
        std::_Exit(exit_failure);
      }
      parts.storage.push_back(node->actor);
      me.storage.push_back(caf::actor_cast<caf::actor>(node->actor));
      me.storage_ports.push_back(node->bulk_port);
      log.info("storage{}: bulk data path on {}:{}", i, sc.bulk_host, node->bulk_port);
    }
    log.info("{} storage node(s) under {}, {} MiB each, fsync {}", cfg.storage_nodes, cfg.storage_dir->string(),
             cfg.storage_capacity_mib, cfg.storage_fsync ? "always" : "never");
  }
  if (cfg.has_role(runtime::role::ve)) {
    // The vision encoder's rows are read by the prefill engines from this node's endpoint.
    auto t = transport::open_transport(cfg.ve_transport, cfg.listen.host);
    if (!t) {
      log.error("key 've.transport' (\"{}\"): {}", cfg.ve_transport, t.error());
      return exit_failure;
    }
    std::shared_ptr<runtime::transport> bulk(std::move(*t));
    auto worker = std::make_unique<runtime::ve_worker>(weights, bulk, cfg.ve_cache_mib << 20,
                                                       engine_config_for(weights->config).batch_invariant);
    parts.ve_worker = actors::spawn_ve_worker(sys, cfg.name, std::move(worker));
    me.ve_worker = caf::actor_cast<caf::actor>(*parts.ve_worker);
    log.info("vision-encoder worker: rows over {}, cache {} MiB", bulk->name(), cfg.ve_cache_mib);
  }
  if (cfg.has_role(runtime::role::directory)) {
    parts.swa_directory = actors::spawn_swa_directory(sys);
    me.swa_directory = caf::actor_cast<caf::actor>(*parts.swa_directory);
    log.info("SWA directory: rebuilt from the stores' reports as they arrive");
  }
  if (cfg.has_role(runtime::role::gateway)) {
    actors::balancer_options bo;
    auto pp = runtime::prefill_policy_named(cfg.prefill_policy);  // validated by the config parser
    bo.prefill.policy = pp ? *pp : runtime::prefill_policy::tiered;
    bo.prefill.tier_bounds = cfg.tier_bounds;
    bo.prefill.round_s = static_cast<double>(cfg.balancer_round_ms) / 1000.0;
    bo.prefill.block_size = mcfg->block_size;
    bo.decode_policy = cfg.decode_policy;
    if (cfg.balancer_cost_model) {
      auto cm = runtime::read_cost_model_file(cfg.balancer_cost_model->string());
      if (!cm) {
        log.error("key 'gateway.balancer_cost_model': {}", cm.error());
        return exit_failure;
      }
      bo.cost = *cm;
      bo.cost_fitted = true;
    }
    parts.balancers = actors::spawn_balancers(sys, bo);
    me.balancers = {caf::actor_cast<caf::actor>(parts.balancers->prefill), caf::actor_cast<caf::actor>(parts.balancers->decode)};
    if (mcfg->vision.present) {  // images go to the VE workers that join (the engines encode while none is up)
      parts.balancers->ve = actors::spawn_ve_balancer(sys, {std::chrono::milliseconds(cfg.request_timeout_ms), 4});
      me.balancers.push_back(caf::actor_cast<caf::actor>(parts.balancers->ve));
    }
    log.info("balancers: prefill {} (tiers {}, round {} ms), decode {}", cfg.prefill_policy, fmt::join(cfg.tier_bounds, "/"),
             cfg.balancer_round_ms, cfg.decode_policy);
    actors::gateway_config g;
    g.host = cfg.http_listen->host;
    g.port = cfg.http_listen->port;
    g.model_id = cfg.model_dir.filename().string();
    g.context_length = mcfg->max_position_embeddings;
    g.vocab_size = mcfg->vocab_size;
    g.request_timeout = std::chrono::milliseconds(cfg.request_timeout_ms);
    g.max_in_flight = cfg.max_in_flight;
    g.tokenizer_config = cfg.model_dir / "tokenizer_config.json";
    g.vision = mcfg->vision;
    g.request_log = [&log](const std::string& line) { log.info("{}", line); };
    if (cfg.auth_token_file) {
      auto tokens = actors::read_auth_tokens(*cfg.auth_token_file);
      if (!tokens) {
        log.error("key 'gateway.auth_token_file': {}", tokens.error());
        return exit_failure;
      }
      g.auth_tokens = std::move(*tokens);
    }
    auto gw = actors::spawn_gateway(sys, *parts.balancers, tok, g);
    if (!gw) {
      log.error("gateway: {}", gw.error());
      std::_Exit(exit_failure);
    }
    parts.gateway = gw->actor;
    fmt::print("shoald: http on {}:{}\n", g.host, gw->port);
    log.info("gateway: OpenAI API on http://{}:{} (model id '{}'{})", g.host, gw->port, g.model_id,
             g.auth_tokens.empty() ? "" : ", bearer auth");
  }

  node_metrics_server metrics;
  if (cfg.metrics_listen) {
    auto srv = actors::http_server::start(
        cfg.metrics_listen->host, cfg.metrics_listen->port,
        [&sys, &parts, &metrics](const actors::http_request& req, actors::http_writer& w) {
          if (req.target != "/metrics" && req.target.rfind("/metrics?", 0) != 0) {
            w.respond(404, "text/plain", "not found: " + req.target + " (this endpoint serves /metrics)\n");
            return;
          }
          if (req.method != "GET") {
            w.respond(405, "text/plain", "method " + req.method + " not allowed (GET /metrics)\n");
            return;
          }
          scrape(sys, parts, metrics);
          w.respond(200, "text/plain; version=0.0.4", metrics.registry.render());
        },
        {});
    if (!srv) {
      log.error("key 'node.metrics_listen' ({}): {}", runtime::to_string(*cfg.metrics_listen), srv.error());
      std::_Exit(exit_failure);
    }
    metrics.server = std::move(*srv);
    fmt::print("shoald: metrics on {}:{}\n", cfg.metrics_listen->host, metrics.server->port());
    log.info("Prometheus metrics on http://{}:{}/metrics", cfg.metrics_listen->host, metrics.server->port());
  }

  auto agent = actors::spawn_node_agent(sys, me, make_hooks(sys, parts, log));
  auto port = actors::publish_agent(sys, agent, cfg.listen.host, cfg.listen.port);
  if (!port) {
    log.error("cannot listen on {}: {}", runtime::to_string(cfg.listen), port.error());
    std::_Exit(exit_failure);
  }
  me.port = *port;
  me.agent = caf::actor_cast<caf::actor>(agent);
  caf::anon_send(agent, update_atom_v, me);
  if (parts.balancers) {
    caf::anon_send(agent, subscribe_atom_v, caf::actor_cast<caf::actor>(parts.balancers->prefill));
    caf::anon_send(agent, subscribe_atom_v, caf::actor_cast<caf::actor>(parts.balancers->decode));
    if (parts.balancers->ve) caf::anon_send(agent, subscribe_atom_v, caf::actor_cast<caf::actor>(parts.balancers->ve));
  }
  for (const auto& r : parts.ranks) caf::anon_send(agent, subscribe_atom_v, caf::actor_cast<caf::actor>(r));
  if (parts.eplb) caf::anon_send(agent, subscribe_atom_v, parts.eplb->actor);
  if (parts.kv_watcher) caf::anon_send(agent, subscribe_atom_v, parts.kv_watcher);
  if (parts.swa_store) caf::anon_send(agent, subscribe_atom_v, caf::actor_cast<caf::actor>(*parts.swa_store));

  if (!cfg.seeds.empty()) {
    auto m = join(sys, cfg, agent, log);
    if (!m) std::_Exit(exit_failure);
    log.info("joined the cluster: {} node(s)", m->nodes.size());
  }
  // Partitions heal: members lost from the view are tried again, with back-off, on a thread of
  // their own (its connects block; nothing serving a request waits for them).
  static std::atomic<bool> healer_stop{false};
  std::thread([&sys, agent, &log, timeout = std::min<int64_t>(cfg.request_timeout_ms, 5000)] {
    actors::heal_membership(sys, agent, 1s, std::chrono::milliseconds(timeout), healer_stop,
                            [&log](const std::string& line) { log.info("membership: {}", line); });
  }).detach();
  runtime::host_port bound{cfg.listen.host, *port};
  fmt::print("shoald: listening on {}\n", runtime::to_string(bound));
  std::fflush(stdout);
  log.info("node '{}' up on {}", cfg.name, runtime::to_string(bound));

  sigset_t set = stop_signals();
  int sig = 0;
  while (sigwait(&set, &sig) != 0) {
  }
  log.info("{}: draining (at most {} ms)", sig == SIGTERM ? "SIGTERM" : "SIGINT", cfg.drain_timeout_ms);
  drain(sys, agent, parts, std::chrono::milliseconds(cfg.drain_timeout_ms), log);
  log.info("node '{}' stopped", cfg.name);
  // Leave without destroying the actor system: CAF 0.17's ~actor_system can block for good in
  // await_detached_threads once remote peers have connected (a terminated detached engine
  // still referenced by the middleman). Everything owed to clients is done at this point:
  // requests drained, log lines flushed as written.
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(0);
}

}  // namespace shoal::tools::shoald
