#pragma once
/// @file
/// @brief Learning-rate schedules: a per-group hook `lr = schedule(i)`, called at the
///        i-th call of `step()` (counted from 0, skipped steps included, as a torch
///        scheduler stepped every iteration), and the built-in warmup + cosine.

#include <cmath>
#include <cstdint>
#include <functional>
#include <numbers>

namespace dos {

/// @brief The learning rate of the i-th `step()` call (i from 0).
using LrSchedule = std::function<double(std::int64_t)>;

/// @brief Linear warmup from 0 to `peak` over `warmup` steps, then a cosine decay to
///        `floor` at `total`, and `floor` after it; the GPT recipe.
struct WarmupCosine {
  double peak = 3e-4;
  std::int64_t warmup = 100;
  std::int64_t total = 10'000;
  double floor = 0;

  double operator()(std::int64_t i) const {
    if (i < warmup) return peak * static_cast<double>(i + 1) / static_cast<double>(warmup);
    if (i >= total) return floor;
    const double progress = static_cast<double>(i - warmup) / static_cast<double>(std::max<std::int64_t>(1, total - warmup));
    return floor + 0.5 * (peak - floor) * (1 + std::cos(std::numbers::pi * progress));
  }
};

}  // namespace dos
