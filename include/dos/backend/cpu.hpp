#pragma once
/// @file
/// @brief `CpuBackend`: every subgroup is updated on the CPU, from host memory. This
///        is what ZeRO-Offload does, and the baseline every interleaved plan must beat.

#include "dos/cpu/cpu_adam.hpp"
#include "dos/options.hpp"

namespace dos {

/// @brief The all-CPU backend: no device, one CPU executor.
class CpuBackend {
 public:
  struct Config {};  ///< nothing to configure

  explicit CpuBackend(const Options& options, const Config& = {}) : cpu_(options.threads, options.simd) {}

  /// @brief The executor that runs CPU-scheduled subgroups.
  cpu::CpuAdamExecutor& cpu() noexcept { return cpu_; }
  const cpu::CpuAdamExecutor& cpu() const noexcept { return cpu_; }

 private:
  cpu::CpuAdamExecutor cpu_;
};

}  // namespace dos
