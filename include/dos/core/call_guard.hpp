#pragma once
/// @file
/// @brief `CallGuard`: detects calls that must not overlap on one object. Most calls
///        of an optimizer are exclusive (`step`, `accumulate`, setters, state access);
///        `grad_ready` is shared: backward hooks may report gradients from several
///        threads at once, but never while an exclusive call runs. A call that would
///        overlap throws `std::logic_error` naming both, before it touches anything.

#include <atomic>
#include <stdexcept>
#include <string>

namespace dos {

/// @brief The counter behind the guards: -1 while an exclusive call runs, else the
///        number of shared calls in flight.
class CallGuard {
 public:
  /// @brief Holds the object exclusively for one call.
  class Exclusive {
   public:
    Exclusive(CallGuard& g, const char* call) : g_(g) {
      int idle = 0;
      if (!g.state_.compare_exchange_strong(idle, -1, std::memory_order_acquire))
        throw std::logic_error(std::string("dos: ") + call +
                               " was called while another call was running on this optimizer; only grad_ready (and "
                               "read_state without a device) may run concurrently, every other call must be made from "
                               "one thread at a time");
    }
    ~Exclusive() { g_.state_.store(0, std::memory_order_release); }
    Exclusive(const Exclusive&) = delete;
    Exclusive& operator=(const Exclusive&) = delete;

   private:
    CallGuard& g_;
  };

  /// @brief Holds the object for a call that may overlap others of its kind.
  class Shared {
   public:
    Shared(CallGuard& g, const char* call) : g_(g) {
      int v = g.state_.load(std::memory_order_relaxed);
      do {
        if (v < 0)
          throw std::logic_error(std::string("dos: ") + call +
                                 " was called while an exclusive call (step, accumulate, a setter, state access) was "
                                 "running on this optimizer");
      } while (!g.state_.compare_exchange_weak(v, v + 1, std::memory_order_acquire, std::memory_order_relaxed));
    }
    ~Shared() { g_.state_.fetch_sub(1, std::memory_order_release); }
    Shared(const Shared&) = delete;
    Shared& operator=(const Shared&) = delete;

   private:
    CallGuard& g_;
  };

 private:
  std::atomic<int> state_{0};
};

}  // namespace dos
