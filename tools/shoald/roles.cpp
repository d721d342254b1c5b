// Starting a node's roles from its config: the model it loads, the engine ranks (with their
// transports, SWA tier, storage tier and expert parallelism), storage nodes, the VE worker,
// the SWA directory, and the gateway with its balancers.
#include "tools/shoald/node_parts.hpp"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <fmt/ranges.h>
#include <xxhash.h>
#include <caf/actor_system.hpp>

#include "actors/storage_node_actor.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "runtime/core/cost_model.hpp"
#include "runtime/engine/engine_setup.hpp"
#include "runtime/vision/ve_worker.hpp"
#include "tools/shoald/engine_options.hpp"
#include "transport/dual_transport.hpp"

namespace shoal::tools::shoald {

namespace {

// What the engine ranks' configuration was built from, beyond the config keys.
struct engine_build {
  runtime::engine_config ecfg;
  std::shared_ptr<runtime::transport> bulk;  // engine.transport, when something moves over it
  actors::caf_ep_transport::bulk_options ep_bulk;
};

// engine.cost_model, engine.speculative and engine.spec_cost_model into `ecfg`.
// The checkpoint as the members of a group compare it: the directory's name, and a hash of its
// config.json and of each weight file's name, size and first and last 64 KiB (its header and
// the bytes of its first and last tensors: two fine-tunes of one shape differ there; reading
// every weight byte would take minutes on a real checkpoint).
std::string checkpoint_id(const std::filesystem::path& dir) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  std::ifstream config(dir / "config.json", std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(config)), std::istreambuf_iterator<char>());
  XXH3_64bits_update(st, text.data(), text.size());
  std::vector<std::pair<std::string, uintmax_t>> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().extension() == ".safetensors") files.emplace_back(e.path().filename().string(), e.file_size(ec));
  std::sort(files.begin(), files.end());
  std::vector<char> buf(64 << 10);
  for (const auto& [name, size] : files) {
    const std::string line = name + " " + std::to_string(size) + "\n";
    XXH3_64bits_update(st, line.data(), line.size());
    std::ifstream f(dir / name, std::ios::binary);
    for (uintmax_t at : {uintmax_t{0}, size > buf.size() ? size - buf.size() : uintmax_t{0}}) {
      f.clear();
      f.seekg(static_cast<std::streamoff>(at));
      f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      XXH3_64bits_update(st, buf.data(), static_cast<size_t>(f.gcount()));
    }
  }
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return fmt::format("{}:{:016x}", dir.filename().string(), h);
}

