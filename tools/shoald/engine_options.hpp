// How shoald configures each rank's engine: the model's default cache sized from
// engine.cache_mib in engine.kv_dtype, and batch-invariant kernels always on (outputs then do not depend on
// batch composition, which re-routing and expert parallelism rely on). Header-only so tests
// that compare a daemon with a local engine build exactly the same engine_config.
#pragma once

#include "model/config.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/engine/engine_setup.hpp"

namespace shoal::tools::shoald {

inline constexpr double default_cache_mib = 512;

inline runtime::engine_config engine_config_for(const model::model_config& c,
                                                double cache_mib = default_cache_mib,
                                                model::kv_dtype kv = model::kv_dtype::bf16) {
  runtime::engine_config e = runtime::default_engine_config(c, cache_mib, kv);
  e.batch_invariant = true;
  return e;
}

}  // namespace shoal::tools::shoald
