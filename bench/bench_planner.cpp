// The cost of planning one step, next to the step it plans: choose (the policy asks the
// cost model about every candidate), then validate, for 16, 1,000 and 10,000
// subgroups. A 1T-parameter model in subgroups of 100M is 10,000 of them.
//
//   BM_Plan/<policy>/<subgroups>
// Counters: plan_s (choose + validate, per step), step_s (the update time the model
// predicts for that plan on the paper's 4xH100 node per rank: 100M-parameter
// subgroups), plan_share (plan_s / step_s; the target is below 1%), and
// per_subgroup_us (planning time per subgroup, to judge other subgroup sizes).
// Run: build/release/bench/bench_planner

#include <benchmark/benchmark.h>
#include <dos/schedule/any_policy.hpp>
#include <dos/schedule/simulate.hpp>
#include <dos/schedule/validator.hpp>

#include <chrono>
#include <vector>

namespace {

const dos::HardwareProfile h100_rank{.cpu_rate = 8.6e9 / 4, .device_rate = 3.0e12 / 16, .h2d_bandwidth = 20e9,
                                     .d2h_bandwidth = 20e9, .duplex = true, .host_bandwidth = 0};

void BM_Plan(benchmark::State& state, dos::AnyPolicy policy) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto shapes = dos::uniform_shapes(n * 100'000'000, 100'000'000);
  const dos::FirstOrderCostModel model(h100_rank);
  const auto predict = [&](const dos::Plan& p) { return model.predict(p); };
  const dos::PlanLimits limits{.budget = 2 * shapes.front().slot_bytes, .max_slots = 2};
  dos::Plan plan, scratch;
  std::vector<dos::Place> assignment, residency;
  policy.residency({shapes, 0, limits, predict, scratch, assignment}, residency);
  dos::PlanCheckWorkspace check;
  check.reserve(n, 3 * n + 1, 2);
  double step = 0, planning = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    step = policy.choose({shapes, residency, limits, model.profile(), predict, scratch, assignment}, plan);
    dos::validate_plan(plan, check);
    planning += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const double per_step = planning / static_cast<double>(state.iterations());
  state.counters["plan_s"] = per_step;
  state.counters["step_s"] = step;
  state.counters["plan_share"] = per_step / step;
  state.counters["per_subgroup_us"] = per_step / static_cast<double>(n) * 1e6;
}

void register_all() {
  for (const auto& [name, policy] : {std::pair{"automatic_stride", dos::AnyPolicy(dos::AutomaticStride{})},
                                     std::pair{"fixed_stride", dos::AnyPolicy(dos::FixedStride{3})},
                                     std::pair{"balanced", dos::AnyPolicy(dos::Balanced{})}})
    benchmark::RegisterBenchmark((std::string("BM_Plan/") + name).c_str(), BM_Plan, policy)
        ->Arg(16)
        ->Arg(1000)
        ->Arg(10000)
        ->Unit(benchmark::kMicrosecond);
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
