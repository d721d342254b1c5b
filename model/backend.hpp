// The compute backend: everything an engine or an expert-parallel rank computes goes through
// one of these (engine.device): the forward pass over one step's batch, the MTP drafting
// step, the paged KV memory, the vision encoder, another rank's routed experts, and loading
// or dropping an expert's weights. The CPU backend ("cpu") runs model/'s host code; a device
// backend keeps the weights, the pages and the layer loop on its device and uploads one
// batch_plan per step. Backends register by name; every backend registered runs the same
// conformance cases (tests/model/backend_test.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/error.hpp"
#include "model/forward.hpp"
#include "model/kv_format.hpp"
#include "model/weights.hpp"

namespace shoal::model {

// One step's batch as flat host arrays (what a device backend uploads as is). Rows are the
// items' new tokens in item order.
struct batch_plan {
  std::vector<int64_t> row_begin;    // (items + 1): item i's rows are [row_begin[i], row_begin[i + 1])
  std::vector<int32_t> positions;    // (rows) the position of each row
  std::vector<int64_t> table_begin;  // (items + 1): item i's block ids are block_table[table_begin[i] …)
  std::vector<int32_t> block_table;  // block ids, per item in position order
  // (rows) where the compressed run ending at the row is written (shoal_flash: every ratio-th
  // position; deepseek_v3: every row): its block id and index in the block's layer, or −1.
  std::vector<int32_t> slot_block, slot_index;
  std::vector<int64_t> logit_rows;   // rows whose logits are wanted, in output order
  int64_t rows() const { return row_begin.empty() ? 0 : row_begin.back(); }
};
batch_plan build_plan(const model_config& c, std::span<const forward_item> items);

// Rows of one routed expert to run: y (rows, d) = SwiGLU_expert(x (rows, d)).
struct expert_job {
  int64_t expert = 0;
  const float* x = nullptr;
  int64_t rows = 0;
  float* y = nullptr;
};

class compute_backend {
 public:
  virtual ~compute_backend() = default;
  virtual std::string_view name() const = 0;
  virtual const model_weights& weights() const = 0;
  // Worker threads (CPU) or streams the backend computes with.
  virtual int64_t threads() const = 0;
  // The paged KV memory of an engine: num_blocks blocks of format f.
  virtual std::shared_ptr<kv_pages> create_kv(const kv_format& f, int32_t num_blocks) = 0;
  // model::forward over one step's batch (the items' caches are this backend's pages).
  virtual forward_output forward(std::span<forward_item> items, const forward_options& o) = 0;
  // model::mtp_chain_step: one drafting step of a batch.
  virtual std::vector<std::vector<mtp_draft>> mtp_step(std::span<const mtp_step_item> items, int64_t depth,
                                                       int64_t window, const draft_chooser& choose,
                                                       const forward_options& o) = 0;
  // A whole sequence over a private cache in format kv (self-drafting, tools).
  virtual full_result forward_full(std::span<const int32_t> tokens, const forward_options& o, kv_dtype kv) = 0;
  // The vision encoder's rows of one image (it must pass check_image).
  virtual std::vector<float> encode_image(std::span<const uint8_t> rgb, int64_t width, int64_t height,
                                          bool batch_invariant) = 0;
  // Routed experts of MoE slot `moe_slot` over rows another rank sent (expert parallelism):
  // each job runs whole on one worker, with the local path's kernels (bit-identical rows in
  // batch-invariant mode).
  virtual void run_experts(int64_t moe_slot, std::span<const expert_job> jobs, bool batch_invariant) = 0;
  // Installs / drops routed expert `expert` of `moe_slot`, between steps only (nothing in
  // flight reads the weights meanwhile).
  virtual void load_expert(int64_t moe_slot, int64_t expert, expert_weights w) = 0;
  virtual void drop_expert(int64_t moe_slot, int64_t expert) = 0;
};

using backend_factory = std::function<result<std::shared_ptr<compute_backend>>(std::shared_ptr<const model_weights>)>;
// Registers a backend under `name` (false when the name is taken); "cpu" is always there.
bool register_backend(const std::string& name, backend_factory make);
std::vector<std::string> backend_names();
// The backend `name` over these weights; errc::unsupported names the backends there are.
result<std::shared_ptr<compute_backend>> make_backend(const std::string& name, std::shared_ptr<const model_weights> w);
// Threads the CPU kernels use in this process (machine ids of fitted cost models).
int64_t cpu_threads();

}  // namespace shoal::model