// The step-cost model that sizes prefill chunks: engine.cost_model when given; else the one
// this node fitted before for this checkpoint, KV format, group and machine (in
// node.state_dir/cost-models); else one fitted from the ranks' first steps and kept there.
// Engines that decode also fit their decode steps, whichever it is: the decode balancer's weights.
bool configure_cost_model(const runtime::node_config& cfg, const std::string& checkpoint, runtime::engine_config& ecfg,
                          logger& log) {
  const double budget_s = static_cast<double>(cfg.step_ms) / 1000.0;
  ecfg.cost_fit.decode = cfg.disagg_role != runtime::engine_role::prefill;
  if (cfg.cost_model) {  // prefill chunks sized so a step takes about engine.step_ms
    auto cm = runtime::read_cost_model_file(cfg.cost_model->string());
    if (!cm) {
      log.error("key 'engine.cost_model': {}", cm.error());
      return false;
    }
    if (cm->machine() != runtime::machine_id())
      log.warn("engine.cost_model was fitted on {}, this machine is {}: its step times may be off", cm->machine(),
               runtime::machine_id());
    ecfg.sched.cost = *cm;
    ecfg.sched.step_time_budget_s = budget_s;
    ecfg.cost_source = cfg.cost_model->string();
    log.info("prefill chunks from cost model {} (step budget {} ms)", cfg.cost_model->string(), cfg.step_ms);
    return true;
  }
  const std::string dir = (cfg.state_dir / "cost-models").string();
  const std::string preset = checkpoint + "-" + std::string(model::to_string(cfg.kv_dtype)) +
                             (cfg.expert_parallel ? "-ep-" + cfg.ep_group : std::string());
  const std::string path = runtime::cost_model_path(dir, preset, runtime::machine_id());
  if (std::filesystem::exists(path)) {
    auto cm = runtime::load_cost_model(dir, preset, runtime::machine_id());
    if (cm) {
      ecfg.sched.cost = *cm;
      ecfg.sched.step_time_budget_s = budget_s;
      ecfg.cost_source = path;
      log.info("prefill chunks from the cost model this node fitted before, {} (R² {:.3f}, rms error {:.1f}%; step "
               "budget {} ms)", path, cm->quality().r2, 100 * cm->quality().rms_rel_error, cfg.step_ms);
      return true;
    }
    log.warn("the kept cost model {} is unusable ({}): fitting a new one from this node's steps", path, cm.error());
  }
  ecfg.cost_fit.enabled = true;
  ecfg.cost_fit.step_budget_s = budget_s;
  ecfg.cost_fit.fitted = [dir, preset, &log](const runtime::cost_model& fitted) {
    runtime::cost_model m = fitted;
    m.set_preset(preset);
    m.set_machine(runtime::machine_id());
    auto saved = runtime::save_cost_model(dir, m);
    log.info("step-cost model fitted from {} steps (R² {:.3f}, rms error {:.1f}%): prefill chunks follow it now; {}",
             m.quality().samples, m.quality().r2, 100 * m.quality().rms_rel_error,
             saved ? "kept in " + *saved : "not kept: " + saved.error());
  };
  log.info("no step-cost model for {} on {}: fitting one from the first {} prefill steps (token budget {} until then)",
           preset, runtime::machine_id(), ecfg.cost_fit.min_samples, cfg.token_budget);
  return true;
}

// `checkpoint`: checkpoint_id of the node's model (the kept cost models' key).
bool configure_compute_plan(const runtime::node_config& cfg, const model::model_weights& w,
                            const std::string& checkpoint, runtime::engine_config& ecfg, logger& log) {
  ecfg.sched.token_budget = cfg.token_budget;
  ecfg.sched.max_running = cfg.max_running;
  ecfg.async_scheduling = cfg.overlap_scheduling;
  if (!configure_cost_model(cfg, checkpoint, ecfg, log)) return false;
  if (cfg.speculative == "off") return true;
  if (w.mtp.empty()) {  // DSpark: MTP drafts verified each decode step
    log.error("key 'engine.speculative': the model in {} has no MTP module (num_nextn_predict_layers = 0) to draft with",
              cfg.model_dir.string());
    return false;
  }
  ecfg.spec.mode = *runtime::spec_mode_from(cfg.speculative);
  ecfg.spec.nextn = cfg.spec_nextn;
  ecfg.spec.adaptive_from = cfg.spec_adaptive_from;
  ecfg.spec.auto_from = cfg.spec_auto_from;
  if (cfg.spec_cost_model) {
    auto cm = runtime::read_cost_model_file(cfg.spec_cost_model->string());
    if (!cm) {
      log.error("key 'engine.spec_cost_model': {}", cm.error());
      return false;
    }
    ecfg.spec.cost = *cm;
  }
  if (auto bad = runtime::validate(ecfg.spec, runtime::max_backtrack(w.config, ecfg.cache))) {
    log.error("key 'engine.speculative': {}", *bad);
    return false;
  }
  log.info("speculative decoding: {} with {} MTP drafts per step", cfg.speculative, cfg.spec_nextn);
  return true;
}

std::expected<std::shared_ptr<runtime::transport>, std::string> open_bulk(const std::string& provider,
                                                                         const std::string& host) {
  auto t = transport::open_transport(provider, host);
  if (!t) return std::unexpected(t.error());
  return std::shared_ptr<runtime::transport>(std::move(*t));
}

