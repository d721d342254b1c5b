// The node's life: actor system (middleman with heartbeats and connection timeout), the
// roles' actors, the node agent published on node.listen, the join through the seeds, and
// the drain. Leaves with _Exit (see the end of run_node).
#include "tools/shoald/node.hpp"
#include "tools/shoald/node_parts.hpp"

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
constexpr auto join_deadline = 60s;

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
      [&](const actors::engine_stats_snapshot& snap) {
        const runtime::engine_stats& s = snap.engine;
        const runtime::cache_stats& c = s.cache;
        out = fmt::format("rank{}: running={} steps={} prefill_tokens={} decode_tokens={} generated={} "
                          "prefix_hit_tokens={} blocks_free={}/{} waiting_for_remote={} remote_hit_tokens={} "
                          "remote_timeouts={}",
                          rank, snap.requests_running, s.steps, s.prefill_tokens, s.decode_tokens, s.generated,
                          c.hit_tokens, s.blocks_free, s.blocks_total, s.waiting_for_remote, c.remote_hit_tokens,
                          c.remote_timeouts);
        if (c.remote_lookups + c.remote_stored + c.remote_dropped > 0)
          out += fmt::format(" remote_lookups={} remote_fetch_failures={} remote_format_misses={} remote_stored={} "
                             "remote_dropped={}",
                             c.remote_lookups, c.remote_fetch_failures, c.remote_format_misses, c.remote_stored,
                             c.remote_dropped);
        if (!c.remote_last_error.empty()) out += fmt::format(" remote_last_error=\"{}\"", c.remote_last_error);
        // Prefill side: offered, placed with a decode engine, kept; decode side: taken (read or
        // recomputed) and of those recomputed.
        if (snap.role != "both")
          out += fmt::format(" role={} handoffs_offered={} handoffs_placed={} handoffs_kept={} handoffs_taken={} "
                             "handoff_failures={} handoff_timeouts={} handoff_corrupt={} handoffs_refused_format={}",
                             snap.role, s.handoffs_offered, s.handoffs_lent, s.handoffs_kept,
                             c.imports + c.import_failures, c.import_failures, c.import_timeouts, c.import_corrupt,
                             s.handoffs_refused_format);
        // The step-cost model sizing prefill chunks: its source and how well it fits.
        out += fmt::format(" cost_model={} cost_model_samples={} cost_model_r2={:.3f} cost_model_rms_error_pct={:.1f} "
                           "cost_model_detail=\"{}\"",
                           s.cost.source, s.cost.samples, s.cost.r2, 100 * s.cost.rms_rel_error, s.cost.detail);
        // Its decode steps' model (the decode balancer's weights), on engines that decode.
        if (snap.role != "prefill")
          out += fmt::format(" decode_cost_model={} decode_cost_model_samples={} decode_cost_model_rms_error_pct={:.1f}",
                             s.decode_cost.source, s.decode_cost.samples, 100 * s.decode_cost.rms_rel_error);
        // DSpark: drafts made, verified and accepted (per request-step), tokens per decode step.
        if (s.spec.drafted + s.spec.decode_steps > 0)
          out += fmt::format(" spec_decode_steps={} spec_drafted={} spec_verified={} spec_accepted={} "
                             "spec_tokens_per_step={:.3f} spec_auto_verifying={} spec_auto_switches={}",
                             s.spec.decode_steps, s.spec.drafted, s.spec.verified, s.spec.accepted,
                             s.spec.tokens_per_step(), s.spec.auto_verifying, s.spec.auto_switches);
        if (s.failed_steps > 0) out += fmt::format(" failed_steps={} recomputed_steps={}", s.failed_steps, s.recomputed_steps);
        // Requests by their one id: routed here now, and the last that left (how they ended).
        std::vector<std::string> running, recent;
        for (request_id id : snap.running) running.push_back(to_string(id));
        for (const auto& r : snap.recent) recent.push_back(to_string(r.id) + ":" + runtime::to_string(r.reason));
        if (!running.empty()) out += fmt::format(" running=[{}]", fmt::join(running, ","));
        if (!recent.empty()) out += fmt::format(" recent=[{}]", fmt::join(recent, ","));
        if (s.images_encoded + s.image_cache.hits + s.image_rows_read > 0)
          out += fmt::format(" images_encoded={} image_patches_encoded={} image_cache_hits={} image_rows_read={} "
                             "image_row_read_failures={}",
                             s.images_encoded, s.image_patches_encoded, s.image_cache.hits, s.image_rows_read,
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

// One engine rank's counters, as its metric families (label `a`: "rank<i>").
void record_engine(const runtime::node_metrics& m, const actors::engine_stats_snapshot& snap, const std::string& a) {
  const runtime::engine_stats& st = snap.engine;
  m.running.set(static_cast<double>(std::max<int64_t>(0, snap.requests_running - st.waiting - st.waiting_for_remote)), a);
  m.waiting.set(static_cast<double>(st.waiting), a);
  m.waiting_for_remote.set(static_cast<double>(st.waiting_for_remote), a);
  m.blocks_used.set(static_cast<double>(st.blocks_total - st.blocks_free), a);
  m.blocks_free.set(static_cast<double>(st.blocks_free), a);
  m.prefix_queries.advance_to(static_cast<double>(st.cache.lookups), a);
  m.hit_tokens.advance_to(static_cast<double>(st.cache.hit_tokens), a);
  m.storage_hit_tokens.advance_to(static_cast<double>(st.cache.remote_hit_tokens), a);
  m.steps.advance_to(static_cast<double>(st.steps), a);
  m.step_seconds.advance_to(st.forward_s, a);
  m.prefill_tokens.advance_to(static_cast<double>(st.prefill_tokens), a);
  m.decode_tokens.advance_to(static_cast<double>(st.decode_tokens), a);
  m.spec_verified.advance_to(static_cast<double>(st.spec.verified), a);
  m.spec_accepted.advance_to(static_cast<double>(st.spec.accepted), a);
  m.images_encoded.advance_to(static_cast<double>(st.images_encoded), a);
  m.image_cache_hits.advance_to(static_cast<double>(st.image_cache.hits), a);
  m.handoff_failures.advance_to(static_cast<double>(st.cache.import_failures), a);
  m.handoff_timeouts.advance_to(static_cast<double>(st.cache.import_timeouts), a);
  m.handoff_corrupt.advance_to(static_cast<double>(st.cache.import_corrupt), a);
  m.handoffs_refused_format.advance_to(static_cast<double>(st.handoffs_refused_format), a);
  m.storage_format_misses.advance_to(static_cast<double>(st.cache.remote_format_misses), a);
}

// The process's own: expert residency and EP frames, resident memory, bulk transport paths.
void record_process(const runtime::node_metrics& m, const node_parts& parts) {
  if (parts.experts) {
    m.experts_resident.set(static_cast<double>(parts.experts->resident_experts()), "node");
    m.experts_resident_bytes.set(static_cast<double>(parts.experts->resident_bytes()), "node");
    double bulk = 0, inline_ = 0, ranks = 0;
    for (const auto& t : parts.ep_transports) {
      bulk += static_cast<double>(t->frames_bulk()), inline_ += static_cast<double>(t->frames_inline());
      ranks = std::max(ranks, static_cast<double>(t->size()));
    }
    m.ep_group_ranks.set(ranks, "node");
    m.ep_frames_sent.advance_to(bulk, "bulk");
    m.ep_frames_sent.advance_to(inline_, "inline");
    const auto moved = parts.experts->migration();
    m.ep_expert_bytes_read.advance_to(static_cast<double>(moved.fetched_bytes), "holder");
    m.ep_expert_bytes_read.advance_to(static_cast<double>(moved.kept_bytes), "memory");
    m.ep_expert_bytes_read.advance_to(static_cast<double>(moved.checkpoint_bytes), "checkpoint");
    m.ep_expert_read_failures.advance_to(static_cast<double>(moved.fetch_failures), "node");
  }
  m.process_resident.set(static_cast<double>(runtime::process_resident_bytes()));
  double shm_reads = 0, network_reads = 0;
  bool dual = false;
  for (const auto& t : parts.bulk)
    if (const auto* d = dynamic_cast<const transport::dual_transport*>(t.get())) {
      dual = true;
      shm_reads += static_cast<double>(d->reads_local());
      network_reads += static_cast<double>(d->reads_remote());
    }
  if (dual) {
    m.transport_reads.advance_to(shm_reads, "shm");
    m.transport_reads.advance_to(network_reads, "network");
  }
}

void record_storage(const runtime::node_metrics& m, const actors::storage_stats_snapshot& st, const std::string& a) {
  m.storage_usage.set(static_cast<double>(st.usage_bytes), a);
  m.storage_capacity.set(static_cast<double>(st.capacity_bytes), a);
  m.storage_chunks.set(static_cast<double>(st.chunks), a);
  m.storage_puts.advance_to(static_cast<double>(st.puts), a);
  m.storage_gets.advance_to(static_cast<double>(st.gets), a);
  m.storage_gc_evicted.advance_to(static_cast<double>(st.evicted_chunks), a);
  m.storage_ttl_expired.advance_to(static_cast<double>(st.expired_chunks), a);
  m.storage_put_seconds.advance_to(st.put_seconds, a);
  m.storage_get_seconds.advance_to(st.get_seconds, a);
  m.storage_get_hits.advance_to(static_cast<double>(st.get_hits), a);
}

void record_balancers(caf::actor_system& sys, const runtime::node_metrics& m, const actors::balancers& b) {
  if (auto r = ask<actors::prefill_balancer_actor, actors::balancer_report>(sys, b.prefill, 2s, stats_atom_v)) {
    for (const auto& e : r->engines) m.prefill_placements.advance_to(static_cast<double>(e.placed), e.engine);
    for (size_t t = 0; t < r->tier_placements.size(); ++t)
      m.prefill_tier_placements.advance_to(static_cast<double>(r->tier_placements[t]), std::to_string(t));
  }
  if (auto r = ask<actors::decode_balancer_actor, actors::balancer_report>(sys, b.decode, 2s, stats_atom_v)) {
    for (const auto& e : r->engines) m.decode_placements.advance_to(static_cast<double>(e.placed), e.engine);
    m.decode_balance.set(r->balance_now, "now");
    m.decode_balance.set(r->balance_window, "minute");
  }
}

void scrape(caf::actor_system& sys, const node_parts& parts, node_metrics_server& s) {
  std::lock_guard lock(s.mu);
  for (size_t r = 0; r < parts.engines.size(); ++r)
    if (auto snap = ask<actors::engine_actor, actors::engine_stats_snapshot>(sys, parts.engines[r], 2s, stats_atom_v))
      record_engine(s.m, *snap, "rank" + std::to_string(r));
  record_process(s.m, parts);
  for (size_t i = 0; i < parts.storage.size(); ++i)
    if (auto st = ask<actors::storage_node_actor, actors::storage_stats_snapshot>(sys, parts.storage[i], 2s, stats_atom_v))
      record_storage(s.m, *st, "storage" + std::to_string(i));
  if (parts.balancers) record_balancers(sys, s.m, *parts.balancers);
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
    bool refused = false;
    auto m = actors::join_cluster(sys, agent, seeds, std::chrono::milliseconds(cfg.request_timeout_ms), error, &refused);
    if (m) {
      if (!error.empty()) log.warn("joined, but: {}", error);
      return m;
    }
    if (refused) {
      log.error("the cluster refused this node: {}", error);
      return std::nullopt;
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

namespace {

// Leaves at once once actors exist (see the end of run_node); what was logged is written.
[[noreturn]] void leave(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}

// node.metrics_listen: GET /metrics renders the node's ranks and storage nodes.
bool start_metrics(caf::actor_system& sys, const runtime::node_config& cfg, node_parts& parts,
                   node_metrics_server& metrics, logger& log) {
  if (!cfg.metrics_listen) return true;
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
    return false;
  }
  metrics.server = std::move(*srv);
  fmt::print("shoald: metrics on {}:{}\n", cfg.metrics_listen->host, metrics.server->port());
  log.info("Prometheus metrics on http://{}:{}/metrics", cfg.metrics_listen->host, metrics.server->port());
  return true;
}

// The node agent on node.listen, told of the actors that follow the membership; the bound
// address, or nullopt (logged).
std::optional<runtime::host_port> publish(caf::actor_system& sys, const runtime::node_config& cfg, node_parts& parts,
                                          actors::node_info& me, actors::node_agent_actor& agent, logger& log) {
  agent = actors::spawn_node_agent(sys, me, make_hooks(sys, parts, log));
  auto port = actors::publish_agent(sys, agent, cfg.listen.host, cfg.listen.port);
  if (!port) {
    log.error("cannot listen on {}: {}", runtime::to_string(cfg.listen), port.error());
    return std::nullopt;
  }
  me.port = *port;
  me.agent = caf::actor_cast<caf::actor>(agent);
  caf::anon_send(agent, update_atom_v, me);
  auto follow = [&](const caf::actor& a) { caf::anon_send(agent, subscribe_atom_v, a); };
  if (parts.balancers) {
    follow(caf::actor_cast<caf::actor>(parts.balancers->prefill));
    follow(caf::actor_cast<caf::actor>(parts.balancers->decode));
    if (parts.balancers->ve) follow(caf::actor_cast<caf::actor>(parts.balancers->ve));
  }
  for (const auto& r : parts.ranks) follow(caf::actor_cast<caf::actor>(r));
  if (parts.eplb) follow(parts.eplb->actor);
  if (parts.kv_watcher) follow(parts.kv_watcher);
  if (parts.swa_store) follow(caf::actor_cast<caf::actor>(*parts.swa_store));
  return runtime::host_port{cfg.listen.host, *port};
}

// Every role's actors; false once one could not start (logged).
bool start_roles(caf::actor_system& sys, const runtime::node_config& cfg, const node_model& m, node_parts& parts,
                 actors::node_info& me, logger& log) {
  using runtime::role;
  if (cfg.has_role(role::engine) && !start_engines(sys, cfg, m, parts, me, log)) return false;
  if (cfg.has_role(role::storage) && !start_storage(sys, cfg, parts, me, log)) return false;
  if (cfg.has_role(role::ve) && !start_ve_worker(sys, cfg, m, parts, me, log)) return false;
  if (cfg.has_role(role::directory)) start_directory(sys, parts, me, log);
  return !cfg.has_role(role::gateway) || start_gateway(sys, cfg, m, parts, me, log);
}

}  // namespace

int run_node(const runtime::node_config& cfg, logger& log) {
  // CPUs and compute threads first, then everything the node needs from its model directory,
  // before any actor exists.
  if (!set_compute_threads(cfg, log)) return exit_failure;
  std::optional<node_model> model = load_node_model(cfg, log);
  if (!model) return exit_failure;
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
  actors::node_info me{cfg.name, cfg.listen.host, cfg.listen.port, role_names(cfg), {}, {}, {}, false, {}, "both", {}, {}, {}, {}, {}, {}, 0, 0};
  node_metrics_server metrics;
  actors::node_agent_actor agent;
  if (!start_roles(sys, cfg, *model, parts, me, log) || !start_metrics(sys, cfg, parts, metrics, log)) leave(exit_failure);
  std::optional<runtime::host_port> bound = publish(sys, cfg, parts, me, agent, log);
  if (!bound) leave(exit_failure);
  if (!cfg.seeds.empty()) {
    auto m = join(sys, cfg, agent, log);
    if (!m) leave(exit_failure);
    log.info("joined the cluster: {} node(s)", m->nodes.size());
  }
  // Partitions heal: members lost from the view are tried again, with back-off, on a thread of
  // their own (its connects block; nothing serving a request waits for them).
  static std::atomic<bool> healer_stop{false};
  std::thread([&sys, agent, &log, timeout = std::min<int64_t>(cfg.request_timeout_ms, 5000)] {
    actors::heal_membership(sys, agent, 1s, std::chrono::milliseconds(timeout), healer_stop,
                            [&log](const std::string& line) { log.info("membership: {}", line); });
  }).detach();
  fmt::print("shoald: listening on {}\n", runtime::to_string(*bound));
  std::fflush(stdout);
  log.info("node '{}' up on {}", cfg.name, runtime::to_string(*bound));

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
  leave(0);
}

}  // namespace shoal::tools::shoald
