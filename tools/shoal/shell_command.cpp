// `shoal shell [--connect HOST:PORT] [-c "cmd; cmd"]`: the operator's shell, connected to any
// node's agent over CAF's middleman. Interactive with readline (history, tab completion of
// commands and actor names), or scripted with -c (exit code 1 when a command failed).
// Actor names: "<node>" for a node, "<node>/rank<i>", "<node>/gateway"; a bare "rank<i>" or
// "gateway" means the connected node's.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <readline/history.h>
#include <readline/readline.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <iterator>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/after.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/cluster_tls.hpp"
#include "actors/interfaces.hpp"
#include "actors/rank_actor.hpp"
#include "tools/shoal/commands.hpp"

namespace shoal::tools {

namespace {

using namespace std::chrono_literals;
constexpr auto ask_timeout = 10s;

struct shell_config : caf::actor_system_config {
  explicit shell_config(const actors::tls_files& tls) {
    load<caf::io::middleman>();
    actors::add_message_types(*this);
    set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds(500)});
    set("middleman.connection-timeout", caf::timespan{std::chrono::seconds(5)});
    // Everything goes through the node connected to (see shoald's system_config).
    set("middleman.enable-automatic-connections", false);
    if (tls.enabled()) actors::use_tls(*this, tls);
  }
};

const std::vector<std::string> command_names = {"nodes", "actors", "stats", "requests", "submit", "drain",
                                                "kill", "storage", "corrupt", "swa", "balancers", "ve", "eplb", "help", "quit"};

const char* help_text =
  "nodes                     the cluster's nodes (name, address, roles, ranks, state)\n"
  "actors [node]             actors by name: <node>, <node>/gateway, <node>/rank<i>\n"
  "stats <actor>             counters of one actor (a node name for the node itself)\n"
  "requests                  requests in flight at every gateway\n"
  "submit <prompt>           generates through a gateway, streaming the text (max 32 tokens)\n"
  "drain <node>              the node stops taking requests and finishes running ones\n"
  "kill <actor|node>         kills a rank's engine or a storage node, or a whole node process\n"
  "storage                   every storage node: chunks, usage, watermarks, GC/TTL counters\n"
  "corrupt <node>/storage<i> <hi>:<lo>:<index>\n"
  "                          flips a byte of that chunk's file (tests; key words in hex)\n"
  "swa                       the SWA-cache tier: directory size, slots per store, engines'\n"
  "                          restores / replays / fetches, fetch latency p50/p99\n"
  "balancers                 the gateways' prefill and decode balancers: policy, tiers and\n"
  "                          their engines, per engine requests, KV tokens, predicted finish,\n"
  "                          placements; the decode balance ratio now and over the last minute\n"
  "ve                        the vision-encoder pool: per worker queue depth in patches, jobs\n"
  "                          placed / completed / given back; images encoded, cache hits\n"
  "eplb [GROUP] [rebalance]  each expert-parallel group's balancer (engine.ep_group): per-layer\n"
  "                          imbalance now and over the load window, pairs per rank, the last\n"
  "                          plan and the expert weights it moved; `rebalance` plans anew now\n"
  "help                      this text\n"
  "quit                      leaves the shell\n";

class shell {
 public:
  shell(caf::actor_system& sys, actors::node_agent_actor agent, std::string where)
      : sys_(sys), self_(sys), agent_(std::move(agent)), where_(std::move(where)) {}

  // Runs one command line; false when it failed (the message is printed).
  bool run(const std::string& line);
  std::vector<std::string> completions() const;

 private:
  bool dispatch(const std::string& line);
  std::optional<actors::membership> members();
  const actors::node_info* node(const actors::membership& m, const std::string& name);
  // Splits "<node>/<actor>" (or "<actor>" on the connected node) and finds the node's agent.
  bool resolve(const std::string& target, actors::node_agent_actor& agent, std::string& actor);
  bool fail(const std::string& message) {
    fmt::print(stderr, "error: {}\n", message);
    return false;
  }
  template <class T, class Handle, class... Ts>
  std::optional<T> ask(const Handle& h, Ts... xs);
  // As ask, for one of several actors a command lists: one that does not answer gets a line
  // "<who>: no answer (<why>)" in the listing, the rest are still shown, and the command
  // fails at its end (unanswered_).
  template <class T, class Handle, class... Ts>
  std::optional<T> ask_each(const std::string& who, const Handle& h, Ts... xs);

