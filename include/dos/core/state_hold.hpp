#pragma once
/// @file
/// @brief `StateHolds` and `StateHold`: a reader outside the caller's thread (the
///        background copy of an asynchronous checkpoint) keeps the optimizer state as
///        it is; calls that would change it wait until every hold is released, rather
///        than throw as overlapping calls do (`CallGuard`). This is what lets
///        `AsyncCheckpointer::save` return at once and copy while training goes on.

#include <atomic>
#include <utility>

namespace dos {

class StateHolds;

/// @brief One hold on an optimizer's state (move-only; released by `release()` or
///        the destructor). While any hold is alive, `step()`, `write_state()` and
///        `reload_masters()` wait for it before they touch anything.
class StateHold {
 public:
  StateHold() = default;
  StateHold(StateHold&& o) noexcept : holds_(std::exchange(o.holds_, nullptr)) {}
  StateHold& operator=(StateHold&& o) noexcept {
    if (this != &o) {
      release();
      holds_ = std::exchange(o.holds_, nullptr);
    }
    return *this;
  }
  StateHold(const StateHold&) = delete;
  StateHold& operator=(const StateHold&) = delete;
  ~StateHold() { release(); }

  /// @brief Lets waiting calls go on; idempotent.
  inline void release() noexcept;
  /// @brief Whether this is a live hold on @p h.
  bool holds(const StateHolds& h) const noexcept { return holds_ == &h; }

 private:
  friend class StateHolds;
  explicit StateHold(StateHolds* h) noexcept : holds_(h) {}
  StateHolds* holds_ = nullptr;
};

/// @brief The count of live holds on one object's state.
class StateHolds {
 public:
  StateHolds() = default;
  StateHolds(const StateHolds&) = delete;
  StateHolds& operator=(const StateHolds&) = delete;

  /// @brief A new hold; the state must not change until it is released.
  [[nodiscard]] StateHold hold() noexcept {
    count_.fetch_add(1, std::memory_order_acquire);
    return StateHold(this);
  }
  /// @brief Blocks until no hold is alive (returns at once when none is).
  void wait_released() const noexcept {
    for (int n = count_.load(std::memory_order_acquire); n != 0; n = count_.load(std::memory_order_acquire))
      count_.wait(n, std::memory_order_acquire);
  }
  /// @brief Holds alive now.
  int count() const noexcept { return count_.load(std::memory_order_acquire); }

 private:
  friend class StateHold;
  void release() noexcept {
    // Release: the holder's reads happen before a waiting writer's writes.
    count_.fetch_sub(1, std::memory_order_release);
    count_.notify_all();
  }
  std::atomic<int> count_{0};
};

inline void StateHold::release() noexcept {
  if (holds_ != nullptr) std::exchange(holds_, nullptr)->release();
}

}  // namespace dos
