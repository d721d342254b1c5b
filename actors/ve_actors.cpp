#include "actors/ve_actors.hpp"

#include <map>

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/system_messages.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "runtime/placement/ve_balancer.hpp"

namespace shoal::actors {
namespace {

// -- worker ----------------------------------------------------------------------------------

struct worker_state {
  static inline const char* name = "ve_worker";
  std::string node;
  std::unique_ptr<runtime::ve_worker> worker;
};

ve_worker_actor::behavior_type worker_behavior(ve_worker_actor::stateful_pointer<worker_state> self, std::string node,
                                               std::unique_ptr<runtime::ve_worker> worker) {
  self->state.node = std::move(node);
  self->state.worker = std::move(worker);
  return {
    [self](encode_atom, const std::vector<runtime::prompt_image>& images) -> caf::result<std::vector<runtime::remote_memory>> {
      auto rows = self->state.worker->encode(images);
      if (!rows) return make_error(rows.error().bad_input ? errc::invalid_request : errc::unknown, rows.error().message);
      return std::move(*rows);
    },
    [self](stats_atom) {
      const runtime::ve_worker_counters c = self->state.worker->stats();
      return ve_worker_stats{self->state.node, c.jobs, c.images_encoded, c.patches_encoded, c.cache_hits,
                             c.cache.entries, c.cache.bytes, c.cache.capacity_bytes, c.encode_s};
    },
  };
}

// -- balancer --------------------------------------------------------------------------------

struct job {
  caf::typed_response_promise<std::vector<runtime::remote_memory>> promise;
  std::vector<runtime::prompt_image> images;
  int64_t patches = 0;
  uint64_t placement = 0;         // answers of older placements are stale
  std::vector<int64_t> tried;     // workers that failed it
};

struct worker_ref {
  ve_worker_actor actor;
  std::string node;
};

struct balancer_state {
  static inline const char* name = "ve_balancer";
  ve_balancer_options options;
  runtime::ve_balancer policy;
  std::map<int64_t, worker_ref> workers;       // policy id → worker
  std::map<caf::actor_addr, int64_t> ids;      // stable ids while a worker lives
  std::map<int64_t, job> jobs;
  int64_t next_worker = 0, next_job = 0;
  uint64_t taken = 0, replaced = 0, failed = 0;
};

using balancer_pointer = ve_balancer_actor::stateful_pointer<balancer_state>;

void fail(balancer_pointer self, int64_t id, errc code, std::string message) {
  auto& st = self->state;
  auto it = st.jobs.find(id);
  if (it == st.jobs.end()) return;
  st.policy.done(id);
  ++st.failed;
  it->second.promise.deliver(make_error(code, std::move(message)));
  st.jobs.erase(it);
}

void dispatch(balancer_pointer self, int64_t id) {
  auto& st = self->state;
  job& j = st.jobs.at(id);
  std::optional<int64_t> w;
  if (static_cast<int>(j.tried.size()) < st.options.max_placements) w = st.policy.place(id, j.patches, j.tried);
  if (!w) {
    return fail(self, id, errc::no_engine,
                j.tried.empty() ? "no vision-encoder worker is up"
                                : "no vision-encoder worker left for the images (" + std::to_string(j.tried.size()) +
                                      " failed them)");
  }
  const uint64_t placement = ++j.placement;
  const int64_t worker = *w;
  self->request(st.workers.at(worker).actor, st.options.timeout, encode_atom_v, j.images)
    .then(
      [self, id, placement](std::vector<runtime::remote_memory>& rows) {
        auto& st = self->state;
        auto it = st.jobs.find(id);
        if (it == st.jobs.end() || it->second.placement != placement) return;  // placed again meanwhile
        st.policy.done(id);
        it->second.promise.deliver(std::move(rows));
        st.jobs.erase(it);
      },
      [self, id, placement, worker](caf::error& e) {
        auto& st = self->state;
        auto it = st.jobs.find(id);
        if (it == st.jobs.end() || it->second.placement != placement) return;
        error_reply r = to_error_reply(e);
        if (r.code == errc::invalid_request) return fail(self, id, r.code, std::move(r.message));
        it->second.tried.push_back(worker);
        ++st.replaced;
        dispatch(self, id);
      });
}

void replace_all(balancer_pointer self, const std::vector<int64_t>& jobs) {
  for (int64_t id : jobs)
    if (self->state.jobs.contains(id)) {
      ++self->state.replaced;
      dispatch(self, id);
    }
}

void drop_worker(balancer_pointer self, int64_t worker) {
  auto& st = self->state;
  if (auto w = st.workers.find(worker); w != st.workers.end()) {
    st.ids.erase(w->second.actor.address());
    self->demonitor(w->second.actor.address());
    st.workers.erase(w);
  }
  replace_all(self, st.policy.remove_worker(worker));
}

void on_membership(balancer_pointer self, const membership& m) {
  auto& st = self->state;
  std::map<caf::actor_addr, const node_info*> up;
  for (const node_info& n : m.nodes)
    if (n.ve_worker) up[n.ve_worker.address()] = &n;
  std::vector<int64_t> gone;
  for (const auto& [addr, id] : st.ids)
    if (!up.contains(addr)) gone.push_back(id);
  for (int64_t id : gone) drop_worker(self, id);
  for (const auto& [addr, n] : up) {
    int64_t id;
    if (auto it = st.ids.find(addr); it != st.ids.end()) {
      id = it->second;
    } else {
      id = st.next_worker++;
      auto actor = caf::actor_cast<ve_worker_actor>(n->ve_worker);
      st.ids[addr] = id;
      st.workers[id] = {actor, n->name};
      self->monitor(actor);
      st.policy.add_worker(id);
    }
    if (n->draining) replace_all(self, st.policy.drain_worker(id));
    else st.policy.add_worker(id);
  }
}

ve_balancer_actor::behavior_type balancer_behavior(balancer_pointer self, ve_balancer_options options) {
  self->state.options = options;
  self->set_down_handler([self](caf::down_msg& msg) {
    if (auto it = self->state.ids.find(msg.source); it != self->state.ids.end()) drop_worker(self, it->second);
  });
  return {
    [self](encode_atom, request_id, std::vector<runtime::prompt_image>& images)
      -> caf::result<std::vector<runtime::remote_memory>> {
      auto& st = self->state;
      if (images.empty()) return make_error(errc::invalid_request, "no images to encode");
      ++st.taken;
      const int64_t id = st.next_job++;
      job& j = st.jobs[id];
      for (const runtime::prompt_image& im : images) j.patches += im.count;
      j.images = std::move(images);
      j.promise = self->make_response_promise<std::vector<runtime::remote_memory>>();
      auto promise = j.promise;
      dispatch(self, id);
      return promise;
    },
    [self](stats_atom) {
      const auto& st = self->state;
      ve_report r;
      r.jobs = st.taken;
      r.replaced = st.replaced;
      r.failed = st.failed;
      for (const runtime::ve_worker_load& l : st.policy.loads()) {
        auto w = st.workers.find(l.worker);
        r.workers.push_back({w == st.workers.end() ? "?" : w->second.node, l.draining, l.jobs, l.patches, l.placed,
                             l.completed, l.given_back});
      }
      return r;
    },
    [self](const membership& m) { on_membership(self, m); },
  };
}

}  // namespace

ve_worker_actor spawn_ve_worker(caf::actor_system& sys, std::string node, std::unique_ptr<runtime::ve_worker> worker) {
  return sys.spawn<caf::detached>(worker_behavior, std::move(node), std::move(worker));
}

ve_balancer_actor spawn_ve_balancer(caf::actor_system& sys, ve_balancer_options options) {
  return sys.spawn(balancer_behavior, options);
}

}  // namespace shoal::actors
