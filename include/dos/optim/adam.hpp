#pragma once
/// @file
/// @brief Adam and AdamW hyperparameters with exactly PyTorch's semantics, their
///        validation, and the per-step coefficients shared by every executor.
///
/// The maths of one element lives in `dos/optim/detail/adam_step.inl`; this header
/// turns hyperparameters and a step count into the scalars that maths consumes.

#include "dos/config.hpp"
#include "dos/error.hpp"
#include "dos/optim/coefficients.hpp"

#include <bit>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string_view>

namespace dos {

/// @brief `torch.optim.Adam`: L2 weight decay, added to the gradient.
struct Adam {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool amsgrad = false;
  bool maximize = false;
};

/// @brief `torch.optim.AdamW`: decoupled weight decay, applied to the parameter
///        before the moments are updated.
struct AdamW {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;
  bool maximize = false;
};

/// @brief The one representation both optimizers reduce to. Implicitly built from
///        `Adam` or `AdamW`, so a parameter group accepts either.
struct AdamConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool amsgrad = false;
  bool maximize = false;
  /// true for AdamW: `p *= 1 - lr * weight_decay`; false for Adam: `g += weight_decay * p`.
  bool decoupled_weight_decay = false;

  AdamConfig() = default;
  AdamConfig(const Adam& a)  // NOLINT(google-explicit-constructor): groups take either
      : lr(a.lr), beta1(a.beta1), beta2(a.beta2), eps(a.eps), weight_decay(a.weight_decay),
        amsgrad(a.amsgrad), maximize(a.maximize), decoupled_weight_decay(false) {}
  AdamConfig(const AdamW& a)  // NOLINT(google-explicit-constructor)
      : lr(a.lr), beta1(a.beta1), beta2(a.beta2), eps(a.eps), weight_decay(a.weight_decay),
        amsgrad(a.amsgrad), maximize(a.maximize), decoupled_weight_decay(true) {}
};

namespace detail {
/// Finite test on the exponent bits: `std::isfinite` folds to true under the
/// consumer's -ffinite-math-only, which would let a NaN learning rate through.
inline bool finite_bits(double x) noexcept {
  return (std::bit_cast<std::uint64_t>(x) & 0x7FF0000000000000ull) != 0x7FF0000000000000ull;
}
}  // namespace detail

/// @brief Throws `std::invalid_argument` naming the first invalid field and its value.
/// @param c the hyperparameters to check.
/// @param group the parameter group, named in the message when given. The message is
///        formatted only on failure, so a valid call never allocates (schedulers
///        validate every step).
/// @throws std::invalid_argument for lr < 0, betas outside [0, 1), eps <= 0,
///         weight_decay < 0, any non-finite value, or an AdamW decay factor below 0.
inline void validate(const AdamConfig& c, std::optional<std::size_t> group = std::nullopt) {
  const auto require = [&](bool ok, std::string_view field, std::string_view rule, double value) {
    if (ok) return;
    if (group) throw_invalid_argument("parameter group {}: {} must be {}, got {}", *group, field, rule, value);
    throw_invalid_argument("{} must be {}, got {}", field, rule, value);
  };
  using detail::finite_bits;
  require(finite_bits(c.lr) && c.lr >= 0, "lr", "finite and >= 0", c.lr);
  require(finite_bits(c.beta1) && c.beta1 >= 0 && c.beta1 < 1, "beta1", "in [0, 1)", c.beta1);
  require(finite_bits(c.beta2) && c.beta2 >= 0 && c.beta2 < 1, "beta2", "in [0, 1)", c.beta2);
  require(finite_bits(c.eps) && c.eps > 0, "eps", "finite and > 0", c.eps);
  require(finite_bits(c.weight_decay) && c.weight_decay >= 0, "weight_decay", "finite and >= 0", c.weight_decay);
  require(!c.decoupled_weight_decay || c.lr * c.weight_decay <= 1, "lr * weight_decay",
          "<= 1 for AdamW (it scales the parameter by 1 - lr * wd)", c.lr * c.weight_decay);
}

/// @brief The coefficients of step @p t (counted from 1), computed in double as
///        PyTorch does with Python floats, then rounded once to float.
inline AdamCoefficients<float> coefficients(const AdamConfig& c, std::int64_t t) {
  const double steps = static_cast<double>(t);
  const double bias_correction1 = 1.0 - std::pow(c.beta1, steps);
  const double bias_correction2 = 1.0 - std::pow(c.beta2, steps);
  AdamCoefficients<float> k{};
  k.grad_sign = c.maximize ? -1.0f : 1.0f;
  k.l2 = c.decoupled_weight_decay ? 0.0f : static_cast<float>(c.weight_decay);
  k.decay = c.decoupled_weight_decay ? static_cast<float>(1.0 - c.lr * c.weight_decay) : 1.0f;
  k.beta1 = static_cast<float>(c.beta1);
  k.one_minus_beta1 = static_cast<float>(1.0 - c.beta1);
  k.beta2 = static_cast<float>(c.beta2);
  k.one_minus_beta2 = static_cast<float>(1.0 - c.beta2);
  k.inv_sqrt_bias_correction2 = static_cast<float>(1.0 / std::sqrt(bias_correction2));
  k.eps = static_cast<float>(c.eps);
  k.neg_step_size = static_cast<float>(-c.lr / bias_correction1);
  return k;
}

}  // namespace dos
