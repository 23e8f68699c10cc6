#pragma once
// The emulated device with its copies throttled to a given ratio of this machine's
// one-thread CPU Adam rate, so the split matters as it does on a real node
// (docs/design.md, "The cost model": R_g close to R_cpu). Shared by the interleaving
// benchmarks.

#include <dos/optimizer.hpp>

#include <algorithm>

namespace dos::bench {

struct Machine {
  EmulatedDeviceConfig device;
  HardwareProfile profile;  ///< calibrated on the throttled device, as the optimizer would
};

/// The link runs at @p link_ratio times the CPU's Adam rate, in parameters per second
/// (12 B/param each way). The CPU lane runs on one thread, the emulated device's
/// streams on the other core.
inline Machine emulated_machine(double link_ratio) {
  Machine out;
  cpu::CpuAdamExecutor cpu({.threads = 1});
  EmulatedDeviceBackend probe({.threads = 1});
  const HardwareProfile free = calibrate(probe, cpu);
  // An emulated copy takes its throttled time plus the memcpy itself, so the throttle
  // is set for the sum to give the target link rate.
  const double target = 12 * free.cpu_rate * link_ratio;
  const double memcpy_rate = std::min(free.h2d_bandwidth, free.d2h_bandwidth);
  out.device.h2d_bandwidth = out.device.d2h_bandwidth = target < memcpy_rate ? 1 / (1 / target - 1 / memcpy_rate) : 0;
  EmulatedDeviceBackend throttled({.threads = 1}, out.device);
  out.profile = calibrate(throttled, cpu);
  return out;
}

}  // namespace dos::bench
