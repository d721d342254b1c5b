// One outcome that a producer (a transport's poller, a tier's worker) sets exactly once and
// a consumer polls between steps, may give up on (cancel), or waits for at shutdown. The one
// base of every "operation in flight" handle: transfer, remote_fetch, slot_fetch.
#pragma once

#include <atomic>
#include <chrono>
#include <string>
#include <utility>

namespace shoal::runtime {

template <class T>
class one_shot {
 public:
  bool done() const { return done_.load(std::memory_order_acquire); }
  // Blocks until done (shutdown and tests only: never on a step loop).
  void wait() const { done_.wait(false, std::memory_order_acquire); }
  // The consumer no longer needs the outcome: the producer may skip work it has not begun.
  void cancel() { cancelled_.store(true, std::memory_order_release); }
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }

  // Valid once done(): the outcome, why it failed or stopped short ("" when it did not), and
  // when it completed (seconds(): since this handle was made).
  const T& value() const { return value_; }
  const std::string& error() const { return error_; }
  std::chrono::steady_clock::time_point finished_at() const { return finished_at_; }
  double seconds() const { return std::chrono::duration<double>(finished_at_ - started_).count(); }

 protected:
  // The producer, exactly once.
  void set(T value, std::string error) {
    value_ = std::move(value);
    error_ = std::move(error);
    finished_at_ = std::chrono::steady_clock::now();
    done_.store(true, std::memory_order_release);
    done_.notify_all();
  }

 private:
  std::atomic<bool> done_{false}, cancelled_{false};
  T value_{};
  std::string error_;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now(), finished_at_{};
};

}  // namespace shoal::runtime
