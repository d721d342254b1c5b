// Expert parallelism (EP) below the actor layer: the routed experts of every MoE layer are
// partitioned among the ranks of an EP group; at each MoE slot the ranks exchange token
// activations (dispatch) and expert outputs (combine) through an expert_transport, and each
// rank sums its rows exactly as the local path does, so outputs are bit-identical to the
// single-process engine in batch-invariant mode. The actor layer implements the transport
// over CAF; local_ep_hub implements it over threads for tests.
#pragma once

#include <chrono>
#include <cstdint>
#include <expected>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/backend.hpp"
#include "model/forward.hpp"
#include "runtime/base/error.hpp"
#include "runtime/placement/expert_placement.hpp"
#include "runtime/placement/regroup.hpp"

namespace shoal::runtime {

// Place of one rank in its EP group. Which experts it computes is the group's ep_placement
// (expert_placement.hpp): contiguous blocks when the group forms (expert e of E on rank r with
// e in [r·E/size, (r+1)·E/size)), then whatever the expert-parallel balancer places. With
// partitioned weights (expert_residency.hpp) its process holds only the experts it computes,
// and the ones it gains are read between steps.
struct ep_layout {
  int32_t rank = 0;
  int32_t size = 1;
};


using ep_payloads = std::vector<std::vector<uint8_t>>;  // one byte string per rank

// One blocking collective of the EP group, called by every rank with the same (step, slot,
// phase) in the same order. outgoing[r] goes to rank r (the own entry is delivered locally);
// returns incoming[r] = what rank r sent to this rank. An error (peer lost, timeout, group
// changed) is a value; after one, the caller abandons the step.
class expert_transport {
 public:
  virtual ~expert_transport() = default;
  virtual std::expected<ep_payloads, std::string> exchange(uint64_t step, int32_t slot,
                                                           int32_t phase,  // 0 dispatch, 1 combine
                                                           ep_payloads outgoing) = 0;
};

// Thrown out of model::forward by ep_moe_exchange when the transport fails or a peer's frame
// is bad; the engine catches it (the one exception that crosses model code).
class ep_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Frames (msgpack; tensors as `bin` of little-endian IEEE float32 / int32, never as arrays).
// Every frame is one msgpack array; header fields are unsigned integers:
//   dispatch (phase 0), sender s → owner r:
//     ["shoal-ep", 3 (version), 0 (phase), step, slot, s, d, epoch, ready, n_rows, n_pairs,
//      xn: bin (n_rows, d) float32         — each row once, even when it goes to several experts
//      pair_row: bin (n_pairs) int32       — index into xn's rows
//      pair_expert: bin (n_pairs) int32    — an expert r computes; pairs in the sender's row order
//      drafts]                             — 1: the sender drafts in this step (first exchange)
//     epoch: the placement the sender routed by (must be the receiver's); ready: the highest
//     placement epoch the sender holds the experts of (epoch or epoch + 1).
//   combine (phase 1), owner r → sender s:
//     ["shoal-ep", 3, 1, step, slot, r, d, n_pairs,
//      out: bin (n_pairs, d) float32]      — unweighted SwiGLU output of pair i of s's dispatch
// The gate weights never travel: the sender scales and sums the combined outputs per row in
// ascending expert id, as the local path does. A receiver checks every field (magic, version,
// phase, step, slot, source rank, hidden size, counts against bounds, bin sizes, row indices,
// expert ids it computes, epochs, no trailing bytes) and names the first bad one.
//
// Placement switches (the balancer's live reassignment) happen at a step boundary, agreed in
// band: a rank offered the next placement (offer) holds its experts (the engine reads them),
// then advertises it as ready in its dispatch frames. When every rank's slot-0 frame of step
// t says ready, every rank switches after step t, so step t + 1 routes by the new placement
// everywhere and no step sees a half-moved layer. A new group (reconfigure) drops an offered
// placement: the plan is aborted and the group starts again from contiguous blocks.
struct ep_frame_limits {
  int64_t max_rows = 1 << 20;  // rows one sender may dispatch to one owner in one slot
};

// The routed-expert hook of one rank. Use per step: begin_step(), forward (and mtp_last) with
// forward_options::moe = this, end_step(). Slots a forward pass skips (earlier slots when it
// jumps ahead, the rest at end_step) are joined with empty frames, so a rank with fewer MoE
// slots in a step — nothing scheduled, no flash decoder rows — stays in lockstep.
class ep_moe_exchange final : public model::moe_exchange {
 public:
  // Computes with `weights` (the same the forward pass uses) on `backend` and
  // `batch_invariant` as the forward options (slots joined at end_step compute peers' rows too).
  ep_moe_exchange(std::shared_ptr<const model::model_weights> weights, std::shared_ptr<model::compute_backend> backend,
                  ep_layout layout,
                  std::shared_ptr<expert_transport> transport, bool batch_invariant,
                  ep_frame_limits limits = {});

