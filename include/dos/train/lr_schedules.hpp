#pragma once
/// @file
/// @brief `LrSchedules`: each group's learning-rate schedule, applied at every `step()`
///        call (skipped steps included), all validated before any is applied.

#include "dos/error.hpp"
#include "dos/optim/adam.hpp"
#include "dos/optim/schedule.hpp"

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace dos {

/// @brief The schedules of every group and the index they see next.
class LrSchedules {
 public:
  explicit LrSchedules(std::size_t groups) : schedules_(groups), scheduled_(groups) {}

  /// @brief Sets group @p g's schedule; an empty one turns it off.
  void set(std::size_t g, LrSchedule s) { schedules_.at(g) = std::move(s); }
  /// @brief `step()` calls so far: the index the schedules see next.
  std::int64_t calls() const noexcept { return calls_; }
  /// @brief Sets the index the schedules see next, for resuming.
  /// @throws std::invalid_argument for a negative index.
  void set_calls(std::int64_t calls) {
    if (calls < 0) throw_invalid_argument("schedule index must be >= 0, got {}", calls);
    calls_ = calls;
  }

  /// @brief Checks every scheduled learning rate of this call against its group.
  /// @throws std::invalid_argument for an invalid scheduled value; nothing changes then.
  void prepare(const std::vector<AdamConfig>& groups) {
    for (std::size_t g = 0; g < groups.size(); ++g)
      if (schedules_[g]) {
        AdamConfig c = groups[g];
        c.lr = schedules_[g](calls_);
        validate(c, g);
        scheduled_[g] = c.lr;
      }
  }
  /// @brief Applies what `prepare` checked, and moves to the next call.
  void apply(std::vector<AdamConfig>& groups) noexcept {
    for (std::size_t g = 0; g < groups.size(); ++g)
      if (schedules_[g]) groups[g].lr = scheduled_[g];
    ++calls_;
  }

 private:
  std::vector<LrSchedule> schedules_;
  std::vector<double> scheduled_;
  std::int64_t calls_ = 0;
};

}  // namespace dos
