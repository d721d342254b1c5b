// The engine's compute thread (async scheduling): launch() hands it the step's forward pass
// and returns at once, so the engine plans the next step meanwhile; wait() returns once the
// pass ended, and rethrows what the pass threw (an expert-parallel step abandoned by its
// exchange fails the step that ran it). Without async scheduling the pass runs inside launch().
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace shoal::runtime {

class forward_worker {
 public:
  forward_worker(bool async, std::function<void()> pass) : pass_(std::move(pass)) {
    if (async) thread_ = std::thread([this] { loop(); });
  }
  ~forward_worker() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  forward_worker(const forward_worker&) = delete;
  forward_worker& operator=(const forward_worker&) = delete;

  void launch() {
    if (!thread_.joinable()) return pass_();
    {
      std::lock_guard lock(mu_);
      ready_ = true;
      done_ = false;
    }
    cv_.notify_all();
  }
  void wait() {
    if (!thread_.joinable()) return;
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  void loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stopping_ || ready_; });
      if (stopping_) return;
      ready_ = false;
      lock.unlock();
      std::exception_ptr error;
      try {
        pass_();
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      error_ = error;
      done_ = true;
      cv_.notify_all();
    }
  }

  const std::function<void()> pass_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool ready_ = false, done_ = false, stopping_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: started once the rest exists
};

}  // namespace shoal::runtime