// engine.transport (handoffs, SWA slots, encoder rows) and the machine's SWA slot store.
bool attach_transfers(caf::actor_system& sys, const runtime::node_config& cfg, const model::model_config& c,
                      engine_build& b, node_parts& parts, actors::node_info& me, logger& log) {
  const bool swa_tier = c.is_flash() && cfg.swa_slots > 0;
  const bool vision = c.vision.present;  // reads rows the VE workers encoded
  if (!c.is_flash()) {  // keys that only shoal_flash models use: said, not silently dropped
    const runtime::node_config defaults;
    if (cfg.swa_slots != defaults.swa_slots || cfg.swa_timeout_ms != defaults.swa_timeout_ms)
      log.warn("engine.swa_slots / engine.swa_timeout_ms unused: {} has no SWA window (shoal_flash only)",
               cfg.model_dir.string());
    if (cfg.disagg_role == runtime::engine_role::both && !vision && !cfg.expert_parallel &&
        cfg.transport != defaults.transport)
      log.warn("engine.transport unused: a colocated deepseek_v3 engine without vision or expert parallelism "
               "moves no handoffs, reads no encoder rows, has no SWA slots and sends no expert frames");
  }
  if (cfg.disagg_role != runtime::engine_role::both || swa_tier || vision) {
    // One libfabric endpoint for the node's ranks, bound to the listen host (shm needs no address).
    auto t = open_bulk(cfg.transport, cfg.listen.host);
    if (!t) {
      log.error("key 'engine.transport' (\"{}\"): {}", cfg.transport, t.error());
      return false;
    }
    b.bulk = *t;
    parts.bulk.push_back(b.bulk);
  }
  if (swa_tier) {  // the machine's SWA slot store, shared by its ranks, and the reads of other machines'
    auto store = std::make_shared<runtime::swa_store>(cfg.swa_slots,
                                                      runtime::swa_snapshot_bytes(c, b.ecfg.cache.snapshot_storage));
    const auto timeout = std::chrono::milliseconds(cfg.swa_timeout_ms);
    parts.swa_fetcher = std::make_shared<actors::swa_fetcher>(sys, b.bulk, cfg.name, timeout);
    auto a = actors::spawn_swa_store(sys, {cfg.name, store, b.bulk, parts.swa_fetcher});
    if (!a) {
      log.error("key 'engine.swa_slots' ({}): {}", cfg.swa_slots, a.error());
      return false;
    }
    parts.swa_store = *a;
    me.swa_store = caf::actor_cast<caf::actor>(*a);
    b.ecfg.cache.swa_machine_store = store;
    b.ecfg.cache.swa_remote = parts.swa_fetcher;
    b.ecfg.cache.swa_timeout_s = std::chrono::duration<double>(timeout).count();
    log.info("SWA store: {} slots of {} bytes, slot reads over {}", store->capacity(), store->slot_bytes(),
             b.bulk->name());
  }
  if (cfg.disagg_role != runtime::engine_role::both || vision) {
    b.ecfg.role = cfg.disagg_role;
    b.ecfg.bulk = b.bulk;
    b.ecfg.handoff_read_timeout = std::chrono::milliseconds(cfg.handoff_timeout_ms);
    if (cfg.disagg_role != runtime::engine_role::both) log.info("{} engine: handoffs over {}", me.engine_role, b.bulk->name());
    else log.info("engine: encoder rows of vision-encoder workers over {}", b.bulk->name());
  }
  return true;
}

// engine.kv_storage: the storage cluster as the ranks' second cache tier.
bool attach_kv_storage(caf::actor_system& sys, const runtime::node_config& cfg, engine_build& b, node_parts& parts,
                       logger& log) {
  if (!cfg.kv_storage) return true;
  actors::kv_client_config kc;
  kc.timeout = std::chrono::milliseconds(std::min<int64_t>(cfg.request_timeout_ms, 5000));
  auto client = actors::kv_client::create(sys, kc);
  if (!client) {
    log.error("{}", client.error());
    return false;
  }
  parts.kv = std::make_shared<actors::kv_block_store>(std::move(*client));
  parts.kv_watcher = actors::spawn_storage_watcher(sys, parts.kv);
  b.ecfg.cache.remote = parts.kv;
  b.ecfg.cache.remote_timeout_s = std::chrono::duration<double>(kc.timeout).count();  // then recompute
  return true;
}

