// A bounded queue served by a fixed set of worker threads: the one way work leaves a caller's
// thread in this project when no actor fits (a blocking client, a transfer to wait for).
// push() refuses when `capacity` jobs wait, so the caller says so instead of growing without
// limit; the workers take up to `batch` jobs at a time (a writer that sends them together).
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <span>
#include <thread>
#include <utility>
#include <vector>

namespace shoal::runtime {

template <class Job>
class work_queue {
 public:
  // What the destructor does with jobs still queued: serve them (each bounded by its own
  // timeout) or drop them (writes whose loss is counted elsewhere).
  enum class on_stop { finish, drop };
  using serve_fn = std::function<void(std::span<Job>)>;

  work_queue(size_t workers, size_t capacity, size_t batch, serve_fn serve, on_stop stop = on_stop::finish)
      : capacity_(std::max<size_t>(1, capacity)), batch_(std::max<size_t>(1, batch)), serve_(std::move(serve)),
        stop_(stop) {
    for (size_t i = 0; i < std::max<size_t>(1, workers); ++i) workers_.emplace_back([this] { loop(); });
  }
  ~work_queue() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
      if (stop_ == on_stop::drop) jobs_.clear();
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
  }
  work_queue(const work_queue&) = delete;
  work_queue& operator=(const work_queue&) = delete;

  // False (nothing queued) when `capacity` jobs wait already, or while stopping.
  bool push(Job job) {
    {
      std::lock_guard lock(mu_);
      if (stopping_ || jobs_.size() >= capacity_) return false;
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
    return true;
  }

  // Waits (at most `timeout`) until no job waits or runs; true when it got there.
  bool wait_idle(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    return idle_cv_.wait_for(lock, timeout, [&] { return jobs_.empty() && running_ == 0; });
  }

  size_t capacity() const { return capacity_; }

 private:
  void loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return !jobs_.empty() || stopping_; });
      if (jobs_.empty()) return;  // stopping, and nothing left to serve
      std::vector<Job> taken;
      while (!jobs_.empty() && taken.size() < batch_) {
        taken.push_back(std::move(jobs_.front()));
        jobs_.pop_front();
      }
      ++running_;
      lock.unlock();
      serve_(taken);
      lock.lock();
      --running_;
      if (jobs_.empty() && running_ == 0) idle_cv_.notify_all();
    }
  }

  const size_t capacity_, batch_;
  const serve_fn serve_;
  const on_stop stop_;
  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<Job> jobs_;
  size_t running_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;  // last: started once everything above exists
};

}  // namespace shoal::runtime
