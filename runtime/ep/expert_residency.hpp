// The routed experts an expert-parallel process holds in memory. Its ranks share one
// model_weights loaded without routed experts (model::load_options); each rank holds the
// (MoE slot, expert) weights its group's placement gives it, and while a new placement is
// being adopted those of both: the missing ones are read from the checkpoint, and weights no
// rank of the process holds any more are dropped. A rank only computes experts it holds, and
// changes what it holds only between its steps, so no forward pass ever reads an expert
// being read or dropped.
//
// Migration (expert_migration.hpp): the missing experts of a placement being adopted are read
// from the processes that hold them when their holders described them (lend → fetch), from
// the checkpoint otherwise or when such a read fails. Lent weights stay in memory, even if
// dropped meanwhile, until their loan ends (the placement they were lent for took effect
// everywhere) or its lease passes: a peer's late read never reads freed memory.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <expected>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "model/weights.hpp"
#include "runtime/base/error.hpp"
#include "runtime/base/work_queue.hpp"
#include "runtime/ep/expert_migration.hpp"
#include "runtime/ep/expert_parallel.hpp"

namespace shoal::runtime {

class expert_residency {
 public:
  // `weights` loaded from `dir` with no routed experts (they are filled in here: the one part
  // of the shared weights that changes after loading), installed and dropped through
  // `backend` (the ranks' compute backend; null: the CPU one over `weights`). Errors name the file.
  static std::expected<std::shared_ptr<expert_residency>, std::string> open(
    const std::string& dir, std::shared_ptr<const model::model_weights> weights,
    std::shared_ptr<model::compute_backend> backend = nullptr);

  // experts[slot]: the experts of that MoE slot, ascending.
  using expert_set = std::vector<std::vector<int32_t>>;
  // The experts `holder` (one per rank) computes under `placement` for `rank`, with those of
  // `also` (the placement being adopted) when given.
  static expert_set experts_for(const ep_placement& placement, int32_t rank, const ep_placement* also = nullptr);

  // Every expert of `experts` is resident or waits in memory for hold(): fetched from a
  // holder, or read from the checkpoint. Starts, on the preparing thread, the checkpoint reads
  // still missing (experts no fetch brings, and those whose fetch failed). Never waits, and
  // holds the lock only to look: a step polls it.
  bool ready(const expert_set& experts);
  // Polls ready(experts) until true, without the lock, for at most `limit`: for a rank that
  // has no experts to compute with yet (a group's first placement). False when the limit
  // passed (the reads go on; not_ready names one still missing).
  bool wait_ready(const expert_set& experts,
                  std::chrono::milliseconds limit = std::chrono::milliseconds::max());
  // One expert of `experts` not in memory yet and where it is coming from ("" when all are).
  std::string not_ready(const expert_set& experts) const;
  // Holder `holder` now holds `experts`: installs what no holder has (as ready() left it:
  // nothing is read here), drops what no holder keeps. When a checkpoint read failed, or an
  // expert is not ready, nothing changes for `holder` and the error names the expert (and
  // the tensor that could not be read).
  std::expected<void, std::string> hold(const void* holder, const expert_set& experts);
  void release(const void* holder);
  // The group changed: its ranks here adopt their new placements one after another, and what
  // the first drops may be what the next takes over (its own experts, a redundant copy). Until
  // every current holder has held (or released) once more, nothing is dropped.
  void defer_drops();
  ~expert_residency();
  // (MoE slot, routed expert) weights in memory, and their bytes.
  int64_t resident_experts() const;
  int64_t resident_bytes() const;
  // The (slot, expert) weights in memory, per slot ascending.
  expert_set resident_set() const;