  bool cmd_nodes();
  bool cmd_actors(const std::string& which);
  bool cmd_stats(const std::string& target);
  bool cmd_requests();
  bool cmd_submit(const std::string& prompt);
  bool cmd_drain(const std::string& name);
  bool cmd_kill(const std::string& target);
  bool cmd_storage();
  bool cmd_swa();
  bool cmd_balancers();
  bool cmd_ve();
  bool cmd_eplb(const std::string& arg);
  bool cmd_corrupt(const std::string& args);
  // The storage node actor named "<node>/storage<i>", or a printed error.
  std::optional<actors::storage_node_actor> storage_node(const std::string& name);

  caf::actor_system& sys_;
  caf::scoped_actor self_;
  actors::node_agent_actor agent_;
  std::string where_;
  std::string self_name_;
  std::vector<std::string> known_names_;
  bool unanswered_ = false;  // an ask_each of the running command went unanswered
};

template <class T, class Handle, class... Ts>
std::optional<T> shell::ask(const Handle& h, Ts... xs) {
  std::optional<T> out;
  self_->request(h, ask_timeout, xs...)
    .receive([&](T& x) { out = std::move(x); },
             [&](caf::error& e) { fail(actors::to_error_reply(e).message); });
  return out;
}

template <class T, class Handle, class... Ts>
std::optional<T> shell::ask_each(const std::string& who, const Handle& h, Ts... xs) {
  std::optional<T> out;
  self_->request(h, ask_timeout, xs...)
    .receive([&](T& x) { out = std::move(x); },
             [&](caf::error& e) {
               unanswered_ = true;
               fmt::print("{}: no answer ({})\n", who, actors::to_error_reply(e).message);
             });
  return out;
}

std::optional<actors::membership> shell::members() {
  auto m = ask<actors::membership>(agent_, members_atom_v);
  if (!m) return std::nullopt;
  known_names_.clear();
  for (const auto& n : m->nodes) {
    if (n.agent == caf::actor_cast<caf::actor>(agent_)) self_name_ = n.name;
    known_names_.push_back(n.name);
    for (const auto& r : n.ranks) known_names_.push_back(n.name + "/rank" + std::to_string(r.index));
    for (const auto& role : n.roles)
      if (role == "gateway") known_names_.push_back(n.name + "/gateway");
    for (size_t i = 0; i < n.storage.size(); ++i) known_names_.push_back(n.name + "/storage" + std::to_string(i));
  }
  return m;
}

const actors::node_info* shell::node(const actors::membership& m, const std::string& name) {
  for (const auto& n : m.nodes)
    if (n.name == name) return &n;
  return nullptr;
}

bool shell::resolve(const std::string& target, actors::node_agent_actor& agent, std::string& actor) {
  auto m = members();
  if (!m) return false;
  std::string node_name = self_name_;
  actor = target;
  if (auto slash = target.find('/'); slash != std::string::npos) {
    node_name = target.substr(0, slash);
    actor = target.substr(slash + 1);
  } else if (node(*m, target)) {
    node_name = actor = target;
  }
  const actors::node_info* n = node(*m, node_name);
  if (!n) return fail("no node '" + node_name + "' in the cluster (try `nodes`)");
  agent = caf::actor_cast<actors::node_agent_actor>(n->agent);
  return true;
}

bool shell::cmd_nodes() {
  auto m = members();
  if (!m) return false;
  fmt::print("{:<16} {:<22} {:<16} {:>5}  {}\n", "NODE", "ADDRESS", "ROLES", "RANKS", "STATE");
  for (const auto& n : m->nodes) {
    std::string roles;
    for (const auto& r : n.roles) roles += (roles.empty() ? "" : ",") + r;
    fmt::print("{:<16} {:<22} {:<16} {:>5}  {}\n", n.name, n.host + ":" + std::to_string(n.port), roles,
               n.ranks.size(), n.draining ? "draining" : "up");
  }
  return true;
}

