// Engines of one expert-parallel group stepped in lockstep on threads (local_ep_hub), and the
// one-engine reference they must equal: shared by the engine-level expert-parallel tests.
#pragma once

#include <algorithm>
#include <barrier>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include "runtime/engine/engine.hpp"
#include "runtime/ep/expert_parallel.hpp"
#include "tests/support/tiny_models.hpp"

namespace shoal::test::ep {

using runtime::engine;
using runtime::engine_config;
using runtime::local_ep_hub;
using runtime::sampling_params;
using runtime::token_event;


// ---- engine level ----

inline engine_config base_config(int64_t blocks = 128) { return test::exact_engine_config(blocks); }

inline engine_config ep_config(local_ep_hub& hub, int32_t rank) {
  engine_config c = base_config();
  c.ep = engine_config::ep_config{};
  c.ep->layout = {rank, hub.size()};
  c.ep->transport = hub.transport(rank);
  return c;
}

struct job {
  std::vector<int32_t> prompt;
  sampling_params params;
};

// Requests of rank r (none for `idle`): greedy and seeded sampling, different lengths.
inline std::vector<job> jobs_for(int32_t r, uint32_t salt, int32_t idle) {
  std::vector<job> out;
  if (r == idle) return out;
  for (uint32_t i = 0; i < 3; ++i) {
    job j;
    j.prompt = test::random_tokens(10 + 17 * i + 3 * static_cast<uint32_t>(r), salt + 100 * r + i);
    j.params.max_tokens = 6 + static_cast<int32_t>(i) * 3;
    j.params.ignore_eos = true;
    if (i % 2 == 1) {
      j.params.temperature = 0.8f;
      j.params.top_p = 0.9f;
      j.params.seed = salt + 1000 * r + i;
    }
    out.push_back(j);
  }
  return out;
}

// Steps every engine on its own thread in lockstep until none has work; each engine's events.
// `between(rank, step)` runs on the rank's thread before each of its steps.
inline std::vector<std::vector<token_event>> run_lockstep(const std::vector<engine*>& engines,
                                                   const std::function<void(size_t, int)>& between = {}) {
  size_t n = engines.size();
  std::vector<std::vector<token_event>> events(n);
  std::vector<char> busy(n, 0);
  std::barrier sync(static_cast<std::ptrdiff_t>(n));
  std::vector<std::thread> threads;
  for (size_t r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      for (int s = 0; s < 10000; ++s) {
        busy[r] = engines[r]->has_work();
        sync.arrive_and_wait();
        bool any = std::any_of(busy.begin(), busy.end(), [](char b) { return b != 0; });
        sync.arrive_and_wait();
        if (!any) return;
        if (between) between(r, s);
        for (auto& ev : engines[r]->step()) events[r].push_back(std::move(ev));
      }
    });
  for (auto& t : threads) t.join();
  return events;
}

// Per request id: its tokens and captured logits, in order.
using trace = std::map<int64_t, std::pair<std::vector<int32_t>, std::vector<std::vector<float>>>>;
inline trace trace_of(const std::vector<token_event>& events) {
  trace t;
  for (auto& ev : events)
    if (ev.token >= 0) {
      t[ev.id.value].first.push_back(ev.token);
      t[ev.id.value].second.push_back(ev.logits);
    }
  return t;
}

// The same jobs on one engine without EP, all at once; per (rank, job index) its trace entry.
inline std::map<std::pair<int32_t, size_t>, trace::mapped_type> reference(
    const std::shared_ptr<model::model_weights>& w, const std::vector<std::vector<job>>& jobs) {
  engine e(w, base_config(512));
  std::map<int64_t, std::pair<int32_t, size_t>> who;
  for (int32_t r = 0; r < static_cast<int32_t>(jobs.size()); ++r)
    for (size_t i = 0; i < jobs[r].size(); ++i)
      who[e.add_request(jobs[r][i].prompt, jobs[r][i].params)->value] = {r, i};
  std::vector<token_event> events;
  while (e.has_work())
    for (auto& ev : e.step()) events.push_back(std::move(ev));
  std::map<std::pair<int32_t, size_t>, trace::mapped_type> out;
  for (auto& [id, t] : trace_of(events)) out[who[id]] = t;
  return out;
}

// Adds rank r's jobs to its engine, returning id → job index.
inline std::map<int64_t, size_t> add_jobs(engine& e, const std::vector<job>& jobs) {
  std::map<int64_t, size_t> ids;
  for (size_t i = 0; i < jobs.size(); ++i) ids[e.add_request(jobs[i].prompt, jobs[i].params)->value] = i;
  return ids;
}

// Checks each rank's traces against the reference.
inline void check_against(const std::vector<std::vector<token_event>>& events,
                   const std::vector<std::map<int64_t, size_t>>& ids,
                   const std::map<std::pair<int32_t, size_t>, trace::mapped_type>& ref) {
  for (int32_t r = 0; r < static_cast<int32_t>(events.size()); ++r) {
    trace t = trace_of(events[r]);
    CHECK(t.size() == ids[r].size());
    for (auto& [id, i] : ids[r]) {
      CAPTURE(r);
      CAPTURE(i);
      REQUIRE(t.count(id) == 1);
      const auto& want = ref.at({r, i});
      CHECK(t[id].first == want.first);
      CHECK(t[id].second == want.second);
    }
  }
}

// Gives each of the first `n` engines (ranks of one group) the jobs of jobs_for(rank, salt,
// idle), steps them in lockstep and checks every rank's tokens and logits against one engine
// on `w` running the same jobs.
inline void serve_and_check(const std::vector<std::unique_ptr<engine>>& engines, size_t n, uint32_t salt, int32_t idle,
                     const std::shared_ptr<model::model_weights>& w,
                     const std::function<void(size_t, int)>& between = {}) {
  std::vector<std::vector<job>> jobs;
  std::vector<std::map<int64_t, size_t>> ids;
  std::vector<engine*> group;
  for (size_t r = 0; r < n; ++r) {
    jobs.push_back(jobs_for(static_cast<int32_t>(r), salt, idle));
    ids.push_back(add_jobs(*engines[r], jobs[r]));
    group.push_back(engines[r].get());
  }
  check_against(run_lockstep(group, between), ids, reference(w, jobs));
}


}  // namespace shoal::test::ep
