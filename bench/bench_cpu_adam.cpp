// CPU Adam throughput against the memory-bandwidth limit, in one binary so every
// figure is a ratio from one run.
//
// Default: Google Benchmark entries, one measurement each.
//   BM_AdamShapedBandwidth/<shape>/<variant>/<n>/threads:<t>  the limit: fp32 (read 4 arrays,
//                                                      write 3) or mixed16 (the bf16 step's streams)
//   BM_CpuAdam/<fp32|bf16>/<n>/threads:<t>            dos's CPU update (fp32 state; bf16 =
//                                                      bf16 values and gradients, fp32 master)
//   items_per_second is parameters per second; bytes_per_second counts 28 B/param.
//   Run: build/release/bench/bench_cpu_adam --benchmark_min_time=2
//
// --paired[=rounds]: the table the README shows. The VM's bandwidth moves between
// levels minute to minute, so contenders run in one process, in rounds, each round
// timing every contender once (in alternating order), and the table gives medians of
// per-round ratios with their spread. For 16M and 128M parameters, fp32 and bf16, at
// every thread count up to the machine's: the step, the step on the caller's arrays
// left on 4 KiB pages, the step with the old interleaved-chunk scheduling, t 1-thread
// optimizers on t contiguous parts run side by side, and every probe variant of the
// step's shape (cpu/bandwidth_probe.hpp: fp32, or mixed16 for a bf16 step), in one
// block or in separate allocations (the limit is the variant with the shortest median
// time), and the step's bare kernel over the probe's arrays. A verdict follows: the
// step, the best probe and the parts again, alone, in twice as many rounds.
//   Run: build/release/bench/bench_cpu_adam --paired=15
//
// --calibration[=rounds]: the step's rate over the CPU rate calibrate() measures, with
// the backend's pinned memory on huge pages and on 4 KiB pages (run_calibration).
//   Run: build/release/bench/bench_cpu_adam --calibration=12

#include "rounds.hpp"

#include <benchmark/benchmark.h>
#include <dos/cpu/bandwidth_probe.hpp>
#include <dos/optimizer.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace {

constexpr std::int64_t kElements = 16'777'216;

void set_counters(benchmark::State& state, std::int64_t n) {
  state.SetItemsProcessed(state.iterations() * n);
  state.SetBytesProcessed(state.iterations() * n * static_cast<std::int64_t>(dos::adam_bytes_per_element));
}

using dos::ProbeArrays;

void BM_AdamShapedBandwidth(benchmark::State& state, dos::ProbeShape shape, dos::ProbeVariant variant) {
  dos::ThreadPool pool(static_cast<unsigned>(state.range(1)));
  ProbeArrays a(static_cast<std::size_t>(state.range(0)));
  a.pass(pool, variant, shape);  // first touch
  for (auto _ : state) {
    a.pass(pool, variant, shape);
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
    for (const dos::ProbeShape shape : {dos::ProbeShape::fp32, dos::ProbeShape::mixed16})
      for (const dos::ProbeVariant variant : dos::probe_variants)
        benchmark::RegisterBenchmark(
            fmt::format("BM_AdamShapedBandwidth/{}/{}", dos::probe_shape_name(shape), dos::probe_name(variant)).c_str(),
            BM_AdamShapedBandwidth, shape, variant)
            ->Args({kElements, t})->ArgNames({"", "threads"})->UseRealTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("BM_CpuAdam/fp32", BM_CpuAdam<float>)
        ->Args({kElements, t})->ArgNames({"", "threads"})->UseRealTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("BM_CpuAdam/bf16", BM_CpuAdam<dos::bf16>)
        ->Args({kElements, t})->ArgNames({"", "threads"})->UseRealTime()->Unit(benchmark::kMillisecond);
  }
}

// ---- --paired --------------------------------------------------------------------