bool shell::cmd_actors(const std::string& which) {
  auto m = members();
  if (!m) return false;
  if (!which.empty() && !node(*m, which)) return fail("no node '" + which + "' in the cluster");
  for (const auto& n : m->nodes) {
    if (!which.empty() && n.name != which) continue;
    fmt::print("{}  (node agent)\n", n.name);
    for (const auto& role : n.roles)
      if (role == "gateway") fmt::print("{}/gateway  (gateway: HTTP API, request relays)\n", n.name);
    // node_info.balancers: the prefill, decode and VE balancers (shell `balancers`, `ve`).
    static constexpr const char* balancer_names[] = {"prefill_balancer", "decode_balancer", "ve_balancer"};
    for (size_t i = 0; i < n.balancers.size() && i < 3; ++i)
      if (n.balancers[i]) fmt::print("{}/{}  (balancer)\n", n.name, balancer_names[i]);
    if (n.ve_worker) fmt::print("{}/ve_worker  (vision encoder)\n", n.name);
    for (const auto& r : n.ranks)
      fmt::print("{}/rank{}  (engine{})\n", n.name, r.index, r.rank ? " + expert-parallel rank" : "");
    for (size_t i = 0; i < n.storage.size(); ++i) fmt::print("{}/storage{}  (storage node)\n", n.name, i);
  }
  return true;
}

bool shell::cmd_stats(const std::string& target) {
  if (target.empty()) return fail("usage: stats <actor>");
  actors::node_agent_actor agent;
  std::string actor;
  if (!resolve(target, agent, actor)) return false;
  auto text = ask<std::string>(agent, describe_atom_v, actor);
  if (!text) return false;
  fmt::print("{}\n", *text);
  return true;
}

bool shell::cmd_requests() {
  auto m = members();
  if (!m) return false;
  size_t total = 0;
  for (const auto& n : m->nodes) {
    auto lines = ask<std::vector<std::string>>(caf::actor_cast<actors::node_agent_actor>(n.agent), requests_atom_v);
    if (!lines) return false;
    for (const auto& l : *lines) fmt::print("{}: {}\n", n.name, l);
    total += lines->size();
  }
  fmt::print("{} request(s) in flight\n", total);
  return true;
}

bool shell::cmd_submit(const std::string& prompt) {
  if (prompt.empty()) return fail("usage: submit <prompt>");
  auto m = members();
  if (!m) return false;
  const actors::node_info* gw = nullptr;
  for (const auto& n : m->nodes)
    for (const auto& role : n.roles)
      if (role == "gateway" && !n.draining && (!gw || n.name == self_name_)) gw = &n;
  if (!gw) return fail("no gateway node is up");
  auto id = ask<request_id>(caf::actor_cast<actors::node_agent_actor>(gw->agent), submit_atom_v, prompt,
                            int32_t{32}, caf::actor_cast<caf::actor>(self_));
  if (!id) return false;
  bool done = false, ok = true;
  self_->receive_while([&] { return !done; })(
    [&](const actors::text_event& ev) {
      if (ev.id != *id) return;
      fmt::print("{}", ev.text);
      std::fflush(stdout);
      if (ev.finished) {
        done = true;
        ok = ev.reason != runtime::finish_reason::error;
        fmt::print("\n[{}{}{}]\n", runtime::to_string(ev.reason), ev.error.empty() ? "" : ": ", ev.error);
      }
    },
    caf::after(std::chrono::seconds(120)) >> [&] {
      done = true;
      ok = fail("no text within 120 s");
    });
  return ok;
}

bool shell::cmd_drain(const std::string& name) {
  if (name.empty()) return fail("usage: drain <node>");
  auto m = members();
  if (!m) return false;
  const actors::node_info* n = node(*m, name);
  if (!n) return fail("no node '" + name + "' in the cluster (try `nodes`)");
  auto changed = ask<bool>(caf::actor_cast<actors::node_agent_actor>(n->agent), drain_atom_v);
  if (!changed) return false;
  fmt::print("{}: {}\n", name, *changed ? "draining" : "was already draining");
  return true;
}

