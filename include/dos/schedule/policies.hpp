#pragma once
/// @file
/// @brief The built-in assignment policies, each a small value type with its own
///        validation:
///  - `AllCpu`: nothing on the device (ZeRO-Offload's baseline);
///  - `StaticFraction`: a fixed share stays resident on the device (TwinFlow); the rest
///    runs on the CPU;
///  - `FixedStride`: every k-th subgroup streamed through the device;
///  - `AutomaticStride` (the default): the stride, or no streaming, that measured
///    fastest, exploring the others at a bounded cost (`StrideExplorer`);
///  - `Balanced`: streamed subgroups chosen by size, longest first (uneven subgroups);
///  - `ResidentThenStride`: as many resident subgroups as the device memory left after
///    staging holds and measured steps find worth it (the model's count first), the
///    rest streamed at the stride that measured fastest.

#include "dos/error.hpp"
#include "dos/schedule/explorer.hpp"
#include "dos/schedule/policy.hpp"
#include "dos/schedule/residency_explorer.hpp"
#include "dos/schedule/timeline.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string_view>
#include <vector>

namespace dos {

namespace detail {
inline void no_residents(const ResidencyRequest& r, std::vector<Place>& out) { out.assign(r.shapes.size(), Place::cpu); }
inline void check_max_stride(std::uint32_t max_stride) {
  if (max_stride < 1) throw_invalid_argument("policy max_stride must be >= 1, got {}", max_stride);
}
}  // namespace detail

/// @brief Every subgroup on the CPU.
struct AllCpu {
  std::string_view name() const noexcept { return "all_cpu"; }
  void validate() const noexcept {}
  void residency(const ResidencyRequest& r, std::vector<Place>& out) const { detail::no_residents(r, out); }
  double choose(const PlanRequest& r, Plan& plan) const { return detail::stride_plan(r, r.residency, plan, 0); }
};

/// @brief The first round(fraction * subgroups) subgroups resident on the device for
///        good; the others on the CPU.
struct StaticFraction {
  double fraction = 0.25;  ///< in [0, 1]

  std::string_view name() const noexcept { return "static_fraction"; }
  void validate() const {
    if (!(fraction >= 0 && fraction <= 1)) throw_invalid_argument("policy fraction must be in [0, 1], got {}", fraction);
  }
  void residency(const ResidencyRequest& r, std::vector<Place>& out) const {
    resident_prefix(out, r.shapes.size(), count(r.shapes.size()));
  }
  /// @brief The subgroups kept resident of @p subgroups: the nearest to the fraction.
  std::size_t count(std::size_t subgroups) const noexcept {
    return static_cast<std::size_t>(std::lround(fraction * static_cast<double>(subgroups)));
  }
  double choose(const PlanRequest& r, Plan& plan) const { return detail::stride_plan(r, r.residency, plan, 0); }
};

/// @brief Every k-th subgroup streamed through the device, the rest on the CPU.
struct FixedStride {
  std::uint32_t stride = 2;  ///< k >= 1 (1: every subgroup on the device)

  std::string_view name() const noexcept { return "fixed_stride"; }
  void validate() const {
    if (stride < 1) throw_invalid_argument("policy stride must be >= 1, got {}", stride);
  }
  void residency(const ResidencyRequest& r, std::vector<Place>& out) const { detail::no_residents(r, out); }
  double choose(const PlanRequest& r, Plan& plan) const { return detail::stride_plan(r, r.residency, plan, stride); }
};

/// @brief The stride in 1..max_stride, or no streaming, that measured fastest: every
///        candidate the model finds worth trying is run and timed, the fastest is kept
///        until another beats it side by side, and the others are re-checked now and
///        then (`StrideExplorer`). No streaming is always a candidate, and the first to
///        challenge, so the choice does not stay on a plan slower than the all-CPU
///        update it measured.
struct AutomaticStride {
  std::uint32_t max_stride = 8;  ///< the largest k tried, >= 1
  ExploreSettings explore{};     ///< how often, and what, it explores
  StrideExplorer explorer{};     ///< what it has measured (its memory; read it, do not set it)

