#pragma once
/// @file
/// @brief The overlap planner: turns an assignment of subgroups to places into an
///        explicit plan of operations on lanes.
///
/// Issue order, which is what makes the lanes overlap:
///  1. gradient fetches of CPU subgroups whose gradients sit on the device, so the
///     CPU can start as soon as the first one lands;
///  2. resident subgroups (their state is already on the device);
///  3. the streamed pipeline: subgroup i of the device list uses slot i mod S; its
///     upload waits for the download of the slot's previous occupant, its update for
///     its upload, its download for its update;
///  4. CPU updates, each followed by the push of its parameters that live on the
///     device. The host has already issued every device operation, so the device
///     side runs while the CPU works.

#include "dos/schedule/plan.hpp"

#include <algorithm>
#include <cstddef>
#include <span>

namespace dos {

/// @brief Limits of one plan.
struct PlanLimits {
  std::size_t budget = 0;     ///< staging bytes available on the device this step
  std::size_t max_slots = 2;  ///< staging slots at most (2: double buffering); 0 for no limit
};

namespace detail {
inline std::uint32_t push_op(Plan& plan, OpKind kind, std::uint32_t subgroup, std::size_t bytes,
                             std::size_t elements, std::int32_t slot = Op::no_slot) {
  Op op;
  op.kind = kind;
  op.lane = lane_of(kind);
  op.subgroup = subgroup;
  op.bytes = bytes;
  op.elements = elements;
  op.slot = slot;
  plan.ops.push_back(op);
  return static_cast<std::uint32_t>(plan.ops.size() - 1);
}
// Adds "consumer waits for producer", with an event unless both share a stream or
// the producer runs on the CPU (met by issue order).
inline void depend(Plan& plan, std::uint32_t consumer, std::uint32_t producer) {
  Op& p = plan.ops[producer];
  const bool event = p.lane != Lane::cpu && p.lane != plan.ops[consumer].lane;
  if (event) p.records_event = true;
  plan.ops[consumer].depend(producer, event);
}
}  // namespace detail

/// @brief Builds the plan for @p assignment into @p plan (whose capacity is reused, so
///        re-planning every step allocates nothing once warm).
///
/// When the budget cannot hold one staging slot, the streamed subgroups go to the CPU
/// and `plan.fallback` says why; that is a normal outcome, not an error.
inline void make_plan(Plan& plan, std::span<const SubgroupShape> shapes, std::span<const Place> assignment,
                      const PlanLimits& limits, std::uint32_t stride = 0) {
  plan.ops.clear();
  plan.placement.assign(assignment.begin(), assignment.end());
  plan.shapes.assign(shapes.begin(), shapes.end());
  plan.stride = stride;
  plan.budget = limits.budget;
  plan.fallback = {};
  plan.explored = false;
  plan.slot_bytes = 0;
  plan.slots = 0;

  std::size_t streamed = 0;
  for (std::size_t s = 0; s < shapes.size(); ++s)
    if (plan.placement[s] == Place::device) {
      plan.slot_bytes = std::max(plan.slot_bytes, shapes[s].slot_bytes);
      ++streamed;
    }
  if (streamed > 0) {
    std::size_t slots = plan.slot_bytes == 0 ? streamed : limits.budget / plan.slot_bytes;
    if (limits.max_slots != 0) slots = std::min(slots, limits.max_slots);
    plan.slots = std::min(slots, streamed);
    if (plan.slots == 0) {
      plan.fallback = "the staging budget is smaller than one subgroup's staging slot";
      for (Place& p : plan.placement)
        if (p == Place::device) p = Place::cpu;
      plan.slot_bytes = 0;
      plan.stride = 0;
    }
  }

  constexpr std::uint32_t none = ~std::uint32_t{0};
  const auto n = static_cast<std::uint32_t>(shapes.size());
  using detail::depend;
  using detail::push_op;

  // 1. Gradient fetches for the CPU.
  std::vector<std::uint32_t>& fetch = plan.workspace[0];
  fetch.assign(n, none);
  for (std::uint32_t s = 0; s < n; ++s)
    if (plan.placement[s] == Place::cpu && shapes[s].fetch_bytes > 0)
      fetch[s] = push_op(plan, OpKind::fetch_grad, s, shapes[s].fetch_bytes, 0);

  // 2. Resident subgroups: gradients in if they are on the host, parameters out if
  //    the framework keeps them on the host.
  for (std::uint32_t s = 0; s < n; ++s) {
    if (plan.placement[s] != Place::resident) continue;
    const SubgroupShape& sh = shapes[s];
    std::uint32_t up = none;
    if (sh.resident_upload_bytes > 0) up = push_op(plan, OpKind::upload, s, sh.resident_upload_bytes, 0);
    const std::uint32_t update = push_op(plan, OpKind::device_update, s, 0, sh.elements);
    if (up != none) depend(plan, update, up);
    if (sh.resident_download_bytes > 0) {
      const std::uint32_t down = push_op(plan, OpKind::download, s, sh.resident_download_bytes, 0);
      depend(plan, down, update);
    }
  }

  // 3. The streamed pipeline over `slots` staging slots.
  std::vector<std::uint32_t>& last_use = plan.workspace[1];
  last_use.assign(plan.slots, none);
  std::size_t i = 0;
  for (std::uint32_t s = 0; s < n; ++s) {
    if (plan.placement[s] != Place::device) continue;
    const auto slot = static_cast<std::int32_t>(i++ % plan.slots);
    const SubgroupShape& sh = shapes[s];
    const std::uint32_t up = push_op(plan, OpKind::upload, s, sh.upload_bytes, 0, slot);
    if (last_use[slot] != none) depend(plan, up, last_use[slot]);
    const std::uint32_t update = push_op(plan, OpKind::device_update, s, 0, sh.elements, slot);
    depend(plan, update, up);
    const std::uint32_t down = push_op(plan, OpKind::download, s, sh.download_bytes, 0, slot);
    depend(plan, down, update);
    last_use[slot] = down;
  }

  // 4. CPU updates and their parameter pushes.
  for (std::uint32_t s = 0; s < n; ++s) {
    if (plan.placement[s] != Place::cpu) continue;
    const std::uint32_t update = push_op(plan, OpKind::cpu_update, s, shapes[s].cpu_bytes, shapes[s].elements);
    if (fetch[s] != none) depend(plan, update, fetch[s]);
    if (shapes[s].push_bytes > 0) {
      const std::uint32_t push = push_op(plan, OpKind::push_params, s, shapes[s].push_bytes, 0);
      depend(plan, push, update);
    }
  }
}

}  // namespace dos
