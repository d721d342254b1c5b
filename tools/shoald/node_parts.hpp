// Inside shoald: what a node runs (node_parts) and the functions that start each role's
// actors from the node config (roles.cpp). Each starter logs what it started, or the key at
// fault and returns false; run_node then leaves (node.cpp).
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include <caf/fwd.hpp>

#include "actors/balancer_actors.hpp"
#include "actors/engine_actor.hpp"
#include "actors/eplb_actor.hpp"
#include "actors/gateway_actor.hpp"
#include "actors/interfaces.hpp"
#include "actors/kv_block_store.hpp"
#include "actors/rank_actor.hpp"
#include "actors/swa_tier.hpp"
#include "actors/ve_actors.hpp"
#include "model/config.hpp"
#include "model/tokenizer.hpp"
#include "model/weights.hpp"
#include "runtime/config/node_config.hpp"
#include "runtime/ep/expert_residency.hpp"
#include "tools/shoald/log.hpp"

namespace shoal::tools::shoald {

constexpr int exit_failure = 1;

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

// What the node reads from its model directory before any actor exists: the weights
// (engine and ve roles) or only the config and tokenizer (a gateway alone).
struct node_model {
  std::shared_ptr<const model::model_weights> weights;
  std::shared_ptr<const model::tokenizer> tok;
  std::optional<model::model_config> config;
};

// node.cpus and node.threads: false (logged) when the CPUs cannot be pinned.
bool set_compute_threads(const runtime::node_config& cfg, logger& log);
std::optional<node_model> load_node_model(const runtime::node_config& cfg, logger& log);

// Each role's actors, recorded in `parts` and announced in `me`.
bool start_engines(caf::actor_system& sys, const runtime::node_config& cfg, const node_model& m, node_parts& parts,
                   actors::node_info& me, logger& log);
bool start_storage(caf::actor_system& sys, const runtime::node_config& cfg, node_parts& parts, actors::node_info& me,
                   logger& log);
bool start_ve_worker(caf::actor_system& sys, const runtime::node_config& cfg, const node_model& m, node_parts& parts,
                     actors::node_info& me, logger& log);
void start_directory(caf::actor_system& sys, node_parts& parts, actors::node_info& me, logger& log);
bool start_gateway(caf::actor_system& sys, const runtime::node_config& cfg, const node_model& m, node_parts& parts,
                   actors::node_info& me, logger& log);

}  // namespace shoal::tools::shoald
