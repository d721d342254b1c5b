// The vision-encoder balancer's policy (MISSION.md: the third of the four balancers): encode
// jobs (the images of one request) go to the live, non-draining worker with the least
// outstanding work, measured in patches queued there (ties: fewer jobs, then the lower worker
// id: deterministic). A worker that dies gives back its jobs to be placed again; a draining one
// takes no new jobs and gives back its queued ones when another worker can take them. Plain
// state: the actor (actors/ve_actors.hpp) feeds it membership changes and replies.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <vector>

namespace shoal::runtime {

struct ve_worker_load {
  int64_t worker = 0;
  bool draining = false;
  int64_t jobs = 0, patches = 0;           // outstanding (placed, not done)
  int64_t placed = 0, completed = 0;       // since it joined
  int64_t given_back = 0;                  // jobs re-placed away from it (death, drain, failure)
};

class ve_balancer {
 public:
  // A worker joins (or rejoins: it takes jobs again). Idempotent.
  void add_worker(int64_t worker);
  // The worker is gone: its outstanding jobs, in job order, to be placed again.
  std::vector<int64_t> remove_worker(int64_t worker);
  // The worker drains: no new jobs; its outstanding jobs are returned (to be placed again)
  // when some other worker takes jobs, else they stay.
  std::vector<int64_t> drain_worker(int64_t worker);
  // The worker for `job` of `patches` patches, never one of `exclude`; nullopt when none takes
  // jobs. Placing a job that is already placed moves it (the old placement is given back).
  std::optional<int64_t> place(int64_t job, int64_t patches, std::span<const int64_t> exclude = {});
  // The job's rows are back (or it failed for good): it leaves its worker.
  void done(int64_t job);
  // Where `job` is placed now, if anywhere.
  std::optional<int64_t> worker_of(int64_t job) const;
  bool has_worker(int64_t worker) const { return workers_.contains(worker); }
  size_t workers() const { return workers_.size(); }
  std::vector<ve_worker_load> loads() const;

 private:
  struct job_state {
    int64_t worker = 0, patches = 0;
  };
  void unplace(int64_t job, bool given_back);
  std::vector<int64_t> jobs_of(int64_t worker) const;
  std::map<int64_t, ve_worker_load> workers_;
  std::map<int64_t, job_state> jobs_;
};

}  // namespace shoal::runtime
