// CPU Adam throughput against the memory-bandwidth limit, in one binary so every
// figure is a ratio from one run:
//   BM_AdamShapedBandwidth/<n>/threads:<t>   the limit (read 4 arrays, write 3)
//   BM_CpuAdam/<fp32|bf16>/<n>/threads:<t>   dos's CPU update (fp32 state; bf16 = bf16
//                                            values and gradients with an fp32 master)
// items_per_second is parameters per second; bytes_per_second counts 28 B/param.
// Run: build/release/bench/bench_cpu_adam --benchmark_min_time=2

#include <benchmark/benchmark.h>
#include <dos/cpu/bandwidth_probe.hpp>
#include <dos/optimizer.hpp>

#include <string>
#include <vector>

namespace {

constexpr std::int64_t kElements = 16'777'216;

void set_counters(benchmark::State& state, std::int64_t n) {
  state.SetItemsProcessed(state.iterations() * n);
  state.SetBytesProcessed(state.iterations() * n * static_cast<std::int64_t>(dos::adam_bytes_per_element));
}

void BM_AdamShapedBandwidth(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  dos::ThreadPool pool(static_cast<unsigned>(state.range(1)));
  std::vector<float> p(n, 1.0f), g(n, 1e-3f), m(n, 0.0f), v(n, 0.0f);
  for (auto _ : state) {
    dos::adam_shaped_pass(pool, p, g, m, v);
    benchmark::DoNotOptimize(p.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, state.range(0));
}

template <class T>
void BM_CpuAdam(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  std::vector<T> value(n, T(0.5f)), grad(n, T(1e-3f));
  std::vector<dos::HostParam<T>> params{{value, grad}};
  dos::CpuOptimizer opt(params, dos::AdamW{},
                        {.subgroup_elements = n, .threads = static_cast<unsigned>(state.range(1))});
  opt.step();  // first touch of the state outside the timing
  for (auto _ : state) {
    opt.step();
    benchmark::ClobberMemory();
  }
  set_counters(state, state.range(0));
  state.SetLabel(std::string(dos::simd_name(opt.simd_level())));
}

void register_all() {
  const auto all = static_cast<std::int64_t>(dos::available_threads());
  std::vector<std::int64_t> threads{1};
  if (all > 1) threads.push_back(all);
  for (std::int64_t t : threads) {
    benchmark::RegisterBenchmark("BM_AdamShapedBandwidth", BM_AdamShapedBandwidth)
        ->Args({kElements, t})->ArgNames({"", "threads"})->UseRealTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("BM_CpuAdam/fp32", BM_CpuAdam<float>)
        ->Args({kElements, t})->ArgNames({"", "threads"})->UseRealTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("BM_CpuAdam/bf16", BM_CpuAdam<dos::bf16>)
        ->Args({kElements, t})->ArgNames({"", "threads"})->UseRealTime()->Unit(benchmark::kMillisecond);
  }
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
