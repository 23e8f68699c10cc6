#pragma once
/// @file
/// @brief `CpuBackend`: every subgroup is updated on the CPU, from host memory. This
///        is what ZeRO-Offload does, and the baseline every interleaved plan must beat.

#include "dos/backend/device_backend.hpp"
#include "dos/cpu/executor.hpp"

namespace dos {

/// @brief The all-CPU backend: no device. The optimizer's CPU executor does all of it.
class CpuBackend {
 public:
  struct Config {};  ///< nothing to configure

  explicit CpuBackend(const cpu::CpuConfig& = {}, const Config& = {}) noexcept {}
};
static_assert(HostBackend<CpuBackend>);

}  // namespace dos
