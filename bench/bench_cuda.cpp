// The CUDA backend on a real GPU, in one run, as ratios:
//  (a) GPU Adam bytes/s (28 B/param) against a device-to-device cudaMemcpy;
//  (b) the backend's pinned h2d and d2h copies against plain cudaMemcpy;
//  (c) an update of N parameters (default 2B; bf16 values and gradients on the GPU,
//      fp32 state in pinned host memory): all-CPU against the automatic stride, and
//      the automatic stride's time against the cost model's prediction;
//  (d) the stride the automatic policy chose.
// Writes a JSON summary to the path given (default dos_cuda_summary.json).
//
//   build/release/bench/bench_cuda [summary.json] [parameters]

#include <dos/backend/cuda.hpp>
#include <dos/cuda/kernels.hpp>
#include <dos/optimizer.hpp>

#include <fmt/core.h>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using dos::cuda::check;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

template <class F>
double best_of(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t = Clock::now();
    f();
    best = std::min(best, seconds_since(t));
  }
  return best;
}

struct DeviceTensor {
  void* value = nullptr;
  void* grad = nullptr;
  std::size_t numel = 0;
};

}  // namespace

template <>
struct dos::tensor_traits<DeviceTensor> {
  static TensorView value(const DeviceTensor& t) { return {t.value, t.numel, DType::bf16, Device::device}; }
  static ConstTensorView grad(const DeviceTensor& t) { return {t.grad, t.numel, DType::bf16, Device::device}; }
};

