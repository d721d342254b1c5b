// Expert parallelism: expert ownership, the msgpack frame codec (every incoming field
// checked), the per-slot dispatch → own experts → combine → weighted sum of ep_moe_exchange,
// and the in-process mailbox hub tests use as the transport.
#include "runtime/ep/expert_parallel.hpp"

#include <algorithm>
#include <bit>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>

#include "kernels/assert.hpp"
#include "runtime/base/msgpack_frame.hpp"

namespace shoal::runtime {

static_assert(std::endian::native == std::endian::little, "frames carry little-endian tensors");

// ---- frames ----

namespace {

constexpr const char* frame_magic = "shoal-ep";
constexpr uint64_t frame_version = 3;
constexpr uint32_t dispatch_fields = 15, combine_fields = 9;

void pack_header(frame_packer& pk, uint32_t fields, uint64_t phase, uint64_t step, int32_t slot, int32_t source,
                 int64_t hidden) {
  pk.pack_array(fields);
  pk.pack(std::string_view(frame_magic));
  pk.pack(frame_version);
  pk.pack(phase);
  pk.pack(step);
  pk.pack(static_cast<uint64_t>(slot));
  pk.pack(static_cast<uint64_t>(source));
  pk.pack(static_cast<uint64_t>(hidden));
}

template <class T>
void pack_tensor(frame_packer& pk, const T* data, size_t count) {
  SHOAL_ASSERT(count * sizeof(T) <= UINT32_MAX);
  pack_bin_of(pk, data, count);
}

// Checks the magic and the common header fields 1…6.
bool read_header(frame_fields& r, uint64_t phase, uint64_t step, int32_t slot, int32_t source, int64_t hidden) {
  uint64_t v;
  auto magic = r.str(0, "magic");
  if (magic && *magic != frame_magic) r.fail("field 0 (magic) is not \"shoal-ep\"");
  return r.ok() && r.uint(1, "version", v, frame_version) && r.uint(2, "phase", v, phase) &&
         r.uint(3, "step", v, step) && r.uint(4, "slot", v, static_cast<uint64_t>(slot)) &&
         r.uint(5, "source rank", v, static_cast<uint64_t>(source)) &&
         r.uint(6, "hidden size", v, static_cast<uint64_t>(hidden));
}

}  // namespace

std::vector<uint8_t> encode_dispatch(const dispatch_frame& f) {
  SHOAL_ASSERT(static_cast<int64_t>(f.xn.size()) == f.rows * f.hidden && f.pair_row.size() == f.pair_expert.size());
  frame_sink sink;
  frame_packer pk(sink);
  pack_header(pk, dispatch_fields, 0, f.step, f.slot, f.source, f.hidden);
  pk.pack(f.epoch);
  pk.pack(f.ready);
  pk.pack(static_cast<uint64_t>(f.rows));
  pk.pack(static_cast<uint64_t>(f.pair_row.size()));
  pack_tensor(pk, f.xn.data(), f.xn.size());
  pack_tensor(pk, f.pair_row.data(), f.pair_row.size());
  pack_tensor(pk, f.pair_expert.data(), f.pair_expert.size());
  pk.pack(f.drafts);
  return std::move(sink.bytes);
}

std::expected<dispatch_frame, std::string> decode_dispatch(const std::vector<uint8_t>& bytes, uint64_t step,
                                                           int32_t slot, int32_t source, const ep_placement& placement,
                                                           int32_t rank, int64_t hidden, int64_t top_k,
                                                           const ep_frame_limits& limits) {
  frame_fields r(bytes, dispatch_fields, "dispatch");
  dispatch_frame f;
  uint64_t rows = 0, pairs = 0;
  if (!read_header(r, 0, step, slot, source, hidden) || !r.uint(7, "epoch", f.epoch, placement.epoch()) ||
      !r.uint(8, "ready", f.ready, {}, placement.epoch() + 1) ||
      !r.uint(9, "rows", rows, {}, static_cast<uint64_t>(limits.max_rows)) ||
      !r.uint(10, "pairs", pairs, {}, rows * static_cast<uint64_t>(top_k)) ||
      !r.bin_of(11, "xn", rows * static_cast<uint64_t>(hidden), f.xn) ||
      !r.bin_of(12, "pair_row", pairs, f.pair_row) || !r.bin_of(13, "pair_expert", pairs, f.pair_expert) ||
      !r.uint(14, "drafts", f.drafts, {}, 1))
    return std::unexpected(r.error());
  if (f.ready < f.epoch)
    return std::unexpected("dispatch frame field 8 (ready) is " + std::to_string(f.ready) + ", below its epoch " +
                           std::to_string(f.epoch));
  if (slot < 0 || slot >= placement.slots())
    return std::unexpected("dispatch frame slot " + std::to_string(slot) + " outside the placement's " +
                           std::to_string(placement.slots()) + " slots");
  std::vector<int32_t> per_row(rows, 0);
  for (uint64_t p = 0; p < pairs; ++p) {
    int32_t row = f.pair_row[p], e = f.pair_expert[p];
    if (row < 0 || static_cast<uint64_t>(row) >= rows)
      return std::unexpected("dispatch frame pair " + std::to_string(p) + ": row " + std::to_string(row) +
                             " outside [0, " + std::to_string(rows) + ")");
    if (e < 0 || e >= placement.logical() || !placement.holds(slot, rank, e))
      return std::unexpected("dispatch frame pair " + std::to_string(p) + ": expert " + std::to_string(e) +
                             " is not computed by rank " + std::to_string(rank) + " in slot " + std::to_string(slot) +
                             " (placement epoch " + std::to_string(placement.epoch()) + ")");
    if (++per_row[row] > top_k)
      return std::unexpected("dispatch frame row " + std::to_string(row) + " has more than top_k = " +
                             std::to_string(top_k) + " pairs");
  }
  f.step = step;
  f.slot = slot;
  f.source = source;
  f.hidden = hidden;
  f.rows = static_cast<int64_t>(rows);
  return f;
}

std::vector<uint8_t> encode_combine(uint64_t step, int32_t slot, int32_t source, int64_t hidden, const float* out,
                                    int64_t pairs) {
  frame_sink sink;
  frame_packer pk(sink);
  pack_header(pk, combine_fields, 1, step, slot, source, hidden);
  pk.pack(static_cast<uint64_t>(pairs));
  pack_tensor(pk, out, static_cast<size_t>(pairs * hidden));
  return std::move(sink.bytes);
}

std::expected<std::vector<float>, std::string> decode_combine(const std::vector<uint8_t>& bytes, uint64_t step,
                                                              int32_t slot, int32_t source, int64_t hidden,
                                                              int64_t pairs) {
  frame_fields r(bytes, combine_fields, "combine");
  uint64_t n = 0;
  std::vector<float> out;
  if (!read_header(r, 1, step, slot, source, hidden) ||
      !r.uint(7, "pairs", n, static_cast<uint64_t>(pairs)) ||
      !r.bin_of(8, "out", n * static_cast<uint64_t>(hidden), out))
    return std::unexpected(r.error());
  return out;
}

// ---- group frames ----

namespace {

constexpr uint32_t group_fields = 15;

// Lists as counts + concatenated experts.
void pack_lists(frame_packer& pk, const std::vector<std::vector<int32_t>>& lists) {
  std::vector<int32_t> counts, all;
  for (const auto& l : lists) {
    counts.push_back(static_cast<int32_t>(l.size()));
    all.insert(all.end(), l.begin(), l.end());
  }
  pack_tensor(pk, counts.data(), counts.size());
  pack_tensor(pk, all.data(), all.size());
}

// Fields i (counts, `n` lists) and i + 1 (experts) back into lists; their values are checked by
// regroup_placement.
bool read_lists(frame_fields& r, uint32_t i, const char* counts_name, const char* experts_name, uint64_t n,
                uint64_t max_total, std::vector<std::vector<int32_t>>& out) {
  std::vector<int32_t> counts, all;
  if (!r.bin_of(i, counts_name, n, counts)) return false;
  uint64_t total = 0;
  for (int32_t c : counts) {
    if (c < 0) r.fail("field " + std::to_string(i) + " (" + counts_name + ") has a negative count");
    total += static_cast<uint64_t>(std::max(c, 0));
  }
  if (r.ok() && total > max_total)
    r.fail("field " + std::to_string(i) + " (" + counts_name + ") counts " + std::to_string(total) +
           " experts, more than " + std::to_string(max_total));
  if (!r.ok() || !r.bin_of(i + 1, experts_name, total, all)) return false;
  out.assign(n, {});
  size_t at = 0;
  for (uint64_t k = 0; k < n; ++k) {
    out[k].assign(all.begin() + static_cast<ptrdiff_t>(at), all.begin() + static_cast<ptrdiff_t>(at + counts[k]));
    at += static_cast<size_t>(counts[k]);
  }
  return true;
}

}  // namespace

std::vector<uint8_t> encode_group(const group_view& v, uint64_t step, int32_t source, int64_t slots, int32_t ranks,
                                  int64_t logical) {
  frame_sink sink;
  frame_packer pk(sink);
  pk.pack_array(group_fields);
  pk.pack(std::string_view(frame_magic));
  pk.pack(frame_version);
  pk.pack(uint64_t{2});
  pk.pack(step);
  pk.pack(static_cast<uint64_t>(source));
  pk.pack(static_cast<uint64_t>(slots));
  pk.pack(static_cast<uint64_t>(ranks));
  pk.pack(static_cast<uint64_t>(logical));
  pk.pack(uint64_t{v.has_basis ? 1u : 0u});
  pk.pack(v.epoch);
  std::vector<uint8_t> known = v.known;
  known.resize(static_cast<size_t>(ranks), 0);
  std::vector<std::vector<int32_t>> lists = v.lists, holds = v.holds;
  lists.resize(static_cast<size_t>(slots * ranks));
  holds.resize(static_cast<size_t>(slots));
  pack_tensor(pk, known.data(), known.size());
  pack_lists(pk, lists);
  pack_lists(pk, holds);
  return std::move(sink.bytes);
}

std::expected<group_view, std::string> decode_group(const std::vector<uint8_t>& bytes, uint64_t step, int32_t source,
                                                    int64_t slots, int32_t ranks, int64_t logical) {
  frame_fields r(bytes, group_fields, "group");
  group_view v;
  uint64_t x = 0, basis = 0;
  auto magic = r.str(0, "magic");
  if (magic && *magic != frame_magic) r.fail("field 0 (magic) is not \"shoal-ep\"");
  const auto n_lists = static_cast<uint64_t>(slots * ranks), max_total = n_lists * static_cast<uint64_t>(logical);
  if (!r.ok() || !r.uint(1, "version", x, frame_version) || !r.uint(2, "phase", x, 2) || !r.uint(3, "step", x, step) ||
      !r.uint(4, "source rank", x, static_cast<uint64_t>(source)) || !r.uint(5, "slots", x, static_cast<uint64_t>(slots)) ||
      !r.uint(6, "ranks", x, static_cast<uint64_t>(ranks)) || !r.uint(7, "logical", x, static_cast<uint64_t>(logical)) ||
      !r.uint(8, "has_basis", basis, {}, 1) || !r.uint(9, "epoch", v.epoch, {}) ||
      !r.bin_of(10, "known", static_cast<uint64_t>(ranks), v.known) ||
      !read_lists(r, 11, "counts", "experts", n_lists, max_total, v.lists) ||
      !read_lists(r, 13, "hold_counts", "holds", static_cast<uint64_t>(slots), static_cast<uint64_t>(slots * logical),
                  v.holds))
    return std::unexpected(r.error());
  v.has_basis = basis == 1;
  for (uint8_t k : v.known)
    if (k > 1) return std::unexpected("group frame field 10 (known) holds a value other than 0 and 1");
  if (!v.has_basis) {  // a view without a basis places nothing
    bool places = v.epoch != 0 || std::any_of(v.known.begin(), v.known.end(), [](uint8_t k) { return k != 0; }) ||
                  std::any_of(v.lists.begin(), v.lists.end(), [](const auto& l) { return !l.empty(); });
    if (places) return std::unexpected("group frame has no basis (field 8) but places experts or names an epoch");
    v.known.clear(), v.lists.clear();
  }
  return v;
}

// ---- ep_moe_exchange ----

ep_moe_exchange::ep_moe_exchange(std::shared_ptr<const model::model_weights> weights,
                                 std::shared_ptr<model::compute_backend> backend, ep_layout layout,
                                 std::shared_ptr<expert_transport> transport, bool batch_invariant,
                                 ep_frame_limits limits)
    : weights_(std::move(weights)),
      backend_(std::move(backend)),
      invariant_(batch_invariant),
      slots_(model::moe_slot_count(weights_->config)),
      experts_(weights_->config.n_routed_experts),
      top_k_(weights_->config.num_experts_per_tok),
      hidden_(weights_->config.hidden_size),
      limits_(limits),
      loads_(slots_, std::max<int64_t>(experts_, 1), eplb_policy::decode().window_steps) {
  reconfigure(layout, std::move(transport));
  set_draft_depth(0);
}

void ep_moe_exchange::set_draft_depth(int64_t depth) {
  SHOAL_ASSERT(!in_step_ && depth >= 0);
  const model::model_config& c = weights_->config;
  schedule_.clear();
  // Pass 0: every slot, the MTP modules' too (a forward pass may run them after the main
  // layers: forward_full's MTP output).
  for (int64_t s = 0; s < slots_; ++s) schedule_.push_back({s, 0});
  pass0_ = schedule_.size();
  const int64_t modules = c.num_nextn_predict_layers;
  SHOAL_ASSERT(depth == 0 || modules > 0);
  for (int64_t k = 0; k < depth; ++k)
    if (int64_t s = model::moe_slot_of_layer(c, c.num_hidden_layers + std::min(k, modules - 1)); s >= 0)
      schedule_.push_back({s, static_cast<int32_t>(k + 1)});
}

void ep_moe_exchange::reconfigure(ep_layout layout, std::shared_ptr<expert_transport> transport,
                                  std::vector<int32_t> moved) {
  SHOAL_ASSERT(!in_step_);
  SHOAL_ASSERT(layout.size >= 1 && layout.rank >= 0 && layout.rank < layout.size && transport);
  // What this rank brings: the placement it ran (or, when its previous group changed again
  // before agreeing, the view it brought there), renumbered for the new group.
  if (moved.empty()) view_ = fresh_view(slots_);
  else if (view_) view_ = renumber(*view_, slots_, moved, layout.size);
  else if (placement_ && static_cast<size_t>(placement_->ranks()) == moved.size()) view_ = view_of(*placement_, moved, layout.size);
  else view_ = fresh_view(slots_);
  layout_ = layout;
  transport_ = std::move(transport);
  steps_started_ = 0;
  // Until the group agrees, contiguous blocks (what a group of fresh ranks agrees on); a plan
  // offered to the old group is aborted.
  placement_ = std::make_shared<const ep_placement>(
    ep_placement::contiguous(slots_, std::max<int64_t>(experts_, 1), layout.size));
  offered_.reset();
  ready_ = switch_agreed_ = false;
}

result<regroup_result> ep_moe_exchange::agree_group(std::vector<std::vector<int32_t>> holds) {
  SHOAL_ASSERT(!in_step_ && view_);
  const int32_t R = layout_.size, me = layout_.rank;
  const int64_t logical = std::max<int64_t>(experts_, 1);
  group_view mine = *view_;
  mine.holds = std::move(holds);
  mine.holds.resize(static_cast<size_t>(slots_));
  std::vector<group_view> views(static_cast<size_t>(R));
  if (R > 1) {
    ep_payloads outgoing(static_cast<size_t>(R), encode_group(mine, steps_started_, me, slots_, R, logical));
    auto incoming = transport_->exchange(steps_started_, -1, 2, std::move(outgoing));
    if (!incoming) return runtime::fail(errc::unavailable, "EP rank " + std::to_string(me) + "/" + std::to_string(R) +
                                                             ": agreeing the group's placement: " + incoming.error());
    for (int32_t src = 0; src < R; ++src) {
      if (src == me) continue;
      auto v = decode_group((*incoming)[src], steps_started_, src, slots_, R, logical);
      if (!v) return runtime::fail(errc::invalid_argument, "EP rank " + std::to_string(me) + ": from rank " +
                                                              std::to_string(src) + ": " + v.error());
      views[src] = std::move(*v);
    }
  }
  views[me] = std::move(mine);
  auto placed = regroup_placement(slots_, logical, R, views);
  if (!placed) return runtime::fail(errc::invalid_argument, "EP rank " + std::to_string(me) + ": " + placed.error());
  placement_ = std::make_shared<const ep_placement>(placed->placement);
  view_.reset();
  return std::move(*placed);
}

void ep_moe_exchange::set_load_window(int64_t steps) {
  SHOAL_ASSERT(steps >= 1);
  loads_ = expert_load_window(slots_, std::max<int64_t>(experts_, 1), steps);
}

result<void> ep_moe_exchange::offer(std::shared_ptr<const ep_placement> next) {
  SHOAL_ASSERT(!in_step_ && next);
  if (offered_)
    return runtime::fail(errc::refused, "placement epoch " + std::to_string(offered_->epoch()) + " is still being adopted");
  if (next->epoch() != placement_->epoch() + 1)
    return runtime::fail(errc::invalid_argument, "placement epoch " + std::to_string(next->epoch()) +
                                          " does not follow the current epoch " + std::to_string(placement_->epoch()));
  if (next->ranks() != layout_.size || next->slots() != slots_ || next->logical() != placement_->logical())
    return runtime::fail(errc::invalid_argument, "placement is for " + std::to_string(next->ranks()) + " ranks, " +
                           std::to_string(next->slots()) + " slots, " + std::to_string(next->logical()) +
                           " experts; the group has " + std::to_string(layout_.size) + " ranks, " +
                           std::to_string(slots_) + " slots, " + std::to_string(placement_->logical()) + " experts");
  offered_ = std::move(next);
  ready_ = false;
  return {};
}

void ep_moe_exchange::mark_ready() {
  SHOAL_ASSERT(!in_step_ && offered_);
  ready_ = true;
}

void ep_moe_exchange::begin_step(bool drafts) {
  SHOAL_ASSERT(!in_step_);
  SHOAL_ASSERT(!drafts || schedule_.size() > pass0_);
  view_.reset();  // (a rank stepping without agree_group keeps the contiguous blocks, as its peers do)
  in_step_ = true;
  drafts_ = drafts;
  end_ = schedule_.size();  // until the first position's frames say whether any rank drafts
  next_ = 0;
  switch_agreed_ = false;
  ++steps_started_;
}

std::expected<void, std::string> ep_moe_exchange::end_step() {
  SHOAL_ASSERT(in_step_);
  try {
    while (next_ < end_) run_slot(next_++, nullptr, 0, nullptr, nullptr, nullptr);
  } catch (const ep_error& e) {
    return std::unexpected(e.what());  // fail() already abandoned the step
  }
  in_step_ = false;
  finish_step();
  return {};
}

void ep_moe_exchange::abandon_step() {
  in_step_ = false;
  finish_step();
}

// A switch agreed at slot 0 holds whatever happened later in the step: every rank that saw
// the agreement switches, so the next step's frames carry the same epoch everywhere.
void ep_moe_exchange::finish_step() {
  loads_.end_step();
  if (!switch_agreed_) return;
  switch_agreed_ = false;
  placement_ = std::move(offered_);
  offered_.reset();
  ready_ = false;
  ++switches_;
}

void ep_moe_exchange::fail(const std::string& what) {
  abandon_step();
  throw ep_error("EP rank " + std::to_string(layout_.rank) + "/" + std::to_string(layout_.size) + " step " +
                 std::to_string(steps_started_ - 1) + ": " + what);
}

ep_payloads ep_moe_exchange::exchange(size_t pos, int32_t phase, ep_payloads outgoing) {
  const auto [slot, pass] = schedule_[pos];
  auto in = transport_->exchange(steps_started_ - 1, static_cast<int32_t>(slot), 2 * pass + phase, std::move(outgoing));
  if (!in) fail("slot " + std::to_string(slot) + (phase == 0 ? " dispatch: " : " combine: ") + in.error());
  if (in->size() != static_cast<size_t>(layout_.size))
    fail("transport returned " + std::to_string(in->size()) + " payloads for a group of " +
         std::to_string(layout_.size));
  return std::move(*in);
}

void ep_moe_exchange::routed_experts(const model::model_weights& w, int64_t moe_slot, const float* xn,
                                     int64_t rows, const int32_t* ids, const float* weights,
                                     bool batch_invariant, float* out) {
  SHOAL_ASSERT(&w == weights_.get() && batch_invariant == invariant_);
  SHOAL_ASSERT(in_step_);
  // The schedule's next position of this slot; positions skipped on the way (slots a forward
  // pass skips, a draft depth with no rows) are joined empty: peers may need this rank.
  size_t pos = next_;
  while (pos < end_ && schedule_[pos].slot != moe_slot) ++pos;
  SHOAL_ASSERT(pos < end_);  // a slot outside the step's schedule (drafting not announced at begin_step?)
  while (next_ < pos) run_slot(next_++, nullptr, 0, nullptr, nullptr, nullptr);
  run_slot(next_++, xn, rows, ids, weights, out);
}

namespace {

// Every (row, expert) pair this rank computes in one slot, grouped by expert.
struct owned_work {
  struct ref {
    int32_t source, pair;
  };
  std::vector<int32_t> experts;             // the experts this rank computes in the slot, ascending
  std::vector<std::vector<ref>> by_expert;  // same order
  int64_t index(int32_t e) const {
    return std::lower_bound(experts.begin(), experts.end(), e) - experts.begin();
  }
};

// Runs the owned experts over the dispatched rows through the backend; results[src] (pairs of
// src, d). The backend runs each expert whole on one worker, as the local path does.
void compute_owned(model::compute_backend& backend, int64_t slot, bool invariant, const owned_work& work,
                   const std::vector<dispatch_frame>& in, std::vector<std::vector<float>>& results) {
  const int64_t d = backend.weights().config.hidden_size, n_exp = static_cast<int64_t>(work.by_expert.size());
  std::vector<std::vector<float>> x(static_cast<size_t>(n_exp)), y(static_cast<size_t>(n_exp));
  std::vector<model::expert_job> jobs;
  for (int64_t e = 0; e < n_exp; ++e) {
    const auto& list = work.by_expert[e];
    const int64_t n = static_cast<int64_t>(list.size());
    x[e].resize(static_cast<size_t>(n * d));
    y[e].resize(static_cast<size_t>(n * d));
    for (int64_t i = 0; i < n; ++i) {
      const dispatch_frame& f = in[list[i].source];
      std::memcpy(x[e].data() + i * d, f.xn.data() + int64_t(f.pair_row[list[i].pair]) * d, sizeof(float) * d);
    }
    jobs.push_back({work.experts[e], x[e].data(), n, y[e].data()});
  }
  backend.run_experts(slot, jobs, invariant);
  for (int64_t e = 0; e < n_exp; ++e) {
    const auto& list = work.by_expert[e];
    for (size_t i = 0; i < list.size(); ++i)
      std::memcpy(results[list[i].source].data() + int64_t(list[i].pair) * d, y[e].data() + int64_t(i) * d,
                  sizeof(float) * d);
  }
}

// Dispatch: each row once per computing rank, with its pairs for that rank in row order;
// the n-th pair of an expert goes to the replica replica_for picks. owner_of / pair_of: the
// rank each (row, k) pair went to, and its index among that rank's pairs.
struct dispatch_plan {
  std::vector<dispatch_frame> send;
  std::vector<int32_t> owner_of, pair_of;
};

dispatch_plan plan_dispatch(const ep_placement& place, int64_t slot, int32_t R, int32_t me, const float* xn,
                            int64_t rows, const int32_t* ids, int64_t k, int64_t d) {
  dispatch_plan p{std::vector<dispatch_frame>(static_cast<size_t>(R)), std::vector<int32_t>(static_cast<size_t>(rows * k)),
                  std::vector<int32_t>(static_cast<size_t>(rows * k))};
  std::vector<int64_t> last_row(static_cast<size_t>(R), -1);
  std::vector<int64_t> nth(static_cast<size_t>(place.logical()), 0);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < k; ++j) {
      int32_t e = ids[i * k + j];
      int32_t r = place.replica_for(slot, e, me, nth[e]++);
      dispatch_frame& f = p.send[r];
      if (last_row[r] != i) {
        last_row[r] = i;
        f.xn.insert(f.xn.end(), xn + i * d, xn + (i + 1) * d);
        ++f.rows;
      }
      p.owner_of[i * k + j] = r;
      p.pair_of[i * k + j] = static_cast<int32_t>(f.pair_row.size());
      f.pair_row.push_back(static_cast<int32_t>(f.rows - 1));
      f.pair_expert.push_back(e);
    }
  return p;
}

}  // namespace

