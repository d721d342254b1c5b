// Static-partition worker pool behind parallel_for. Between jobs a worker spins for a short
// while (spin_budget) on the job counter, then sleeps on a condition variable; the caller
// waits for the parts the same way. A decode step is a chain of small products a few µs
// apart: a futex wake-up per product cost as much as reading a 1 MB expert matrix. The
// calling thread takes range 0 itself, so a pool of n threads has n−1 workers.
#include "kernels/cpu/thread_pool.hpp"

#include <sched.h>

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include <cblas.h>

#include "kernels/assert.hpp"

namespace shoal::kernels {
namespace {

// True while this thread runs a part of a parallel_for (worker or caller): nested calls then
// run inline instead of re-entering the pool.
thread_local bool in_parallel = false;

// How long a worker (or a caller waiting for its parts) spins before it sleeps: a few
// products' worth, so a chain of them keeps the workers awake and an idle pool sleeps.
constexpr auto spin_budget = std::chrono::microseconds(100);

// Spins until done() or the budget is spent; whether done() held.
template <class Done>
bool spin_until(const Done& done) {
  const auto until = std::chrono::steady_clock::now() + spin_budget;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
      _mm_pause();
    }
    if (std::chrono::steady_clock::now() >= until) return done();
  }
}

class pool {
 public:
  explicit pool(int n) { start(n); }
  ~pool() { stop(); }

  void resize(int n) {
    stop();
    start(n);
  }
  int size() const { return static_cast<int>(workers_.size()) + 1; }

  void run(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    int parts = static_cast<int>(std::min<int64_t>(n, size()));
    if (parts <= 1 || in_parallel) {
      fn(0, n);
      return;
    }
    // One job at a time: callers on several threads (engines of the ranks of an EP group in
    // one process) take turns instead of overwriting each other's job.
    std::lock_guard turn(run_mu_);
    {
      std::lock_guard lock(mu_);
      job_ = &fn;
      job_n_ = n;
      job_parts_ = parts;
      pending_.store(parts - 1, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    in_parallel = true;
    fn(0, range_end(0));
    in_parallel = false;
    const auto finished = [&] { return pending_.load(std::memory_order_acquire) == 0; };
    spin_until(finished);
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, finished);
    job_ = nullptr;
    job_parts_ = 0;
  }

 private:
  int64_t range_end(int part) const { return job_n_ * (part + 1) / job_parts_; }

  void start(int n) {
    stopping_ = false;
    // New workers start from the current generation: a job that ended before they existed
    // is not theirs to run.
    for (int i = 1; i < n; ++i) workers_.emplace_back([this, i, g = generation_.load()] { work(i, g); });
  }
  void stop() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }
  void work(int index, uint64_t seen) {
    in_parallel = true;
    for (;;) {
      spin_until([&] {
        return stopping_.load(std::memory_order_relaxed) || generation_.load(std::memory_order_acquire) != seen;
      });
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      if (index >= job_parts_) continue;
      auto* fn = job_;
      int64_t begin = job_n_ * index / job_parts_, end = range_end(index);
      lock.unlock();
      (*fn)(begin, end);
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        // Under the lock: a caller between its check and its wait cannot miss this.
        std::lock_guard done(mu_);
        done_cv_.notify_one();
      }
    }
  }

  std::vector<std::thread> workers_;
  std::mutex run_mu_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int job_parts_ = 0;
  // Written under mu_; read without it by spinning threads.
  std::atomic<int> pending_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stopping_{false};
};

int default_threads() { return available_cpus(); }

int initial_threads() {
  openblas_set_num_threads(1);  // the pool owns the threads; BLAS runs inside its parts
  return default_threads();
}

pool& instance() {
  static pool p(initial_threads());
  return p;
}

}  // namespace

int available_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

std::string pin_to_cpus(const std::vector<int>& cpus) {
  if (cpus.empty()) return "no CPUs given";
  cpu_set_t allowed, set;
  CPU_ZERO(&allowed);
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return std::string("sched_getaffinity: ") + std::strerror(errno);
  for (int c : cpus) {
    if (c < 0 || c >= CPU_SETSIZE || !CPU_ISSET(c, &allowed))
      return "CPU " + std::to_string(c) + " is not one this process may run on (it may use " +
             std::to_string(CPU_COUNT(&allowed)) + ": see lscpu and the process's cpuset)";
    CPU_SET(c, &set);
  }
  if (sched_setaffinity(0, sizeof set, &set) != 0) return std::string("sched_setaffinity: ") + std::strerror(errno);
  return {};
}

void set_num_threads(int n) {
  SHOAL_ASSERT(n >= 1);
  instance().resize(n);
  openblas_set_num_threads(1);
}

int num_threads() { return instance().size(); }

void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  instance().run(n, fn);
}

}  // namespace shoal::kernels
