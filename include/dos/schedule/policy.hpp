#pragma once
/// @file
/// @brief The `AssignmentPolicy` concept: which subgroups the device updates in a
///        step, and which stay resident on it for good. What a policy is shown
///        (`PlanRequest`, `ResidencyRequest`), and the assignments the built-in
///        policies are made of. The built-ins are in `policies.hpp`; `AnyPolicy` holds
///        any of them, or a user's.

#include "dos/core/function_ref.hpp"
#include "dos/schedule/cost_model.hpp"
#include "dos/schedule/plan.hpp"
#include "dos/schedule/planner.hpp"
#include "dos/schedule/timeline.hpp"

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <string_view>
#include <vector>

namespace dos {

/// @brief The cost model's prediction of a plan's update seconds, as a policy sees it.
using PredictFn = FunctionRef<double(const Plan&)>;

/// @brief What a policy sees when it chooses one step's plan. Everything it needs to
///        try candidates without allocating: the shapes, the residency in force, the
///        limits, the model, and a second plan and an assignment
///        whose capacity is reserved.
struct PlanRequest {
  std::span<const SubgroupShape> shapes;
  std::span<const Place> residency;  ///< `Place::resident` or `Place::cpu`, per subgroup
  PlanLimits limits;
  const HardwareProfile& profile;
  PredictFn predict;
  Plan& scratch;
  std::vector<Place>& assignment;
};

/// @brief What a policy sees when it chooses the subgroups whose state lives on the
///        device: at construction, and when it replaces another policy (`set_policy`).
struct ResidencyRequest {
  std::span<const SubgroupShape> shapes;
  /// Device bytes left for resident subgroups once the staging slots are taken.
  std::size_t device_bytes = 0;
  PlanLimits limits;
  PredictFn predict;
  Plan& scratch;
  std::vector<Place>& assignment;
};

/// @brief Decides where each subgroup is updated.
///
/// Required: `name()`; `validate()`, which throws `std::invalid_argument` naming the
/// field and value of a bad setting; `residency(request, out)`, which fills @p out
/// with `Place::resident` or `Place::cpu` per subgroup, at construction and when it is
/// set in place of another policy (a resident subgroup's state lives on the device and
/// crosses the link only when the residency changes);
/// `choose(request, plan)`, which builds this step's plan into `plan` (keeping the
/// residents resident) and returns its predicted seconds. Optional:
/// `observe(timeline)`, called after every executed step with what was measured, and
/// `reserve(subgroups)`, called at construction, so a policy that keeps records can
/// make room for them there (a step allocates nothing); and
/// `next_residency(out)`, called after `observe`, which returns true and fills @p out
/// (within its capacity) when the policy wants other residents from the next step on:
/// the engine moves them between the steps, and the next `choose` sees the residency in
/// force (the one asked for, unless the move failed).
/// @code
/// struct EveryThird {  // subgroups 0, 3, 6, ... streamed
///   std::string_view name() const { return "every_third"; }
///   void validate() const {}
///   void residency(const dos::ResidencyRequest& r, std::vector<dos::Place>& out) const {
///     out.assign(r.shapes.size(), dos::Place::cpu);
///   }
///   double choose(const dos::PlanRequest& r, dos::Plan& plan) {
///     dos::stride_assignment(r.assignment, r.residency, 3);
///     dos::make_plan(plan, r.shapes, r.assignment, r.limits, 3);
///     return r.predict(plan);
///   }
/// };
/// static_assert(dos::AssignmentPolicy<EveryThird>);
/// @endcode
template <class P>
concept AssignmentPolicy =
    std::copy_constructible<P> && requires(const P& cp, P& p, const PlanRequest& request,
                                           const ResidencyRequest& residency, std::vector<Place>& out, Plan& plan) {
      { cp.name() } -> std::convertible_to<std::string_view>;
      cp.validate();
      cp.residency(residency, out);
      { p.choose(request, plan) } -> std::convertible_to<double>;
    };

/// @brief Residents where @p residency says, and every k-th of the other subgroups
///        (the first, the (k+1)-th, ...) streamed through the device; k = 0 streams none.
inline void stride_assignment(std::vector<Place>& out, std::span<const Place> residency, std::uint32_t k) {
  out.assign(residency.begin(), residency.end());
  std::size_t i = 0;
  for (Place& p : out) {
    if (p == Place::resident) continue;
    if (k != 0 && i % k == 0) p = Place::device;
    ++i;
  }
}

/// @brief Every k-th subgroup (0, k, 2k, ...) on the device, the rest on the CPU.
inline void stride_assignment(std::vector<Place>& out, std::size_t subgroups, std::uint32_t k) {
  out.assign(subgroups, Place::cpu);
  if (k != 0)
    for (std::size_t s = 0; s < subgroups; s += k) out[s] = Place::device;
}

/// @brief The first @p resident subgroups resident on the device, the rest on the CPU.
inline void resident_prefix(std::vector<Place>& out, std::size_t subgroups, std::size_t resident) {
  out.assign(subgroups, Place::cpu);
  std::fill_n(out.begin(), std::min(resident, subgroups), Place::resident);
}

/// @brief Subgroups that are not resident: those a stride can stream.
inline std::size_t streamable(std::span<const Place> residency) {
  return static_cast<std::size_t>(std::count(residency.begin(), residency.end(), Place::cpu));
}

/// @brief Longest subgroup first, each to the side (CPU or streamed device) whose
///        predicted finish time grows least; residents stay resident.
inline void balanced_assignment(std::vector<Place>& out, std::span<const SubgroupShape> shapes,
                                std::span<const Place> residency, const HardwareProfile& profile,
                                std::vector<std::uint32_t>& order) {
  out.assign(residency.begin(), residency.end());
  order.resize(shapes.size());
  std::iota(order.begin(), order.end(), 0u);
  // Ties broken by index: deterministic, and std::sort needs no buffer (stable_sort
  // allocates one, and this runs every step).
  std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
    return shapes[a].elements != shapes[b].elements ? shapes[a].elements > shapes[b].elements : a < b;
  });
  double cpu = 0, device = 0;
  for (const std::uint32_t s : order) {
    if (out[s] == Place::resident) continue;
    const auto elements = static_cast<double>(shapes[s].elements);
    const double on_cpu = profile.cpu_rate > 0 ? elements / profile.cpu_rate : 0;
    const double bytes = static_cast<double>(std::max(shapes[s].upload_bytes, shapes[s].download_bytes));
    const double on_device = bytes / std::max(1e-30, profile.link_rate()) +
                             (profile.device_rate > 0 ? elements / profile.device_rate : 0);
    if (std::max(cpu, device + on_device) < std::max(cpu + on_cpu, device)) {
      out[s] = Place::device;
      device += on_device;
    } else {
      cpu += on_cpu;
    }
  }
}

namespace detail {

/// The plan of stride @p k (0: no streaming) over the request's residency, and its
/// predicted seconds.
template <class Request>
double stride_plan(const Request& r, std::span<const Place> residency, Plan& into, std::uint32_t k) {
  stride_assignment(r.assignment, residency, k);
  make_plan(into, r.shapes, r.assignment, r.limits, k);
  return r.predict(into);
}

/// The best of no streaming and every stride 1..max_stride over @p residency, built into
/// @p plan (@p scratch holds the candidates). Strides past the streamable subgroups
/// stream the same single subgroup as the last one, so they are not tried.
template <class Request>
double best_stride(const Request& r, std::span<const Place> residency, std::uint32_t max_stride, Plan& plan,
                   Plan& scratch) {
  double best = stride_plan(r, residency, plan, 0);
  const auto last = static_cast<std::uint32_t>(std::min<std::size_t>(max_stride, streamable(residency)));
  std::string_view reason;
  for (std::uint32_t k = 1; k <= last; ++k) {
    const double t = stride_plan(r, residency, scratch, k);
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

}  // namespace detail

}  // namespace dos
