// caf_ep_transport (mailbox + condition variable, CAF sends) and the rank actor.
#include "actors/rank_actor.hpp"

#include <algorithm>
#include <cstring>
#include <thread>

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

namespace shoal::actors {

namespace {
constexpr size_t max_inbox = 1 << 16;  // frames kept; beyond, frames of other groups are dropped
constexpr uint64_t max_bulk_frame = uint64_t{1} << 30;  // a peer's frame read into memory here, at most
// The group's placement agreement (runtime::ep_moe_exchange::agree_group) is exchanged as slot −1,
// phase 2; a rank's frame sent again to a peer that asked by sending its own is phase 3.
constexpr int32_t agreement_phase = 2, agreement_answer = 3;
// A frame with nothing but its formation: tells a peer still in an earlier one of this number.
constexpr int32_t formation_slot = -2;
}

caf_ep_transport::caf_ep_transport(std::chrono::milliseconds timeout, bulk_options bulk)
    : bulk_(std::move(bulk)), timeout_(timeout) {
  if (!bulk_.transport) return;
  send_memory_.resize(2 * bulk_.region_bytes);
  auto reg = bulk_.transport->register_memory(send_memory_);
  if (reg) send_reg_ = std::move(*reg);
  else bulk_error_ = reg.error();
}

caf_ep_transport::~caf_ep_transport() {
  // Reads still landing in buffers of this object end first (each within its timeout).
  std::lock_guard lock(mu_);
  for (auto& [k, r] : reads_) r.read->wait();
  for (auto& r : draining_) r.read->wait();
}

void caf_ep_transport::retire(pending_read r) {
  std::erase_if(draining_, [](const pending_read& x) { return x.read->done(); });
  if (!r.read->done()) draining_.push_back(std::move(r));
}

void caf_ep_transport::drop_frames(const std::function<bool(const key&)>& drop) {
  std::erase_if(inbox_, [&](const auto& e) { return drop(e.first); });
  for (auto it = reads_.begin(); it != reads_.end();)
    if (drop(it->first)) {
      retire(std::move(it->second));
      it = reads_.erase(it);
    } else {
      ++it;
    }
}

void caf_ep_transport::stage(std::vector<ep_frame>& frames, runtime::ep_payloads& outgoing) {
  const size_t region = send_reg_ ? (exchanges_++ % 2) * bulk_.region_bytes : 0;
  size_t used = 0;
  for (size_t r = 0; r < frames.size(); ++r) {
    if (static_cast<int32_t>(r) == frames[r].source) continue;
    const size_t n = outgoing[r].size();
    if (send_reg_ && n >= bulk_.bulk_from && used + n <= bulk_.region_bytes) {
      std::memcpy(send_memory_.data() + region + used, outgoing[r].data(), n);
      frames[r].bulk = send_reg_->describe(region + used, n);
      used += n;
      ++frames_bulk_;
    } else {
      frames[r].bytes = std::move(outgoing[r]);
      ++frames_inline_;
    }
  }
}

std::expected<runtime::ep_payloads, std::string> caf_ep_transport::exchange(uint64_t step, int32_t slot,
                                                                            int32_t phase,
                                                                            runtime::ep_payloads outgoing) {
  uint64_t g, fm;
  int32_t me;
  std::vector<rank_actor> peers;
  {
    std::lock_guard lock(mu_);
    if (interrupted_) return std::unexpected(*interrupted_);
    g = group_;
    fm = formation_;
    me = rank_;
    peers = peers_;
    last_local_step_ = std::max(last_local_step_, static_cast<int64_t>(step));
  }
  const auto n = static_cast<int32_t>(peers.size());
  if (static_cast<int32_t>(outgoing.size()) != std::max(n, 1))
    return std::unexpected("exchange: " + std::to_string(outgoing.size()) + " payloads for a group of " +
                           std::to_string(n));
  runtime::ep_payloads incoming(outgoing.size());
  incoming[me] = std::move(outgoing[me]);
  std::vector<ep_frame> frames(static_cast<size_t>(n), ep_frame{g, step, slot, phase, me, {}, {}, fm});
  if (slot >= 0) {
    stage(frames, outgoing);
  } else {  // the group's agreement: small, inline, and kept to answer a peer that missed it
    for (int32_t r = 0; r < n; ++r)
      if (r != me) frames[r].bytes = std::move(outgoing[r]);
    std::lock_guard lock(mu_);
    if (group_ == g && formation_ == fm) agreement_ = frames;
  }
  for (int32_t r = 0; r < n; ++r)
    if (r != me) caf::anon_send(peers[r], expert_atom_v, std::move(frames[r]));
  std::unique_lock lock(mu_);
  auto arrived = [&](int32_t r) {
    return inbox_.contains(key{g, fm, step, slot, phase, r}) || reads_.contains(key{g, fm, step, slot, phase, r});
  };
  auto missing = [&] {
    std::vector<int32_t> out;
    for (int32_t r = 0; r < n; ++r)
      if (r != me && !arrived(r)) out.push_back(r);
    return out;
  };
  bool complete = cv_.wait_for(lock, timeout_, [&] {
    return interrupted_ || group_ != g || formation_ != fm || missing().empty();
  });
  if (interrupted_) return std::unexpected(*interrupted_);
  if (group_ != g || formation_ != fm) return std::unexpected("expert-parallel group changed during the exchange");
  if (!complete) {
    std::string who;
    for (int32_t r : missing()) who += (who.empty() ? "" : ", ") + std::to_string(r);
    return std::unexpected("expert-parallel exchange timed out after " + std::to_string(timeout_.count()) +
                           " ms waiting for rank(s) " + who + " (step " + std::to_string(step) + ", slot " +
                           std::to_string(slot) + ")");
  }
  std::vector<std::pair<int32_t, pending_read>> reading;
  for (int32_t r = 0; r < n; ++r) {
    if (r == me) continue;
    if (auto it = inbox_.find(key{g, fm, step, slot, phase, r}); it != inbox_.end()) {
      incoming[r] = std::move(it->second);
      inbox_.erase(it);
    } else {
      auto rd = reads_.find(key{g, fm, step, slot, phase, r});
      reading.emplace_back(r, std::move(rd->second));
      reads_.erase(rd);
    }
  }
  lock.unlock();
  if (auto cut = await_reads(reading, g, fm)) return std::unexpected(*cut);
  std::string error;
  for (auto& [r, pr] : reading) {
    if (!pr.read->ok() && error.empty())
      error = "reading rank " + std::to_string(r) + "'s frame over " +
              (bulk_.transport ? bulk_.transport->name() : std::string("no bulk transport")) + ": " + pr.read->error();
    incoming[r] = std::move(*pr.bytes);
  }
  if (!error.empty()) return std::unexpected(error);
  return incoming;
}

std::optional<std::string> caf_ep_transport::await_reads(std::vector<std::pair<int32_t, pending_read>>& reading,
                                                        uint64_t g, uint64_t fm) {
  // Each read ends within its timeout; a group change (a peer lost, its process stopped while
  // this rank reads its frame) ends the wait sooner. A short spin first: most reads are done
  // in microseconds, and the cv's poll would add its period to every exchange.
  const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
  auto all_done = [&] {
    return std::all_of(reading.begin(), reading.end(), [](const auto& x) { return x.second.read->done(); });
  };
  while (!all_done() && std::chrono::steady_clock::now() < spin_until) std::this_thread::yield();
  std::unique_lock lock(mu_);
  auto cut = [&] { return interrupted_ || group_ != g || formation_ != fm; };
  while (!all_done())
    if (cv_.wait_for(lock, std::chrono::milliseconds(1), cut)) {
      for (auto& [r, pr] : reading) retire(std::move(pr));  // kept until they end: they write into pr.bytes
      return interrupted_ ? *interrupted_ : std::string("expert-parallel group changed during the exchange");
    }
  return std::nullopt;
}

bool caf_ep_transport::admit(const ep_frame& f, arrival& out) {
  const bool peer = f.source >= 0 && static_cast<size_t>(f.source) < peers_.size() && f.source != rank_;
  if (f.group == group_ && f.formation < formation_) {
    // A peer still in an earlier formation of this group (it missed a leave-and-return this
    // rank saw): it learns this one's number, once per formation, and forms the group anew.
    if (peer && peers_[f.source] && f.slot != formation_slot && noticed_.insert(f.source).second)
      caf::anon_send(peers_[f.source], expert_atom_v, ep_frame{group_, 0, formation_slot, 0, rank_, {}, {}, formation_});
    return false;
  }
  // A formation this rank left (or, at its own number, one of another group) never comes back.
  if (f.formation < formation_ || (f.formation == formation_ && f.group != group_)) return false;
  if (f.formation > formation_) {
    uint64_t& seen = seen_[f.group];
    seen = std::max(seen, f.formation);
    if (f.group == group_ && !interrupted_) {
      // A peer formed this group anew: so does this rank (at that number, see set_group).
      interrupted_ = "expert-parallel rank " + std::to_string(f.source) + " formed the group anew (formation " +
                     std::to_string(f.formation) + ", this rank's " + std::to_string(formation_) + ")";
      out = arrival::reform;
    }
  }
  return f.slot != formation_slot;  // a notice carries nothing to keep
}

caf_ep_transport::arrival caf_ep_transport::deliver(ep_frame f) {
  arrival out = arrival::none;
  {
    std::lock_guard lock(mu_);
    if (!admit(f, out)) return out;
    if (inbox_.size() + reads_.size() >= max_inbox)
      drop_frames([&](const key& k) { return std::get<0>(k) != group_ || std::get<1>(k) != formation_; });
    const bool current = f.group == group_ && f.formation == formation_ && !interrupted_;
    auto step = static_cast<int64_t>(f.step);
    if (current && step > last_local_step_ && step > last_join_) {
      last_join_ = step;
      out = arrival::join;
    }
    // A peer agreeing the group's placement may have missed this rank's frame: it gets it
    // again, marked as an answer (an answer is not answered, or two ranks would echo forever).
    if (f.slot == -1 && f.phase == agreement_answer) {
      f.phase = agreement_phase;
    } else if (f.slot == -1 && current && f.source >= 0 && static_cast<size_t>(f.source) < agreement_.size() &&
               f.source != rank_ && agreement_[f.source].step == f.step) {
      ep_frame answer = agreement_[f.source];
      answer.phase = agreement_answer;
      caf::anon_send(peers_[f.source], expert_atom_v, std::move(answer));
    }
    const key k{f.group, f.formation, f.step, f.slot, f.phase, f.source};
    if (f.bulk.length == 0) {
      inbox_[k] = std::move(f.bytes);
    } else {
      // The bytes are in the sender's memory: read them now, one-sided; the exchange waits.
      pending_read pr{std::make_shared<std::vector<uint8_t>>(), nullptr};
      if (!bulk_.transport || f.bulk.length > max_bulk_frame) {
        pr.read = std::make_shared<runtime::transfer>();
        if (!bulk_.transport)
          pr.read->fail(runtime::errc::unavailable, "the frame came over a bulk transport this rank does not have");
        else
          pr.read->fail(runtime::errc::invalid_argument, "the frame's " + std::to_string(f.bulk.length) +
                                                           " bytes exceed the limit of " + std::to_string(max_bulk_frame));
      } else {
        pr.bytes->resize(f.bulk.length);
        pr.read = bulk_.transport->read(f.bulk, std::as_writable_bytes(std::span(*pr.bytes)), timeout_);
      }
      if (auto old = reads_.find(k); old != reads_.end()) retire(std::move(old->second));
      reads_[k] = std::move(pr);
    }
  }
  cv_.notify_all();
  return out;
}

void caf_ep_transport::interrupt(const std::string& why) {
  {
    std::lock_guard lock(mu_);
    interrupted_ = why;
  }
  cv_.notify_all();
}

bool caf_ep_transport::set_group(uint64_t group, int32_t rank, std::vector<rank_actor> peers) {
  std::lock_guard lock(mu_);
  // One past the last formation, or the one its peers formed already (their frames wait here).
  uint64_t next = formation_ + 1;
  if (auto it = seen_.find(group); it != seen_.end()) next = std::max(next, it->second);
  group_ = group;
  formation_ = next;
  std::erase_if(seen_, [&](const auto& e) { return e.second <= formation_; });
  noticed_.clear();
  // Frames of the formations left behind go (those of later formations, of any group, stay).
  drop_frames([&](const key& k) {
    return std::get<1>(k) < formation_ || (std::get<1>(k) == formation_ && std::get<0>(k) != group_);
  });
  rank_ = rank;
  peers_ = std::move(peers);
  agreement_.clear();
  interrupted_.reset();
  last_local_step_ = last_join_ = -1;
  auto mine = [&](const key& k) { return std::get<0>(k) == group_ && std::get<1>(k) == formation_; };
  bool waiting = std::any_of(inbox_.begin(), inbox_.end(), [&](const auto& e) { return mine(e.first); }) ||
                 std::any_of(reads_.begin(), reads_.end(), [&](const auto& e) { return mine(e.first); });
  if (waiting) last_join_ = 0;
  return waiting;
}

uint64_t caf_ep_transport::formation() const {
  std::lock_guard lock(mu_);
  return formation_;
}

uint64_t caf_ep_transport::group() const {
  std::lock_guard lock(mu_);
  return group_;
}

std::vector<rank_actor> caf_ep_transport::peers() const {
  std::lock_guard lock(mu_);
  return peers_;
}

int32_t caf_ep_transport::size() const {
  std::lock_guard lock(mu_);
  return static_cast<int32_t>(peers_.size());
}

// -- groups ------------------------------------------------------------------------------------

int32_t ep_group_view::index_of(const caf::actor& rank) const {
  auto it = std::find(ranks.begin(), ranks.end(), rank);
  return it == ranks.end() ? -1 : static_cast<int32_t>(it - ranks.begin());
}

ep_group_view ep_group_of(const membership& m, const std::string& group) {
  std::vector<std::tuple<std::string, caf::actor, caf::actor>> members;
  for (const node_info& n : m.nodes)
    for (const rank_info& r : n.ranks)
      if (n.ep_group == group && r.rank) members.emplace_back(n.name + "/rank" + std::to_string(r.index), r.rank, r.engine);
  std::sort(members.begin(), members.end(),
            [](const auto& a, const auto& b) { return std::get<0>(a) < std::get<0>(b); });
  ep_group_view g;
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64
  for (auto& [name, actor, engine] : members) {
    // The actor's address (node id + actor id) too: a node restarted under the same name is
    // another incarnation, so another group (its predecessor's frames never mix in).
    for (char c : name + " " + to_string(actor.address()) + "\n")
      h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
    g.names.push_back(name);
    g.ranks.push_back(actor);
    g.engines.push_back(engine);
  }
  g.id = h;
  return g;
}

std::optional<std::string> ep_join_conflict(const membership& m, const node_info& joining) {
  if (joining.ep_group.empty()) return std::nullopt;
  for (const node_info& n : m.nodes) {
    if (n.name == joining.name || n.ep_group != joining.ep_group) continue;
    auto differs = [&](const char* field, const std::string& theirs, const std::string& mine) -> std::optional<std::string> {
      if (theirs == mine) return std::nullopt;
      return "node '" + joining.name + "' cannot join expert-parallel group '" + joining.ep_group + "': its " + field +
             " is " + mine + ", member '" + n.name + "' has " + theirs;
    };
    auto size = [](int32_t s) { return s > 0 ? std::to_string(s) : std::string("undeclared"); };
    if (auto e = differs("checkpoint", n.checkpoint, joining.checkpoint)) return e;
    if (auto e = differs("engine.role", n.engine_role, joining.engine_role)) return e;
    if (auto e = differs("engine.ep_group_size", size(n.ep_group_size), size(joining.ep_group_size))) return e;
    if (auto e = differs("speculative depth (engine.speculative, engine.spec_nextn)", std::to_string(n.ep_spec_depth),
                         std::to_string(joining.ep_spec_depth)))
      return e;
  }
  if (joining.ep_group_size > 0) {  // the group may not grow past its declared size
    size_t ranks = joining.ranks.size();
    for (const node_info& n : m.nodes)
      if (n.name != joining.name && n.ep_group == joining.ep_group) ranks += n.ranks.size();
    if (ranks > static_cast<size_t>(joining.ep_group_size))
      return "node '" + joining.name + "' cannot join expert-parallel group '" + joining.ep_group + "': its " +
             std::to_string(joining.ranks.size()) + " rank(s) would make " + std::to_string(ranks) +
             ", above engine.ep_group_size " + std::to_string(joining.ep_group_size);
  }
  return std::nullopt;
}

// -- the rank actor ------------------------------------------------------------------------------

namespace {

struct rank_state {
  static inline const char* name = "rank";
  std::shared_ptr<caf_ep_transport> transport;
  engine_actor engine;
  std::string group_name;  // engine.ep_group
  uint64_t group = 0;  // the last group sent to the engine, this rank's index and its ranks
  int32_t me = -1;
  std::vector<caf::actor> ranks;
};

caf::behavior rank_behavior(caf::stateful_actor<rank_state>* self, std::shared_ptr<caf_ep_transport> transport,
                            engine_actor engine, std::string group) {
  self->state.transport = std::move(transport);
  self->state.engine = std::move(engine);
  self->state.group_name = std::move(group);
  return {
    [self](expert_atom, ep_frame& f) {
      auto& st = self->state;
      uint64_t group = f.group, step = f.step;
      switch (st.transport->deliver(std::move(f))) {
        case caf_ep_transport::arrival::join: caf::anon_send(st.engine, lockstep_atom_v, group, step); break;
        case caf_ep_transport::arrival::reform:  // a peer formed the group anew: adopt it again
          if (group == st.group) caf::anon_send(st.engine, lockstep_atom_v, st.group, st.me, st.ranks);
          break;
        case caf_ep_transport::arrival::none: break;
      }
    },
    [self](const membership& m) {
      auto& st = self->state;
      ep_group_view g = ep_group_of(m, st.group_name);
      int32_t me = g.index_of(caf::actor_cast<caf::actor>(self));
      if (me < 0 || g.id == st.group) return;
      st.group = g.id;
      st.me = me;
      st.ranks = g.ranks;
      st.transport->interrupt("expert-parallel group changed (now " + std::to_string(g.ranks.size()) + " ranks)");
      caf::anon_send(st.engine, lockstep_atom_v, g.id, me, g.ranks);
    },
  };
}

}  // namespace

rank_actor spawn_rank(caf::actor_system& sys, std::shared_ptr<caf_ep_transport> transport, engine_actor engine,
                      std::string group) {
  return caf::actor_cast<rank_actor>(sys.spawn(rank_behavior, std::move(transport), std::move(engine), std::move(group)));
}

}  // namespace shoal::actors