  // Between steps only: a new group (survivors after a loss, or a rank back); the step
  // counter restarts at 0. moved[o]: this rank's new rank for rank o of its previous group
  // (−1: gone); empty when this rank brings no placement (it is new). The group's placement is
  // agreed before its first step (agree_group, runtime/placement/regroup.hpp): survivors keep
  // their experts, a lost rank's only copies go to holders, a joining rank takes a share.
  void reconfigure(ep_layout layout, std::shared_ptr<expert_transport> transport, std::vector<int32_t> moved = {});
  // Whether the group must agree its placement before its next step.
  bool needs_agreement() const { return view_.has_value(); }
  // Every rank of a new group, before its first step: exchanges its view (what it ran, and
  // `holds`: per slot, the experts its process holds in memory) with every peer and adopts
  // regroup_placement over all of them — the same on every rank. An error (a peer lost, a bad
  // view) leaves the group unagreed: the next step tries again.
  result<regroup_result> agree_group(std::vector<std::vector<int32_t>> holds);
  // Speculative decoding under expert parallelism: each lockstep step also runs `depth` MTP
  // passes (the drafts of the next step), each through its MTP module's MoE slot (module
  // min(k, modules − 1) at depth k, as model::mtp_chain_step). Every rank of a group must set
  // the same depth (node_info::ep_spec_depth); 0 (the default): pass 0 only.
  // Between steps only.
  void set_draft_depth(int64_t depth);
  // `drafts`: this rank runs the draft passes in this step (its dispatch frames of the first
  // exchange say so; the step runs them when any rank of the group does, else it ends after
  // pass 0).
  void begin_step(bool drafts = false);
  // Between steps: the group's next placement (epoch placement().epoch() + 1, this group's
  // size and the model's slots and experts); at most one offered at a time. The engine then
  // holds its experts and calls mark_ready. Refused (errc::refused) while another is being
  // adopted; errc::invalid_argument when it does not follow or fit.
  result<void> offer(std::shared_ptr<const ep_placement> next);
  void mark_ready();
  const std::shared_ptr<const ep_placement>& placement() const { return placement_; }
  const std::shared_ptr<const ep_placement>& offered() const { return offered_; }
  // Routed pairs this rank's rows sent per (slot, expert) over the recent steps.
  const expert_load_window& loads() const { return loads_; }
  void set_load_window(int64_t steps);
  // Pairs this rank computed for the group (all sources, all slots) since construction.
  int64_t pairs_computed() const { return pairs_computed_; }
  // Placement switches since construction.
  int64_t switches() const { return switches_; }
  // Schedule positions exchanged (dispatch + combine each) since construction.
  int64_t positions_run() const { return positions_run_; }
  // Joins every slot this step did not use (serving peers' rows routed to this rank's
  // experts). Errors are values here; after one the step is abandoned.
  std::expected<void, std::string> end_step();
  // After an ep_error escaped a forward pass: abandons the running step (no more exchanges).
  void abandon_step();
  bool in_step() const { return in_step_; }
  // Lockstep steps begun since the last (re)configuration; the running step is this − 1.
  uint64_t steps_started() const { return steps_started_; }
  const ep_layout& layout() const { return layout_; }
  int64_t slot_count() const { return slots_; }

  // model::moe_exchange: dispatch → own experts → combine → weighted sum. Throws ep_error.
  void routed_experts(const model::model_weights& w, int64_t moe_slot, const float* xn,
                      int64_t rows, const int32_t* ids, const float* weights,
                      bool batch_invariant, float* out) override;

 private:
  // Exchanges of position `pos` of the step's schedule.
  void run_slot(size_t pos, const float* xn, int64_t rows, const int32_t* ids,
                const float* weights, float* out);
  ep_payloads exchange(size_t pos, int32_t phase, ep_payloads outgoing);
  [[noreturn]] void fail(const std::string& what);

