// The emulated device's own CPU, for the benchmarks. A GPU computes on its own
// silicon; the emulated one runs its streams on host threads. Left to the OS on a
// 2-vCPU VM, a stream's Adam now and then ran on the core of the thread running the
// CPU side, and kept doing so for the life of that optimizer: two copies of one plan
// then read up to 30% apart for a whole run, larger than anything the policies are
// compared on (docs/design.md, "The emulated device's threads"). So the benchmarks
// keep the calling thread (the CPU side, threads = 1) on every CPU of its mask but
// the last, and give the last to the device's streams.
//
// DOS_BENCH_PIN=0 leaves both where the OS puts them, to compare.
#pragma once

#include <fmt/core.h>

#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif

namespace bench {

/// Pins the calling thread off the last CPU of its mask and returns that CPU, for
/// `dos::emulated_link(ratio, cpus)`; {} (nothing pinned) with one CPU, off Linux, or
/// under DOS_BENCH_PIN=0. Says what it did on @p say, so every report records it.
inline std::vector<int> device_cpus(std::FILE* say = stdout) {
  const char* pin = std::getenv("DOS_BENCH_PIN");
  if (pin != nullptr && std::string_view(pin) == "0") {
    fmt::print(say, "emulated device: threads where the OS puts them (DOS_BENCH_PIN=0)\n");
    return {};
  }
#if defined(__linux__)
  cpu_set_t mine;
  CPU_ZERO(&mine);
  if (sched_getaffinity(0, sizeof mine, &mine) == 0 && CPU_COUNT(&mine) >= 2) {
    int last = -1;
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &mine)) last = c;
    cpu_set_t host = mine;
    CPU_CLR(last, &host);
    if (sched_setaffinity(0, sizeof host, &host) == 0) {
      fmt::print(say, "emulated device: its streams on CPU {}, the CPU side on the {} other(s)\n", last, CPU_COUNT(&host));
      return {last};
    }
  }
#endif
  fmt::print(say, "emulated device: threads where the OS puts them (one CPU, or cannot pin)\n");
  return {};
}

}  // namespace bench
