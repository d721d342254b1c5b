// The node agent's state (membership_table + hooks) and handlers, and join_cluster, the
// blocking join a daemon runs once at start. Joining: the seed adds the joiner and replies
// its view; the joiner connects to every other member directly (so EP frames and token
// streams never relay through the seed) and announces itself to each of them.
#include "actors/node_agent_actor.hpp"

#include <set>
#include <thread>

#include <caf/actor_system.hpp>
#include <caf/io/middleman.hpp>
#include <caf/result.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/system_messages.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "actors/cluster_tls.hpp"
#include "actors/rank_actor.hpp"

namespace shoal::actors {

// -- membership_table ---------------------------------------------------------------------------

membership_table::membership_table(node_info self) : self_name_(self.name) {
  members_.emplace(self_name_, std::move(self));
}

bool membership_table::upsert(const node_info& n) {
  auto it = members_.find(n.name);
  if (it != members_.end() && it->second == n) return false;
  members_[n.name] = n;
  ++version_;
  return true;
}

std::optional<std::string> membership_table::remove_agent(const caf::actor_addr& agent) {
  for (auto it = members_.begin(); it != members_.end(); ++it)
    if (it->first != self_name_ && it->second.agent.address() == agent) {
      std::string name = it->first;
      members_.erase(it);
      ++version_;
      return name;
    }
  return std::nullopt;
}

bool membership_table::set_draining(bool draining) {
  node_info& me = members_.at(self_name_);
  if (me.draining == draining) return false;
  me.draining = draining;
  ++version_;
  return true;
}

const node_info* membership_table::find(const std::string& name) const {
  auto it = members_.find(name);
  return it == members_.end() ? nullptr : &it->second;
}

membership membership_table::view() const {
  membership m;
  m.version = version_;
  for (const auto& [name, n] : members_) m.nodes.push_back(n);
  return m;
}

// -- the actor -----------------------------------------------------------------------------------

namespace {

struct agent_state {
  static inline const char* name = "node_agent";
  std::optional<membership_table> table;
  node_hooks hooks;
  std::vector<caf::actor> subscribers;
  std::set<caf::actor_addr> monitored;
};

using agent_pointer = node_agent_actor::stateful_pointer<agent_state>;

void publish_view(agent_pointer self) {
  membership view = self->state.table->view();
  for (const auto& s : self->state.subscribers) caf::anon_send(s, view);
}

// Adds or replaces a member; monitors its agent the first time. A node whose expert-parallel
// group disagrees with its members is not added (its join was refused; see ep_join_conflict).
void learn(agent_pointer self, const node_info& n) {
  auto& st = self->state;
  if (!n.agent) return;
  if (n.name != st.table->self().name && ep_join_conflict(st.table->view(), n)) return;
  if (n.name == st.table->self().name) {
    // Only the node itself may change its own entry (e.g. the bound port once published).
    if (n.agent == caf::actor_cast<caf::actor>(self) && st.table->upsert(n)) publish_view(self);
    return;
  }
  if (st.monitored.insert(n.agent.address()).second) self->monitor(n.agent);
  if (st.table->upsert(n)) publish_view(self);
}

void announce_self(agent_pointer self) {
  const node_info& me = self->state.table->self();
  for (const node_info& n : self->state.table->view().nodes)
    if (n.name != me.name) self->send(caf::actor_cast<node_agent_actor>(n.agent), update_atom_v, me);
}

caf::result<bool> kill(agent_pointer self, const std::string& target) {
  auto& st = self->state;
  if (target == st.table->self().name && st.hooks.kill_node) {
    st.hooks.kill_node();
    return true;
  }
  if (st.hooks.kill_actor && st.hooks.kill_actor(target)) return true;
  return make_error(errc::not_found, "no actor '" + target + "' on node '" + st.table->self().name + "'");
}

caf::result<std::string> describe(agent_pointer self, const std::string& actor) {
  auto& st = self->state;
  if (actor != "node" && st.hooks.describe)
    if (auto text = st.hooks.describe(actor)) return *text;
  if (actor == "node" || actor == st.table->self().name) {
    const node_info& me = st.table->self();
    std::string roles;
    for (const auto& r : me.roles) roles += (roles.empty() ? "" : ",") + r;
    return me.name + " listen=" + me.host + ":" + std::to_string(me.port) + " roles=" + roles +
           " ranks=" + std::to_string(me.ranks.size()) + (me.draining ? " draining" : "") +
           " members=" + std::to_string(st.table->view().nodes.size());
  }
  return make_error(errc::not_found, "no actor '" + actor + "' on node '" + st.table->self().name + "'");
}

node_agent_actor::behavior_type agent_behavior(agent_pointer self, node_info me, node_hooks hooks) {
  me.agent = caf::actor_cast<caf::actor>(self);
  self->state.table.emplace(std::move(me));
  self->state.hooks = std::move(hooks);
  self->set_down_handler([self](caf::down_msg& msg) {
    self->state.monitored.erase(msg.source);
    if (self->state.table->remove_agent(msg.source)) publish_view(self);
  });
  return {
    [self](join_atom, node_info& joining) -> caf::result<membership> {
      if (auto conflict = ep_join_conflict(self->state.table->view(), joining))
        return make_error(errc::conflict, *conflict);
      learn(self, joining);
      // The joiner announces itself to every member over a direct connection; one it cannot
      // reach would never hear of it. The seed tells them all too (a member that knows it
      // already changes nothing), so the membership converges whatever the joiner reaches.
      for (const node_info& n : self->state.table->view().nodes)
        if (n.name != joining.name && n.name != self->state.table->self().name && n.agent)
          self->send(caf::actor_cast<node_agent_actor>(n.agent), update_atom_v, joining);
      return self->state.table->view();
    },
    [self](update_atom, node_info& n) { learn(self, n); },
    [self](members_atom) { return self->state.table->view(); },
    [self](drain_atom) {
      auto& st = self->state;
      if (!st.table->set_draining(true)) return false;
      if (st.hooks.drain) st.hooks.drain();
      announce_self(self);
      publish_view(self);
      return true;
    },
    [self](describe_atom, std::string& actor) { return describe(self, actor); },
    [self](requests_atom) {
      auto& h = self->state.hooks;
      return h.requests ? h.requests() : std::vector<std::string>{};
    },
    [self](kill_atom, std::string& target) { return kill(self, target); },
    [self](eplb_atom, std::string& command) -> caf::result<std::string> {
      auto& st = self->state;
      if (!st.hooks.eplb)
        return make_error(errc::not_found, "node '" + st.table->self().name + "' has no expert-parallel ranks");
      return st.hooks.eplb(command);
    },
    [self](submit_atom, std::string& prompt, int32_t max_tokens, caf::actor& sink) -> caf::result<request_id> {
      auto& st = self->state;
      if (!st.hooks.gateway)
        return make_error(errc::not_found, "node '" + st.table->self().name + "' has no gateway");
      return self->delegate(*st.hooks.gateway, submit_atom_v, std::move(prompt), max_tokens, std::move(sink));
    },
    [self](subscribe_atom, caf::actor& who) {
      self->state.subscribers.push_back(who);
      caf::anon_send(who, self->state.table->view());
    },
  };
}

}  // namespace

node_agent_actor spawn_node_agent(caf::actor_system& sys, node_info self, node_hooks hooks) {
  return sys.spawn(agent_behavior, std::move(self), std::move(hooks));
}

// -- join_cluster ------------------------------------------------------------------------------

std::optional<membership> join_cluster(caf::actor_system& sys, const node_agent_actor& agent,
                                       const std::vector<seed_address>& seeds,
                                       std::chrono::milliseconds timeout, std::string& error, bool* refused) {
  caf::scoped_actor self{sys};
  node_info me;
  self->request(agent, timeout, members_atom_v)
    .receive(
      [&](const membership& m) {
        for (const auto& n : m.nodes)
          if (n.agent == caf::actor_cast<caf::actor>(agent)) me = n;
      },
      [&](caf::error&) {});
  error.clear();
  for (const seed_address& seed : seeds) {
    std::string where = seed.host + ":" + std::to_string(seed.port);
    auto seed_agent = connect_agent(sys, seed.host, seed.port, timeout);
    if (!seed_agent) {
      error += (error.empty() ? "" : "; ") + where + ": " + seed_agent.error();
      continue;
    }
    std::optional<membership> view;
    bool no = false;
    self->request(*seed_agent, timeout, join_atom_v, me)
      .receive([&](membership& m) { view = std::move(m); },
               [&](caf::error& e) {
                 const error_reply r = to_error_reply(e);
                 no = r.code == errc::conflict;
                 error += (error.empty() ? "" : "; ") + where + ": " + (no ? r.message : sys.render(e));
               });
    if (no) {
      if (refused) *refused = true;
      return std::nullopt;
    }
    if (!view) continue;
    for (const node_info& n : view->nodes) {
      if (n.name == me.name) continue;
      if (n.agent != caf::actor_cast<caf::actor>(*seed_agent)) {
        // A direct connection to that member; the handle in the view then routes over it.
        // Unreachable directly: still a member (its handle routes through the seed, which
        // also told it of this node).
        auto direct = connect_agent(sys, n.host, n.port, timeout);
        if (direct)
          self->send(*direct, update_atom_v, me);
        else
          error += (error.empty() ? "" : "; ") + n.name + " (" + n.host + ":" + std::to_string(n.port) +
                   "): " + direct.error();
      }
      self->send(agent, update_atom_v, n);
    }
    return view;
  }
  return std::nullopt;
}

// -- healing -------------------------------------------------------------------------------------

std::vector<rejoin_schedule::peer> rejoin_schedule::due(const membership& view, double now) {
  std::set<std::string> present;
  for (const node_info& n : view.nodes) {
    if (n.name == self_) continue;
    present.insert(n.name);
    entry& e = known_[n.name];
    e.p = {n.name, n.host, n.port};
    e.lost = false;
  }
  std::vector<peer> out;
  for (auto& [name, e] : known_) {
    if (present.contains(name)) continue;
    if (!e.lost) e.lost = true, e.next = now, e.backoff = first_;
    if (now >= e.next) out.push_back(e.p);
  }
  return out;
}

void rejoin_schedule::failed(const std::string& name, double now) {
  auto it = known_.find(name);
  if (it == known_.end()) return;
  it->second.next = now + it->second.backoff;
  it->second.backoff = std::min(max_, it->second.backoff * 2);
}

std::vector<std::string> rejoin_schedule::lost() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : known_)
    if (e.lost) out.push_back(name);
  return out;
}

