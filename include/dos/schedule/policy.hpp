#pragma once
/// @file
/// @brief Assignment policies: which subgroups the device updates in a step.
///
///  - `all_cpu`: none (ZeRO-Offload's baseline);
///  - `static_fraction`: a fixed share stays resident on the device (TwinFlow's
///    baseline); its state never crosses the link, the rest runs on the CPU;
///  - `fixed_stride`: every k-th subgroup is streamed through the device;
///  - `automatic_stride` (default): the k in 1..max_stride, or all-CPU, with the
///    shortest predicted update, chosen again every step from the refined model;
///  - `balanced`: streamed subgroups chosen by size, longest first, to balance the
///    predicted CPU and device makespans; for uneven subgroups.

#include "dos/schedule/cost_model.hpp"
#include "dos/schedule/plan.hpp"
#include "dos/schedule/planner.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

namespace dos {

enum class PolicyKind : std::uint8_t { all_cpu, static_fraction, fixed_stride, automatic_stride, balanced };

constexpr std::string_view policy_name(PolicyKind k) noexcept {
  switch (k) {
    case PolicyKind::all_cpu: return "all_cpu";
    case PolicyKind::static_fraction: return "static_fraction";
    case PolicyKind::fixed_stride: return "fixed_stride";
    case PolicyKind::automatic_stride: return "automatic_stride";
    case PolicyKind::balanced: return "balanced";
  }
  return "?";
}

/// @brief Which policy, with its parameter.
struct Policy {
  PolicyKind kind = PolicyKind::automatic_stride;
  std::uint32_t stride = 2;       ///< k for `fixed_stride`, >= 1 (1: every subgroup on the device)
  double fraction = 0.25;         ///< resident share for `static_fraction`, in [0, 1]
  std::uint32_t max_stride = 8;   ///< largest k `automatic_stride` tries, >= 1
};

/// @brief Every k-th subgroup (0, k, 2k, ...) on the device, the rest on the CPU.
inline void stride_assignment(std::vector<Place>& out, std::size_t subgroups, std::uint32_t k) {
  out.assign(subgroups, Place::cpu);
  for (std::size_t s = 0; s < subgroups; s += k) out[s] = Place::device;
}

/// @brief The first round(fraction * n) subgroups resident on the device.
inline void resident_assignment(std::vector<Place>& out, std::size_t subgroups, double fraction) {
  out.assign(subgroups, Place::cpu);
  const auto resident = static_cast<std::size_t>(std::lround(fraction * static_cast<double>(subgroups)));
  std::fill_n(out.begin(), std::min(resident, subgroups), Place::resident);
}

/// @brief Longest subgroup first, each to the side (CPU or streamed device) whose
///        predicted finish time grows least.
inline void balanced_assignment(std::vector<Place>& out, std::span<const SubgroupShape> shapes,
                                const HardwareProfile& profile, std::vector<std::uint32_t>& order) {
  out.assign(shapes.size(), Place::cpu);
  order.resize(shapes.size());
  std::iota(order.begin(), order.end(), 0u);
  // Ties broken by index: deterministic, and std::sort needs no buffer (stable_sort
  // allocates one, and this runs every step).
  std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
    return shapes[a].elements != shapes[b].elements ? shapes[a].elements > shapes[b].elements : a < b;
  });
  double cpu = 0, device = 0;
  for (const std::uint32_t s : order) {
    const auto elements = static_cast<double>(shapes[s].elements);
    const double on_cpu = profile.cpu_rate > 0 ? elements / profile.cpu_rate : 0;
    const double bytes = static_cast<double>(std::max(shapes[s].upload_bytes, shapes[s].download_bytes));
    const double on_device =
        bytes / std::max(1e-30, profile.duplex ? std::min(profile.h2d_bandwidth, profile.d2h_bandwidth)
                                               : 1 / (1 / profile.h2d_bandwidth + 1 / profile.d2h_bandwidth)) +
        (profile.device_rate > 0 ? elements / profile.device_rate : 0);
    if (std::max(cpu, device + on_device) < std::max(cpu + on_cpu, device)) {
      out[s] = Place::device;
      device += on_device;
    } else {
      cpu += on_cpu;
    }
  }
}

/// @brief Chooses and builds this step's plan into @p plan.
/// @param resident the construction-time placement: `Place::resident` subgroups stay
///        resident whatever the policy; the others are placed by @p policy.
/// @param scratch a second plan, reused to compare candidates.
/// @return the plan's predicted seconds.
template <CostModel Model>
double choose_plan(Plan& plan, Plan& scratch, std::vector<Place>& assignment, std::span<const SubgroupShape> shapes,
                   std::span<const Place> resident, const Policy& policy, const PlanLimits& limits,
                   const Model& model) {
  const std::size_t n = shapes.size();
  const auto keep_resident = [&] {
    for (std::size_t s = 0; s < n; ++s)
      if (resident[s] == Place::resident) assignment[s] = Place::resident;
  };
  const auto build = [&](Plan& into, std::uint32_t k) {
    if (k == 0) assignment.assign(n, Place::cpu);
    else stride_assignment(assignment, n, k);
    keep_resident();
    make_plan(into, shapes, assignment, limits, k);
    return model.predict(into);
  };
  switch (policy.kind) {
    case PolicyKind::all_cpu:
    case PolicyKind::static_fraction: return build(plan, 0);
    case PolicyKind::fixed_stride: return build(plan, policy.stride);
    case PolicyKind::balanced: {
      balanced_assignment(assignment, shapes, model.profile(), scratch.workspace[0]);
      keep_resident();
      make_plan(plan, shapes, assignment, limits, 0);
      return model.predict(plan);
    }
    case PolicyKind::automatic_stride: {
      double best = build(plan, 0);
      std::string_view reason;
      for (std::uint32_t k = 1; k <= policy.max_stride; ++k) {
        const double t = build(scratch, k);
        if (!scratch.fallback.empty()) {
          reason = scratch.fallback;
        } else if (t < best) {
          best = t;
          std::swap(plan, scratch);
        }
      }
      if (plan.stride == 0) plan.fallback = reason;
      return best;
    }
  }
  return build(plan, 0);
}

}  // namespace dos
