// Configuration of one `shoald` node, read from a TOML file (`shoald --config FILE.toml`).
// The schema (sections [node], [engine], [gateway], [cluster], [log]) is documented key by key
// in config/README.md and the samples beside it. Parsing is all-or-nothing: a usable
// node_config, or one config_error naming file, line, column and key; TOML stays out of here.
#pragma once

#include <cstdint>
#include <expected>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/kv_format.hpp"
#include "runtime/base/fault_points.hpp"
#include "runtime/config/host_port.hpp"
#include "runtime/base/roles.hpp"

namespace shoal::runtime {

enum class log_level : uint8_t { trace, debug, info, warn, error };
const char* to_string(log_level l);

struct node_config {
  // [node]
  std::string name;                   // unique in the cluster; [A-Za-z0-9._-], ≤ 64 chars
  host_port listen;                   // CAF middleman endpoint of this node
  std::vector<role> roles;            // non-empty, no duplicates, file order
  std::filesystem::path model_dir;    // set iff the node has the gateway, engine or ve role
  int64_t drain_timeout_ms = 30'000;  // SIGTERM: longest wait for running requests
  std::optional<host_port> metrics_listen;  // Prometheus text of this node's engines and storage nodes
  std::vector<int> cpus;              // non-empty: the process runs on these CPUs only (sched_setaffinity)
  // node.state_dir (or shoald --state-dir): what the node learns and keeps across restarts,
  // the fitted step-cost models under cost-models/. Default: $XDG_STATE_HOME/shoal, else
  // ~/.local/state/shoal, else /tmp/shoal-state.
  std::filesystem::path state_dir;

  // [engine] (only with the engine role)
  int32_t ranks = 1;  // data-parallel ranks hosted by this node, ≥ 1
  int32_t threads = 0;  // compute threads of the process's kernels; 0 = one per CPU it may run on
  int64_t cache_mib = 512;        // KV block memory per rank
  model::kv_dtype kv_dtype = model::kv_dtype::bf16;  // engine.kv_dtype: the KV cache's stored form
  std::string device = "cpu";     // engine.device: the compute backend (model/backend.hpp)
  // engine.expert_parallel: the node's ranks join the expert-parallel group engine.ep_group
  // (default: the engine role's name, so prefill and decode ranks form separate groups). The
  // group is every rank of every engine node naming it; its members must agree on the
  // checkpoint, the role, ep_group_size (when given) and the speculative depth, or a joining
  // node is refused (actors/rank_actor.hpp ep_join_conflict).
  bool expert_parallel = false;
  std::string ep_group;
  int32_t ep_group_size = 0;      // the group's ranks as declared; 0: not declared
  // Expert-parallel dispatch/combine bytes: "transport" (libfabric, engine.transport; control
  // stays CAF) or "caf" (inside the CAF messages). With cluster TLS the default is "caf":
  // libfabric bytes are not encrypted.
  std::string ep_frames = "transport";
  int64_t ep_bulk_min_bytes = 16 << 10;  // smaller frames travel inside the CAF message
  bool kv_storage = false;        // the storage cluster is the ranks' second cache tier
  engine_role disagg_role = engine_role::both;  // engine.role: prefill / decode pools, or both
  std::string transport = "tcp;ofi_rxm";        // libfabric provider of handoff bytes and SWA slot reads
  int64_t handoff_timeout_ms = 5'000;           // decode side: a handoff's reads, then recompute
  std::optional<std::filesystem::path> cost_model;  // fitted prefill cost model: chunks sized to step_ms
  int64_t step_ms = 50;                         // step time budget of the cost model (given, kept or fitted)
  int64_t token_budget = 32'768;                // tokens one step may compute (scheduler_config)
  int64_t max_running = 64;                     // sequences running at once (scheduler_config)
  bool overlap_scheduling = true;               // plan the next step while one computes (engine_config::async_scheduling)
  int64_t swa_slots = 256;                      // shoal_flash: the machine's SWA slot store (0 = none)
  int64_t swa_timeout_ms = 2'000;               // a request waits this long for another machine's slot
  // DSpark speculative decoding (runtime/core/speculative.hpp): "off", "fixed", "adaptive" or
  // "auto" (every draft verified or none, per concurrency whichever measured faster).
  std::string speculative = "off";
  int64_t spec_nextn = 5;                        // MTP drafts per step
  int64_t spec_adaptive_from = 16;               // adaptive below this many decodes verifies every draft
  int64_t spec_auto_from = 16;                   // auto: the prior (verify from this many decodes) until measured
  std::optional<std::filesystem::path> spec_cost_model;  // decode cost model (shoal bench fit-cost --decode), adaptive

  // [eplb] (only with engine.expert_parallel): the group's expert-parallel balancer, run by
  // the node of the group's rank 0 (actors/eplb_actor.hpp). preset "decode" (1 redundant
  // expert per rank, a plan every 10,000 steps from a 1,000-step window) or "prefill" (4, 1,000,
  // 100); the other keys override the preset's values.
  std::string eplb_preset = "decode";
  int64_t eplb_redundant_per_rank = 1;
  int64_t eplb_period_steps = 10'000;
  int64_t eplb_window_steps = 1'000;
  int64_t eplb_interval_ms = 1'000;  // how often the leader collects the ranks' load reports
  // A process reads each expert it gains from a holder within this long (over the transport,
  // with engine.ep_frames = "transport"), or from the checkpoint after it.
  int64_t eplb_fetch_timeout_ms = 60'000;
  // DeepSeek's hierarchical policy when > 1: the routed experts form this many groups (the
  // model's n_group), each group's copies packed onto one node (process) of the EP group;
  // 1: the global policy.
  int64_t eplb_expert_groups = 1;

