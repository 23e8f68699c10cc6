#pragma once
/// @file
/// @brief `InterleaveOptions`: how a device backend splits the update, and `UpdateReport`,
///        what an update engine says about the update it ran.

#include "dos/schedule/any_policy.hpp"
#include "dos/schedule/cost_model.hpp"

#include <cstddef>
#include <optional>
#include <string_view>

namespace dos {

/// @brief How a device backend splits the update. Ignored by `CpuBackend`.
struct InterleaveOptions {
  /// Which subgroups the device updates; any `AssignmentPolicy`.
  AnyPolicy policy{};
  /// Device bytes for staging slots, allocated once at construction; 0 means what the
  /// backend reports free then. `set_staging_budget` lowers it for later steps.
  std::size_t staging_budget = 0;
  /// Staging slots at most: 2 is double buffering; 0 lets the budget decide.
  std::size_t staging_slots = 2;
  /// The machine's profile; when absent, `calibrate()` measures it at construction.
  std::optional<HardwareProfile> profile{};
  /// Refine the profile from every measured step.
  bool refine = true;
  /// Check every plan with `validate_plan` before running it. On in every build: the
  /// check costs microseconds next to a step, and one definition of this class must
  /// hold in translation units built with and without NDEBUG.
  bool validate_plans = true;
};

/// @brief What the update phase of one step did (device backends fill it in).
struct UpdateReport {
  std::string_view policy;           ///< the assignment policy in use
  std::uint32_t stride = 0;          ///< k of the executed plan; 0 when not a stride
  std::size_t device_subgroups = 0;  ///< subgroups updated on the device, residents included
  std::size_t resident_subgroups = 0;  ///< of those, subgroups resident on the device
  std::size_t bytes_moved = 0;       ///< bytes across the link, both directions
  double predicted_seconds = 0;      ///< the cost model's prediction for the plan
  double update_seconds = 0;         ///< measured time of the plan's execution
  std::string_view fallback;         ///< why the step fell back to the CPU, if it did
  bool explored = false;             ///< the policy ran this plan to measure it, not as its best
  std::size_t early_fetch_bytes = 0; ///< device gradients copied to the host during backward (grad_ready)
};

}  // namespace dos