void heal_membership(caf::actor_system& sys, const node_agent_actor& agent, std::chrono::milliseconds period,
                     std::chrono::milliseconds timeout, const std::atomic<bool>& stop,
                     const std::function<void(const std::string&)>& log) {
  caf::scoped_actor self{sys};
  std::optional<rejoin_schedule> sched;
  std::set<std::string> reported;
  const auto now_s = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  };
  while (!stop.load()) {
    std::optional<membership> view;
    self->request(agent, timeout, members_atom_v).receive([&](membership& m) { view = std::move(m); }, [&](caf::error&) {});
    if (view) {
      node_info me;
      for (const node_info& n : view->nodes)
        if (n.agent == caf::actor_cast<caf::actor>(agent)) me = n;
      if (!sched) sched.emplace(me.name);
      for (const rejoin_schedule::peer& p : sched->due(*view, now_s())) {
        if (reported.insert(p.name).second) log("lost " + p.name + " (" + p.host + ":" + std::to_string(p.port) + "); trying to rejoin it");
        // Bounded (a cut link or a stopped process would hold the healer, and every other lost
        // member with it), and through TLS when the cluster has it.
        auto remote = connect_agent(sys, p.host, p.port, timeout);
        std::optional<membership> theirs;
        if (remote)
          self->request(*remote, timeout, join_atom_v, me).receive([&](membership& m) { theirs = std::move(m); },
                                                                  [&](caf::error&) {});
        if (!theirs) {
          sched->failed(p.name, now_s());
          continue;
        }
        for (const node_info& n : theirs->nodes) {
          if (n.name == me.name) continue;
          self->send(agent, update_atom_v, n);
          if (n.agent) self->send(caf::actor_cast<node_agent_actor>(n.agent), update_atom_v, me);
        }
        reported.erase(p.name);
        log("rejoined " + p.name + ": its view had " + std::to_string(theirs->nodes.size()) + " node(s)");
      }
    }
    std::this_thread::sleep_for(period);
  }
}

}  // namespace shoal::actors