  std::string_view name() const noexcept { return "automatic_stride"; }
  void validate() const {
    detail::check_max_stride(max_stride);
    explore.validate();
  }
  void residency(const ResidencyRequest& r, std::vector<Place>& out) const { detail::no_residents(r, out); }
  void reserve(std::size_t subgroups) { explorer.reserve(detail::candidates(max_stride, subgroups)); }
  double choose(const PlanRequest& r, Plan& plan) {
    return explorer.choose(r, r.residency, max_stride, plan, r.scratch, explore);
  }
  void observe(const StepTimeline& t) { explorer.observe(t); }
};

/// @brief Streamed subgroups chosen longest first, to balance the predicted CPU and
///        device finish times; for subgroups of uneven size.
struct Balanced {
  std::string_view name() const noexcept { return "balanced"; }
  void validate() const noexcept {}
  void residency(const ResidencyRequest& r, std::vector<Place>& out) const { detail::no_residents(r, out); }
  double choose(const PlanRequest& r, Plan& plan) const {
    balanced_assignment(r.assignment, r.shapes, r.residency, r.profile, r.scratch.workspace[0]);
    make_plan(plan, r.shapes, r.assignment, r.limits, 0);
    return r.predict(plan);
  }
};

/// @brief TwinFlow's idea and the paper's together: subgroups resident on the device
///        as far as the memory left after staging allows and as far as measured steps
///        show that they help, the others streamed at the stride that measured fastest.
///
/// When the policy is set (at construction, or by `set_policy`, which then sees the
/// model as the steps so far refined it), the model chooses the count r*: for resident
/// counts r from 0 to what fits, the predicted time of the best stride over the rest,
/// searched coarse to fine (its candidates include no residents and the full memory
/// with no streaming, so the prediction is never worse than `AutomaticStride`'s or
/// `StaticFraction`'s filling the memory). Then measurements decide
/// (`ResidencyExplorer`): once the strides over r* are swept, fewer residents, down to
/// none, take r*'s place only by beating it side by side, with the residents moved
/// between steps; `fixed_share`'s count among them once some residents won (and
/// again in blocks, if it lost narrowly); the stride over the other subgroups is chosen
/// as `AutomaticStride` chooses it.
struct ResidentThenStride {
  std::uint32_t max_stride = 8;  ///< the largest k tried, >= 1
  ExploreSettings explore{};     ///< how the stride over the other subgroups is explored
  /// The fixed share whose count is compared too, first in `ResidencyExplorer`'s
  /// refinement wherever it lies below the model's count, and again in blocks if it
  /// lost by less than `ResidencyExplorer::rematch_within`: the plan a user would
  /// otherwise pick, `StaticFraction`'s, is a candidate, as all-CPU is one for the
  /// strides. A fraction of 0 leaves it out.
  StaticFraction fixed_share{};
  ResidencyExplorer explorer{};  ///< what it has measured (its memory; read it, do not set it)

  std::string_view name() const noexcept { return "resident_then_stride"; }
  void validate() const {
    detail::check_max_stride(max_stride);
    explore.validate();
    fixed_share.validate();
  }
  void residency(const ResidencyRequest& r, std::vector<Place>& out) const {
    const std::size_t n = r.shapes.size();
    std::size_t fit = 0;
    for (std::size_t used = 0; fit < n && used + r.shapes[fit].slot_bytes <= r.device_bytes; ++fit)
      used += r.shapes[fit].slot_bytes;
    // Plans of its own: construction may allocate, but the request's scratch plan must
    // keep the capacity reserved for the steps.
    Plan candidate, other;
    std::vector<Place> residents;
    const auto cost = [&](std::size_t count) {
      resident_prefix(residents, n, count);
      return detail::best_stride(r, residents, max_stride, candidate, other);
    };
    std::size_t best = 0;
    double best_time = cost(0);
    const auto consider = [&](std::size_t count) {
      const double t = cost(count);
      if (t < best_time) best_time = t, best = count;
    };
    consider(fit);
    // Coarse to fine: nine points over [lo, hi], then the neighbourhood of the best.
    std::size_t lo = 0, hi = fit;
    while (hi > lo + 1) {
      const std::size_t step = std::max<std::size_t>(1, (hi - lo) / 8);
      for (std::size_t c = lo; c <= hi; c += step) consider(c);
      lo = best > step ? best - step : 0;
      hi = std::min(fit, best + step);
      if (step == 1) break;
    }
    resident_prefix(out, n, best);
  }
  void reserve(std::size_t subgroups) { explorer.reserve(subgroups, max_stride); }
  double choose(const PlanRequest& r, Plan& plan) {
    return explorer.choose(r, max_stride, plan, r.scratch, explore, fixed_share.count(r.shapes.size()));
  }
  void observe(const StepTimeline& t) { explorer.observe(t); }
  bool next_residency(std::vector<Place>& out) const { return explorer.next_residency(out); }
};

}  // namespace dos