int main(int argc, char** argv) {
  const std::string out_path = argc > 1 ? argv[1] : "dos_cuda_summary.json";
  const auto params = static_cast<std::size_t>(argc > 2 ? std::atof(argv[2]) : 2e9);
  if (const std::string why = dos::cuda::unavailable_reason(); !why.empty()) {
    std::printf("skipped: %s\n", why.c_str());
    return 77;
  }
  dos::CudaBackend b;
  auto s = b.make_stream();
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");

  // (a) GPU Adam against a device-to-device copy.
  const std::size_t n = std::size_t{1} << 28;  // 256M fp32 parameters, 4 GiB of state
  dos::DeviceBuffer<dos::cuda::DeviceMemory> arena(4 * n * 4, {});
  auto* f = reinterpret_cast<float*>(arena.data());
  check(cudaMemset(f, 0, 4 * n * 4), "cudaMemset");
  dos::DeviceSegment seg;
  seg.args = {f, f + n, nullptr, f + 2 * n, f + 3 * n, nullptr};
  seg.count = n;
  seg.coefficients = dos::coefficients(dos::AdamW{}, 1);
  const auto sync = [&] { check(cudaStreamSynchronize(s.get()), "cudaStreamSynchronize"); };
  const double adam_s = best_of(5, [&] {
    b.launch_adam({&seg, 1}, s);
    sync();
  });
  const double d2d_s = best_of(5, [&] {
    check(cudaMemcpyAsync(f + 2 * n, f, 2 * n * 4, cudaMemcpyDeviceToDevice, s.get()), "cudaMemcpyAsync d2d");
    sync();
  });
  const double adam_bw = 28.0 * static_cast<double>(n) / adam_s;
  const double d2d_bw = 2.0 * 2 * n * 4 / d2d_s;  // read and write
  fmt::print("(a) GPU Adam {:.0f} GB/s, d2d cudaMemcpy {:.0f} GB/s: {:.2f}x (target >= 0.8)\n", adam_bw / 1e9,
             d2d_bw / 1e9, adam_bw / d2d_bw);

  // (b) pinned copies through the backend against plain cudaMemcpy.
  const std::size_t bytes = std::size_t{1} << 30;
  dos::HostBuffer<std::byte, dos::cuda::PinnedMemory> pinned(bytes, b.pinned_memory());
  auto* dev = arena.data();
  const double h2d_s = best_of(5, [&] {
    b.copy_h2d(dev, pinned.data(), bytes, s);
    b.synchronize(s);
  });
  const double d2h_s = best_of(5, [&] {
    b.copy_d2h(pinned.data(), dev, bytes, s);
    b.synchronize(s);
  });
  const double h2d_peak = best_of(5, [&] { check(cudaMemcpy(dev, pinned.data(), bytes, cudaMemcpyHostToDevice), "h2d"); });
  const double d2h_peak = best_of(5, [&] { check(cudaMemcpy(pinned.data(), dev, bytes, cudaMemcpyDeviceToHost), "d2h"); });
  const double h2d_ratio = h2d_peak / h2d_s, d2h_ratio = d2h_peak / d2h_s;
  fmt::print("(b) h2d {:.1f} GB/s ({:.2f}x cudaMemcpy), d2h {:.1f} GB/s ({:.2f}x cudaMemcpy) (target >= 0.85)\n",
             bytes / h2d_s / 1e9, h2d_ratio, bytes / d2h_s / 1e9, d2h_ratio);
  arena = {};

  // (c) and (d): a large update, all-CPU against the automatic stride, one optimizer.
  const std::size_t tensor = 50'000'000;
  std::vector<DeviceTensor> tensors;
  std::vector<dos::DeviceBuffer<dos::cuda::DeviceMemory>> storage;
  for (std::size_t done = 0; done < params; done += tensor) {
    const std::size_t k = std::min(tensor, params - done);
    storage.emplace_back(2 * k * 2, dos::cuda::DeviceMemory{});
    auto* base = storage.back().data();
    check(cudaMemset(base, 0, 2 * k * 2), "cudaMemset");
    tensors.push_back({base, base + 2 * k, k});
  }
  const auto t_build = Clock::now();
  dos::Options o{.subgroup_elements = 100'000'000};
  o.interleave.policy = dos::AllCpu{};
  dos::InterleavedOptimizer<dos::CudaBackend> opt(tensors, dos::AdamW{}, o);
  fmt::print("built for {:.2f}B parameters in {:.1f} s ({} subgroups, {} CPU threads)\n", params / 1e9,
             seconds_since(t_build), opt.subgroups().size(), opt.threads());
  const auto run = [&](const dos::AnyPolicy& p, int steps) {
    opt.set_policy(p);
    opt.step();  // warm, and refine the model
    double t = 0, predicted = 0;
    std::uint32_t k = 0;
    for (int i = 0; i < steps; ++i) {
      const dos::StepReport r = opt.step();
      t += r.update_seconds;
      predicted += r.predicted_seconds;
      k = r.stride;
    }
    fmt::print("  {}\n", dos::summary(opt.timeline()));
    return std::tuple{t / steps, predicted / steps, k};
  };
  const auto [cpu_s, cpu_pred, cpu_k] = run(dos::AllCpu{}, 3);
  const auto [auto_s, auto_pred, auto_k] = run(dos::AutomaticStride{}, 3);
  (void)cpu_k;
  const double speedup = cpu_s / auto_s, prediction = auto_pred / auto_s;
  fmt::print("(c) all-CPU {:.3f} s, automatic {:.3f} s: {:.2f}x (target >= 2); predicted/measured {:.2f} "
             "(target within 20%)\n(d) chosen k = {}\n",
             cpu_s, auto_s, speedup, prediction, auto_k);

  std::ofstream(out_path) << fmt::format(
      R"({{"gpu":"{}","adam_gbps":{:.1f},"d2d_gbps":{:.1f},"adam_vs_d2d":{:.3f},"h2d_gbps":{:.2f},"d2h_gbps":{:.2f},)"
      R"("h2d_vs_memcpy":{:.3f},"d2h_vs_memcpy":{:.3f},"update_params":{},"all_cpu_s":{:.4f},"automatic_s":{:.4f},)"
      R"("speedup":{:.3f},"predicted_s":{:.4f},"predicted_vs_measured":{:.3f},"all_cpu_predicted_s":{:.4f},"chosen_k":{}}})"
      "\n",
      prop.name, adam_bw / 1e9, d2d_bw / 1e9, adam_bw / d2d_bw, bytes / h2d_s / 1e9, bytes / d2h_s / 1e9, h2d_ratio,
      d2h_ratio, params, cpu_s, auto_s, speedup, auto_pred, prediction, cpu_pred, auto_k);
  fmt::print("summary written to {}\n", out_path);
  return 0;
}