void ep_moe_exchange::run_slot(size_t pos, const float* xn, int64_t rows, const int32_t* ids,
                               const float* weights, float* out) {
  const int64_t slot = schedule_[pos].slot;
  const int32_t R = layout_.size, me = layout_.rank;
  ++positions_run_;
  const int64_t d = hidden_, k = top_k_;
  const uint64_t step = steps_started_ - 1;
  const int32_t s32 = static_cast<int32_t>(slot);
  const ep_placement& place = *placement_;
  const uint64_t ready = ready_ ? offered_->epoch() : place.epoch();
  if (rows > 0) loads_.count(slot, {ids, static_cast<size_t>(rows * k)});
  auto [send, owner_of, pair_of] = plan_dispatch(place, slot, R, me, xn, rows, ids, k, d);
  ep_payloads outgoing(static_cast<size_t>(R));
  for (int32_t r = 0; r < R; ++r) {
    send[r].step = step, send[r].slot = s32, send[r].source = me, send[r].hidden = d;
    send[r].epoch = place.epoch(), send[r].ready = ready;
    send[r].drafts = pos == 0 && drafts_ ? 1 : 0;
    outgoing[r] = encode_dispatch(send[r]);
    send[r].xn = {};  // only the pair counts are needed from here on
  }
  ep_payloads incoming = exchange(pos, 0, std::move(outgoing));

  // Own experts over every source's rows.
  std::vector<dispatch_frame> in(static_cast<size_t>(R));
  owned_work work;
  auto mine = place.experts_of(slot, me);
  work.experts.assign(mine.begin(), mine.end());
  work.by_expert.resize(work.experts.size());
  uint64_t agreed = ready;
  bool any_drafts = false;
  for (int32_t src = 0; src < R; ++src) {
    auto f = decode_dispatch(incoming[src], step, s32, src, place, me, d, k, limits_);
    if (!f) fail("slot " + std::to_string(slot) + ": from rank " + std::to_string(src) + ": " + f.error());
    in[src] = std::move(*f);
    agreed = std::min(agreed, in[src].ready);
    any_drafts = any_drafts || in[src].drafts != 0;
    for (size_t p = 0; p < in[src].pair_expert.size(); ++p)
      work.by_expert[work.index(in[src].pair_expert[p])].push_back({src, static_cast<int32_t>(p)});
    pairs_computed_ += static_cast<int64_t>(in[src].pair_expert.size());
  }
  // Every rank sees the same slot-0 frames, so every rank agrees on the switch alike.
  if (pos == 0 && agreed > place.epoch()) switch_agreed_ = true;
  // Likewise the draft passes: this step runs them only when some rank drafts in it.
  if (pos == 0 && !any_drafts) end_ = std::min(end_, pass0_);
  incoming = {};
  std::vector<std::vector<float>> results(static_cast<size_t>(R));
  for (int32_t src = 0; src < R; ++src) results[src].resize(in[src].pair_row.size() * static_cast<size_t>(d));
  compute_owned(*backend_, slot, invariant_, work, in, results);
  outgoing.assign(static_cast<size_t>(R), {});
  for (int32_t src = 0; src < R; ++src)
    outgoing[src] = encode_combine(step, s32, me, d, results[src].data(),
                                   static_cast<int64_t>(in[src].pair_row.size()));
  in = {};
  results = {};
  incoming = exchange(pos, 1, std::move(outgoing));

  // Combine: per row, contributions in ascending expert id, as the local path sums them.
  std::vector<std::vector<float>> back(static_cast<size_t>(R));
  for (int32_t r = 0; r < R; ++r) {
    auto b = decode_combine(incoming[r], step, s32, r, d, static_cast<int64_t>(send[r].pair_row.size()));
    if (!b) fail("slot " + std::to_string(slot) + ": from rank " + std::to_string(r) + ": " + b.error());
    back[r] = std::move(*b);
  }
  // The order of ffn.cpp's local sum, hence the same bits.
  model::sum_in_expert_order(rows, k, d, ids, weights, [&](int64_t i, int64_t j) {
    return back[owner_of[i * k + j]].data() + int64_t(pair_of[i * k + j]) * d;
  }, out);
}