bool shell::cmd_kill(const std::string& target) {
  if (target.empty()) return fail("usage: kill <actor|node>");
  actors::node_agent_actor agent;
  std::string actor;
  if (!resolve(target, agent, actor)) return false;
  if (!ask<bool>(agent, kill_atom_v, actor)) return false;
  fmt::print("killed {}\n", target);
  return true;
}

std::optional<actors::storage_node_actor> shell::storage_node(const std::string& name) {
  auto m = members();
  if (!m) return std::nullopt;
  for (const auto& n : m->nodes)
    for (size_t i = 0; i < n.storage.size(); ++i)
      if (name == n.name + "/storage" + std::to_string(i)) return caf::actor_cast<actors::storage_node_actor>(n.storage[i]);
  fail("no storage node '" + name + "' (try `storage`)");
  return std::nullopt;
}

bool shell::cmd_storage() {
  auto m = members();
  if (!m) return false;
  size_t count = 0;
  for (const auto& n : m->nodes)
    for (size_t i = 0; i < n.storage.size(); ++i, ++count) {
      auto s = ask_each<actors::storage_stats_snapshot>(n.name + "/storage" + std::to_string(i),
                                                        caf::actor_cast<actors::storage_node_actor>(n.storage[i]),
                                                        stats_atom_v);
      if (!s) continue;
      fmt::print("{}/storage{}: chunks={} usage={}/{} MiB ({:.1f}%) watermarks={}%/{}% gc_runs={} evicted={} "
                 "expired={} corrupt_removed={} puts={} gets={} hits={}\n",
                 n.name, i, s->chunks, s->usage_bytes >> 20, s->capacity_bytes >> 20,
                 s->capacity_bytes ? 100.0 * static_cast<double>(s->usage_bytes) / static_cast<double>(s->capacity_bytes) : 0.0,
                 s->high_watermark_pct, s->low_watermark_pct, s->gc_runs, s->evicted_chunks, s->expired_chunks,
                 s->corrupt_removed, s->puts, s->gets, s->get_hits);
    }
  fmt::print("{} storage node(s)\n", count);
  return true;
}

bool shell::cmd_balancers() {
  auto m = members();
  if (!m) return false;
  bool any = false;
  for (const auto& n : m->nodes)
    for (size_t i = 0; i < n.balancers.size() && i < 2; ++i) {  // [2]: the VE balancer (`ve`)
      const caf::actor& b = n.balancers[i];
      any = true;
      auto r = ask_each<actors::balancer_report>(n.name + (i == 0 ? "/prefill_balancer" : "/decode_balancer"),
                                                 caf::actor_cast<actors::prefill_balancer_actor>(b), stats_atom_v);
      if (!r) continue;
      if (r->kind == "prefill") {
        std::string tiers;
        for (size_t t = 0; t < r->tier_placements.size(); ++t) {
          const std::string lo = t == 0 ? "0" : std::to_string(r->tier_bounds[t - 1]);
          const std::string hi = t < r->tier_bounds.size() ? std::to_string(r->tier_bounds[t]) : "inf";
          tiers += fmt::format("{}[{}, {}): {} placed", t ? "; " : "", lo, hi, r->tier_placements[t]);
        }
        fmt::print("{}/prefill_balancer: policy={} tiers {} cost_models={}\n", n.name, r->policy, tiers, r->cost);
      } else {
        fmt::print("{}/decode_balancer: policy={} balance_ratio now={:.3f} last_minute={:.3f} weights={}\n", n.name,
                   r->policy, r->balance_now, r->balance_window, r->cost);
      }
      for (const auto& e : r->engines) {
        if (r->kind == "prefill")
          fmt::print("  {}: tier={} requests={} prompt_tokens={} predicted_finish_s={:.3f} placed={}\n", e.engine,
                     e.tier < 0 ? std::string("all") : std::to_string(e.tier), e.in_flight, e.kv_tokens,
                     e.predicted_finish_s, e.placed);
        else
          fmt::print("  {}: requests={} kv_tokens={} placed={}\n", e.engine, e.in_flight, e.kv_tokens, e.placed);
      }
    }
  if (!any) fmt::print("no balancers in the cluster (they run on gateway nodes)\n");
  return true;
}