  // [ve] (only with the ve role): the vision-encoder worker
  std::string ve_transport = "tcp;ofi_rxm";  // libfabric provider the prefill engines read the rows over
  int64_t ve_cache_mib = 256;                // registered encoder rows kept (embedding cache)

  // [gateway] (required with the gateway role, rejected without it)
  std::optional<host_port> http_listen;                 // set iff the node has the gateway role
  std::optional<std::filesystem::path> auth_token_file;  // bearer tokens; nullopt = no auth
  // The gateway's balancers (runtime/placement/prefill_balancer.hpp, runtime/placement/decode_placement.hpp).
  std::string prefill_policy = "tiered";         // tiered, untiered, round_robin, least_requests, cache_aware, dynamo
  std::string decode_policy = "decode_balancer";  // decode_balancer, least_loaded, least_kv, round_robin
  int64_t balancer_round_ms = 10'000;            // prefill tiers are reassigned this often
  std::vector<int64_t> tier_bounds = {16 * 1024, 64 * 1024, 256 * 1024};  // prompt tokens, ascending
  std::optional<std::filesystem::path> balancer_cost_model;  // fitted prefill cost model (default: 1 per token)
  int32_t max_in_flight = 256;  // requests served at once (HTTP connections + shell submits); more: 429

  // [storage] (only with the storage role; dir required there)
  std::optional<std::filesystem::path> storage_dir;  // chunk stores: DIR/<i> for node i
  int32_t storage_nodes = 1;                 // storage node actors on this node (tests run several)
  int64_t storage_capacity_mib = 1024;       // per storage node
  int32_t storage_high_watermark_pct = 90;   // GC starts above this usage …
  int32_t storage_low_watermark_pct = 70;    // … and evicts down to this
  bool storage_fsync = true;                 // fsync before a put is acknowledged
  int64_t storage_ttl_agent_s = 3 * 86400;   // traffic class TTLs
  int64_t storage_ttl_chat_s = 7 * 86400;
  int32_t storage_bulk_port = 0;             // storage node i's bulk data port: this + i (0: any free port)

  // [cluster]
  std::vector<host_port> seeds;               // empty = this node starts the cluster
  int64_t heartbeat_interval_ms = 1'000;      // middleman.heartbeat-interval
  int64_t connection_timeout_ms = 5'000;      // middleman.connection-timeout, > heartbeat
  int64_t request_timeout_ms = 60'000;        // every request to another actor
  // Authenticated cluster traffic (CAF's OpenSSL module): this node's certificate and key (PEM)
  // and the cluster CA that signed every member's; all three or none. With them, every
  // connection between nodes (and from the shell) is TLS with both sides' certificates
  // verified against the CA; a node without a certificate of that CA cannot join or send.
  std::optional<std::filesystem::path> tls_certificate, tls_key, tls_ca_file;

  // [log]
  log_level level = log_level::info;
  std::optional<std::filesystem::path> log_file;  // nullopt = stderr only

  // [faults] (tests only): plan = "seed=N,point=probability,..." (runtime/base/fault_points.hpp);
  // absent = no fault is ever injected.
  fault_plan faults;

  bool has_role(role r) const;
};

enum class config_errc : uint8_t {
  io,            // file unreadable
  syntax,        // not TOML
  unknown_key,   // key or section outside the schema (typos are errors, never ignored)
  wrong_type,    // e.g. a string where an integer belongs
  bad_value,     // out of range, unknown enum name, malformed host:port, duplicate
  missing_key,   // required key absent
};
const char* to_string(config_errc e);

// One operating error in a config file. line/column are 1-based; 0 means "no position"
// (an unreadable file, or a key missing from a section that is absent too).
struct config_error {
  config_errc code = config_errc::syntax;
  std::string file;
  int32_t line = 0;
  int32_t column = 0;
  std::string key;  // dotted path ("engine.ranks"); empty for syntax and io errors
  std::string message;
};

// "FILE:LINE:COL: key 'engine.ranks': must be ≥ 1, got 0"; the position is left out when
// line is 0 and the key part when key is empty.
std::string to_string(const config_error& e);

// Parses and validates `toml_text`; `file` names the text in errors. Relative paths in the
// file (model_dir, auth_token_file, log file) resolve against the directory of `file`
// (lexically; nothing is opened or checked for existence). Never throws a TOML exception.
std::expected<node_config, config_error> parse_node_config(std::string_view toml_text,
                                                           const std::string& file);

// Reads `path` and parses it; relative paths in it resolve against its absolute directory,
// so the result does not depend on the working directory afterwards.
std::expected<node_config, config_error> load_node_config(const std::filesystem::path& path);

}  // namespace shoal::runtime
