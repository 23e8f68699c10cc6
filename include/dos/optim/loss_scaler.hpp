#pragma once
/// @file
/// @brief Dynamic loss scaling for fp16 training, as torch's GradScaler: the settings
///        (`LossScaling`) and the scale's state machine (`LossScaler`).

#include "dos/error.hpp"
#include "dos/optim/adam.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <utility>

namespace dos {

/// @brief Multiply the loss by the optimizer's `loss_scale()` before backward; `step()`
///        unscales, skips the step on overflow (inf/NaN gradients) and backs the scale
///        off, and grows it after `growth_interval` clean steps.
struct LossScaling {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;
};

/// @brief The scale and its growth tracker. Disabled (scale 1, never skips) when built
///        without settings.
class LossScaler {
 public:
  LossScaler() = default;
  /// @throws std::invalid_argument for a setting torch would not accept, or one that
  ///         would make folding 1/scale into the step inexact (not a power of two).
  explicit LossScaler(std::optional<LossScaling> settings) : settings_(settings) {
    if (settings_) {
      validate(*settings_);
      scale_ = settings_->init_scale;
    }
  }

  bool enabled() const noexcept { return settings_.has_value(); }
  /// @brief The factor the loss is multiplied by (1 when disabled).
  double scale() const noexcept { return enabled() ? scale_ : 1.0; }
  /// @brief 1 / scale in float: exact, the scale being a power of two.
  float inverse() const noexcept { return enabled() ? static_cast<float>(1.0 / scale_) : 1.0f; }
  /// @brief Clean steps since the scale last changed.
  std::int64_t growth_tracker() const noexcept { return tracker_; }

  /// @brief The smallest scale dos backs off to: below it, 1/scale is not a finite
  ///        float and unscaling would turn every gradient into inf. (torch's
  ///        GradScaler has no floor: its inverse becomes inf and every later step is
  ///        skipped. dos stops at 2^-126 and keeps skipping only the steps that
  ///        really overflow.)
  static constexpr double min_scale = 0x1p-126;
  /// @brief The largest scale: beyond it the scale is not a finite float.
  static constexpr double max_scale = 0x1p127;

  /// @brief A step overflowed: back off, no lower than `min_scale`.
  void overflowed() noexcept {
    if (!enabled()) return;
    scale_ = std::max(min_scale, scale_ * settings_->backoff_factor);
    tracker_ = 0;
  }
  /// @brief A step was applied: grow after `growth_interval` of them.
  void applied() noexcept {
    if (!enabled() || ++tracker_ < settings_->growth_interval) return;
    // torch keeps the scale in float32, where growth stops short of infinity.
    const double grown = scale_ * settings_->growth_factor;
    if (grown <= max_scale) scale_ = grown;
    tracker_ = 0;
  }

  /// @brief Restores a saved scale and growth tracker, for resuming.
  /// @throws std::invalid_argument when loss scaling is off, for a scale that is not a
  ///         power of two in [`min_scale`, `max_scale`], or a tracker outside
  ///         [0, growth_interval); nothing changes then.
  void restore(double scale, std::int64_t growth_tracker) {
    if (!enabled()) throw_invalid_argument("set_loss_scaler_state: this optimizer has no loss scaling");
    int e = 0;
    if (!detail::finite_bits(scale) || scale < min_scale || scale > max_scale || std::frexp(scale, &e) != 0.5)
      throw_invalid_argument("loss scale must be a power of two in [2^-126, 2^127], got {}", scale);
    if (growth_tracker < 0 || growth_tracker >= settings_->growth_interval)
      throw_invalid_argument("loss scale growth tracker must be in [0, {}), got {}", settings_->growth_interval,
                             growth_tracker);
    scale_ = scale;
    tracker_ = growth_tracker;
  }

  static void validate(const LossScaling& ls) {
    // Bit tests, not std::isfinite: a consumer built with -ffast-math must still be checked.
    const auto finite = [](double x) { return detail::finite_bits(x); };
    if (!finite(ls.init_scale) || ls.init_scale <= 0)
      throw_invalid_argument("loss_scaling.init_scale must be finite and > 0, got {}", ls.init_scale);
    if (ls.init_scale < min_scale || ls.init_scale > max_scale)
      throw_invalid_argument("loss_scaling.init_scale must be in [2^-126, 2^127], where it and its inverse are "
                             "finite floats, got {}", ls.init_scale);
    if (!finite(ls.growth_factor) || ls.growth_factor < 1)
      throw_invalid_argument("loss_scaling.growth_factor must be finite and >= 1, got {}", ls.growth_factor);
    if (!finite(ls.backoff_factor) || ls.backoff_factor <= 0 || ls.backoff_factor >= 1)
      throw_invalid_argument("loss_scaling.backoff_factor must be in (0, 1), got {}", ls.backoff_factor);
    if (ls.growth_interval < 1)
      throw_invalid_argument("loss_scaling.growth_interval must be >= 1, got {}", ls.growth_interval);
    // Powers of two keep unscaling exact, so folding 1/scale and the clipping
    // coefficient into one multiplication gives torch's two.
    const auto power_of_two = [](double x) {
      int e = 0;
      return std::frexp(x, &e) == 0.5;
    };
    for (const auto& [name, value] : {std::pair{"init_scale", ls.init_scale}, std::pair{"growth_factor", ls.growth_factor},
                                      std::pair{"backoff_factor", ls.backoff_factor}})
      if (!power_of_two(value)) throw_invalid_argument("loss_scaling.{} must be a power of two, got {}", name, value);
  }

 private:
  std::optional<LossScaling> settings_;
  double scale_ = 1;
  std::int64_t tracker_ = 0;
};

}  // namespace dos