// eplb [GROUP] [rebalance]: every expert-parallel group's balancer (or GROUP's).
bool shell::cmd_eplb(const std::string& arg) {
  std::istringstream in(arg);
  std::vector<std::string> words{std::istream_iterator<std::string>(in), std::istream_iterator<std::string>()};
  const bool rebalance = !words.empty() && words.back() == "rebalance";
  if (rebalance) words.pop_back();
  if (words.size() > 1) return fail("usage: eplb [GROUP] [rebalance]");
  auto m = members();
  if (!m) return false;
  std::set<std::string> groups;
  for (const auto& n : m->nodes)
    if (!n.ep_group.empty()) groups.insert(n.ep_group);
  if (!words.empty() && !groups.contains(words[0]))
    return fail("no expert-parallel group '" + words[0] + "' in the cluster");
  if (!words.empty()) groups = {words[0]};
  if (groups.empty()) {
    fmt::print("no expert-parallel group in the cluster (engine.expert_parallel)\n");
    return true;
  }
  bool ok = true;
  for (const std::string& group : groups) {
    // The balancer that acts is the one on the node of the group's rank 0.
    const actors::ep_group_view g = actors::ep_group_of(*m, group);
    const std::string leader = g.names.empty() ? std::string() : g.names[0].substr(0, g.names[0].find('/'));
    const auto n = std::find_if(m->nodes.begin(), m->nodes.end(), [&](const auto& x) { return x.name == leader; });
    if (n == m->nodes.end()) {
      ok = fail("group '" + group + "': no node of its rank 0 in the membership");
      continue;
    }
    auto text = ask<std::string>(caf::actor_cast<actors::node_agent_actor>(n->agent), eplb_atom_v,
                                 std::string(rebalance ? "rebalance" : "status"));
    if (!text) ok = false;
    else fmt::print("{}: {}", leader, *text);
  }
  return ok;
}

bool shell::cmd_ve() {
  auto m = members();
  if (!m) return false;
  bool any = false;
  for (const auto& n : m->nodes) {
    if (n.balancers.size() < 3 || !n.balancers[2]) continue;
    any = true;
    auto r = ask_each<actors::ve_report>(n.name + "/ve_balancer", caf::actor_cast<actors::ve_balancer_actor>(n.balancers[2]),
                                         stats_atom_v);
    if (!r) continue;
    fmt::print("{}/ve_balancer: jobs={} placed_again={} failed={} workers={}\n", n.name, r->jobs, r->replaced, r->failed,
               r->workers.size());
    for (const auto& w : r->workers)
      fmt::print("  {}: queued_patches={} jobs={} placed={} completed={} given_back={}{}\n", w.node, w.patches, w.jobs,
                 w.placed, w.completed, w.given_back, w.draining ? " draining" : "");
  }
  for (const auto& n : m->nodes) {
    if (!n.ve_worker) continue;
    any = true;
    // A worker busy encoding (or hung) answers late: said on its line, the others still shown.
    self_->request(caf::actor_cast<actors::ve_worker_actor>(n.ve_worker), ask_timeout, stats_atom_v)
      .receive(
        [&](const actors::ve_worker_stats& s) {
          fmt::print("{}/ve_worker: jobs={} images_encoded={} patches={} cache_hits={} cache={} entries {}/{} MiB "
                     "encode_s={:.3f}\n",
                     n.name, s.jobs, s.images_encoded, s.patches_encoded, s.cache_hits, s.cache_entries,
                     s.cache_bytes >> 20, s.cache_capacity >> 20, s.encode_s);
        },
        [&](caf::error& e) { fmt::print("{}/ve_worker: no answer ({})\n", n.name, actors::to_error_reply(e).message); });
  }
  if (!any) fmt::print("no vision-encoder pool in the cluster (ve nodes and a gateway of a vision model)\n");
  return true;
}

