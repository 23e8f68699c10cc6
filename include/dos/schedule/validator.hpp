#pragma once
/// @file
/// @brief The plan validator: the invariants every plan must hold before a byte moves.
///
/// It checks exactly the properties whose violation broke the authors' code
/// (docs/design.md, "Traps"):
///  - every subgroup is updated exactly once, where its placement says, and every
///    copy its shape calls for (gradient fetch, parameter push, resident transfers)
///    is in the plan (the lost update);
///  - a streamed update reads a slot its upload filled, and is downloaded afterwards;
///  - no staging slot is refilled before the operations of its previous occupant are
///    complete;
///  - every dependency between two streams goes through a recorded event (the stream
///    race), and every dependency points backwards in issue order;
///  - peak staging stays within the budget.

#include "dos/schedule/plan.hpp"

#include <fmt/format.h>

#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace dos {

/// @brief Thrown when a plan breaks an invariant; a bug in a planner, never bad input.
class plan_error : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

/// @brief Scratch for `find_plan_error`, reserved once so that validating every step
///        allocates nothing (a plan that breaks an invariant allocates its message).
struct PlanCheckWorkspace {
  std::vector<std::uint32_t> update, upload, download, fetch, push, occupant, last_op;
  std::vector<std::uint32_t> seen, stack;
  std::uint32_t stamp = 0;

  /// @brief Room for plans of up to @p subgroups subgroups, @p ops operations and @p slots slots.
  void reserve(std::size_t subgroups, std::size_t ops, std::size_t slots) {
    for (auto* v : {&update, &upload, &download, &fetch, &push}) v->reserve(subgroups);
    occupant.reserve(slots);
    last_op.reserve(slots);
    seen.reserve(ops);
    stack.reserve(ops);
  }
};

namespace detail {

// Whether op `from` transitively depends on op `target`. Visited ops are stamped with
// a fresh number per call instead of cleared, so a call costs what it visits.
inline bool reaches(const Plan& plan, std::uint32_t from, std::uint32_t target, PlanCheckWorkspace& w) {
  if (w.seen.size() != plan.ops.size() || ++w.stamp == 0) {
    w.seen.assign(plan.ops.size(), 0);
    w.stamp = 1;
  }
  w.stack.clear();
  w.stack.push_back(from);
  while (!w.stack.empty()) {
    const std::uint32_t o = w.stack.back();
    w.stack.pop_back();
    if (o == target) return true;
    if (w.seen[o] == w.stamp) continue;
    w.seen[o] = w.stamp;
    for (const Dependency& d : plan.ops[o].dependencies())
      if (d.op < plan.ops.size()) w.stack.push_back(d.op);
  }
  return false;
}

inline std::string describe(const Plan& plan, std::uint32_t i) {
  const Op& op = plan.ops[i];
  return fmt::format("op {} ({} of subgroup {}{})", i, op_name(op.kind), op.subgroup,
                     op.slot >= 0 ? fmt::format(", slot {}", op.slot) : std::string());
}

}  // namespace detail