// engine.expert_parallel: the routed experts each rank reads when it joins a group, and the
// frames' transport (engine.ep_frames).
bool attach_expert_parallel(const runtime::node_config& cfg, const node_model& m, engine_build& b, node_parts& parts,
                            logger& log) {
  if (!cfg.expert_parallel) return true;
  // One backend for the process's ranks and its routed experts: they install into what the
  // ranks compute with.
  auto backend = model::make_backend(cfg.device, m.weights);
  if (!backend) {
    log.error("engine.device: {}", backend.error().message);
    return false;
  }
  b.ecfg.backend = *backend;
  auto residency = runtime::expert_residency::open(cfg.model_dir.string(), m.weights, *backend);
  if (!residency) {
    log.error("cannot open model dir {} for its routed experts: {}", cfg.model_dir.string(), residency.error());
    return false;
  }
  b.ecfg.experts = *residency;
  parts.experts = *residency;
  // the transport is the rank's own, set by spawn_engine; the load window is the balancer's
  b.ecfg.ep = runtime::engine_config::ep_config{};
  b.ecfg.ep->load_window_steps = cfg.eplb_window_steps;
  b.ecfg.ep->notice = [&log](const std::string& line) { log.info("{}", line); };
  log.info("routed experts: each rank reads its own when it joins a group (none read yet)");
  if (cfg.ep_frames != "transport") return true;
  // Control over CAF, the bytes over libfabric (engine.transport), read one-sided from the
  // sender's registered memory.
  if (b.bulk) {
    b.ep_bulk.transport = b.bulk;
  } else {
    auto t = open_bulk(cfg.transport, cfg.listen.host);
    if (!t) {
      log.error("key 'engine.transport' (\"{}\"): {}", cfg.transport, t.error());
      return false;
    }
    b.ep_bulk.transport = *t;
    parts.bulk.push_back(b.ep_bulk.transport);
  }
  b.ep_bulk.bulk_from = static_cast<size_t>(cfg.ep_bulk_min_bytes);
  if (cfg.tls_certificate)
    log.warn("engine.ep_frames = \"transport\" under cluster TLS: expert frames travel unencrypted over {}",
             cfg.transport);
  log.info("expert-parallel frames from {} bytes over {}, control over CAF", b.ep_bulk.bulk_from,
           b.ep_bulk.transport->name());
  // The experts a rank gains from the balancer's plans move over the same transport.
  b.ecfg.ep->bulk = b.ep_bulk.transport;
  b.ecfg.ep->fetch_timeout = std::chrono::milliseconds(cfg.eplb_fetch_timeout_ms);
  return true;
}

