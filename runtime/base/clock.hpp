// Time as the engine's state machines read it: deadlines of remote waits (and, later, leases)
// go through this interface so tests and the cluster simulator can advance a manual clock
// instead of sleeping. Seconds as a double, monotonic.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>

namespace shoal::runtime {

class clock {
 public:
  virtual ~clock() = default;
  virtual double now_s() const = 0;
};

// std::chrono::steady_clock.
class steady_clock final : public clock {
 public:
  double now_s() const override {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
};

// A clock that moves only when told (tests, simulation).
class manual_clock final : public clock {
 public:
  double now_s() const override { return t_.load(); }
  void advance(double seconds) { t_.store(t_.load() + seconds); }

 private:
  std::atomic<double> t_{0.0};
};

inline std::shared_ptr<const clock> default_clock() {
  static const auto c = std::make_shared<const steady_clock>();
  return c;
}

}  // namespace shoal::runtime