bool shell::cmd_swa() {
  auto m = members();
  if (!m) return false;
  bool directory = false;
  for (const auto& n : m->nodes) {
    if (!n.swa_directory) continue;
    directory = true;
    auto d = ask_each<actors::swa_directory_stats>(n.name + "/swa_directory",
                                                   caf::actor_cast<actors::swa_directory_actor>(n.swa_directory), stats_atom_v);
    if (!d) continue;
    fmt::print("{}/swa_directory: entries={} stores={} lookups={} hits={} reports={} full_reports={}\n", n.name,
               d->entries, d->nodes.size(), d->lookups, d->hits, d->reports, d->full_reports);
    for (size_t i = 0; i < d->nodes.size(); ++i) fmt::print("  {}: {} slot(s) registered\n", d->nodes[i], d->slots[i]);
  }
  if (!directory) fmt::print("no SWA directory in the cluster (a node with the 'directory' role)\n");
  for (const auto& n : m->nodes) {
    if (!n.swa_store) continue;
    auto s = ask_each<actors::swa_store_stats>(n.name + "/swa_store", caf::actor_cast<actors::swa_store_actor>(n.swa_store),
                                               stats_atom_v);
    if (!s) continue;
    fmt::print("{}/swa_store: slots={}/{} slot_bytes={} puts={} evictions={} served={}\n", n.name, s->slots,
               s->capacity, s->slot_bytes, s->puts, s->evictions, s->served);
    for (const auto& r : n.ranks) {
      auto e = ask_each<actors::engine_stats_snapshot>("  rank" + std::to_string(r.index),
                                                       caf::actor_cast<actors::engine_actor>(r.engine), stats_atom_v);
      if (!e) continue;
      // Replays: windows recomputed (bounded replay, or exact hits cut back); fetch failures:
      // the holder failed, died, timed out or sent a bad slot.
      const runtime::cache_stats& c = e->engine.cache;
      const uint64_t failed = c.swa_fetch_failures + c.swa_fetch_timeouts;
      fmt::print("  rank{}: restores={} replays={} lookups={} fetches={} fetch_failures={} misses={} "
                 "fetch_ms p50={:.2f} p99={:.2f}\n",
                 r.index, c.swa_restores, c.replays + c.swa_cut, c.swa_lookups, c.swa_fetches, failed,
                 c.swa_lookups - std::min(c.swa_lookups, c.swa_fetches + failed), e->swa_fetch_p50_ms,
                 e->swa_fetch_p99_ms);
    }
  }
  return true;
}

bool shell::cmd_corrupt(const std::string& args) {
  std::istringstream in(args);
  std::string name, chunk;
  in >> name >> chunk;
  unsigned long long hi = 0, lo = 0;
  int index = -1;
  if (name.empty() || std::sscanf(chunk.c_str(), "%llx:%llx:%d", &hi, &lo, &index) != 3)
    return fail("usage: corrupt <node>/storage<i> <hi>:<lo>:<index> (key words in hex)");
  auto node = storage_node(name);
  if (!node) return false;
  auto found = ask<bool>(*node, corrupt_atom_v, runtime::block_key{.lo = lo, .hi = hi}, int32_t{index});
  if (!found) return false;
  if (!*found) return fail("no chunk " + chunk + " on " + name);
  fmt::print("corrupted {} on {}\n", chunk, name);
  return true;
}