// node.ranks engine actors (and their expert-parallel rank actors), then the group's balancer.
void spawn_ranks(caf::actor_system& sys, const runtime::node_config& cfg, const node_model& m, const engine_build& b,
                 node_parts& parts, actors::node_info& me, logger& log) {
  // A silent peer fails an expert-parallel exchange after this long at the latest (a dead
  // one sooner: the membership change interrupts it).
  auto ep_timeout = std::chrono::milliseconds(std::max<int64_t>(2 * cfg.connection_timeout_ms, 5000));
  for (int32_t r = 0; r < cfg.ranks; ++r) {
    std::shared_ptr<actors::caf_ep_transport> ep;
    if (cfg.expert_parallel) {
      ep = std::make_shared<actors::caf_ep_transport>(ep_timeout, b.ep_bulk);
      parts.ep_transports.push_back(ep);
    }
    parts.engines.push_back(actors::spawn_engine(sys, m.weights, b.ecfg, /*detached=*/true, ep, m.tok));
    caf::actor rank;
    if (ep) {
      parts.ranks.push_back(actors::spawn_rank(sys, ep, parts.engines.back(), cfg.ep_group));
      rank = caf::actor_cast<caf::actor>(parts.ranks.back());
    }
    me.ranks.push_back({r, caf::actor_cast<caf::actor>(parts.engines.back()), rank});
  }
  log.info("{} engine rank(s), {} cache blocks each, batch-invariant{}", cfg.ranks, b.ecfg.cache.num_blocks,
           cfg.expert_parallel ? ", expert-parallel" : "");
  if (!cfg.expert_parallel) return;
  parts.eplb = std::make_shared<actors::eplb_board>();
  const runtime::eplb_policy policy{cfg.eplb_redundant_per_rank, cfg.eplb_period_steps, cfg.eplb_window_steps,
                                    cfg.eplb_expert_groups, 1};  // nodes: the group's processes
  actors::spawn_eplb(sys, cfg.name, cfg.ep_group, policy, std::chrono::milliseconds(cfg.eplb_interval_ms),
                     std::chrono::milliseconds(cfg.eplb_fetch_timeout_ms), parts.eplb);
  log.info("expert-parallel group '{}'{}: balancer with the {} preset, {} redundant expert(s) per rank, a plan every "
           "{} steps from a {}-step window",
           cfg.ep_group, cfg.ep_group_size > 0 ? fmt::format(" of {} ranks", cfg.ep_group_size) : std::string(),
           cfg.eplb_preset, policy.redundant_per_rank, policy.period_steps, policy.window_steps);
}

actors::storage_node_config storage_config_of(const runtime::node_config& cfg, int32_t i) {
  actors::storage_node_config sc;
  sc.store.root = (*cfg.storage_dir / std::to_string(i)).string();
  sc.store.capacity_bytes = static_cast<uint64_t>(cfg.storage_capacity_mib) << 20;
  sc.store.gc_high_watermark = cfg.storage_high_watermark_pct / 100.0;
  sc.store.gc_low_watermark = cfg.storage_low_watermark_pct / 100.0;
  sc.store.sync = cfg.storage_fsync ? storage::sync_policy::always : storage::sync_policy::never;
  sc.store.ttl.agent_ms = cfg.storage_ttl_agent_s * 1000;
  sc.store.ttl.chat_ms = cfg.storage_ttl_chat_s * 1000;
  sc.store.now_ms = [] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
  };
  sc.bulk_host = cfg.listen.host;
  sc.bulk_port = cfg.storage_bulk_port > 0 ? static_cast<uint16_t>(cfg.storage_bulk_port + i) : uint16_t{0};
  return sc;
}

// The gateway's balancers (prefill, decode, and VE when the model has a vision encoder).
bool start_balancers(caf::actor_system& sys, const runtime::node_config& cfg, const model::model_config& c,
                     node_parts& parts, actors::node_info& me, logger& log) {
  actors::balancer_options bo;
  auto pp = runtime::prefill_policy_named(cfg.prefill_policy);  // validated by the config parser
  bo.prefill.policy = pp ? *pp : runtime::prefill_policy::tiered;
  bo.prefill.tier_bounds = cfg.tier_bounds;
  bo.prefill.round_s = static_cast<double>(cfg.balancer_round_ms) / 1000.0;
  bo.prefill.block_size = c.block_size;
  bo.decode_policy = cfg.decode_policy;
  if (cfg.balancer_cost_model) {
    auto cm = runtime::read_cost_model_file(cfg.balancer_cost_model->string());
    if (!cm) {
      log.error("key 'gateway.balancer_cost_model': {}", cm.error());
      return false;
    }
    bo.cost = *cm;
    bo.cost_fitted = true;
  }
  parts.balancers = actors::spawn_balancers(sys, bo);
  me.balancers = {caf::actor_cast<caf::actor>(parts.balancers->prefill),
                  caf::actor_cast<caf::actor>(parts.balancers->decode)};
  if (c.vision.present) {  // images go to the VE workers that join (the engines encode while none is up)
    parts.balancers->ve = actors::spawn_ve_balancer(sys, {std::chrono::milliseconds(cfg.request_timeout_ms), 4});
    me.balancers.push_back(caf::actor_cast<caf::actor>(parts.balancers->ve));
  }
  log.info("balancers: prefill {} (tiers {}, round {} ms), decode {}", cfg.prefill_policy,
           fmt::join(cfg.tier_bounds, "/"), cfg.balancer_round_ms, cfg.decode_policy);
  return true;
}

}  // namespace

