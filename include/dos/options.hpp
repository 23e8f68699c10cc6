#pragma once
/// @file
/// @brief What a user chooses when building an optimizer, and what a step reports.

#include "dos/cpu/simd.hpp"

#include <cstddef>
#include <cstdint>
#include <limits>

namespace dos {

/// @brief What `step()` does when a gradient holds an inf or a NaN.
enum class NonFinitePolicy : std::uint8_t {
  /// Update as torch does: the non-finite values flow into the state. No extra pass.
  propagate,
  /// Check every gradient first (one extra read of the gradients); if any element is
  /// non-finite, change nothing and report the step as skipped.
  skip_step,
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
};

}  // namespace dos
