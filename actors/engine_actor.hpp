// The engine actor: one data-parallel replica's runtime::engine behind the engine_actor
// interface (actors/interfaces.hpp). Its state owns the engine and a routing table (caller's
// request id ↔ engine id, sink per request); handlers only translate messages to engine calls
// and stream the token events each step produces, one step per self-sent step message.
#pragma once

#include <memory>

#include "actors/interfaces.hpp"
#include "actors/rank_actor.hpp"
#include "model/weights.hpp"
#include "runtime/engine/engine.hpp"

namespace shoal::actors {

// Spawns an engine actor in `sys` owning runtime::engine(weights, config). detached = on its
// own thread, as production wants (a step blocks for a whole forward pass); not detached =
// on the scheduler, which tests with the deterministic test coordinator need. With `ep` the
// engine is one rank of an expert-parallel group (a group of itself until its rank actor,
// spawn_rank over the same transport, hands it one) and always runs detached. `tok` lets the
// engine apply stop strings as it samples (requests with stop strings are refused without).
engine_actor spawn_engine(caf::actor_system& sys, std::shared_ptr<const model::model_weights> weights,
                          const runtime::engine_config& config, bool detached = false,
                          std::shared_ptr<caf_ep_transport> ep = nullptr,
                          std::shared_ptr<const model::tokenizer> tok = nullptr);

}  // namespace shoal::actors