bool set_compute_threads(const runtime::node_config& cfg, logger& log) {
  // Every thread started from here on inherits the mask.
  if (!cfg.cpus.empty()) {
    if (std::string e = kernels::pin_to_cpus(cfg.cpus); !e.empty()) {
      log.error("key 'node.cpus': {}", e);
      return false;
    }
  }
  if (cfg.threads > 0) kernels::set_num_threads(cfg.threads);
  if (cfg.has_role(runtime::role::engine))
    log.info("compute threads: {} on {} CPU{}", kernels::num_threads(), kernels::available_cpus(),
             kernels::available_cpus() == 1 ? "" : "s");
  return true;
}

std::optional<node_model> load_node_model(const runtime::node_config& cfg, logger& log) {
  node_model out;
  if (cfg.has_role(runtime::role::engine) || cfg.has_role(runtime::role::ve)) {
    log.info("loading model {}", cfg.model_dir.string());
    // Expert-parallel ranks read their routed experts when they adopt a group (expert_residency).
    model::load_options options;
    if (cfg.has_role(runtime::role::engine) && cfg.expert_parallel)
      options.keep_routed_expert = [](int64_t, int64_t) { return false; };
    auto m = runtime::load_model_dir(cfg.model_dir.string(), false, options);
    if (!m) {
      log.error("cannot load model dir {}: {}", cfg.model_dir.string(), m.error().message);
      return std::nullopt;
    }
    out.weights = m->weights;
    out.tok = m->tokenizer;
    out.config = out.weights->config;
    if (cfg.has_role(runtime::role::ve) && !out.config->vision.present) {
      log.error("node.roles has 've' but the model in {} has no vision encoder (config.json \"vision\")",
                cfg.model_dir.string());
      return std::nullopt;
    }
  } else if (cfg.has_role(runtime::role::gateway)) {
    auto c = model::load_config(cfg.model_dir.string());
    auto t = c ? model::tokenizer::load((cfg.model_dir / "tokenizer.json").string())
               : model::result<model::tokenizer>(std::unexpected(c.error()));
    if (!t) {
      log.error("cannot load model dir {}: {}", cfg.model_dir.string(), t.error().message);
      return std::nullopt;
    }
    out.config = *c;
    out.tok = std::make_shared<const model::tokenizer>(std::move(*t));
  }
  return out;
}

bool start_engines(caf::actor_system& sys, const runtime::node_config& cfg, const node_model& m, node_parts& parts,
                   actors::node_info& me, logger& log) {
  engine_build b{engine_config_for(m.weights->config, static_cast<double>(cfg.cache_mib), cfg.kv_dtype), nullptr, {}};
  b.ecfg.device = cfg.device;
  me.engine_role = runtime::to_string(cfg.disagg_role);
  me.checkpoint = checkpoint_id(cfg.model_dir);
  if (cfg.expert_parallel) {
    me.ep_group = cfg.ep_group;
    me.ep_group_size = cfg.ep_group_size;
    me.ep_spec_depth = cfg.speculative == "off" ? 0 : static_cast<int32_t>(cfg.spec_nextn);
  }
  if (!configure_compute_plan(cfg, *m.weights, me.checkpoint, b.ecfg, log) ||
      !attach_transfers(sys, cfg, m.weights->config, b, parts, me, log) || !attach_kv_storage(sys, cfg, b, parts, log) ||
      !attach_expert_parallel(cfg, m, b, parts, log))
    return false;
  spawn_ranks(sys, cfg, m, b, parts, me, log);
  return true;
}

