// The CUDA backend on a real GPU: every figure of the device check, each against its
// reference (tests/device/summary.py names them), timed on the device with events:
//  (a) GPU Adam, fp32 and bf16 with an fp32 master, against a device-to-device copy;
//  (b) pinned h2d and d2h against the same copies from and to pageable memory, both
//      directions at once, and many 1 MiB copies against one large copy;
//  (c) the hybrid update of bf16 device tensors (N parameters, default 2B) and of fp32
//      host tensors, pinned and pageable (N/4): all-CPU, the automatic policy (the first
//      step after calibration, not yet refined, and the last) and resident_then_stride,
//      against the physical limit N / (R_cpu + min(B_h2d, B_d2h) / 12).
// The JSON is rewritten after every figure, so a run cut at its time limit keeps what it
// measured. Without a GPU it writes why, and exits 77.
//
//   build/release/bench/bench_cuda [bench.json] [parameters]

#include <dos/backend/cuda.hpp>
#include <dos/cuda/kernels.hpp>
#include <dos/optimizer.hpp>

#include <fmt/core.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace {

using dos::cuda::check;

std::string json_escaped(std::string_view text) {
  std::string s;
  for (const char c : text) {
    if (c == '"' || c == '\\') s += '\\';
    s += c == '\n' ? ' ' : c;
  }
  return s;
}

/// The figures measured so far, written out whole after each one.
class Report {
 public:
  explicit Report(std::string path) : path_(std::move(path)) {}
  void set(const std::string& key, double value) {
    figures_[key] = value;
    fmt::print("  {} = {:.4g}\n", key, value);
    std::fflush(stdout);
    write();
  }
  void note(const std::string& key, const std::string& why) {
    reasons_[key] = why;
    write();
  }
  void write(const std::string& skipped = {}) const {
    std::string s = "{\"figures\": {";
    const char* sep = "";
    for (const auto& [k, v] : figures_) s += fmt::format("{}\"{}\": {:.6g}", std::exchange(sep, ", "), k, v);
    s += "}, \"reasons\": {";
    sep = "";
    for (const auto& [k, v] : reasons_) s += fmt::format("{}\"{}\": \"{}\"", std::exchange(sep, ", "), k, json_escaped(v));
    s += "}";
    if (!skipped.empty()) s += fmt::format(", \"skipped\": \"{}\"", json_escaped(skipped));
    s += "}\n";
    const std::string tmp = path_ + ".tmp";
    std::ofstream(tmp) << s;
    std::rename(tmp.c_str(), path_.c_str());  // a reader never sees half a file
  }

 private:
  std::string path_;
  std::map<std::string, double> figures_;
  std::map<std::string, std::string> reasons_;
};

/// Best of @p reps device-side times (events on @p s) of what @p f enqueues on @p s.
template <class F>
double device_time(dos::CudaBackend& b, dos::CudaBackend::Stream& s, int reps, F&& f) {
  auto start = b.make_event(), stop = b.make_event();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    b.record(start, s);
    f();
    b.record(stop, s);
    b.synchronize(stop);
    best = std::min(best, b.elapsed(start, stop));
  }
  return best;
}

template <class T>
struct BenchTensor {
  void* value = nullptr;
  void* grad = nullptr;
  std::size_t numel = 0;
};
struct DeviceBf16 {};
struct HostF32 {};

/// Host memory of the kind a framework hands over: pinned (cudaHostAlloc) or pageable.
struct HostBlock {
  std::byte* p = nullptr;
  bool pinned = false;
  HostBlock(std::size_t bytes, bool pin) : pinned(pin) {
    if (pin) check(cudaHostAlloc(reinterpret_cast<void**>(&p), bytes, cudaHostAllocDefault), "cudaHostAlloc");
    else p = static_cast<std::byte*>(::operator new(bytes, std::align_val_t{64}));
    std::memset(p, 0, bytes);  // touched: pageable pages exist before they are timed
  }
  HostBlock(HostBlock&& o) noexcept : p(std::exchange(o.p, nullptr)), pinned(o.pinned) {}
  HostBlock& operator=(HostBlock&&) = delete;
  ~HostBlock() {
    if (p == nullptr) return;
    if (pinned) cudaFreeHost(p);
    else ::operator delete(p, std::align_val_t{64});
  }
};

}  // namespace