// The executor as it was: chunks dealt from one shared counter.
struct InterleavedChunks : dos::cpu::CpuAdamExecutor {
  using CpuAdamExecutor::CpuAdamExecutor;
  void run(std::span<const dos::cpu::Chunk> chunks, std::span<const dos::cpu::SegmentWork> work) {
    run_interleaved(chunks, work);
  }
};
struct OldComponents : dos::DefaultComponents {
  using cpu_executor = InterleavedChunks;
};

struct Contender {
  std::string name;
  std::function<void()> run;
  bool probe = false;
  std::vector<double> seconds;  // one per round
};

using bench::median;

double quantile(std::vector<double> x, double q) {
  std::sort(x.begin(), x.end());
  return x[static_cast<std::size_t>(q * static_cast<double>(x.size() - 1) + 0.5)];
}

std::string ratio_cell(const std::vector<double>& r) {
  return fmt::format("{:.3f} [{:.3f}-{:.3f}]", median(r), quantile(r, 0.0), quantile(r, 1.0));
}

// Runs every contender once per round, alternating the order; each timing is the
// mean over `reps` calls, so small sizes are not timer-bound.
void run_rounds(std::vector<Contender>& cs, int rounds, int reps) {
  for (auto& c : cs) c.run();  // first touch
  for (int r = 0; r < rounds; ++r)
    for (std::size_t k = 0; k < cs.size(); ++k) {
      Contender& c = cs[r % 2 == 0 ? k : cs.size() - 1 - k];
      const auto t = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; ++i) c.run();
      c.seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count() / reps);
    }
}