std::string trim(const std::string& s) {
  auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

bool shell::run(const std::string& raw) {
  unanswered_ = false;
  const bool ok = dispatch(raw);
  if (unanswered_) return fail("an actor did not answer (its line above says which)");
  return ok;
}

bool shell::dispatch(const std::string& raw) {
  std::string line = trim(raw);
  if (line.empty()) return true;
  auto space = line.find(' ');
  std::string cmd = line.substr(0, space);
  std::string arg = space == std::string::npos ? "" : trim(line.substr(space + 1));
  if (cmd == "nodes") return cmd_nodes();
  if (cmd == "actors") return cmd_actors(arg);
  if (cmd == "stats") return cmd_stats(arg);
  if (cmd == "requests") return cmd_requests();
  if (cmd == "submit") return cmd_submit(arg);
  if (cmd == "drain") return cmd_drain(arg);
  if (cmd == "kill") return cmd_kill(arg);
  if (cmd == "storage") return cmd_storage();
  if (cmd == "swa") return cmd_swa();
  if (cmd == "balancers") return cmd_balancers();
  if (cmd == "ve") return cmd_ve();
  if (cmd == "eplb") return cmd_eplb(arg);
  if (cmd == "corrupt") return cmd_corrupt(arg);
  if (cmd == "help") {
    fmt::print("{}", help_text);
    return true;
  }
  return fail("unknown command '" + cmd + "' (try `help`)");
}

std::vector<std::string> shell::completions() const {
  std::vector<std::string> out = command_names;
  out.insert(out.end(), known_names_.begin(), known_names_.end());
  return out;
}

// readline's completion callbacks are C functions: the shell they complete for.
shell* completing = nullptr;

char* complete_next(const char* text, int state) {
  static std::vector<std::string> matches;
  static size_t next = 0;
  if (state == 0) {
    matches.clear();
    next = 0;
    for (const auto& w : completing->completions())
      if (w.rfind(text, 0) == 0) matches.push_back(w);
  }
  return next < matches.size() ? strdup(matches[next++].c_str()) : nullptr;
}

char** complete(const char* text, int, int) {
  rl_attempted_completion_over = 1;
  return rl_completion_matches(text, complete_next);
}

int interactive(shell& sh) {
  completing = &sh;
  rl_attempted_completion_function = complete;
  rl_completer_word_break_characters = const_cast<char*>(" \t");
  sh.run("nodes");
  while (char* raw = readline("shoal> ")) {
    std::string line = raw;
    std::free(raw);
    if (trim(line).empty()) continue;
    add_history(line.c_str());
    if (trim(line) == "quit" || trim(line) == "exit") break;
    sh.run(line);
  }
  return 0;
}

int run_shell(const std::string& connect, const std::string& script, const actors::tls_files& tls) {
  auto colon = connect.rfind(':');
  if (colon == std::string::npos) {
    fmt::print(stderr, "shoal shell: --connect wants HOST:PORT, got '{}'\n", connect);
    return 2;
  }
  std::string host = connect.substr(0, colon);
  uint16_t port = static_cast<uint16_t>(std::atoi(connect.c_str() + colon + 1));
  if (tls.enabled() != !tls.key.empty() || tls.enabled() != !tls.ca_file.empty()) {
    fmt::print(stderr, "shoal shell: --tls-cert, --tls-key and --tls-ca go together\n");
    return 2;
  }
  if (tls.enabled())
    if (std::string bad = actors::check_tls_files(tls); !bad.empty()) {
      fmt::print(stderr, "shoal shell: {}\n", bad);
      return 2;
    }
  shell_config cfg(tls);
  caf::actor_system sys{cfg};
  auto agent = actors::connect_agent(sys, host, port, std::chrono::seconds(10));
  if (!agent) {
    fmt::print(stderr, "shoal shell: cannot reach a shoal node at {}: {}\n", connect, agent.error());
    std::fflush(stderr);
    std::_Exit(1);
  }
  int rc = 0;
  {
    shell sh(sys, *agent, connect);
    if (script.empty()) {
      rc = interactive(sh);
    } else {
      std::stringstream in(script);
      for (std::string cmd; std::getline(in, cmd, ';');)
        if (!sh.run(cmd)) rc = 1;
    }
  }
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(rc);  // the middleman's teardown can block once remote nodes are gone (CAF 0.17)
}

}  // namespace

void add_shell_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("shell", "interactive shell connected to a shoal node");
  static std::string connect, script, state_dir = ".shoal";
  static actors::tls_files tls;
  cmd->add_option("--connect", connect,
                  "HOST:PORT of any node's node.listen (default: the cluster `shoal up` started with --state-dir, "
                  "else 127.0.0.1:7100)");
  cmd->add_option("--state-dir", state_dir, "the state directory given to `shoal up`")->capture_default_str();
  cmd->add_option("-c", script, "run these ';'-separated commands and exit (exit code 1 when one failed)");
  cmd->add_option("--tls-cert", tls.certificate, "a certificate of the cluster CA (clusters with [cluster] tls_*)");
  cmd->add_option("--tls-key", tls.key, "its private key");
  cmd->add_option("--tls-ca", tls.ca_file, "the cluster CA");
  cmd->callback([] {
    if (connect.empty()) connect = recorded_cluster(state_dir);
    if (connect.empty()) connect = "127.0.0.1:7100";
    set_exit_code(run_shell(connect, script, tls));
  });
}

}  // namespace shoal::tools
