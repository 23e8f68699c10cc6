#pragma once
/// @file
/// @brief `StepCounts`: each parameter's Adam step count, as torch keeps
///        `state[p]["step"]` per parameter, and the step coefficients that follow from
///        them. A parameter without a gradient at a step (`ConstTensorView::absent()`)
///        is skipped and its count stays; so counts may differ within a group, and with
///        them the bias corrections. The coefficients are computed once per group, for
///        the count its first parameter with a gradient reaches, and once more only for
///        each parameter whose count differs; every segment of the store is pointed at
///        the set its parameter uses. Sized at construction: a step allocates nothing.

#include "dos/error.hpp"
#include "dos/optim/adam.hpp"
#include "dos/state/param_table.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace dos {

/// @brief Per-parameter step counts and the coefficients of the parameters whose
///        count differs from their group's.
class StepCounts {
 public:
  /// @param params the number of parameters; @param groups the number of groups.
  StepCounts(std::size_t params, std::size_t groups) : count_(params, 0), own_(params), uses_own_(params, 0), group_count_(groups, 0) {}

  /// @brief Steps parameter @p p has taken (steps it had no gradient at excluded).
  std::int64_t count(std::size_t p) const noexcept { return count_[p]; }
  /// @brief Sets parameter @p p's count, for resuming.
  /// @throws std::invalid_argument when @p t is outside [0, INT64_MAX).
  void set(std::size_t p, std::int64_t t) { count_[p] = checked(t); }
  /// @brief Sets every parameter's count to @p t (a checkpoint with one count for all).
  void set_all(std::int64_t t) { std::fill(count_.begin(), count_.end(), checked(t)); }

  /// @brief @p t, when it is a count a step can still advance.
  /// @throws std::invalid_argument otherwise.
  static std::int64_t checked(std::int64_t t) {
    if (t < 0 || t == std::numeric_limits<std::int64_t>::max())
      throw_invalid_argument("step count must be in [0, {}), got {}", std::numeric_limits<std::int64_t>::max(), t);
    return t;
  }

  /// @brief Refuses a step that would advance a count past the largest there is.
  /// @throws std::invalid_argument naming the parameter; nothing changes.
  void check_can_advance(const ParamTable& params) const {
    for (std::size_t p = 0; p < count_.size(); ++p)
      if (params.present(p) && count_[p] == std::numeric_limits<std::int64_t>::max())
        throw_invalid_argument("parameter {}: its step count is {}, the largest there is: it cannot advance", p, count_[p]);
  }

  /// @brief Sets the coefficients of the coming step in @p store: per group, and per
  ///        parameter where its count differs; each multiplied by @p multiplier (the
  ///        inverse loss scale times the clipping coefficient) through `grad_sign`.
  template <class Store>
  void prepare(Store& store, const ParamTable& params, const std::vector<AdamConfig>& groups, float multiplier) {
    std::fill(group_count_.begin(), group_count_.end(), std::int64_t{0});
    for (std::size_t p = 0; p < count_.size(); ++p) {
      std::int64_t& common = group_count_[params.record(p).group];
      if (params.present(p) && common == 0) common = count_[p] + 1;
    }
    for (std::size_t g = 0; g < groups.size(); ++g) store.coefficients(g) = scaled(groups[g], std::max<std::int64_t>(group_count_[g], 1), multiplier);
    for (std::size_t p = 0; p < count_.size(); ++p) {
      const std::uint32_t g = params.record(p).group;
      uses_own_[p] = params.present(p) && count_[p] + 1 != group_count_[g];
      if (uses_own_[p] != 0) own_[p] = scaled(groups[g], count_[p] + 1, multiplier);
    }
    const auto refs = store.segments();
    auto work = store.work();
    for (std::size_t k = 0; k < work.size(); ++k) {
      const std::uint32_t p = refs[k].segment->tensor;
      work[k].coefficients = uses_own_[p] != 0 ? &own_[p] : &store.coefficients(params.record(p).group);
    }
  }

  /// @brief The step was applied: every parameter that had a gradient advances.
  /// @return the elements of those parameters (the elements the step updated).
  std::size_t advance(const ParamTable& params) noexcept {
    std::size_t elements = 0;
    for (std::size_t p = 0; p < count_.size(); ++p)
      if (params.present(p)) {
        ++count_[p];
        elements += params.record(p).numel;
      }
    return elements;
  }

 private:
  static AdamCoefficients<float> scaled(const AdamConfig& c, std::int64_t t, float multiplier) {
    AdamCoefficients<float> k = coefficients(c, t);
    k.grad_sign *= multiplier;  // +-1 times it: exact
    return k;
  }

  std::vector<std::int64_t> count_;
  std::vector<AdamCoefficients<float>> own_;
  std::vector<std::uint8_t> uses_own_;
  std::vector<std::int64_t> group_count_;  // scratch: the count each group's coefficients are for
};

}  // namespace dos
