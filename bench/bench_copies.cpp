// How far apart do identical copies of one model run? bench_automatic compares each
// policy's copy of the model with the fixed contenders' copies; if copies of the same
// plan ran at different speeds for good, part of every ratio there would be the copy,
// not the choice. Here `copies` all-CPU copies of a 16M-parameter model (16 subgroups
// of 1M) on the emulated device step in rounds, in an order shuffled afresh each
// round; each copy's step over the round's median step, as the median over the first
// half of the rounds and over the second. Where a copy's two medians agree with each
// other and differ from 1, its speed is a property of the copy (where its memory
// lies), not of the machine's phases, and bench_automatic's placement check can take
// it out (docs/policy-runs.md, run AV).
//
//   build/release/bench/bench_copies [copies=6] [rounds=120] [runs=2]

#include "device_cpus.hpp"
#include "rounds.hpp"

#include <dos/optimizer.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <random>
#include <span>
#include <vector>

namespace {

using Optimizer = dos::InterleavedOptimizer<dos::EmulatedDeviceBackend>;
constexpr std::size_t kSubgroup = 1u << 20;

using bench::median;

}  // namespace

int main(int argc, char** argv) {
  const auto number = [&](int i, int fallback, int least) {
    if (argc <= i) return fallback;
    char* end = nullptr;
    const long x = std::strtol(argv[i], &end, 10);
    if (end == argv[i] || *end != '\0' || x < least || x > 100000) {
      fmt::print(stderr, "bench_copies: argument {} must be an integer from {} to 100000, got '{}'\n", i, least, argv[i]);
      std::exit(2);
    }
    return static_cast<int>(x);
  };
  const int copies = number(1, 6, 2), rounds = number(2, 120, 4), runs = number(3, 2, 1);
  constexpr std::size_t elements = 16 * kSubgroup;
  const std::vector<float> grad(elements, 1e-3f);
  const dos::EmulatedLink m = dos::emulated_link(0.6, bench::device_cpus());
  fmt::print("{} all-CPU copies of 16M parameters, {} rounds; each copy's step over the round's median step, "
             "median over the first half of the rounds | over the second\n",
             copies, rounds);
  for (int run = 0; run < runs; ++run) {
    std::vector<std::vector<float>> values(static_cast<std::size_t>(copies));
    std::vector<std::unique_ptr<Optimizer>> cs;
    for (std::vector<float>& v : values) {
      v.assign(elements, 0.5f);
      std::vector<dos::HostParam<float>> params;
      for (std::size_t off = 0; off < elements; off += kSubgroup)
        params.push_back({std::span(v).subspan(off, kSubgroup), std::span(grad).subspan(off, kSubgroup)});
      dos::Options o{.subgroup_elements = kSubgroup, .threads = 1};
      o.interleave.policy = dos::AllCpu{};
      o.interleave.profile = m.profile;
      cs.push_back(std::make_unique<Optimizer>(params, dos::AdamW{}, o, m.device));
      cs.back()->step();  // first touch of the state, outside the measured steps
    }
    std::mt19937 shuffle(static_cast<unsigned>(run) + 1);
    const auto over = bench::over_round_median(cs.size(), rounds, 0, shuffle, [&](std::size_t i) { return cs[i]->step().seconds; });
    fmt::print("run {}:", run + 1);
    for (const std::vector<double>& o : over) {
      const auto half = o.begin() + static_cast<std::ptrdiff_t>(o.size() / 2);
      fmt::print(" {:.3f}|{:.3f}", median({o.begin(), half}), median({half, o.end()}));
    }
    fmt::print("\n");
  }
}
