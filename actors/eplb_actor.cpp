// The eplb actor: membership → am I the leader; tick → reports from every engine → controller
// → lends from the holders of the experts processes gain → offers (placement + where to read
// the experts) to every engine. At most one round in flight; replies are matched by round
// number.
#include "actors/eplb_actor.hpp"

#include <algorithm>
#include <cstdio>
#include <optional>

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>

#include "actors/rank_actor.hpp"
#include "runtime/ep/expert_migration.hpp"

namespace shoal::actors {

placement_msg to_msg(const runtime::ep_placement& p) {
  placement_msg m{p.epoch(), p.slots(), p.logical(), p.ranks(), {0}, {}};
  for (const auto& list : p.lists()) {
    m.experts.insert(m.experts.end(), list.begin(), list.end());
    m.offsets.push_back(static_cast<int32_t>(m.experts.size()));
  }
  return m;
}

std::expected<runtime::ep_placement, std::string> to_placement(const placement_msg& m) {
  if (m.slots < 0 || m.ranks < 1 || m.slots > (1 << 20) || m.ranks > (1 << 20))
    return std::unexpected("placement has " + std::to_string(m.slots) + " slots and " + std::to_string(m.ranks) +
                           " ranks");
  const size_t lists = static_cast<size_t>(m.slots * m.ranks);
  if (m.offsets.size() != lists + 1 || m.offsets.front() != 0 ||
      m.offsets.back() != static_cast<int32_t>(m.experts.size()))
    return std::unexpected("placement offsets (" + std::to_string(m.offsets.size()) + ") do not frame " +
                           std::to_string(m.experts.size()) + " experts in " + std::to_string(lists) + " lists");
  for (size_t i = 0; i < lists; ++i)  // with the ends checked above, every list is then in range
    if (m.offsets[i] > m.offsets[i + 1]) return std::unexpected("placement offsets decrease at list " + std::to_string(i));
  std::vector<std::vector<int32_t>> out(lists);
  for (size_t i = 0; i < lists; ++i) out[i].assign(m.experts.begin() + m.offsets[i], m.experts.begin() + m.offsets[i + 1]);
  return runtime::ep_placement::from_lists(m.slots, m.logical, m.ranks, m.epoch, std::move(out));
}

namespace {

struct eplb_state {
  static inline const char* name = "eplb";
  std::string node;
  std::string group_name;  // engine.ep_group
  std::chrono::milliseconds interval{1000};
  std::shared_ptr<eplb_board> board;
  std::optional<runtime::eplb_controller> controller;
  ep_group_view group;
  bool leader = false;
  bool force = false;    // a rebalance was asked for
  uint64_t round = 0;    // the round in flight (0: none)
  uint64_t rounds = 0;
  std::chrono::milliseconds fetch_timeout{60'000};  // a process's reads of the experts it gains
  std::vector<std::optional<runtime::rank_load_report>> reports;
  std::vector<expert_load_msg> moved;  // per rank: its process's migration counters (no loads)
  size_t pending = 0;
  std::string error;     // of the last round
  std::string migration; // the processes' migration counters, in words

  void publish() {
    std::string text;
    if (!leader) {
      text = group.names.empty() ? "expert-parallel balancer of group '" + group_name + "': no rank of it yet\n"
                                 : "expert-parallel balancer of group '" + group_name + "': led by the node of " +
                                     group.names[0] + "\n";
    } else {
      text = "group '" + group_name + "' (" + std::to_string(group.names.size()) + " ranks): " + controller->status() +
             migration;
      if (!error.empty()) text += "last round: " + error + "\n";
    }
    std::lock_guard lock(board->mu);
    board->text = std::move(text);
  }
};

using eplb_pointer = caf::stateful_actor<eplb_state>*;

std::string megabytes(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB", static_cast<double>(bytes) / 1e6);
  return buf;
}

// The first rank of each process, in rank order (every rank reports its process's counters:
// one per process counts).
std::vector<size_t> first_rank_of_each_process(size_t ranks, const std::vector<int32_t>& process_of) {
  std::vector<size_t> out;
  std::vector<bool> seen;
  for (size_t r = 0; r < ranks && r < process_of.size(); ++r) {
    const auto p = static_cast<size_t>(process_of[r]);
    if (p >= seen.size()) seen.resize(p + 1, false);
    if (!seen[p]) out.push_back(r);
    seen[p] = true;
  }
  return out;
}

// Expert weights moved, summed over the processes.
std::string migration_line(const std::vector<expert_load_msg>& per_rank, const std::vector<int32_t>& process_of) {
  int64_t fetched = 0, checkpoint = 0, lent = 0, failures = 0, kept = 0;
  std::string last;
  for (size_t r : first_rank_of_each_process(per_rank.size(), process_of)) {
    const expert_load_msg& m = per_rank[r];
    fetched += m.fetched_bytes;
    kept += m.kept_bytes;
    checkpoint += m.checkpoint_bytes;
    lent += m.lent_bytes;
    failures += m.fetch_failures;
    if (!m.fetch_error.empty()) last = m.fetch_error;
  }
  std::string out = "expert weights read: " + megabytes(fetched) + " from holders over the transport (" +
                    megabytes(lent) + " lent), " + megabytes(checkpoint) + " from the checkpoint (group start included); " +
                    megabytes(kept) + " taken over from memory (another rank of the process held them)";
  out += failures ? ", " + std::to_string(failures) + " read(s) from holders failed, last: " + last + "\n" : "\n";
  return out;
}

// Memory: the pairs each rank computes, and per process its routed experts in memory and
// its resident set (`names`: the group's ranks as "node/rankN").
std::string memory_line(const std::vector<expert_load_msg>& per_rank, const std::vector<int32_t>& process_of,
                        const std::vector<std::string>& names) {
  std::string out = "experts computed per rank (redundant copies included):";
  for (const expert_load_msg& m : per_rank) out += " " + std::to_string(m.experts_computed);
  out += "\nmemory per process:";
  const char* sep = " ";
  for (size_t r : first_rank_of_each_process(std::min(per_rank.size(), names.size()), process_of)) {
    const expert_load_msg& m = per_rank[r];
    out += sep + names[r].substr(0, names[r].rfind('/')) + " RSS " + megabytes(m.process_rss_bytes) +
           ", routed experts " + std::to_string(m.process_experts) + " held (" + megabytes(m.process_expert_bytes) + ")";
    sep = "; ";
  }
  return out + "\n";
}

void end_round(eplb_pointer self, const std::string& error) {
  auto& st = self->state;
  st.round = 0;
  st.error = error;
  st.publish();
}

// The process (node) of each rank, numbered in order of first appearance.
std::vector<int32_t> processes_of(const ep_group_view& g) {
  std::vector<std::string> nodes;
  std::vector<int32_t> out;
  for (const std::string& name : g.names) {
    std::string node = name.substr(0, name.rfind('/'));
    auto it = std::find(nodes.begin(), nodes.end(), node);
    if (it == nodes.end()) it = nodes.insert(nodes.end(), node);
    out.push_back(static_cast<int32_t>(it - nodes.begin()));
  }
  return out;
}

void offer(eplb_pointer self, std::shared_ptr<runtime::placement_plan> plan, uint64_t at_step, int64_t expert_bytes,
           const std::vector<std::vector<runtime::expert_part>>& sources, std::string lend_error) {
  auto& st = self->state;
  const bool forced = st.force;
  st.force = false;
  auto msg = std::make_shared<placement_msg>(to_msg(plan->placement));
  st.pending = st.group.engines.size();
  auto failed = std::make_shared<std::string>();
  const uint64_t round = st.round;
  const auto process_of = processes_of(st.group);
  for (size_t r = 0; r < st.group.engines.size(); ++r) {
    auto engine = caf::actor_cast<engine_actor>(st.group.engines[r]);
    auto done = [self, round, r, failed, plan, at_step, forced, expert_bytes, lend_error](const std::string& err) {
      auto& st = self->state;
      if (st.round != round) return;
      if (!err.empty() && failed->empty()) *failed = "rank " + std::to_string(r) + ": " + err;
      if (--st.pending > 0) return;
      st.controller->offered(*plan, at_step, forced, expert_bytes, *failed);
      std::string error = failed->empty() ? std::string() : "offer failed at " + *failed;
      if (!lend_error.empty()) error += (error.empty() ? "" : "; ") + lend_error;
      end_round(self, error);
    };
    self->request(engine, st.interval * 5, eplb_atom_v, *msg, sources[process_of[r]])
      .then([done](bool) { done({}); }, [done](caf::error& e) { done(to_error_reply(e).message); });
  }
}

// Asks the holders to lend what each process gains (runtime::plan_migration), then offers
// the plan with every process's sources. A holder that cannot lend leaves its experts to be
// read from the checkpoint (said in the round's error, not a failed plan).
void lend_and_offer(eplb_pointer self, runtime::placement_plan plan, uint64_t at_step, int64_t expert_bytes,
                    std::shared_ptr<const runtime::ep_placement> current) {
  auto& st = self->state;
  const auto process_of = processes_of(st.group);
  const auto migration = runtime::plan_migration(*current, plan.placement, process_of);
  auto shared_plan = std::make_shared<runtime::placement_plan>(std::move(plan));
  auto sources = std::make_shared<std::vector<std::vector<runtime::expert_part>>>(migration.gains.size());
  if (migration.lends.empty()) return offer(self, shared_plan, at_step, expert_bytes, *sources, {});
  auto lend_error = std::make_shared<std::string>();
  st.pending = migration.lends.size();
  const uint64_t round = st.round;
  const int64_t lease_ms = (st.fetch_timeout + st.interval * 10).count();
  for (const auto& lend : migration.lends) {
    expert_lend_msg m{st.group.id, shared_plan->placement.epoch(), lease_ms, {}, {}};
    for (auto [s, e] : lend.experts) {
      m.slots.push_back(s);
      m.experts.push_back(e);
    }
    auto engine = caf::actor_cast<engine_actor>(st.group.engines[lend.holder]);
    auto done = [self, round, shared_plan, at_step, expert_bytes, sources, lend_error](const std::string& err) {
      auto& st = self->state;
      if (st.round != round) return;
      if (!err.empty() && lend_error->empty()) *lend_error = err;
      if (--st.pending == 0) offer(self, shared_plan, at_step, expert_bytes, *sources, *lend_error);
    };
    const int32_t holder = lend.holder;
    self->request(engine, st.interval * 5, eplb_atom_v, std::move(m))
      .then(
        [done, sources, process_of, gains = migration.gains](std::vector<runtime::expert_part>& parts) {
          // Each part goes to every process that gains its expert.
          for (size_t p = 0; p < gains.size(); ++p)
            for (const auto& part : parts)
              if (std::binary_search(gains[p].begin(), gains[p].end(), std::pair{part.slot, part.expert}))
                (*sources)[p].push_back(part);
          done({});
        },
        [done, holder](caf::error& e) {
          done("rank " + std::to_string(holder) + " lent no experts (they are read from the checkpoint): " +
               to_error_reply(e).message);
        });
  }
}

void finish_reports(eplb_pointer self) {
  auto& st = self->state;
  std::vector<runtime::rank_load_report> reports;
  for (auto& r : st.reports) reports.push_back(std::move(*r));
  st.reports.clear();
  for (const auto& r : reports)
    if (r.group != st.group.id) return end_round(self, "the group is still forming (a rank reports another group)");
  const auto process_of = processes_of(st.group);
  st.migration = migration_line(st.moved, process_of) + memory_line(st.moved, process_of, st.group.names);
  // The hierarchical policy's nodes: the processes, when each has as many ranks (ranks of
  // a process are consecutive); otherwise one node (the global policy).
  std::vector<int64_t> per_process;
  for (int32_t p : process_of) {
    if (static_cast<size_t>(p) >= per_process.size()) per_process.resize(static_cast<size_t>(p) + 1, 0);
    ++per_process[p];
  }
  const bool even = !per_process.empty() && std::all_of(per_process.begin(), per_process.end(),
                                                         [&](int64_t n) { return n == per_process[0]; });
  st.controller->set_nodes(even ? static_cast<int64_t>(per_process.size()) : 1);
  auto plan = st.controller->decide(reports, st.force);
  if (!plan) return end_round(self, plan.error());
  if (!*plan) return end_round(self, {});
  lend_and_offer(self, std::move(**plan), reports[0].steps, reports[0].expert_bytes, reports[0].placement);
}

void start_round(eplb_pointer self) {
  auto& st = self->state;
  if (!st.leader || st.round != 0 || st.group.engines.empty()) return;
  st.round = ++st.rounds;
  const uint64_t round = st.round;
  st.reports.assign(st.group.engines.size(), std::nullopt);
  st.moved.assign(st.group.engines.size(), expert_load_msg{});
  st.pending = st.group.engines.size();
  for (size_t r = 0; r < st.group.engines.size(); ++r) {
    auto engine = caf::actor_cast<engine_actor>(st.group.engines[r]);
    self->request(engine, st.interval * 5, eplb_atom_v)
      .then(
        [self, round, r](expert_load_msg& m) {
          auto& st = self->state;
          if (st.round != round) return;
          auto place = to_placement(m.placement);
          if (!place) return end_round(self, "rank " + std::to_string(r) + " reported a bad placement: " + place.error());
          st.reports[r] = runtime::rank_load_report{m.group, m.steps, m.window_steps, std::move(m.window),
                                                    std::move(m.recent),
                                                    std::make_shared<const runtime::ep_placement>(std::move(*place)),
                                                    m.offered_epoch, m.pairs_computed, m.expert_bytes};
          // The rest (migration and memory counters) without the loads and the placement.
          m.window.clear(), m.recent.clear(), m.placement = {};
          st.moved[r] = std::move(m);
          if (--st.pending == 0) finish_reports(self);
        },
        [self, round, r](caf::error& e) {
          if (self->state.round == round)
            end_round(self, "rank " + std::to_string(r) + " gave no report: " + to_error_reply(e).message);
        });
  }
}

caf::behavior eplb_behavior(eplb_pointer self, std::string node, std::string group, runtime::eplb_policy policy,
                            std::chrono::milliseconds interval, std::chrono::milliseconds fetch_timeout,
                            std::shared_ptr<eplb_board> board) {
  auto& st = self->state;
  st.node = std::move(node);
  st.group_name = std::move(group);
  st.interval = interval;
  st.fetch_timeout = fetch_timeout;
  st.board = std::move(board);
  st.controller.emplace(policy);
  st.publish();
  self->delayed_send(self, interval, tick_atom_v);
  return {
    [self](const membership& m) {
      auto& st = self->state;
      st.group = ep_group_of(m, st.group_name);
      st.leader = !st.group.names.empty() && st.group.names[0].starts_with(st.node + "/");
      st.round = 0;  // replies of a round for the old group are ignored
      st.publish();
    },
    [self](tick_atom) {
      start_round(self);
      self->delayed_send(self, self->state.interval, tick_atom_v);
    },
    [self](eplb_atom, const std::string& command) -> std::string {
      auto& st = self->state;
      if (command != "rebalance") return "unknown balancer command '" + command + "' (status, rebalance)";
      if (!st.leader) return st.board->read();
      st.force = true;
      start_round(self);
      return "rebalance asked: a plan is made from the current window at once unless a placement is being adopted\n";
    },
  };
}

}  // namespace

caf::actor spawn_eplb(caf::actor_system& sys, std::string node, std::string group, runtime::eplb_policy policy,
                      std::chrono::milliseconds interval, std::chrono::milliseconds fetch_timeout,
                      std::shared_ptr<eplb_board> board) {
  auto a = sys.spawn(eplb_behavior, std::move(node), std::move(group), policy, interval, fetch_timeout, board);
  board->actor = a;
  return a;
}

}  // namespace shoal::actors
