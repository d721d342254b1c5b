// How shoald sizes and configures each rank's engine. node_config has no [engine] tuning keys
// yet, so every rank gets the model's default cache of `cache_mib` and batch-invariant kernels
// always on (outputs then do not depend on batch composition). Header-only so tests that
// compare a daemon with a local engine build exactly the same engine_config.
#pragma once

#include "model/config.hpp"
#include "runtime/engine.hpp"
#include "runtime/engine_setup.hpp"

namespace shoal::tools::shoald {

inline constexpr double engine_cache_mib = 512;

inline runtime::engine_config engine_config_for(const model::model_config& c) {
  runtime::engine_config e = runtime::default_engine_config(c, engine_cache_mib);
  e.batch_invariant = true;
  return e;
}

}  // namespace shoal::tools::shoald
