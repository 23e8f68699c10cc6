// Checkpoint cost on a large optimizer state, in one binary so the figures are ratios
// from one run:
//   BM_Step                   one optimizer step (the unit a stall is measured in)
//   BM_SaveSync               dos::save: training stalls for all of it (snapshot,
//                             checksums, write, fsync, rename)
//   BM_SaveAsyncReturn        AsyncCheckpointer::save until it returns (the copy and
//                             the write go on in the background; waited for untimed)
//   BM_AsyncSaveStall/G       training iterations (G steps' worth of forward and
//                             backward during which the CPU idles, as on a GPU
//                             machine, then step()) with and without an asynchronous
//                             save at their start, alternating: counter stall_steps is
//                             the median excess in steps (step() waits for what is
//                             left of the copy; the write competes for memory)
//   BM_WriteSnapshot          what the background thread does after the copy:
//                             checksums, write, fsync, renames, index
//   BM_PlainWrite             the same bytes written sequentially to one file + fsync:
//                             what the disk can do, to compare BM_WriteSnapshot with
// bytes_per_second of the saves and of the plain write count the checkpoint's bytes.
// Flags (before Google Benchmark's): --params=N (default 256M fp32 parameters; state
// m and v: 8 B/param), --dir=PATH (default: the system temporary directory).
// Run: build/release/bench/bench_checkpoint --params=268435456

#include <benchmark/benchmark.h>
#include <dos/checkpoint.hpp>
#include <dos/optimizer.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>

namespace {

std::size_t g_params = std::size_t{256} << 20;
std::filesystem::path g_dir;

struct Setup {
  std::vector<float> value, grad;
  std::vector<dos::HostParam<float>> params;
  std::unique_ptr<dos::CpuOptimizer> opt;
  dos::AsyncCheckpointer async;
  std::size_t bytes = 0;  // of one checkpoint file
  double step_seconds = 0;  // the fastest of three steps: the unit of the idle gaps

  Setup() : value(g_params, 0.5f), grad(g_params, 1e-3f) {
    params.push_back({value, grad});
    opt = std::make_unique<dos::CpuOptimizer>(params, dos::AdamW{.lr = 1e-3}, dos::Options{.subgroup_elements = 100'000'000});
    opt->step();  // the state is touched and non-zero
    dos::save(*opt, g_dir / "probe");
    for (const auto& e : std::filesystem::directory_iterator(g_dir / "probe"))
      if (e.path().extension() == ".safetensors") bytes = e.file_size();
    std::filesystem::remove_all(g_dir / "probe");
    step_seconds = 1e30;
    for (int i = 0; i < 3; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      opt->step();
      step_seconds = std::min(step_seconds, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
};
Setup& setup() {
  static Setup s;
  return s;
}

void finish(benchmark::State& state, std::size_t bytes) {
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
  state.counters["params"] = static_cast<double>(g_params);
}

void BM_Step(benchmark::State& state) {
  Setup& s = setup();
  for (auto _ : state) s.opt->step();
  finish(state, 0);
}

void BM_SaveSync(benchmark::State& state) {
  Setup& s = setup();
  for (auto _ : state) dos::save(*s.opt, g_dir / "sync");
  finish(state, s.bytes);
}

void BM_SaveAsyncReturn(benchmark::State& state) {
  Setup& s = setup();
  s.async.save(*s.opt, g_dir / "async").wait();  // the snapshot buffer exists from now on
  for (auto _ : state) {
    dos::SaveHandle h = s.async.save(*s.opt, g_dir / "async");
    state.PauseTiming();
    h.wait();
    state.ResumeTiming();
  }
  finish(state, 0);
}

// Training iterations: the CPU idles for G steps' time (forward and backward on the
// GPU), then steps. Each timed iteration is a pair, alternating: one without a save,
// one with an asynchronous save at its start. stall_steps is the median over pairs of
// the excess, in steps; the time reported is the pair's.
void BM_AsyncSaveStall(benchmark::State& state) {
  Setup& s = setup();
  const auto gap = std::chrono::duration<double>(static_cast<double>(state.range(0)) * s.step_seconds);
  s.async.save(*s.opt, g_dir / "async").wait();
  const auto iteration = [&](bool save) {
    const auto t0 = std::chrono::steady_clock::now();
    dos::SaveHandle h;
    if (save) h = s.async.save(*s.opt, g_dir / "async");
    std::this_thread::sleep_for(gap);
    s.opt->step();
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    h.wait();
    return t;
  };
  std::vector<double> excess;
  for (auto _ : state) {
    const double plain = iteration(false);
    excess.push_back((iteration(true) - plain) / s.step_seconds);
  }
  std::sort(excess.begin(), excess.end());
  finish(state, 0);
  state.counters["gap_steps"] = static_cast<double>(state.range(0));
  state.counters["stall_steps"] = excess[excess.size() / 2];
  state.counters["step_ms"] = s.step_seconds * 1e3;
}

void BM_WriteSnapshot(benchmark::State& state) {
  Setup& s = setup();
  if (s.async.snapshot().capacity() == 0) s.async.save(*s.opt, g_dir / "async").wait();
  for (auto _ : state) dos::checkpoint::write_snapshot(s.async.snapshot(), g_dir / "async");
  finish(state, s.bytes);
}

void BM_PlainWrite(benchmark::State& state) {
  Setup& s = setup();
  // The checkpoint's bytes, from memory already touched (the async snapshot).
  if (s.async.snapshot().capacity() == 0) s.async.save(*s.opt, g_dir / "async").wait();
  const auto* data = s.async.snapshot().data().data();
  for (auto _ : state) {
    dos::checkpoint::detail::Fd f(g_dir / "plain.bin", O_WRONLY | O_CREAT | O_TRUNC);
    f.write_all(data, s.bytes);
    f.sync();
    f.close();
  }
  std::filesystem::remove(g_dir / "plain.bin");
  finish(state, s.bytes);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--params=", 0) == 0) g_params = std::stoull(a.substr(9));
    else if (a.rfind("--dir=", 0) == 0) g_dir = a.substr(6);
    else rest.push_back(argv[i]);
  }
  if (g_dir.empty()) g_dir = std::filesystem::temp_directory_path() / "dos_bench_checkpoint";
  std::filesystem::create_directories(g_dir);
  for (auto* b : {benchmark::RegisterBenchmark("BM_Step", BM_Step), benchmark::RegisterBenchmark("BM_SaveSync", BM_SaveSync),
                  benchmark::RegisterBenchmark("BM_SaveAsyncReturn", BM_SaveAsyncReturn),
                  benchmark::RegisterBenchmark("BM_WriteSnapshot", BM_WriteSnapshot),
                  benchmark::RegisterBenchmark("BM_PlainWrite", BM_PlainWrite)})
    b->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(3);
  // More pairs: the stall is a difference of two noisy times.
  benchmark::RegisterBenchmark("BM_AsyncSaveStall", BM_AsyncSaveStall)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(9);
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::filesystem::remove_all(g_dir);
}
