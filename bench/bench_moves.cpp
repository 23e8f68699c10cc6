// Does moving residents between steps leave a lasting cost? resident_then_stride moves
// its residents every two steps while it compares counts, then stays; if the moves
// left the device memory or the host pages slower for good, its settled steps would
// read slower than static_fraction's on the same plan, whatever it chose. Three
// contenders on the emulated device (16M parameters, 16 subgroups of 1M): static_fraction
// 0.25 (4 resident), a second copy of it (the control), and a mover: static_fraction set
// anew every two steps for the first 60, 3 and 4 residents in turn (a duel's moves),
// then 4 for 60 steps. Each round runs the three in a shuffled order; per run, the
// median over the last 60 rounds of mover/sf and sf_again/sf.
//
//   build/release/bench/bench_moves [link=0.6] [runs=5]

#include "device_cpus.hpp"
#include "rounds.hpp"

#include <dos/optimizer.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace {

using Optimizer = dos::InterleavedOptimizer<dos::EmulatedDeviceBackend>;
constexpr std::size_t kSubgroup = 1u << 20;
constexpr int kSteps = 120, kMoving = 60;

using bench::median;

struct Contender {
  std::vector<float> values;
  std::unique_ptr<Optimizer> opt;
  std::vector<double> seconds;
};

}  // namespace

int main(int argc, char** argv) {
  const auto number = [&](int i, double fallback) {
    if (argc <= i) return fallback;
    char* end = nullptr;
    const double x = std::strtod(argv[i], &end);
    if (end == argv[i] || *end != '\0' || !(x > 0 && x < 1e6)) {
      fmt::print(stderr, "bench_moves: argument {} must be a positive number, got '{}'\n", i, argv[i]);
      std::exit(2);
    }
    return x;
  };
  const double link = number(1, 0.6);
  const int runs = static_cast<int>(number(2, 5));
  constexpr std::size_t elements = 16 * kSubgroup;
  std::vector<float> grad(elements);
  for (std::size_t i = 0; i < elements; ++i) grad[i] = 1e-3f * static_cast<float>((i * 2654435761u) % 1000) - 0.5f;
  const dos::EmulatedLink m = dos::emulated_link(link, bench::device_cpus());
  fmt::print("link {}, {} runs of {} steps (the mover moves in the first {}); medians of paired ratios over the last {}\n",
             link, runs, kSteps, kMoving, kSteps - kMoving);
  for (int run = 0; run < runs; ++run) {
    std::vector<Contender> cs(3);  // static_fraction, its copy, the mover
    for (Contender& c : cs) {
      c.values.assign(elements, 0.5f);
      std::vector<dos::HostParam<float>> params;
      for (std::size_t off = 0; off < elements; off += kSubgroup)
        params.push_back({std::span(c.values).subspan(off, kSubgroup), std::span(grad).subspan(off, kSubgroup)});
      dos::Options o{.subgroup_elements = kSubgroup, .threads = 1};
      o.interleave.policy = dos::StaticFraction{0.25};
      o.interleave.profile = m.profile;
      c.opt = std::make_unique<Optimizer>(params, dos::AdamW{}, o, m.device);
      c.opt->step();  // first touch of the state, outside the measured steps
    }
    std::mt19937 shuffle(static_cast<unsigned>(run) + 1);
    std::vector<std::size_t> order{0, 1, 2};
    std::size_t moved_residents = 0, late_residents = 0;
    for (int step = 0; step < kSteps; ++step) {
      if (step < kMoving && step % 2 == 0)
        cs[2].opt->set_policy(dos::StaticFraction{(step / 2) % 2 == 0 ? 3.0 / 16 : 0.25});
      std::shuffle(order.begin(), order.end(), shuffle);
      for (const std::size_t i : order) {
        const dos::StepReport r = cs[i].opt->step();
        cs[i].seconds.push_back(r.seconds);
        if (i == 2 && step == 0) moved_residents = r.resident_subgroups;
        if (i == 2 && step == kSteps - 1) late_residents = r.resident_subgroups;
      }
    }
    std::vector<double> mover, again;
    for (std::size_t i = kMoving; i < kSteps; ++i) {
      mover.push_back(cs[2].seconds[i] / cs[0].seconds[i]);
      again.push_back(cs[1].seconds[i] / cs[0].seconds[i]);
    }
    fmt::print("run {}: mover/sf {:.3f}  sf_again/sf {:.3f}  (mover's residents: {} at step 0, {} at the end)\n", run + 1,
               median(mover), median(again), moved_residents, late_residents);
  }
}