/// @brief The first invariant @p plan breaks, described; empty when it is sound.
inline std::optional<std::string> find_plan_error(const Plan& plan, PlanCheckWorkspace& w) {
  using detail::describe;
  const std::size_t n_ops = plan.ops.size();
  const std::size_t n_sub = plan.placement.size();
  constexpr std::uint32_t none = ~std::uint32_t{0};
  const auto reaches = [&](std::uint32_t from, std::uint32_t target) { return detail::reaches(plan, from, target, w); };

  if (plan.staging_bytes() > plan.budget)
    return fmt::format("peak staging is {} slots x {} B = {} B, over the budget of {} B", plan.slots,
                       plan.slot_bytes, plan.staging_bytes(), plan.budget);

  auto& update = w.update;
  auto& upload = w.upload;
  auto& download = w.download;
  auto& fetch = w.fetch;
  auto& push = w.push;
  for (auto* v : {&update, &upload, &download, &fetch, &push}) v->assign(n_sub, none);
  for (std::uint32_t i = 0; i < n_ops; ++i) {
    const Op& op = plan.ops[i];
    if (op.subgroup >= n_sub) return fmt::format("{} names a subgroup the plan does not place", describe(plan, i));
    if (op.lane != lane_of(op.kind)) return fmt::format("{} sits on lane {}", describe(plan, i), lane_name(op.lane));
    if (op.slot != Op::no_slot && (op.slot < 0 || static_cast<std::size_t>(op.slot) >= plan.slots))
      return fmt::format("{} uses a slot outside the {} staging slots", describe(plan, i), plan.slots);
    for (const Dependency& d : op.dependencies()) {
      if (d.op >= i) return fmt::format("{} depends on op {}, which is not issued before it", describe(plan, i), d.op);
      const Op& p = plan.ops[d.op];
      const bool needs_event = p.lane != Lane::cpu && p.lane != op.lane;
      if (needs_event && (!d.event || !p.records_event))
        return fmt::format("{} waits for {} on another stream without an event", describe(plan, i),
                           describe(plan, d.op));
      if (d.event && !p.records_event)
        return fmt::format("{} waits on an event {} never records", describe(plan, i), describe(plan, d.op));
    }
    const Place place = plan.placement[op.subgroup];
    auto& slot_of_kind = [&]() -> std::vector<std::uint32_t>& {
      switch (op.kind) {
        case OpKind::cpu_update:
        case OpKind::device_update: return update;
        case OpKind::upload: return upload;
        case OpKind::download: return download;
        case OpKind::fetch_grad: return fetch;
        case OpKind::push_params: return push;
      }
      return update;
    }();
    if (slot_of_kind[op.subgroup] != none)
      return fmt::format("subgroup {} {} twice (ops {} and {})", op.subgroup,
                         op.kind == OpKind::cpu_update || op.kind == OpKind::device_update ? "is updated"
                                                                                            : "has " + std::string(op_name(op.kind)),
                         slot_of_kind[op.subgroup], i);
    slot_of_kind[op.subgroup] = i;
    const bool on_device = op.kind == OpKind::upload || op.kind == OpKind::device_update || op.kind == OpKind::download;
    if (on_device && place == Place::cpu)
      return fmt::format("{} belongs to a subgroup placed on the CPU", describe(plan, i));
    if (!on_device && place != Place::cpu)
      return fmt::format("{} belongs to a subgroup placed on the device", describe(plan, i));
    if (on_device && (place == Place::device) != (op.slot != Op::no_slot))
      return fmt::format("{}: streamed operations need a slot, resident ones must not have one", describe(plan, i));
  }

  for (std::uint32_t s = 0; s < n_sub; ++s) {
    if (update[s] == none) return fmt::format("subgroup {} is never updated", s);
    if (s < plan.shapes.size()) {
      const SubgroupShape& sh = plan.shapes[s];
      const Place place = plan.placement[s];
      if (place == Place::cpu && sh.fetch_bytes > 0 && fetch[s] == none)
        return fmt::format("subgroup {} runs on the CPU but its device gradients are never fetched", s);
      if (place == Place::cpu && sh.push_bytes > 0 && push[s] == none)
        return fmt::format("subgroup {} runs on the CPU but its device parameters are never pushed", s);
      if (place == Place::resident && sh.resident_upload_bytes > 0 && upload[s] == none)
        return fmt::format("resident subgroup {} never receives its host inputs", s);
      if (place == Place::resident && sh.resident_download_bytes > 0 && download[s] == none)
        return fmt::format("resident subgroup {} never writes back its host parameters", s);
    }
    const Op& u = plan.ops[update[s]];
    if (plan.placement[s] == Place::cpu) {
      if (u.kind != OpKind::cpu_update) return fmt::format("subgroup {} is placed on the CPU but updated on the device", s);
      if (fetch[s] != none && !reaches(update[s], fetch[s]))
        return fmt::format("{} does not wait for its gradient fetch", describe(plan, update[s]));
      if (push[s] != none && !reaches(push[s], update[s]))
        return fmt::format("{} does not wait for the CPU update", describe(plan, push[s]));
    } else {
      if (u.kind != OpKind::device_update) return fmt::format("subgroup {} is placed on the device but updated on the CPU", s);
      if (plan.placement[s] == Place::device) {
        if (upload[s] == none || !reaches(update[s], upload[s]) || plan.ops[upload[s]].slot != u.slot)
          return fmt::format("{} does not wait for an upload into its slot", describe(plan, update[s]));
        if (download[s] == none || plan.ops[download[s]].slot != u.slot)
          return fmt::format("subgroup {} is updated on the device but its state is never written back", s);
      }
      if (upload[s] != none && !reaches(update[s], upload[s]))
        return fmt::format("{} does not wait for its upload", describe(plan, update[s]));
      if (download[s] != none && !reaches(download[s], update[s]))
        return fmt::format("{} does not wait for the device update", describe(plan, download[s]));
    }
  }

  // A slot is refilled only after every operation of its previous occupant completed.
  auto& occupant = w.occupant;
  auto& last_op = w.last_op;
  occupant.assign(plan.slots, none);
  last_op.assign(plan.slots, none);
  for (std::uint32_t i = 0; i < n_ops; ++i) {
    const Op& op = plan.ops[i];
    if (op.slot == Op::no_slot) continue;
    const auto slot = static_cast<std::size_t>(op.slot);
    if (occupant[slot] != none && occupant[slot] != op.subgroup) {
      if (op.kind != OpKind::upload)
        return fmt::format("{} uses slot {} while subgroup {} occupies it", describe(plan, i), slot, occupant[slot]);
      if (!reaches(i, last_op[slot]))
        return fmt::format("{} refills slot {} before {} completes", describe(plan, i), slot,
                           describe(plan, last_op[slot]));
    }
    occupant[slot] = op.subgroup;
    last_op[slot] = i;
  }
  return std::nullopt;
}

/// @brief `find_plan_error` with scratch of its own.
inline std::optional<std::string> find_plan_error(const Plan& plan) {
  PlanCheckWorkspace w;
  return find_plan_error(plan, w);
}

/// @brief Throws `plan_error` when @p plan breaks an invariant; allocates nothing when
///        it holds and @p w was reserved for it.
inline void validate_plan(const Plan& plan, PlanCheckWorkspace& w) {
  if (auto e = find_plan_error(plan, w)) throw plan_error("dos: invalid plan: " + *e);
}
/// @brief Throws `plan_error` when @p plan breaks an invariant.
inline void validate_plan(const Plan& plan) {
  PlanCheckWorkspace w;
  validate_plan(plan, w);
}

}  // namespace dos
