// The routed experts an expert-parallel process holds in memory. Its ranks share one
// model_weights loaded without routed experts (model::load_options); each rank, when it adopts
// a layout, holds the experts that layout gives it (every MoE slot, experts
// owned_experts(layout)): the missing ones are read from the checkpoint, and experts no rank
// of the process holds any more are dropped. A rank only computes experts it holds, and
// changes what it holds only between its steps, so no forward pass ever reads an expert
// being read or dropped.
#pragma once

#include <cstdint>
#include <expected>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "model/weights.hpp"
#include "runtime/expert_parallel.hpp"

namespace shoal::runtime {

class expert_residency {
 public:
  // `weights` loaded from `dir` with no routed experts (they are filled in here: the one part
  // of the shared weights that changes after loading). Errors name the file.
  static std::expected<std::shared_ptr<expert_residency>, std::string> open(
    const std::string& dir, std::shared_ptr<const model::model_weights> weights);

  // Holder `holder` (one per rank) now computes experts `range` of every MoE slot: reads what
  // no holder has, drops what no holder keeps. On a read error nothing changes for `holder`
  // and the error names the tensor.
  std::expected<void, std::string> hold(const void* holder, expert_range range);
  void release(const void* holder);
  // Routed experts in memory (of every slot) and their bytes.
  int64_t resident_experts() const;
  int64_t resident_bytes() const;

 private:
  expert_residency(model::expert_reader reader, std::shared_ptr<const model::model_weights> weights);
  void drop(int64_t expert);  // every slot of it; mu_ held
  void drop_unheld();         // mu_ held

  model::expert_reader reader_;
  std::shared_ptr<const model::model_weights> weights_;
  model::model_weights& mutable_weights_;  // the routed experts only
  int64_t slots_, experts_;
  mutable std::mutex mu_;
  std::map<const void*, expert_range> held_;
  std::vector<bool> resident_;  // by expert id (all slots together)
};

}  // namespace shoal::runtime
