#pragma once
/// @file
/// @brief `emulated_link(ratio)`: an emulated device whose copies are throttled so the
///        link moves `ratio` times this machine's one-thread CPU Adam rate, in
///        parameters per second (12 B each way), and the profile calibrated on it.
///        The paper's node had the device path about as fast as the CPU (ratio ~1);
///        on a machine without a GPU this is how the examples and benchmarks make the
///        split matter as it does there (docs/design.md, "The cost model").

#include "dos/backend/emulated_device.hpp"
#include "dos/cpu/cpu_adam.hpp"
#include "dos/engine/calibrate.hpp"
#include "dos/error.hpp"

#include <algorithm>
#include <utility>
#include <vector>

namespace dos {

/// @brief A throttled emulated device and the profile the optimizer would calibrate on it.
struct EmulatedLink {
  EmulatedDeviceConfig device;  ///< pass to `InterleavedOptimizer<EmulatedDeviceBackend>`
  HardwareProfile profile;      ///< pass as `Options::interleave.profile` to skip calibrating again
};

/// @brief Measures this machine (one CPU thread; the emulated device's streams run on
///        another) and throttles the emulated link to @p ratio times the CPU's rate.
/// @param ratio the link's rate over the CPU's one-thread Adam rate, in parameters/s.
/// @param device_cpus where the device's streams run (`EmulatedDeviceConfig::cpus`),
///        in the calibration and in the returned config; empty: wherever the OS puts
///        them. The calling thread runs the CPU side: keep it off these CPUs.
/// @throws std::invalid_argument unless @p ratio is positive and finite, or when a
///         stream cannot run on @p device_cpus.
inline EmulatedLink emulated_link(double ratio, std::vector<int> device_cpus = {}) {
  if (!(ratio > 0 && ratio < 1e300)) throw_invalid_argument("emulated_link ratio must be positive, got {}", ratio);
  EmulatedLink out;
  out.device.cpus = std::move(device_cpus);
  cpu::CpuAdamExecutor cpu({.threads = 1});
  EmulatedDeviceBackend free_device({.threads = 1}, {.cpus = out.device.cpus});
  const HardwareProfile free = calibrate(free_device, cpu);
  // An emulated copy takes its throttled time plus the memcpy itself, so the throttle
  // is set for the sum to give the target rate.
  const double target = 12 * free.cpu_rate * ratio;
  const double memcpy_rate = std::min(free.h2d_bandwidth, free.d2h_bandwidth);
  out.device.h2d_bandwidth = out.device.d2h_bandwidth = target < memcpy_rate ? 1 / (1 / target - 1 / memcpy_rate) : 0;
  EmulatedDeviceBackend throttled({.threads = 1}, out.device);
  out.profile = calibrate(throttled, cpu);
  return out;
}

}  // namespace dos