  std::shared_ptr<const model::model_weights> weights_;
  std::shared_ptr<model::compute_backend> backend_;
  bool invariant_;
  int64_t slots_, experts_, top_k_, hidden_;
  void finish_step();  // a switch agreed in this step takes effect

  ep_layout layout_;
  std::shared_ptr<expert_transport> transport_;
  ep_frame_limits limits_;
  std::shared_ptr<const ep_placement> placement_, offered_;
  std::optional<group_view> view_;  // this rank's view of a group not yet agreed
  bool ready_ = false;         // offered_'s experts are held
  bool switch_agreed_ = false; // every rank advertised offered_ ready in this step
  expert_load_window loads_;
  int64_t pairs_computed_ = 0, switches_ = 0, positions_run_ = 0;
  uint64_t steps_started_ = 0;
  bool in_step_ = false;
  // A step's MoE exchanges in order: every slot (pass 0), then each draft depth's MTP slot
  // (pass k + 1). The transport's key is (step, slot, 2·pass + phase), increasing
  // along the schedule.
  struct scheduled {
    int64_t slot;
    int32_t pass;
  };
  std::vector<scheduled> schedule_;
  size_t pass0_ = 0;           // positions of pass 0 (draft passes follow)
  bool drafts_ = false;        // this rank drafts in the running step
  size_t end_ = 0;             // the running step's positions (pass 0 only when no rank drafts)
  size_t next_ = 0;            // positions below it were joined in the running step
};

// Frame codec, exposed for tests and for the actor layer's diagnostics.
struct dispatch_frame {
  uint64_t step = 0, epoch = 0, ready = 0;
  int32_t slot = 0, source = 0;
  int64_t hidden = 0, rows = 0;
  std::vector<float> xn;            // (rows, hidden)
  std::vector<int32_t> pair_row;    // (pairs)
  std::vector<int32_t> pair_expert; // (pairs)
  uint64_t drafts = 0;              // 1: the sender runs this step's draft passes (first exchange only)
};
std::vector<uint8_t> encode_dispatch(const dispatch_frame& f);
// Checks a dispatch frame arriving at `rank` from `source` for (step, slot): routed by
// `placement` (its epoch), experts `rank` computes in `slot` there; at most top_k pairs per row.
std::expected<dispatch_frame, std::string> decode_dispatch(
    const std::vector<uint8_t>& bytes, uint64_t step, int32_t slot, int32_t source,
    const ep_placement& placement, int32_t rank, int64_t hidden, int64_t top_k,
    const ep_frame_limits& limits = {});
// Group frames (phase 2, once per group before its first step, exchanged as slot −1):
//   ["shoal-ep", 3, 2, step, source, slots, ranks, logical, has_basis, epoch,
//    known: bin (ranks) uint8, counts: bin (slots·ranks) int32, experts: bin int32,
//    hold_counts: bin (slots) int32, holds: bin int32]
std::vector<uint8_t> encode_group(const group_view& v, uint64_t step, int32_t source, int64_t slots, int32_t ranks,
                                  int64_t logical);
std::expected<group_view, std::string> decode_group(const std::vector<uint8_t>& bytes, uint64_t step, int32_t source,
                                                    int64_t slots, int32_t ranks, int64_t logical);
std::vector<uint8_t> encode_combine(uint64_t step, int32_t slot, int32_t source, int64_t hidden,
                                    const float* out, int64_t pairs);  // out (pairs, hidden)
// Checks a combine frame from `source`: exactly `pairs` rows of `hidden` floats.
std::expected<std::vector<float>, std::string> decode_combine(
    const std::vector<uint8_t>& bytes, uint64_t step, int32_t slot, int32_t source,
    int64_t hidden, int64_t pairs);

// In-process transport for tests: N transports backed by mailboxes keyed by (step, slot,
// phase, source) under one mutex. exchange() posts, then waits up to `timeout` for every
// peer's entry. fail(r) marks rank r lost: its own and its peers' exchanges return an error
// at once (within the timeout at worst) instead of hanging.
class local_ep_hub {
 public:
  local_ep_hub(int32_t size, std::chrono::milliseconds timeout);
  ~local_ep_hub();
  std::shared_ptr<expert_transport> transport(int32_t rank);
  void fail(int32_t rank);
  int32_t size() const;

  struct state;  // mailboxes, shared with the transports

 private:
  std::shared_ptr<state> state_;
  std::vector<std::shared_ptr<expert_transport>> transports_;
};

}  // namespace shoal::runtime