bool start_storage(caf::actor_system& sys, const runtime::node_config& cfg, node_parts& parts, actors::node_info& me,
                   logger& log) {
  for (int32_t i = 0; i < cfg.storage_nodes; ++i) {
    actors::storage_node_config sc = storage_config_of(cfg, i);
    std::error_code ec;
    std::filesystem::create_directories(sc.store.root, ec);
    if (ec) {
      log.error("key 'storage.dir': cannot create {}: {}", sc.store.root, ec.message());
      return false;
    }
    auto node = actors::spawn_storage_node(sys, sc);
    if (!node) {
      log.error("{}", node.error());
      return false;
    }
    parts.storage.push_back(node->actor);
    me.storage.push_back(caf::actor_cast<caf::actor>(node->actor));
    me.storage_ports.push_back(node->bulk_port);
    log.info("storage{}: bulk data path on {}:{}", i, sc.bulk_host, node->bulk_port);
  }
  log.info("{} storage node(s) under {}, {} MiB each, fsync {}", cfg.storage_nodes, cfg.storage_dir->string(),
           cfg.storage_capacity_mib, cfg.storage_fsync ? "always" : "never");
  return true;
}

bool start_ve_worker(caf::actor_system& sys, const runtime::node_config& cfg, const node_model& m, node_parts& parts,
                     actors::node_info& me, logger& log) {
  // The vision encoder's rows are read by the prefill engines from this node's endpoint.
  auto bulk = open_bulk(cfg.ve_transport, cfg.listen.host);
  if (!bulk) {
    log.error("key 've.transport' (\"{}\"): {}", cfg.ve_transport, bulk.error());
    return false;
  }
  auto worker = std::make_unique<runtime::ve_worker>(m.weights, *bulk, cfg.ve_cache_mib << 20,
                                                     engine_config_for(m.weights->config).batch_invariant);
  parts.ve_worker = actors::spawn_ve_worker(sys, cfg.name, std::move(worker));
  me.ve_worker = caf::actor_cast<caf::actor>(*parts.ve_worker);
  log.info("vision-encoder worker: rows over {}, cache {} MiB", (*bulk)->name(), cfg.ve_cache_mib);
  return true;
}

void start_directory(caf::actor_system& sys, node_parts& parts, actors::node_info& me, logger& log) {
  parts.swa_directory = actors::spawn_swa_directory(sys);
  me.swa_directory = caf::actor_cast<caf::actor>(*parts.swa_directory);
  log.info("SWA directory: rebuilt from the stores' reports as they arrive");
}

bool start_gateway(caf::actor_system& sys, const runtime::node_config& cfg, const node_model& m, node_parts& parts,
                   actors::node_info& me, logger& log) {
  const model::model_config& c = *m.config;
  if (!start_balancers(sys, cfg, c, parts, me, log)) return false;
  actors::gateway_config g;
  g.host = cfg.http_listen->host;
  g.port = cfg.http_listen->port;
  g.model_id = cfg.model_dir.filename().string();
  g.context_length = c.max_position_embeddings;
  g.vocab_size = c.vocab_size;
  g.request_timeout = std::chrono::milliseconds(cfg.request_timeout_ms);
  g.max_in_flight = cfg.max_in_flight;
  g.tokenizer_config = cfg.model_dir / "tokenizer_config.json";
  g.vision = c.vision;
  g.request_log = [&log](const std::string& line) { log.info("{}", line); };
  if (cfg.auth_token_file) {
    auto tokens = actors::read_auth_tokens(*cfg.auth_token_file);
    if (!tokens) {
      log.error("key 'gateway.auth_token_file': {}", tokens.error());
      return false;
    }
    g.auth_tokens = std::move(*tokens);
  }
  auto gw = actors::spawn_gateway(sys, *parts.balancers, m.tok, g);
  if (!gw) {
    log.error("gateway: {}", gw.error());
    return false;
  }
  parts.gateway = gw->actor;
  fmt::print("shoald: http on {}:{}\n", g.host, gw->port);
  log.info("gateway: OpenAI API on http://{}:{} (model id '{}'{})", g.host, gw->port, g.model_id,
           g.auth_tokens.empty() ? "" : ", bearer auth");
  return true;
}

}  // namespace shoal::tools::shoald
