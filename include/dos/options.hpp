#pragma once
/// @file
/// @brief What a user chooses when building an optimizer, and what a step reports.

#include "dos/cpu/simd.hpp"
#include "dos/schedule/cost_model.hpp"
#include "dos/schedule/policy.hpp"

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>

namespace dos {

/// @brief What `step()` does when a gradient holds an inf or a NaN.
enum class NonFinitePolicy : std::uint8_t {
  /// Update as torch does: the non-finite values flow into the state. No extra pass.
  propagate,
  /// Check every gradient first (one extra read of the gradients); if any element is
  /// non-finite, change nothing and report the step as skipped.
  skip_step,
};

/// @brief How a device backend splits the update. Ignored by `CpuBackend`.
struct InterleaveOptions {
  Policy policy{};
  /// Device bytes for staging slots, allocated once at construction; 0 means what the
  /// backend reports free then. `set_staging_budget` lowers it for later steps.
  std::size_t staging_budget = 0;
  /// Staging slots at most: 2 is double buffering; 0 lets the budget decide.
  std::size_t staging_slots = 2;
  /// The machine's profile; when absent, `calibrate()` measures it at construction.
  std::optional<HardwareProfile> profile{};
  /// Refine the profile from every measured step.
  bool refine = true;
  /// Check every plan with `validate_plan` before running it.
#ifdef NDEBUG
  bool validate_plans = false;
#else
  bool validate_plans = true;
#endif
};

/// @brief Dynamic loss scaling for fp16 training, as torch's GradScaler: multiply the
///        loss by `InterleavedOptimizer::loss_scale()` before backward; `step()`
///        unscales, skips the step on overflow (inf/NaN gradients) and backs the scale
///        off, and grows it after `growth_interval` clean steps.
struct LossScaling {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;
};

/// @brief Construction options shared by every backend.
struct Options {
  /// Target elements per subgroup (the unit of scheduling). The paper used 100M.
  std::size_t subgroup_elements = 100'000'000;
  /// CPU threads for the update, the caller included; 0 means every hardware thread
  /// this process may use. Set it explicitly under torchrun, which sets
  /// OMP_NUM_THREADS=1 (dos does not read OpenMP variables).
  unsigned threads = 0;
  NonFinitePolicy nonfinite = NonFinitePolicy::propagate;
  /// Force a CPU kernel family (tests, benchmarks); `automatic` picks the widest.
  SimdLevel simd = SimdLevel::automatic;
  /// Back large state blocks with transparent huge pages.
  bool huge_pages = true;
  /// Global-norm gradient clipping (L2), as torch.nn.utils.clip_grad_norm_; 0 turns it off.
  double max_grad_norm = 0;
  /// Dynamic loss scaling; implies skipping steps whose gradients overflow.
  std::optional<LossScaling> loss_scaling{};
  /// The CPU/device split, for device backends.
  InterleaveOptions interleave{};
};

/// @brief What one call to `step()` did.
struct StepReport {
  static constexpr std::size_t none = std::numeric_limits<std::size_t>::max();

  bool applied = false;              ///< false when the step was skipped
  std::int64_t step = 0;             ///< the optimizer's step count after the call
  std::size_t elements = 0;          ///< elements updated
  std::size_t nonfinite_params = 0;  ///< parameters with a non-finite gradient (skip_step only)
  std::size_t first_nonfinite_param = none;
  double seconds = 0;                ///< wall time of the call
  bool overflow = false;             ///< skipped because a gradient held an inf or a NaN
  double grad_norm = -1;             ///< global L2 norm of the (unscaled) gradients; -1 if not computed
  double clip_coef = 1;              ///< the factor the gradients were multiplied by (clipping)
  double loss_scale = 1;             ///< the loss scale this step's gradients carried

  // Device backends only:
  std::string_view policy;           ///< the assignment policy in use
  std::uint32_t stride = 0;          ///< k of the executed plan; 0 when not a stride
  std::size_t device_subgroups = 0;  ///< subgroups updated on the device
  std::size_t bytes_moved = 0;       ///< bytes across the link, both directions
  double predicted_seconds = 0;      ///< the cost model's prediction for the plan
  double update_seconds = 0;         ///< measured time of the plan's execution
  std::string_view fallback;         ///< why the step fell back to the CPU, if it did
  std::size_t early_fetch_bytes = 0; ///< device gradients copied to the host during backward (grad_ready)
};

}  // namespace dos
