// The interleaved update on the emulated device, with its copies throttled to a
// PCIe-like ratio of the measured CPU rate, so the split matters as it does on a real
// node (docs/design.md, "The cost model": R_g close to R_cpu).
//
//   BM_Interleaved/<policy>   one update step of a 16M-parameter fp32 model in 16
//                             subgroups; the CPU lane runs on one thread, the
//                             emulated device's streams on the remaining core.
// Counters: measured_s (the update, as the executor timed it), predicted_s (the
// cost model's prediction for the same plan, with what it learned from earlier
// steps), first_order_s (the first-order part alone, from the refined rates),
// k (the executed stride, averaged), explored (the share of steps that explored),
// step_s (the whole step() call: with resident_then_stride, the moves of its residents
// between steps too), residents (subgroups kept resident, averaged).
// Every policy first runs kWarmSteps unmeasured steps, in which the automatic ones settle.
// BM_Interleaved/all_cpu_again is a second all-CPU run, the control.
// Run: build/release/bench/bench_interleaved --benchmark_min_time=1
// and: /usr/bin/python3 bench/interleaved_report.py build/release/bench/bench_interleaved [min_time] [repetitions]
// (the report runs each policy five times, in a random order, and takes medians)

#include <benchmark/benchmark.h>
#include "device_cpus.hpp"

#include <dos/optimizer.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

constexpr std::size_t kElements = 16u << 20;
constexpr std::size_t kSubgroup = 1u << 20;
constexpr int kWarmSteps = 40;

// The link runs at this fraction of the CPU's Adam rate, in parameters per second
// (12 B/param each way). The paper's H100 node had R_g / R_c close to 1; the emulated
// device shares this machine's cores and memory with the CPU lane, so a lower ratio
// keeps the copies' own CPU cost from dominating.
double link_ratio() {
  if (const char* r = std::getenv("DOS_BENCH_LINK_RATIO")) return std::atof(r);
  return 0.6;
}

const dos::EmulatedLink& machine() {
  static const dos::EmulatedLink m = dos::emulated_link(link_ratio(), bench::device_cpus(stderr));
  return m;
}

void BM_Interleaved(benchmark::State& state, dos::AnyPolicy policy) {
  std::vector<float> value(kElements, 0.5f), grad(kElements, 1e-3f);
  std::vector<dos::HostParam<float>> params;
  for (std::size_t off = 0; off < kElements; off += kSubgroup)
    params.push_back({std::span(value).subspan(off, kSubgroup), std::span<const float>(grad).subspan(off, kSubgroup)});
  dos::Options o{.subgroup_elements = kSubgroup, .threads = 1};
  o.interleave.policy = policy;
  o.interleave.profile = machine().profile;
  dos::InterleavedOptimizer<dos::EmulatedDeviceBackend> opt(params, dos::AdamW{}, o, machine().device);
  // First touch, the model refines, and the automatic policies settle (they explore
  // their candidates first: bench_automatic reports how long that takes).
  for (int warm = 0; warm < kWarmSteps; ++warm) opt.step();
  double measured = 0, predicted = 0, first_order = 0, stride = 0, explored = 0, whole = 0, residents = 0;
  for (auto _ : state) {
    const dos::StepReport r = opt.step();
    measured += r.update_seconds;
    predicted += r.predicted_seconds;
    // What the model predicted before any residual it learned from measured steps.
    first_order += opt.cost_model().first_order(opt.timeline().plan);
    stride += r.stride;
    explored += r.explored ? 1 : 0;
    whole += r.seconds;
    residents += static_cast<double>(r.resident_subgroups);
    state.SetIterationTime(r.update_seconds);
  }
  const auto n = static_cast<double>(state.iterations());
  state.counters["measured_s"] = measured / n;
  state.counters["predicted_s"] = predicted / n;
  state.counters["first_order_s"] = first_order / n;
  state.counters["k"] = stride / n;
  state.counters["explored"] = explored / n;  // share of the measured steps that explored
  state.counters["step_s"] = whole / n;
  state.counters["residents"] = residents / n;
  state.counters["device_subgroups"] = static_cast<double>(opt.timeline().plan.device_subgroups());
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(kElements));
  state.SetLabel(dos::summary(opt.timeline()));
}

void register_all() {
  const auto add = [](const std::string& name, dos::AnyPolicy p) {
    benchmark::RegisterBenchmark(("BM_Interleaved/" + name).c_str(), BM_Interleaved, p)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  };
  add("all_cpu", dos::AllCpu{});
  // A second all-CPU run, the control: what the machine alone moves a figure by.
  add("all_cpu_again", dos::AllCpu{});
  for (std::uint32_t k = 1; k <= 8; ++k) add(fmt::format("stride_{}", k), dos::FixedStride{k});
  add("automatic", dos::AutomaticStride{});
  add("balanced", dos::Balanced{});
  add("static_fraction", dos::StaticFraction{0.25});
  add("resident_then_stride", dos::ResidentThenStride{});
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  const dos::EmulatedLink& m = machine();
  fmt::print(stderr,
             "calibrated: cpu {:.0f}M params/s (1 thread), link {:.2f} GB/s each way (throttle {:.2f}), device {:.0f}M "
             "params/s, duplex {}\n",
             m.profile.cpu_rate / 1e6, m.profile.h2d_bandwidth / 1e9, m.device.h2d_bandwidth / 1e9,
             m.profile.device_rate / 1e6, m.profile.duplex);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
