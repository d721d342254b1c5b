// The routed experts an expert-parallel process holds in memory. Its ranks share one
// model_weights loaded without routed experts (model::load_options); each rank holds the
// (MoE slot, expert) weights its group's placement gives it, and while a new placement is
// being adopted those of both: the missing ones are read from the checkpoint, and weights no
// rank of the process holds any more are dropped. A rank only computes experts it holds, and
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

  // experts[slot]: the experts of that MoE slot, ascending.
  using expert_set = std::vector<std::vector<int32_t>>;
  // The experts `holder` (one per rank) computes under `placement` for `rank`, with those of
  // `also` (the placement being adopted) when given.
  static expert_set experts_for(const ep_placement& placement, int32_t rank, const ep_placement* also = nullptr);

  // Holder `holder` now holds `experts`: reads what no holder has, drops what no holder
  // keeps. On a read error nothing changes for `holder` and the error names the tensor.
  std::expected<void, std::string> hold(const void* holder, const expert_set& experts);
  void release(const void* holder);
  // (MoE slot, routed expert) weights in memory, and their bytes.
  int64_t resident_experts() const;
  int64_t resident_bytes() const;

 private:
  expert_residency(model::expert_reader reader, std::shared_ptr<const model::model_weights> weights);
  void drop(int64_t slot, int64_t expert);  // mu_ held
  void drop_unheld();                       // mu_ held

  model::expert_reader reader_;
  std::shared_ptr<const model::model_weights> weights_;
  model::model_weights& mutable_weights_;  // the routed experts only
  int64_t slots_, experts_;
  mutable std::mutex mu_;
  std::map<const void*, expert_set> held_;
  std::vector<bool> resident_;  // [slot·experts + expert]
};

}  // namespace shoal::runtime