// ---- local_ep_hub ----

struct local_ep_hub::state {
  using key = std::tuple<uint64_t, int32_t, int32_t, int32_t>;  // step, slot, phase, destination
  int32_t size;
  std::chrono::milliseconds timeout;
  std::mutex mu;
  std::condition_variable cv;
  std::map<key, std::vector<std::optional<std::vector<uint8_t>>>> boxes;  // [source]
  std::vector<bool> failed;
};

namespace {

class hub_transport final : public expert_transport {
 public:
  hub_transport(std::shared_ptr<local_ep_hub::state> s, int32_t rank) : s_(std::move(s)), rank_(rank) {}

  std::expected<ep_payloads, std::string> exchange(uint64_t step, int32_t slot, int32_t phase,
                                                   ep_payloads outgoing) override {
    auto& s = *s_;
    if (outgoing.size() != static_cast<size_t>(s.size))
      return std::unexpected("outgoing has " + std::to_string(outgoing.size()) + " payloads for " +
                             std::to_string(s.size) + " ranks");
    std::unique_lock lock(s.mu);
    auto lost = [&]() -> std::optional<std::string> {
      for (int32_t r = 0; r < s.size; ++r)
        if (s.failed[r]) return r == rank_ ? "this rank was failed" : "rank " + std::to_string(r) + " lost";
      return std::nullopt;
    };
    if (s.failed[rank_]) return std::unexpected("this rank was failed");
    // entries of abandoned earlier exchanges addressed to this rank are dead
    using key = local_ep_hub::state::key;
    for (auto it = s.boxes.begin(); it != s.boxes.end();) {
      auto [st, sl, ph, dest] = it->first;
      bool stale = dest == rank_ && std::tuple(st, sl, ph) < std::tuple(step, slot, phase);
      it = stale ? s.boxes.erase(it) : std::next(it);
    }
    ep_payloads incoming(static_cast<size_t>(s.size));
    for (int32_t r = 0; r < s.size; ++r) {
      if (r == rank_) {
        incoming[r] = std::move(outgoing[r]);
        continue;
      }
      auto& box = s.boxes[key{step, slot, phase, r}];
      box.resize(static_cast<size_t>(s.size));
      box[rank_] = std::move(outgoing[r]);
    }
    s.cv.notify_all();
    key mine{step, slot, phase, rank_};
    auto complete = [&] {
      auto it = s.boxes.find(mine);
      if (s.size == 1) return true;
      if (it == s.boxes.end()) return false;
      for (int32_t r = 0; r < s.size; ++r)
        if (r != rank_ && !it->second[r]) return false;
      return true;
    };
    s.cv.wait_for(lock, s.timeout, [&] { return complete() || lost(); });
    if (complete()) {
      if (s.size > 1) {
        auto it = s.boxes.find(mine);
        for (int32_t r = 0; r < s.size; ++r)
          if (r != rank_) incoming[r] = std::move(*it->second[r]);
        s.boxes.erase(it);
      }
      return incoming;
    }
    if (auto why = lost()) return std::unexpected(*why);
    std::string missing;
    auto it = s.boxes.find(mine);
    for (int32_t r = 0; r < s.size; ++r)
      if (r != rank_ && (it == s.boxes.end() || !it->second[r])) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    return std::unexpected("timed out after " + std::to_string(s.timeout.count()) + " ms waiting for rank(s) " +
                           missing);
  }

 private:
  std::shared_ptr<local_ep_hub::state> s_;
  int32_t rank_;
};

}  // namespace

local_ep_hub::local_ep_hub(int32_t size, std::chrono::milliseconds timeout) : state_(std::make_shared<state>()) {
  SHOAL_ASSERT(size >= 1);
  state_->size = size;
  state_->timeout = timeout;
  state_->failed.assign(static_cast<size_t>(size), false);
  for (int32_t r = 0; r < size; ++r) transports_.push_back(std::make_shared<hub_transport>(state_, r));
}

local_ep_hub::~local_ep_hub() = default;

std::shared_ptr<expert_transport> local_ep_hub::transport(int32_t rank) {
  SHOAL_ASSERT(rank >= 0 && rank < state_->size);
  return transports_[rank];
}

void local_ep_hub::fail(int32_t rank) {
  SHOAL_ASSERT(rank >= 0 && rank < state_->size);
  {
    std::lock_guard lock(state_->mu);
    state_->failed[rank] = true;
  }
  state_->cv.notify_all();
}

int32_t local_ep_hub::size() const { return state_->size; }

}  // namespace shoal::runtime