  // -- migration --
  // Registers the weights of `experts` (slot, expert; each resident here) with `bulk` and
  // describes them for placement `epoch`. An error (nothing lent) names an expert that does
  // not exist (errc::invalid_argument), one not held here (errc::not_found) or the
  // registration that failed (errc::unavailable). The lock that hold() and the stats take is held
  // only to pin the experts (the loan keeps them alive if dropped meanwhile), not while
  // their bytes are registered.
  result<std::vector<expert_part>> lend(uint64_t epoch,
                                                            const std::vector<std::pair<int32_t, int32_t>>& experts,
                                                            transport& bulk, std::chrono::milliseconds lease);
  // Placement `epoch` took effect in the whole group: its loans (and older ones) end.
  void end_loans(uint64_t epoch);
  // Starts reading the experts `parts` describe that are neither resident nor being read,
  // each within `timeout`. An expert whose parts do not describe this model's weights
  // exactly is not read (ready() then has it read from the checkpoint): the error says why. Only
  // the descriptions are checked on the caller's thread (an engine's, between steps): the
  // buffers the reads land in are allocated, and the reads posted, on this object's one
  // preparing thread, since the first touch of that much fresh memory costs as much as
  // reading it. When that thread has 64 batches queued already, the batch is not read (an
  // error, errc::no_room; ready() has those experts read from the checkpoint). A description
  // that names what this model lacks or does not fit it: errc::invalid_argument.
  result<void> fetch(uint64_t epoch, const std::vector<expert_part>& parts,
                                         std::shared_ptr<transport> bulk, std::chrono::milliseconds timeout);
  // The plan the reads were for was dropped: their weights are discarded.
  void drop_fetches();
  struct migration_stats {
    int64_t kept_experts = 0, kept_bytes = 0;              // a rank adopted them from memory (another rank here held them)
    int64_t fetched_experts = 0, fetched_bytes = 0;        // read from a holder and installed
    int64_t checkpoint_experts = 0, checkpoint_bytes = 0;  // read from the checkpoint
    int64_t fetch_failures = 0;                            // reads from a holder that failed (then the checkpoint)
    int64_t lent_experts = 0, lent_bytes = 0;              // described for peers
    std::string last_failure;
  };
  migration_stats migration() const;

 private:
  struct fetch_entry;
  struct staged_read;
  struct loan;
  expert_residency(model::expert_reader reader, std::shared_ptr<const model::model_weights> weights,
                   std::shared_ptr<model::compute_backend> backend);
  void drop(int64_t slot, int64_t expert);  // mu_ held
  void drop_unheld();                       // mu_ held
  void expire_loans();                      // mu_ held
  // mu_ held: a done fetch of (slot, expert) brought valid weights; false (and the reason
  // kept) when a read failed or what arrived is not valid weights.
  bool check_fetch(int64_t slot, int64_t expert, const fetch_entry& f);
  int64_t install(int64_t slot, int64_t expert, model::expert_weights&& w);  // mu_ held; its bytes
  // mu_ held: (slot, expert) is resident or its weights wait to be installed; starts its
  // checkpoint read when nothing brings it.
  bool ready_one(int64_t slot, int64_t expert);

  model::expert_reader reader_;
  std::shared_ptr<const model::model_weights> weights_;
  model::model_weights& mutable_weights_;  // the routed experts only, read for loans
  std::shared_ptr<model::compute_backend> backend_;  // installs and drops them
  int64_t slots_, experts_;
  mutable std::mutex mu_;
  std::map<const void*, expert_set> held_;
  std::set<const void*> deferring_;  // holders to hold once more before anything is dropped
  std::vector<bool> resident_;  // [slot·experts + expert]
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<fetch_entry>> fetches_;
  std::vector<std::unique_ptr<fetch_entry>> draining_;  // discarded, reads still landing
  // Checkpoint reads on the preparing thread (shared: the job holds its own).
  std::map<std::pair<int64_t, int64_t>, std::shared_ptr<staged_read>> staged_;
  std::vector<std::shared_ptr<loan>> loans_;  // shared: lend registers outside mu_
  std::optional<uint64_t> ended_epoch_;       // the latest end_loans
  migration_stats stats_;
  // Prepares fetch batches (allocates their buffers, posts their reads) and reads experts from
  // the checkpoint; last, so it stops (finishing what is queued) before the entries it writes go.
  work_queue<std::function<void()>> preparing_;
};

}  // namespace shoal::runtime
