// The backend registry, the host-side step plan, and the CPU backend over model/'s host code.
#include "model/backend.hpp"

#include <map>
#include <mutex>

#include "kernels/assert.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "model/vision.hpp"

namespace shoal::model {

batch_plan build_plan(const model_config& c, std::span<const forward_item> items) {
  batch_plan p;
  p.row_begin.push_back(0);
  p.table_begin.push_back(0);
  const int64_t m = c.ratio(), per_block = c.block_size / m;
  for (const forward_item& it : items) {
    const int64_t p0 = it.cache->computed, n = static_cast<int64_t>(it.tokens.size()), row0 = p.rows();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pos = p0 + i;
      p.positions.push_back(static_cast<int32_t>(pos));
      const bool ends_run = (pos + 1) % m == 0;
      const int64_t run = pos / m;
      p.slot_block.push_back(ends_run ? it.cache->blocks[static_cast<size_t>(run / per_block)] : -1);
      p.slot_index.push_back(ends_run ? static_cast<int32_t>(run % per_block) : -1);
    }
    p.row_begin.push_back(row0 + n);
    p.block_table.insert(p.block_table.end(), it.cache->blocks.begin(), it.cache->blocks.end());
    p.table_begin.push_back(static_cast<int64_t>(p.block_table.size()));
    if (it.logits)
      for (int64_t r = row0 + n - it.logit_rows; r < row0 + n; ++r) p.logit_rows.push_back(r);
  }
  return p;
}

namespace {

class cpu_backend final : public compute_backend {
 public:
  explicit cpu_backend(std::shared_ptr<const model_weights> w) : w_(std::move(w)) {}
  std::string_view name() const override { return "cpu"; }
  const model_weights& weights() const override { return *w_; }
  int64_t threads() const override { return kernels::num_threads(); }
  std::shared_ptr<kv_pages> create_kv(const kv_format& f, int32_t num_blocks) override {
    return std::make_shared<kv_pages>(f, num_blocks);
  }
  forward_output forward(std::span<forward_item> items, const forward_options& o) override {
    return model::forward(*w_, items, o);
  }
  std::vector<std::vector<mtp_draft>> mtp_step(std::span<const mtp_step_item> items, int64_t depth, int64_t window,
                                               const draft_chooser& choose, const forward_options& o) override {
    return mtp_chain_step(*w_, items, depth, window, choose, o);
  }
  full_result forward_full(std::span<const int32_t> tokens, const forward_options& o, kv_dtype kv) override {
    return model::forward_full(*w_, tokens, o, {}, kv);
  }
  std::vector<float> encode_image(std::span<const uint8_t> rgb, int64_t width, int64_t height,
                                  bool batch_invariant) override {
    return model::encode_image(*w_, rgb, width, height, batch_invariant);
  }
  void run_experts(int64_t moe_slot, std::span<const expert_job> jobs, bool batch_invariant) override {
    std::vector<size_t> rows(jobs.size());
    for (size_t j = 0; j < jobs.size(); ++j) rows[j] = static_cast<size_t>(jobs[j].rows);
    const int64_t parts = kernels::num_threads();
    const std::vector<std::vector<int64_t>> assigned = assign_experts(rows, parts);
    kernels::parallel_for(parts, [&](int64_t p0, int64_t p1) {
      for (int64_t part = p0; part < p1; ++part)
        for (int64_t j : assigned[static_cast<size_t>(part)]) {
          const expert_job& job = jobs[static_cast<size_t>(j)];
          routed_expert(*w_, moe_slot, job.expert, job.x, job.rows, batch_invariant, job.y);
        }
    });
  }
  // The weights are shared by the engines of a process: installing and dropping write them in
  // place, between steps (the caller's contract).
  void load_expert(int64_t moe_slot, int64_t expert, expert_weights w) override {
    routed_expert_weights(const_cast<model_weights&>(*w_), moe_slot, expert) = std::move(w);
  }
  void drop_expert(int64_t moe_slot, int64_t expert) override {
    expert_reader::drop(const_cast<model_weights&>(*w_), moe_slot, expert);
  }

 private:
  std::shared_ptr<const model_weights> w_;
};

struct registry {
  std::mutex mu;
  std::map<std::string, backend_factory> factories;
  registry() {
    factories["cpu"] = [](std::shared_ptr<const model_weights> w) -> result<std::shared_ptr<compute_backend>> {
      return std::make_shared<cpu_backend>(std::move(w));
    };
  }
};

registry& backends() {
  static registry r;
  return r;
}

}  // namespace

bool register_backend(const std::string& name, backend_factory make) {
  std::lock_guard lock(backends().mu);
  return backends().factories.emplace(name, std::move(make)).second;
}

std::vector<std::string> backend_names() {
  std::lock_guard lock(backends().mu);
  std::vector<std::string> out;
  for (const auto& [name, f] : backends().factories) out.push_back(name);
  return out;
}

result<std::shared_ptr<compute_backend>> make_backend(const std::string& name, std::shared_ptr<const model_weights> w) {
  backend_factory make;
  {
    std::lock_guard lock(backends().mu);
    auto it = backends().factories.find(name);
    if (it == backends().factories.end()) {
      std::string known;
      for (const auto& [n, f] : backends().factories) known += (known.empty() ? "" : ", ") + n;
      return fail(errc::unsupported, "no compute backend '" + name + "' in this build (" + known + ")");
    }
    make = it->second;
  }
  return make(std::move(w));
}

int64_t cpu_threads() { return kernels::num_threads(); }

}  // namespace shoal::model
