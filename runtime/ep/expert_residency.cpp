#include "runtime/ep/expert_residency.hpp"

#include <algorithm>
#include <array>
#include <map>
#include <set>
#include <thread>

#include "kernels/assert.hpp"
#include "model/forward.hpp"

namespace shoal::runtime {

namespace {

using model::linear;

// The arrays a linear holds (model::linear's storages), as bytes.
struct array_ref {
  expert_field field;
  std::span<std::byte> bytes;
};

template <class T>
std::span<std::byte> as_bytes(std::vector<T>& v) {
  return std::as_writable_bytes(std::span(v));
}

std::vector<array_ref> arrays_of(linear& l) {
  std::vector<array_ref> out;
  if (!l.w.empty()) out.push_back({expert_field::f32, as_bytes(l.w)});
  if (!l.w_bf16.empty()) out.push_back({expert_field::bf16, as_bytes(l.w_bf16)});
  if (!l.w_fp8.codes.empty()) {
    out.push_back({expert_field::fp8_codes, as_bytes(l.w_fp8.codes)});
    out.push_back({expert_field::fp8_scales, as_bytes(l.w_fp8.scales)});
    out.push_back({expert_field::fp8_row_scales, as_bytes(l.w_fp8.row_scales)});
  }
  return out;
}

std::string name_of(int64_t slot, int64_t expert) {
  return "routed expert " + std::to_string(expert) + " of MoE slot " + std::to_string(slot);
}

const char* tensor_name(int32_t t) { return t == 0 ? "gate_up" : "down"; }

}  // namespace

// Reads of one expert's weights from a holder, into `w`'s arrays.
struct expert_residency::fetch_entry {
  std::array<std::vector<expert_part>, 2> parts;  // per tensor (gate_up, down), checked by fetch
  model::expert_weights w;
  // Set by the preparing thread once `w` is allocated and `reads` posted; neither is touched
  // by anyone else before.
  std::atomic<bool> posted{false};
  std::vector<std::shared_ptr<transfer>> reads;
  bool done() const {
    return posted.load(std::memory_order_acquire) &&
           std::all_of(reads.begin(), reads.end(), [](const auto& r) { return r->done(); });
  }
  void wait() const {
    while (!posted.load(std::memory_order_acquire)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    for (const auto& r : reads) r->wait();
  }
};

// Weights described to peers for one placement: kept alive until the loan ends.
struct expert_residency::loan {
  uint64_t epoch = 0;
  std::chrono::steady_clock::time_point until;
  std::set<std::pair<int64_t, int64_t>> experts;
  std::vector<std::shared_ptr<model::expert_weights>> kept;       // dropped while lent
  std::vector<std::unique_ptr<registered_memory>> registrations;  // destroyed first
  bool registering = true;  // lend is registering it outside the lock: it may not end yet
};

std::expected<std::shared_ptr<expert_residency>, std::string> expert_residency::open(
  const std::string& dir, std::shared_ptr<const model::model_weights> weights,
  std::shared_ptr<model::compute_backend> backend) {
  auto reader = model::expert_reader::open(dir);
  if (!reader) return std::unexpected(reader.error().message);
  if (!backend) {
    auto cpu = model::make_backend("cpu", weights);
    if (!cpu) return std::unexpected(cpu.error().message);
    backend = std::move(*cpu);
  }
  return std::shared_ptr<expert_residency>(new expert_residency(std::move(*reader), std::move(weights), std::move(backend)));
}

expert_residency::expert_residency(model::expert_reader reader, std::shared_ptr<const model::model_weights> weights,
                                   std::shared_ptr<model::compute_backend> backend)
    : reader_(std::move(reader)),
      weights_(std::move(weights)),
      // The process's ranks share these weights read-only but for the routed experts, which
      // only this object changes (see the header), through the backend.
      mutable_weights_(const_cast<model::model_weights&>(*weights_)),
      backend_(std::move(backend)),
      slots_(model::moe_slot_count(weights_->config)),
      experts_(weights_->config.n_routed_experts),
      resident_(static_cast<size_t>(slots_ * experts_), false),
      preparing_(1, 64, 1, [](std::span<std::function<void()>> jobs) {
        for (auto& job : jobs) job();
      }) {
  for (int64_t s = 0; s < slots_; ++s)  // whatever the load kept counts as resident
    for (int64_t e = 0; e < experts_; ++e)
      resident_[s * experts_ + e] = !model::routed_expert_weights(mutable_weights_, s, e).gate_up.empty();
}

expert_residency::expert_set expert_residency::experts_for(const ep_placement& placement, int32_t rank,
                                                           const ep_placement* also) {
  expert_set out(static_cast<size_t>(placement.slots()));
  for (int64_t s = 0; s < placement.slots(); ++s) {
    auto mine = placement.experts_of(s, rank);
    out[s].assign(mine.begin(), mine.end());
    if (also) {
      auto more = also->experts_of(s, rank);
      out[s].insert(out[s].end(), more.begin(), more.end());
      std::sort(out[s].begin(), out[s].end());
      out[s].erase(std::unique(out[s].begin(), out[s].end()), out[s].end());
    }
  }
  return out;
}

expert_residency::~expert_residency() {
  // Reads still landing in buffers of this object end first (each within its timeout); the
  // preparing thread posts what is queued meanwhile.
  for (auto& [k, f] : fetches_) f->wait();
  for (auto& f : draining_) f->wait();
}

// One expert read from the checkpoint on the preparing thread.
struct expert_residency::staged_read {
  std::atomic<bool> done{false};
  model::expert_weights w;  // written by the job before `done`
  std::string error;        // the same
};

bool expert_residency::ready_one(int64_t slot, int64_t expert) {
  SHOAL_ASSERT(slot >= 0 && slot < slots_ && expert >= 0 && expert < experts_);
  if (resident_[slot * experts_ + expert]) return true;
  const std::pair key{slot, expert};
  if (auto it = fetches_.find(key); it != fetches_.end()) {
    if (!it->second->done()) return false;
    if (check_fetch(slot, expert, *it->second)) return true;
    fetches_.erase(it);  // done: nothing lands in it any more; the checkpoint has it
  }
  if (auto it = staged_.find(key); it != staged_.end()) return it->second->done.load(std::memory_order_acquire);
  auto read = std::make_shared<staged_read>();
  auto job = [read, reader = reader_, config = weights_->config, slot, expert] {
    if (auto w = reader.read(config, slot, expert))
      read->w = std::move(*w);
    else
      read->error = "reading " + name_of(slot, expert) + ": " + w.error().message;
    read->done.store(true, std::memory_order_release);
  };
  if (preparing_.push(std::move(job))) staged_[key] = std::move(read);  // else: asked again at the next poll
  return false;
}

bool expert_residency::ready(const expert_set& experts) {
  std::lock_guard lock(mu_);
  SHOAL_ASSERT(static_cast<int64_t>(experts.size()) == slots_);
  bool all = true;
  for (int64_t s = 0; s < slots_; ++s)
    for (int32_t e : experts[s]) all = ready_one(s, e) && all;  // every missing read starts now
  return all;
}

bool expert_residency::wait_ready(const expert_set& experts, std::chrono::milliseconds limit) {
  const auto start = std::chrono::steady_clock::now();
  while (!ready(experts)) {
    if (std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start) >= limit)
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

std::string expert_residency::not_ready(const expert_set& experts) const {
  std::lock_guard lock(mu_);
  for (int64_t s = 0; s < std::min<int64_t>(slots_, static_cast<int64_t>(experts.size())); ++s)
    for (int32_t e : experts[s]) {
      if (e < 0 || e >= experts_ || resident_[s * experts_ + e]) continue;
      const std::pair key{s, e};
      if (auto it = fetches_.find(key); it != fetches_.end() && !it->second->done())
        return name_of(s, e) + " (being read from its holder)";
      if (auto it = staged_.find(key); it != staged_.end() && !it->second->done.load(std::memory_order_acquire))
        return name_of(s, e) + " (being read from the checkpoint)";
      if (!staged_.contains(key) && !fetches_.contains(key)) return name_of(s, e) + " (no read started)";
    }
  return "";
}

std::expected<void, std::string> expert_residency::hold(const void* holder, const expert_set& experts) {
  std::lock_guard lock(mu_);
  SHOAL_ASSERT(static_cast<int64_t>(experts.size()) == slots_);
  expire_loans();
  // First every check, then the installs: an error changes nothing.
  for (int64_t s = 0; s < slots_; ++s)
    for (int32_t e : experts[s]) {
      if (!ready_one(s, e)) return std::unexpected(name_of(s, e) + " is not in memory yet (hold before ready)");
      auto it = staged_.find({s, e});
      if (resident_[s * experts_ + e] || fetches_.contains({s, e}) || it == staged_.end()) continue;
      if (!it->second->error.empty()) {
        std::string why = std::move(it->second->error);
        staged_.erase(it);  // the next ready() reads it again
        return std::unexpected(why);
      }
    }
  // What the holder gains that is in memory already (another rank of this process holds it, as
  // its own or a redundant copy): nothing read.
  const auto before = held_.find(holder);
  for (int64_t s = 0; s < slots_; ++s)
    for (int32_t e : experts[s])
      if (resident_[s * experts_ + e] &&
          (before == held_.end() || std::ranges::find(before->second[s], e) == before->second[s].end())) {
        const auto& x = model::routed_expert_weights(mutable_weights_, s, e);
        ++stats_.kept_experts;
        stats_.kept_bytes += static_cast<int64_t>(x.gate_up.bytes() + x.down.bytes());
      }
  for (int64_t s = 0; s < slots_; ++s)
    for (int32_t e : experts[s]) {
      if (resident_[s * experts_ + e]) continue;
      if (auto it = fetches_.find({s, e}); it != fetches_.end()) {
        ++stats_.fetched_experts;
        stats_.fetched_bytes += install(s, e, std::move(it->second->w));
        fetches_.erase(it);
        staged_.erase({s, e});  // a checkpoint read of an earlier, failed fetch is not needed
      } else {
        auto st = staged_.extract({s, e});
        ++stats_.checkpoint_experts;
        stats_.checkpoint_bytes += install(s, e, std::move(st.mapped()->w));
      }
    }
  held_[holder] = experts;
  deferring_.erase(holder);
  if (deferring_.empty()) drop_unheld();
  return {};
}

// A done fetch brought valid weights; false (the reason kept) when a read failed or what
// arrived is not valid weights.
bool expert_residency::check_fetch(int64_t slot, int64_t expert, const fetch_entry& f) {
  std::string why;
  for (const auto& r : f.reads)
    if (!r->ok()) {
      why = r->error();
      break;
    }
  // FP8: every row's scale row must lie inside the scales that arrived.
  for (const linear* l : {&f.w.gate_up, &f.w.down}) {
    if (!why.empty() || l->w_fp8.codes.empty()) continue;
    const auto per_row = (l->in + l->w_fp8.block_in - 1) / l->w_fp8.block_in;
    for (int32_t at : l->w_fp8.row_scales)
      if (at < 0 || static_cast<size_t>(at) + static_cast<size_t>(per_row) > l->w_fp8.scales.size()) {
        why = "an FP8 row scale offset (" + std::to_string(at) + ") lies outside its " +
              std::to_string(l->w_fp8.scales.size()) + " scales";
        break;
      }
  }
  if (why.empty()) return true;
  ++stats_.fetch_failures;
  stats_.last_failure = "reading " + name_of(slot, expert) + " from its holder: " + why;
  return false;
}

int64_t expert_residency::install(int64_t slot, int64_t expert, model::expert_weights&& w) {
  const auto bytes = static_cast<int64_t>(w.gate_up.bytes() + w.down.bytes());
  backend_->load_expert(slot, expert, std::move(w));
  resident_[slot * experts_ + expert] = true;
  return bytes;
}

void expert_residency::release(const void* holder) {
  std::lock_guard lock(mu_);
  held_.erase(holder);
  deferring_.erase(holder);
  if (deferring_.empty()) drop_unheld();
}

void expert_residency::defer_drops() {
  std::lock_guard lock(mu_);
  if (!deferring_.empty()) return;  // a change under way: its holders are awaited already
  for (const auto& [h, set] : held_) deferring_.insert(h);
}

void expert_residency::drop(int64_t slot, int64_t expert) {
  auto& x = model::routed_expert_weights(mutable_weights_, slot, expert);
  std::shared_ptr<model::expert_weights> kept;
  for (auto& l : loans_)
    if (l->experts.contains({slot, expert})) {  // a peer may still read it: it moves into the loan
      if (!kept) kept = std::make_shared<model::expert_weights>(std::move(x));
      l->kept.push_back(kept);
    }
  backend_->drop_expert(slot, expert);
  resident_[slot * experts_ + expert] = false;
}

void expert_residency::drop_unheld() {
  std::vector<bool> held(resident_.size(), false);
  for (const auto& [h, set] : held_)
    for (int64_t s = 0; s < slots_; ++s)
      for (int32_t e : set[s]) held[s * experts_ + e] = true;
  for (int64_t s = 0; s < slots_; ++s)
    for (int64_t e = 0; e < experts_; ++e)
      if (resident_[s * experts_ + e] && !held[s * experts_ + e]) drop(s, e);
}

int64_t expert_residency::resident_experts() const {
  std::lock_guard lock(mu_);
  return std::count(resident_.begin(), resident_.end(), true);
}

expert_residency::expert_set expert_residency::resident_set() const {
  std::lock_guard lock(mu_);
  expert_set out(static_cast<size_t>(slots_));
  for (int64_t s = 0; s < slots_; ++s)
    for (int64_t e = 0; e < experts_; ++e)
      if (resident_[s * experts_ + e]) out[s].push_back(static_cast<int32_t>(e));
  return out;
}

int64_t expert_residency::resident_bytes() const {
  std::lock_guard lock(mu_);
  int64_t bytes = 0;
  for (int64_t s = 0; s < slots_; ++s)
    for (int64_t e = 0; e < experts_; ++e)
      if (resident_[s * experts_ + e]) {
        const auto& x = model::routed_expert_weights(mutable_weights_, s, e);
        bytes += static_cast<int64_t>(x.gate_up.bytes() + x.down.bytes());
      }
  return bytes;
}

}  // namespace shoal::runtime

namespace shoal::runtime {

void expert_residency::expire_loans() {
  const auto now = std::chrono::steady_clock::now();
  std::erase_if(loans_, [&](const auto& l) { return l->until <= now && !l->registering; });
  std::erase_if(draining_, [](const auto& f) { return f->done(); });
}

result<std::vector<expert_part>> expert_residency::lend(
    uint64_t epoch, const std::vector<std::pair<int32_t, int32_t>>& experts, transport& bulk,
    std::chrono::milliseconds lease) {
  struct lent_array {
    int32_t slot, expert, tensor, field;
    int64_t block_in;
    std::span<std::byte> bytes;
  };
  auto l = std::make_shared<loan>();
  l->epoch = epoch;
  l->until = std::chrono::steady_clock::now() + lease;
  std::vector<lent_array> arrays;
  int64_t bytes = 0;
  {  // pin: from here a drop() of these experts moves their weights into the loan
    std::lock_guard lock(mu_);
    expire_loans();
    for (auto [s, e] : experts) {
      if (s < 0 || s >= slots_ || e < 0 || e >= experts_)
        return fail(errc::invalid_argument, name_of(s, e) + " does not exist (" + std::to_string(slots_) +
                                              " MoE slots of " + std::to_string(experts_) + " experts)");
      if (!resident_[s * experts_ + e]) return fail(errc::not_found, name_of(s, e) + " is not held here");
      auto& x = model::routed_expert_weights(mutable_weights_, s, e);
      for (int32_t t = 0; t < 2; ++t) {
        linear& lin = t == 0 ? x.gate_up : x.down;
        for (const array_ref& a : arrays_of(lin))
          arrays.push_back({s, e, t, static_cast<int32_t>(a.field), lin.w_fp8.block_in, a.bytes});
      }
      bytes += static_cast<int64_t>(x.gate_up.bytes() + x.down.bytes());
      l->experts.insert({s, e});
    }
    loans_.push_back(l);
  }
  std::vector<expert_part> parts;
  std::vector<std::unique_ptr<registered_memory>> regs;
  for (const lent_array& a : arrays) {
    auto reg = bulk.register_memory(a.bytes);
    if (!reg) {
      std::lock_guard lock(mu_);
      std::erase(loans_, l);
      return fail(errc::unavailable, "registering " + name_of(a.slot, a.expert) + " with " + bulk.name() + ": " + reg.error());
    }
    parts.push_back({a.slot, a.expert, a.tensor, a.field, a.block_in, (*reg)->describe(0, a.bytes.size())});
    regs.push_back(std::move(*reg));
  }
  std::lock_guard lock(mu_);
  l->registrations = std::move(regs);
  l->registering = false;
  if (ended_epoch_ && l->epoch <= *ended_epoch_) std::erase(loans_, l);  // its placement took effect meanwhile
  stats_.lent_experts += static_cast<int64_t>(l->experts.size());
  stats_.lent_bytes += bytes;
  return parts;
}

void expert_residency::end_loans(uint64_t epoch) {
  std::lock_guard lock(mu_);
  ended_epoch_ = std::max(ended_epoch_.value_or(0), epoch);
  std::erase_if(loans_, [&](const auto& l) { return l->epoch <= epoch && !l->registering; });
}

namespace {

// Sizes `l` for the arrays `parts` describe (one tensor of one expert), as this model's
// (out, in) projection; the spans reads land in, or why the parts do not fit.
// With `check_only`, nothing is allocated (and no span returned): the check alone.
std::expected<std::vector<std::span<std::byte>>, std::string> shape(linear& l, int64_t out, int64_t in,
                                                                   const std::vector<expert_part>& parts,
                                                                   const linear* like, bool check_only) {
  std::set<int32_t> fields;
  for (const expert_part& p : parts)
    if (!fields.insert(p.field).second) return std::unexpected("field " + std::to_string(p.field) + " twice");
  const std::set<int32_t> f32{0}, bf16{1}, fp8{2, 3, 4};
  if (fields != f32 && fields != bf16 && fields != fp8)
    return std::unexpected("its arrays are neither fp32, bf16 nor FP8 codes with scales and row scales");
  if (like) {  // the same storage as the experts this process holds
    const bool same = (fields == f32 && !like->w.empty()) || (fields == bf16 && !like->w_bf16.empty()) ||
                      (fields == fp8 && !like->w_fp8.codes.empty());
    if (!same) return std::unexpected("its storage differs from this process's experts of the same checkpoint");
  }
  l.out = out;
  l.in = in;
  std::vector<std::span<std::byte>> dst;
  const auto n = static_cast<uint64_t>(out * in);
  for (const expert_part& p : parts) {
    const uint64_t len = p.memory.length;
    auto need = [&](uint64_t want) -> std::expected<void, std::string> {
      if (len == want) return {};
      return std::unexpected("field " + std::to_string(p.field) + " is " + std::to_string(len) + " bytes, " +
                             std::to_string(want) + " expected for (" + std::to_string(out) + ", " +
                             std::to_string(in) + ")");
    };
    std::expected<void, std::string> ok;
    switch (static_cast<expert_field>(p.field)) {
      case expert_field::f32:
        if (ok = need(n * 4); ok && !check_only) l.w.resize(n);
        break;
      case expert_field::bf16:
        if (ok = need(n * 2); ok && !check_only) l.w_bf16.resize(n);
        break;
      case expert_field::fp8_codes:
        if (p.block_in < 1 || p.block_in > (int64_t{1} << 20))
          return std::unexpected("FP8 block of " + std::to_string(p.block_in) + " columns");
        l.w_fp8.block_in = p.block_in;
        if (ok = need(n); ok && !check_only) l.w_fp8.codes.resize(n);
        break;
      case expert_field::fp8_scales: {
        const uint64_t most = static_cast<uint64_t>(out) * static_cast<uint64_t>(in) * 4;
        if (len == 0 || len % 4 != 0 || len > most)
          return std::unexpected("FP8 scales of " + std::to_string(len) + " bytes");
        if (!check_only) l.w_fp8.scales.resize(len / 4);
        break;
      }
      case expert_field::fp8_row_scales:
        if (ok = need(static_cast<uint64_t>(out) * 4); ok && !check_only)
          l.w_fp8.row_scales.resize(static_cast<size_t>(out));
        break;
    }
    if (!ok) return std::unexpected(ok.error());
  }
  if (check_only) return dst;
  for (const expert_part& p : parts) {  // after every resize: the spans stay valid
    for (const array_ref& a : arrays_of(l))
      if (static_cast<int32_t>(a.field) == p.field) dst.push_back(a.bytes);
  }
  return dst;
}

}  // namespace

result<void> expert_residency::fetch(uint64_t epoch, const std::vector<expert_part>& parts,
                                                         std::shared_ptr<transport> bulk,
                                                         std::chrono::milliseconds timeout) {
  std::lock_guard lock(mu_);
  expire_loans();
  const auto& c = weights_->config;
  std::map<std::pair<int64_t, int64_t>, std::array<std::vector<expert_part>, 2>> by_expert;
  for (const expert_part& p : parts) {
    if (p.slot < 0 || p.slot >= slots_ || p.expert < 0 || p.expert >= experts_ || p.tensor < 0 || p.tensor > 1)
      return fail(errc::invalid_argument, "a part names " + name_of(p.slot, p.expert) + " tensor " +
                                            std::to_string(p.tensor) + ", which this model does not have");
    by_expert[{p.slot, p.expert}][p.tensor].push_back(p);
  }
  const model::expert_weights* like = nullptr;  // an expert held here: the storage to expect
  for (int64_t i = 0; i < slots_ * experts_ && !like; ++i)
    if (resident_[i]) like = &model::routed_expert_weights(mutable_weights_, i / experts_, i % experts_);
  const int64_t I = c.moe_intermediate_size, d = c.hidden_size;
  const auto out_of = [I, d](int32_t t) { return t == 0 ? 2 * I : d; };  // by value: the thread below uses them
  const auto in_of = [I, d](int32_t t) { return t == 0 ? d : I; };
  std::optional<error> first;  // the first description refused (the others are read)
  std::vector<fetch_entry*> batch;
  for (auto& [key, tensors] : by_expert) {
    const auto [s, e] = key;
    if (resident_[s * experts_ + e] || fetches_.contains(key)) continue;
    std::string why;
    for (int32_t t = 0; t < 2 && why.empty(); ++t) {
      linear scratch;
      auto checked = shape(scratch, out_of(t), in_of(t), tensors[t],
                           like ? (t == 0 ? &like->gate_up : &like->down) : nullptr, true);
      if (!checked) why = std::string(tensor_name(t)) + ": " + checked.error();
    }
    if (!why.empty()) {
      ++stats_.fetch_failures;
      stats_.last_failure = "placement epoch " + std::to_string(epoch) + ": the description of " + name_of(s, e) +
                            " does not fit this model: " + why;
      if (!first) first = error{errc::invalid_argument, stats_.last_failure};
      continue;
    }
    auto f = std::make_unique<fetch_entry>();
    f->parts = std::move(tensors);
    batch.push_back(f.get());
    fetches_[key] = std::move(f);
  }
  if (!batch.empty()) {
    // The entries outlive the job: the destructor waits until each is posted and read, and
    // an entry dropped meanwhile waits in draining_ until done() (posted and read).
    auto job = [batch, bulk = std::move(bulk), timeout, out_of, in_of] {
      for (fetch_entry* f : batch) {
        std::vector<remote_memory> srcs;
        std::vector<std::span<std::byte>> dsts;
        for (int32_t t = 0; t < 2; ++t) {
          auto dst = shape(t == 0 ? f->w.gate_up : f->w.down, out_of(t), in_of(t), f->parts[t], nullptr, false);
          SHOAL_ASSERT(dst.has_value());  // fetch checked the same parts
          for (const expert_part& p : f->parts[t]) srcs.push_back(p.memory);
          dsts.insert(dsts.end(), dst->begin(), dst->end());
        }
        f->reads = bulk->read_all(srcs, dsts, timeout);
        f->posted.store(true, std::memory_order_release);  // f may be gone from here on
      }
    };
    if (!preparing_.push(std::move(job))) {  // nothing posted: these come from the checkpoint
      for (fetch_entry* f : batch)
        std::erase_if(fetches_, [f](const auto& kv) { return kv.second.get() == f; });
      ++stats_.fetch_failures;
      stats_.last_failure = "placement epoch " + std::to_string(epoch) + ": " + std::to_string(preparing_.capacity()) +
                            " expert fetch batches wait to be prepared already";
      if (!first) first = error{errc::no_room, stats_.last_failure};
    }
  }
  if (first) return std::unexpected(std::move(*first));
  return {};
}

void expert_residency::drop_fetches() {
  std::lock_guard lock(mu_);
  for (auto& [key, f] : fetches_)
    if (!f->done()) draining_.push_back(std::move(f));
  fetches_.clear();
  staged_.clear();  // a job still reading keeps its own
  expire_loans();
}

expert_residency::migration_stats expert_residency::migration() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace shoal::runtime