template <class T>
void paired_case(std::size_t n, unsigned threads, int rounds, const char* type) {
  std::vector<T> value(n, T(0.5f)), grad(n, T(1e-3f));
  const dos::Options options{.subgroup_elements = n, .threads = threads, .huge_pages = std::getenv("DOS_NO_HUGE") == nullptr};
  std::vector<dos::HostParam<T>> whole{{value, grad}};
  std::vector<Contender> cs;
  std::size_t parts_at = 0;  // the t 1-thread parts' place in cs; 0: none (at one thread)
  auto step = std::make_shared<dos::CpuOptimizer>(whole, dos::AdamW{.lr = 1e-6}, options);
  cs.push_back({"step", [step] { step->step(); }});
  // The same step on arrays left on 4 KiB pages (Options::caller_huge_pages off): what
  // moving the caller's values and gradients onto huge pages gains.
  auto small_pages = std::make_shared<std::pair<std::vector<T>, std::vector<T>>>(value, grad);
  std::vector<dos::HostParam<T>> small{{small_pages->first, small_pages->second}};
  dos::Options no_collapse = options;
  no_collapse.caller_huge_pages = false;
  auto step4k = std::make_shared<dos::CpuOptimizer>(small, dos::AdamW{.lr = 1e-6}, no_collapse);
  cs.push_back({"step, 4K caller pages", [step4k, small_pages] { step4k->step(); }});
  if (threads > 1) {
    auto old = std::make_shared<dos::InterleavedOptimizer<dos::CpuBackend, OldComponents>>(whole, dos::AdamW{.lr = 1e-6},
                                                                                           options);
    cs.push_back({"interleaved chunks", [old] { old->step(); }});
    // t 1-thread optimizers on t contiguous parts, stepped side by side.
    auto parts = std::make_shared<std::vector<std::unique_ptr<dos::CpuOptimizer>>>();
    for (unsigned t = 0; t < threads; ++t) {
      const std::size_t b = n * t / threads, e = n * (t + 1) / threads;
      std::vector<dos::HostParam<T>> part{{std::span(value).subspan(b, e - b), std::span(grad).subspan(b, e - b)}};
      parts->push_back(std::make_unique<dos::CpuOptimizer>(
          part, dos::AdamW{.lr = 1e-6}, dos::Options{.subgroup_elements = e - b, .threads = 1}));
    }
    parts_at = cs.size();
    cs.push_back({fmt::format("{} x 1-thread parts", threads), [parts] {
                    std::vector<std::jthread> others;
                    for (std::size_t t = 1; t < parts->size(); ++t) others.emplace_back([&, t] { (*parts)[t]->step(); });
                    (*parts)[0]->step();
                  }});
  }
  // The probes of the step's own shape are the candidates for the limit; a 16-bit
  // step also sees the fp32-shaped probe, which moves as many bytes in other streams.
  const dos::ProbeShape shape = dos::probe_shape_of(dos::dtype_of<T>);
  auto pool = std::make_shared<dos::ThreadPool>(threads);
  auto arrays = std::make_shared<ProbeArrays>(n, shape != dos::ProbeShape::fp32);
  for (const dos::ProbeVariant variant : dos::probe_variants)
    cs.push_back({fmt::format("probe {}", dos::probe_name(variant)),
                  [pool, arrays, variant, shape] { arrays->pass(*pool, variant, shape); }, true});
  if (shape != dos::ProbeShape::fp32)
    cs.push_back({"probe native, fp32 shape", [pool, arrays] { arrays->pass(*pool, dos::ProbeVariant::native); }});
  // The probe's arrays in separate allocations (each on huge pages, 2 MiB aligned)
  // rather than one block: on the 2-vCPU EPYC VM this layout streamed faster, so it
  // belongs among the candidates for the limit.
  auto apart = std::make_shared<std::array<dos::HostBuffer<float>, 4>>();
  auto apart16 = std::make_shared<std::array<dos::HostBuffer<std::uint16_t>, 2>>();
  for (auto& b : *apart) {
    b = dos::HostBuffer<float>(n, dos::HostResource{.huge_pages = true});
    std::fill(b.span().begin(), b.span().end(), 1e-3f);
  }
  if (shape != dos::ProbeShape::fp32)
    for (auto& b : *apart16) b = dos::HostBuffer<std::uint16_t>(n, dos::HostResource{.huge_pages = true});
  const std::array<dos::ProbeVariant, 3> apart_variants{dos::ProbeVariant::native, dos::ProbeVariant::native_prefetch,
                                                        dos::ProbeVariant::native_streaming_prefetch};
  for (const dos::ProbeVariant variant : apart_variants)
    cs.push_back({fmt::format("probe {}, apart", dos::probe_name(variant)), [pool, apart, apart16, variant, shape] {
                    auto& [p, g, m, v] = *apart;
                    if (shape == dos::ProbeShape::fp32) {
                      dos::adam_shaped_pass(*pool, p.span(), g.span(), m.span(), v.span(), variant);
                    } else {
                      dos::mixed16_shaped_pass(*pool, p.span(), (*apart16)[0].span(), m.span(), v.span(),
                                               (*apart16)[1].span(), variant);
                    }
                  }, true});
  const int reps = static_cast<int>(std::max<std::size_t>(1, (std::size_t{64} << 20) / n));
  // The step's own kernel, bare, over the probe's arrays in the probe's split: not a
  // candidate for the limit (it does the step's arithmetic), but when the step beats
  // the probe it tells whether the kernel's loop streams better than the probe's loops
  // (this one beats them too) or the step's layout and scheduling do (it does not).
  auto coefficients = std::make_shared<dos::AdamCoefficients<float>>(dos::coefficients(dos::AdamW{.lr = 1e-6}, 1));
  const dos::cpu::RangeKernel kernel = dos::select_kernel(step->simd_level(), dos::dtype_of<T>, dos::dtype_of<T>, false);
  cs.push_back({"Adam kernel, probe arrays", [pool, arrays, coefficients, kernel, shape] {
                  dos::cpu::SegmentArgs a{.exp_avg = arrays->m.data(), .exp_avg_sq = arrays->v.data()};
                  if (shape == dos::ProbeShape::fp32) {
                    a.param = arrays->p.data();
                    a.grad = arrays->g.data();
                  } else {
                    a.param = arrays->copy16.data();
                    a.grad = arrays->g16.data();
                    a.master = arrays->p.data();
                  }
                  dos::detail::over_chunks(*pool, arrays->n,
                                           [&](std::size_t b, std::size_t e) { kernel(a, b, e, *coefficients); });
                }});
  run_rounds(cs, rounds, reps);

  // The limit is the probe variant with the shortest median time; every ratio to it is
  // per round. (The fastest variant of each round would not do: the minimum of several
  // noisy timings beats any one contender's typical time, even a probe's own.)
  const Contender* best = nullptr;
  for (const auto& c : cs)
    if (c.probe && (best == nullptr || median(c.seconds) < median(best->seconds))) best = &c;
  const std::vector<double>& limit = best->seconds;
  fmt::print("\n{} {}M params, {} thread{}, {} kernels\n", type, n >> 20, threads, threads > 1 ? "s" : "",
             dos::simd_name(step->simd_level()));
  fmt::print("  best probe ({} shape): {}\n", dos::probe_shape_name(shape), best->name);
  fmt::print("  {:<26} {:>7}   {:<26} {:<26}\n", "contender", "GB/s", "vs best probe: med [min-max]",
             "step vs this: med [min-max]");
  for (const auto& c : cs) {
    std::vector<double> to_limit, step_to_this;
    for (int r = 0; r < rounds; ++r) {
      to_limit.push_back(limit[r] / c.seconds[r]);
      step_to_this.push_back(c.seconds[r] / cs[0].seconds[r]);
    }
    const double gbps = static_cast<double>(n) * dos::adam_bytes_per_element / median(c.seconds) / 1e9;
    fmt::print("  {:<26} {:>7.2f}   {:<26} {:<26}\n", c.name, gbps, ratio_cell(to_limit),
               &c == &cs[0] ? std::string("-") : ratio_cell(step_to_this));
  }

  // The verdict: the step against the best probe (and the 1-thread parts) again, now
  // alone, so the timings of a round lie tens of milliseconds apart instead of the
  // whole round's second: this VM's bandwidth moves within a second, and a round of
  // every contender pairs the step with a probe run under other conditions.
  std::vector<Contender> verdict{{cs[0].name, cs[0].run}, {best->name, best->run, true}};
  if (parts_at != 0) verdict.push_back({cs[parts_at].name, cs[parts_at].run});
  const int verdict_rounds = 2 * rounds + 1;
  run_rounds(verdict, verdict_rounds, reps);
  std::vector<double> step_ratio, parts_ratio;
  for (int r = 0; r < verdict_rounds; ++r) {
    step_ratio.push_back(verdict[1].seconds[r] / verdict[0].seconds[r]);
    if (verdict.size() > 2) parts_ratio.push_back(verdict[2].seconds[r] / verdict[0].seconds[r]);
  }
  fmt::print("  verdict, {} rounds of the step, the best probe{} alone: step / best probe {}{}\n", verdict_rounds,
             verdict.size() > 2 ? " and the parts" : "", ratio_cell(step_ratio),
             parts_ratio.empty() ? std::string() : fmt::format(", step vs parts {}", ratio_cell(parts_ratio)));
  if (median(step_ratio) > 1.0)
    fmt::print("  NOTE: the step beats the best probe (median {:.3f}): the probe is not a ceiling here\n",
               median(step_ratio));
}

