#include "runtime/placement/ve_balancer.hpp"

#include <algorithm>
#include <tuple>

namespace shoal::runtime {

void ve_balancer::add_worker(int64_t worker) {
  auto& w = workers_[worker];
  w.worker = worker;
  w.draining = false;
}

std::vector<int64_t> ve_balancer::jobs_of(int64_t worker) const {
  std::vector<int64_t> out;
  for (const auto& [job, j] : jobs_)
    if (j.worker == worker) out.push_back(job);
  return out;
}

void ve_balancer::unplace(int64_t job, bool given_back) {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return;
  if (auto w = workers_.find(it->second.worker); w != workers_.end()) {
    w->second.jobs -= 1;
    w->second.patches -= it->second.patches;
    (given_back ? w->second.given_back : w->second.completed) += 1;
  }
  jobs_.erase(it);
}

std::vector<int64_t> ve_balancer::remove_worker(int64_t worker) {
  std::vector<int64_t> jobs = jobs_of(worker);
  for (int64_t job : jobs) jobs_.erase(job);
  workers_.erase(worker);
  return jobs;
}

std::vector<int64_t> ve_balancer::drain_worker(int64_t worker) {
  auto w = workers_.find(worker);
  if (w == workers_.end()) return {};
  w->second.draining = true;
  const bool other = std::ranges::any_of(workers_, [](const auto& kv) { return !kv.second.draining; });
  if (!other) return {};
  std::vector<int64_t> jobs = jobs_of(worker);
  for (int64_t job : jobs) unplace(job, true);
  return jobs;
}

std::optional<int64_t> ve_balancer::place(int64_t job, int64_t patches, std::span<const int64_t> exclude) {
  const ve_worker_load* best = nullptr;
  for (const auto& [id, w] : workers_) {
    if (w.draining || std::ranges::find(exclude, id) != exclude.end()) continue;
    if (!best || std::tie(w.patches, w.jobs, w.worker) < std::tie(best->patches, best->jobs, best->worker)) best = &w;
  }
  if (!best) return std::nullopt;
  const int64_t to = best->worker;
  unplace(job, true);
  auto& w = workers_.at(to);
  w.jobs += 1;
  w.patches += patches;
  w.placed += 1;
  jobs_[job] = {to, patches};
  return to;
}

void ve_balancer::done(int64_t job) { unplace(job, false); }

std::optional<int64_t> ve_balancer::worker_of(int64_t job) const {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return std::nullopt;
  return it->second.worker;
}

std::vector<ve_worker_load> ve_balancer::loads() const {
  std::vector<ve_worker_load> out;
  for (const auto& [id, w] : workers_) out.push_back(w);
  return out;
}

}  // namespace shoal::runtime