template <>
struct dos::tensor_traits<BenchTensor<DeviceBf16>> {
  static TensorView value(const BenchTensor<DeviceBf16>& t) { return {t.value, t.numel, DType::bf16, Device::device}; }
  static ConstTensorView grad(const BenchTensor<DeviceBf16>& t) { return {t.grad, t.numel, DType::bf16, Device::device}; }
};
template <>
struct dos::tensor_traits<BenchTensor<HostF32>> {
  static TensorView value(const BenchTensor<HostF32>& t) { return {t.value, t.numel, DType::f32, Device::host}; }
  static ConstTensorView grad(const BenchTensor<HostF32>& t) { return {t.grad, t.numel, DType::f32, Device::host}; }
};

namespace {

constexpr double GB = 1e9;

void adam_and_copies(dos::CudaBackend& b, Report& r, double& h2d_bps, double& d2h_bps) {
  auto s = b.make_stream(), s2 = b.make_stream();
  // (a) 256M parameters: 5 GiB of arrays, far beyond L2.
  const std::size_t n = std::size_t{1} << 28;
  dos::DeviceBuffer<dos::cuda::DeviceMemory> arena(5 * n * 4, b.device_memory());
  auto* f = reinterpret_cast<float*>(arena.data());
  // On the stream that then reads it: a legacy-stream memset is not ordered before
  // work on a non-blocking stream.
  check(cudaMemsetAsync(f, 0, 5 * n * 4, s.get()), "cudaMemsetAsync");
  const double d2d = device_time(b, s, 5, [&] {
    check(cudaMemcpyAsync(f + 2 * n, f, 2 * n * 4, cudaMemcpyDeviceToDevice, s.get()), "cudaMemcpyAsync d2d");
  });
  r.set("d2d_copy_gbps", 2.0 * 2 * n * 4 / d2d / GB);  // read and write
  dos::DeviceSegment seg;
  seg.coefficients = dos::coefficients(dos::AdamW{}, 1);
  seg.count = n;
  seg.args = {f, f + n, nullptr, f + 2 * n, f + 3 * n, nullptr};
  const double fp32 = device_time(b, s, 5, [&] { b.launch_adam({&seg, 1}, s); });
  r.set("adam_fp32_gbps", 28.0 * n / fp32 / GB);
  r.set("adam_fp32_vs_d2d", (28.0 * n / fp32) / (4.0 * n * 4 / d2d));
  // bf16 values and gradients, fp32 master, m and v: 2 + 2 + 8 + 8 + 8 = 28 B too.
  auto* h = reinterpret_cast<std::uint16_t*>(f + 4 * n);
  seg.value = seg.grad = dos::DType::bf16;
  seg.args = {h, h + n, f, f + n, f + 2 * n, nullptr};
  const double bf16 = device_time(b, s, 5, [&] { b.launch_adam({&seg, 1}, s); });
  r.set("adam_bf16_master_gbps", 28.0 * n / bf16 / GB);
  r.set("adam_bf16_master_vs_d2d", (28.0 * n / bf16) / (4.0 * n * 4 / d2d));

  // (b) 1 GiB each way.
  const std::size_t bytes = std::size_t{1} << 30;
  auto* dev = arena.data();
  auto* dev2 = arena.data() + bytes;
  HostBlock pinned(bytes, true), pinned2(bytes, true), pageable(bytes, false);
  const double total = static_cast<double>(bytes);
  const auto gbps = [](double secs, double moved) { return moved / secs / GB; };
  const double h2d = device_time(b, s, 5, [&] { b.copy_h2d(dev, pinned.p, bytes, s); });
  const double d2h = device_time(b, s, 5, [&] { b.copy_d2h(pinned.p, dev, bytes, s); });
  h2d_bps = bytes / h2d, d2h_bps = bytes / d2h;
  r.set("h2d_pinned_gbps", gbps(h2d, total));
  r.set("d2h_pinned_gbps", gbps(d2h, total));
  r.set("h2d_pageable_gbps", gbps(device_time(b, s, 3, [&] { b.copy_h2d(dev, pageable.p, bytes, s); }), total));
  r.set("d2h_pageable_gbps", gbps(device_time(b, s, 3, [&] { b.copy_d2h(pageable.p, dev, bytes, s); }), total));
  auto forked = b.make_event(), joined = b.make_event();
  r.set("h2d_d2h_at_once_gbps", gbps(device_time(b, s, 5, [&] {
                                        b.record(forked, s);
                                        b.wait(s2, forked);
                                        b.copy_h2d(dev, pinned.p, bytes, s);
                                        b.copy_d2h(pinned2.p, dev2, bytes, s2);
                                        b.record(joined, s2);
                                        b.wait(s, joined);
                                      }), 2 * total));
  const std::size_t mib = std::size_t{1} << 20;
  r.set("many_1mb_h2d_gbps", gbps(device_time(b, s, 5, [&] {
          for (std::size_t o = 0; o < bytes; o += mib) b.copy_h2d(dev + o, pinned.p + o, mib, s);
        }), total));
  r.set("one_large_h2d_gbps", gbps(h2d, total));
}

/// One hybrid update, N parameters in tensors of at most 50M: the automatic policy from
/// its first (calibrated, unrefined) step, then all-CPU, then resident_then_stride.
template <class Kind>
void hybrid(Report& r, const std::string& pre, std::size_t params, bool pin, double h2d_bps, double d2h_bps) {
  constexpr bool on_device = std::is_same_v<Kind, DeviceBf16>;
  constexpr std::size_t element = on_device ? 2 : 4;
  const std::size_t tensor = 50'000'000;
  std::vector<BenchTensor<Kind>> tensors;
  std::vector<dos::DeviceBuffer<dos::cuda::DeviceMemory>> device;
  std::vector<HostBlock> host;
  for (std::size_t done = 0; done < params; done += tensor) {
    const std::size_t k = std::min(tensor, params - done);
    std::byte* base = nullptr;
    if constexpr (on_device) {
      device.emplace_back(2 * k * element, dos::cuda::DeviceMemory{});
      base = device.back().data();
      check(cudaMemset(base, 0, 2 * k * element), "cudaMemset");
      check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");  // before dos's non-blocking streams read it
    } else {
      host.emplace_back(2 * k * element, pin);
      base = host.back().p;
    }
    tensors.push_back({base, base + k * element, k});
  }
  r.set(pre + "params", static_cast<double>(params));
  const auto steps = [&](auto& opt, int count, const std::string& name) {
    dos::StepReport last;
    for (int i = 0; i < count; ++i) {
      last = opt.step();
      if (i == 0 && name == "automatic") {
        r.set(pre + "automatic_first_predicted_s", last.predicted_seconds);
        r.set(pre + "automatic_first_measured_s", last.update_seconds);
      }
    }
    fmt::print("  {}: {}\n", name, dos::summary(opt.timeline()));
    return last;
  };
  dos::Options o{.subgroup_elements = 100'000'000};
  {
    o.interleave.policy = dos::AutomaticStride{};
    dos::InterleavedOptimizer<dos::CudaBackend> opt(tensors, dos::AdamW{}, o);
    const dos::StepReport a = steps(opt, 4, "automatic");
    r.set(pre + "automatic_last_predicted_s", a.predicted_seconds);
    r.set(pre + "automatic_last_measured_s", a.update_seconds);
    r.set(pre + "automatic_s", a.update_seconds);
    r.set(pre + "automatic_k", a.stride);
    opt.set_policy(dos::AllCpu{});
    const dos::StepReport c = steps(opt, 2, "all_cpu");
    r.set(pre + "all_cpu_s", c.update_seconds);
    const double r_cpu = static_cast<double>(params) / c.update_seconds;
    r.set(pre + "cpu_params_per_s", r_cpu);
    r.set(pre + "physical_limit_s", static_cast<double>(params) / (r_cpu + std::min(h2d_bps, d2h_bps) / 12));
  }
  o.interleave.policy = dos::ResidentThenStride{};
  dos::InterleavedOptimizer<dos::CudaBackend> opt(tensors, dos::AdamW{}, o);
  const dos::StepReport rs = steps(opt, 3, "resident_then_stride");
  r.set(pre + "resident_then_stride_s", rs.update_seconds);
  r.set(pre + "resident_then_stride_k", rs.stride);
}

}  // namespace

int main(int argc, char** argv) {
  Report report(argc > 1 ? argv[1] : "bench.json");
  const auto params = static_cast<std::size_t>(argc > 2 ? std::atof(argv[2]) : 2e9);
  if (const std::string why = dos::cuda::unavailable_reason(); !why.empty()) {
    std::printf("skipped: %s\n", why.c_str());
    report.write(why);
    return 77;
  }
  dos::CudaBackend b;
  double h2d_bps = 0, d2h_bps = 0;
  fmt::print("(a, b) Adam against a d2d copy; copies\n");
  adam_and_copies(b, report, h2d_bps, d2h_bps);
  fmt::print("(c) hybrid update, {:.2g} bf16 device parameters\n", static_cast<double>(params));
  hybrid<DeviceBf16>(report, "hybrid_device_", params, false, h2d_bps, d2h_bps);
  for (const bool pin : {true, false}) {
    fmt::print("(c) hybrid update, {:.2g} fp32 host parameters, {}\n", params / 4.0, pin ? "pinned" : "pageable");
    hybrid<HostF32>(report, pin ? "hybrid_host_pinned_" : "hybrid_host_pageable_", params / 4, pin, h2d_bps, d2h_bps);
  }
  return 0;
}