// DOS_PAIRED_SIZES (millions, comma-separated; default 16,128) and DOS_PAIRED_TYPES
// (fp32, bf16 or both) narrow the table for a quick look.
int run_paired(int rounds) {
  const unsigned all = dos::available_threads();
  std::vector<std::size_t> sizes;
  const char* env = std::getenv("DOS_PAIRED_SIZES");
  for (const char* p = env != nullptr ? env : "16,128"; *p != '\0';) {
    char* end = nullptr;
    sizes.push_back(std::strtoul(p, &end, 10) << 20);
    p = *end == ',' ? end + 1 : end;
    if (end == p && *p != '\0') return 2;
  }
  const std::string_view types = std::getenv("DOS_PAIRED_TYPES") != nullptr ? std::getenv("DOS_PAIRED_TYPES") : "fp32,bf16";
  for (const std::size_t n : sizes)
    for (unsigned t = 1; t <= all; ++t) {
      if (types.find("fp32") != std::string_view::npos) paired_case<float>(n, t, rounds, "fp32");
      if (types.find("bf16") != std::string_view::npos) paired_case<dos::bf16>(n, t, rounds, "bf16");
    }
  return 0;
}

// ---- --calibration ----------------------------------------------------------------

// How well the calibrated CPU rate predicts the step. calibrate() measures the CPU's
// Adam over the backend's pinned memory, where the state lives: an emulated device whose
// pinned memory is on huge pages (the default, as the state is) and one whose pinned
// memory is on 4 KiB pages (where calibration measured before 2026-12-07), each against
// the all-CPU step of a 64M-parameter optimizer on one thread, in rounds that alternate
// the order. The table gives the step's rate over each calibrated rate (1: the model
// predicts the step; 2: it predicts it twice as slow).
int run_calibration(int rounds) {
  const std::size_t elements = std::size_t{64} << 20, subgroup = std::size_t{1} << 20;
  std::vector<float> values(elements, 0.5f), grad(elements, 1e-3f);
  std::vector<dos::HostParam<float>> params;
  for (std::size_t off = 0; off < elements; off += subgroup)
    params.push_back({std::span(values).subspan(off, subgroup), std::span(grad).subspan(off, subgroup)});
  dos::InterleavedOptimizer<> opt(params, dos::AdamW{}, dos::Options{.subgroup_elements = subgroup, .threads = 1});
  opt.step();  // first touch
  dos::cpu::CpuAdamExecutor cpu({.threads = 1});
  dos::EmulatedDeviceBackend huge({.threads = 1}, {}), small({.threads = 1, .huge_pages = false}, {});
  std::vector<double> over_huge, over_small;
  fmt::print("64M parameters, one thread; rates in M parameters/s\n");
  for (int r = 0; r < rounds; ++r) {
    double rate_huge = 0, rate_small = 0, step = 0;
    const auto time_step = [&] {
      double best = std::numeric_limits<double>::infinity();
      for (int i = 0; i < 3; ++i) best = std::min(best, opt.step().seconds);
      step = static_cast<double>(elements) / best;
    };
    if (r % 2 == 0) {
      rate_huge = dos::calibrate(huge, cpu).cpu_rate;
      rate_small = dos::calibrate(small, cpu).cpu_rate;
      time_step();
    } else {
      time_step();
      rate_small = dos::calibrate(small, cpu).cpu_rate;
      rate_huge = dos::calibrate(huge, cpu).cpu_rate;
    }
    over_huge.push_back(step / rate_huge);
    over_small.push_back(step / rate_small);
    fmt::print("  round {:2}: calibrated on huge pages {:5.0f}, on 4 KiB pages {:5.0f}; the step {:5.0f}\n", r,
               rate_huge / 1e6, rate_small / 1e6, step / 1e6);
  }
  fmt::print("the step's rate over the calibrated rate, median [range]: huge pages {}, 4 KiB pages {}\n",
             ratio_cell(over_huge), ratio_cell(over_small));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--paired") return run_paired(15);
    if (a.starts_with("--paired=")) return run_paired(std::max(3, std::atoi(argv[i] + 9)));
    if (a == "--calibration") return run_calibration(12);
    if (a.starts_with("--calibration=")) return run_calibration(std::max(2, std::atoi(argv[i] + 14)));
  }
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
