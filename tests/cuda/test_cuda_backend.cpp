// The CUDA backend on a real GPU: streams and events, the Adam kernel against the CPU
// executor bit for bit (every value/gradient type, amsgrad, unaligned and tiny
// segments, many segments per launch), the gradient reduction, and the interleaved
// optimizer against CpuOptimizer over 50 steps, with clipping and loss scaling, and
// read_state/write_state between two optimizers. Without a GPU every case is skipped:
// the process exits with 77, which CTest reports as skipped, not passed.

#define DOCTEST_CONFIG_IMPLEMENT
#include "../support/backend_compare.hpp"
#include "cuda_access.hpp"

#include <doctest/doctest.h>
#include <dos/backend/cuda.hpp>
#include <dos/cuda/kernels.hpp>
#include <dos/optimizer.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

using namespace dos;
using test::CudaAccess;

namespace {

struct DeviceArray {
  DeviceBuffer<cuda::DeviceMemory> buf;
  explicit DeviceArray(std::size_t bytes) : buf(bytes, cuda::DeviceMemory{}) {}
  template <class T>
  T* as() const { return reinterpret_cast<T*>(buf.data()); }
};

}  // namespace

TEST_CASE("events order a copy on one stream after another stream's copy") {
  CudaBackend b;
  constexpr std::size_t n = 1 << 22;
  std::vector<float> host(n, 3.0f), back(n, 0.0f);
  DeviceArray d(n * 4);
  auto up = b.make_stream(), down = b.make_stream();
  auto e = b.make_event(), start = b.make_event();
  b.record(start, up);
  b.copy_h2d(d.buf.data(), host.data(), n * 4, up);
  b.record(e, up);
  b.wait(down, e);
  b.copy_d2h(back.data(), d.buf.data(), n * 4, down);
  b.synchronize(down);
  CHECK(back == host);
  CHECK(b.elapsed(start, e) > 0);
}

TEST_CASE("the Adam kernel gives the CPU executor's bits for every type triple, aligned or not") {
  CudaBackend b;
  auto s = b.make_stream();
  test::Rng rng(17);
  for (DType value : {DType::f32, DType::bf16, DType::f16})
    for (DType grad : {DType::f32, DType::bf16, DType::f16})
      for (bool amsgrad : {false, true})
        for (std::size_t offset : {0u, 1u, 3u})
          for (bool mixed : {false, true})  // the gradient alone misaligned, or aligned alone
          for (std::size_t n : {1u, 7u, 1000u, 100003u}) {
            CAPTURE(dtype_name(value));
            CAPTURE(dtype_name(grad));
            CAPTURE(amsgrad);
            CAPTURE(offset);
            CAPTURE(mixed);
            CAPTURE(n);
            const std::size_t goff = mixed ? (offset + 1) % 4 : offset;
            const bool master = value != DType::f32 || rng.below(2) == 0;
            const std::size_t total = n + 4;
            std::vector<float> p32(total), m(total), v(total), vmax(total), mst(total);
            std::vector<std::byte> pv(total * 4), gv(total * 4);
            for (std::size_t i = 0; i < total; ++i) {
              const float x = rng.uniform(-2, 2);
              test::store_as(pv.data(), value, i, x);
              mst[i] = test::load_as(pv.data(), value, i);
              test::store_as(gv.data(), grad, i, rng.uniform(-1, 1) * (i % 17 == 0 ? 1e-30f : 1.0f));
              m[i] = rng.uniform(-0.1f, 0.1f);
              v[i] = rng.uniform(0, 0.01f);
              vmax[i] = v[i] + rng.uniform(0, 0.01f);
            }
            DeviceArray dp(total * 4), dg(total * 4), dm(total * 4), dv(total * 4), dx(total * 4), dmst(total * 4);
            for (auto [d, h] : {std::pair{dp.buf.data(), static_cast<const void*>(pv.data())}, {dg.buf.data(), gv.data()},
                                {dm.buf.data(), m.data()}, {dv.buf.data(), v.data()}, {dx.buf.data(), vmax.data()},
                                {dmst.buf.data(), mst.data()}})
              CudaAccess::write(d, h, total * 4);
            const auto vs = dtype_size(value), gs = dtype_size(grad);
            DeviceSegment seg;
            seg.args = {dp.buf.data() + offset * vs, dg.buf.data() + goff * gs,
                        master ? dmst.as<float>() + offset : nullptr, dm.as<float>() + offset,
                        dv.as<float>() + offset, amsgrad ? dx.as<float>() + offset : nullptr};
            seg.count = n;
            seg.value = value;
            seg.grad = grad;
            seg.amsgrad = amsgrad;
            seg.coefficients = coefficients(AdamW{.lr = 1e-2, .weight_decay = 0.1}, 7);
            b.launch_adam({&seg, 1}, s);
            b.synchronize(s);
            cpu::SegmentArgs a{pv.data() + offset * vs, gv.data() + goff * gs, master ? mst.data() + offset : nullptr,
                               m.data() + offset, v.data() + offset, amsgrad ? vmax.data() + offset : nullptr};
            select_kernel(SimdLevel::scalar, value, grad, amsgrad)(a, 0, n, seg.coefficients);
            std::vector<std::byte> got(total * 4);
            CudaAccess::read(got.data(), dp.buf.data(), total * vs);
            REQUIRE(std::memcmp(got.data(), pv.data(), total * vs) == 0);
            CudaAccess::read(got.data(), dm.buf.data(), total * 4);
            REQUIRE(std::memcmp(got.data(), m.data(), total * 4) == 0);
            CudaAccess::read(got.data(), dv.buf.data(), total * 4);
            REQUIRE(std::memcmp(got.data(), v.data(), total * 4) == 0);
            CudaAccess::read(got.data(), dmst.buf.data(), total * 4);
            REQUIRE(std::memcmp(got.data(), mst.data(), total * 4) == 0);
            CudaAccess::read(got.data(), dx.buf.data(), total * 4);
            REQUIRE(std::memcmp(got.data(), vmax.data(), total * 4) == 0);
          }
}

TEST_CASE("many small segments in one call: several launches, every element once") {
  CudaBackend b;
  auto s = b.make_stream();
  constexpr std::size_t segments = 40, n = 333;
  DeviceArray p(segments * n * 4), g(segments * n * 4), m(segments * n * 4), v(segments * n * 4);
  std::vector<float> ones(segments * n, 1.0f), zeros(segments * n, 0.0f);
  CudaAccess::write(p.buf.data(), ones.data(), ones.size() * 4);
  CudaAccess::write(g.buf.data(), ones.data(), ones.size() * 4);
  CudaAccess::write(m.buf.data(), zeros.data(), zeros.size() * 4);
  CudaAccess::write(v.buf.data(), zeros.data(), zeros.size() * 4);
  std::vector<DeviceSegment> segs(segments);
  for (std::size_t i = 0; i < segments; ++i) {
    segs[i].args = {p.as<float>() + i * n, g.as<float>() + i * n, nullptr, m.as<float>() + i * n, v.as<float>() + i * n,
                    nullptr};
    segs[i].count = n;
    segs[i].coefficients = coefficients(Adam{.lr = 0.5}, 1);
  }
  b.launch_adam(segs, s);
  b.synchronize(s);
  std::vector<float> out(segments * n);
  CudaAccess::read(out.data(), m.buf.data(), out.size() * 4);
  for (float x : out) REQUIRE(x == doctest::Approx(0.1f));  // every element updated exactly once
}

TEST_CASE("the fused reduction (CUB, scratch allocated once): sum of squares and non-finite detection") {
  constexpr std::size_t n = 1 << 20;
  std::vector<float> x(n);
  double expect = 0;
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i % 13) * 0.25f;
    expect += static_cast<double>(x[i]) * x[i];
  }
  DeviceArray d(n * 4);
  CudaAccess::write(d.buf.data(), x.data(), n * 4);
  cuda::GradReduction reduce;
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, n}) {
    double partial = 0;
    for (std::size_t i = 0; i < count; ++i) partial += static_cast<double>(x[i]) * x[i];
    const auto stats = reduce(d.buf.data(), DType::f32, count, nullptr);
    CHECK(stats.sum_squares == doctest::Approx(partial).epsilon(1e-12));
    CHECK_FALSE(stats.nonfinite);
  }
  x[n / 2] = std::nanf("");
  CudaAccess::write(d.buf.data(), x.data(), n * 4);
  CHECK(reduce(d.buf.data(), DType::f32, n, nullptr).nonfinite);
  // 16-bit gradients: the CPU's statistics of the same bits.
  std::vector<bf16> h(n);
  for (std::size_t i = 0; i < n; ++i) h[i] = bf16(static_cast<float>(i % 7) - 3.0f);
  DeviceArray dh(n * 2);
  CudaAccess::write(dh.buf.data(), h.data(), n * 2);
  const GradStats want = cpu::grad_stats(h.data(), DType::bf16, 0, n);
  CHECK(reduce(dh.buf.data(), DType::bf16, n, nullptr).sum_squares == doctest::Approx(want.sum_squares).epsilon(1e-12));
}

TEST_CASE("grad_stats from several threads at once: each gets its own gradient's statistics") {
  CudaBackend b;
  constexpr std::size_t n = 1 << 18, threads = 8;
  std::vector<DeviceArray> grads;
  for (std::size_t t = 0; t < threads; ++t) {
    grads.emplace_back(n * 4);
    const std::vector<float> x(n, static_cast<float>(t + 1));
    CudaAccess::write(grads.back().buf.data(), x.data(), n * 4);
  }
  std::vector<double> got(threads);
  std::vector<std::thread> pool;
  for (std::size_t t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      for (int r = 0; r < 20; ++r) got[t] = b.grad_stats(grads[t].buf.data(), DType::f32, n).sum_squares;
    });
  for (auto& th : pool) th.join();
  for (std::size_t t = 0; t < threads; ++t) CHECK(got[t] == static_cast<double>(n) * double(t + 1) * double(t + 1));
}

TEST_CASE("wait_for_framework orders dos after the framework's stream without blocking the host") {
  cudaStream_t fs = nullptr;
  cuda::check(cudaStreamCreateWithFlags(&fs, cudaStreamNonBlocking), "cudaStreamCreate");
  CudaBackend b({}, {.framework_stream = fs});
  constexpr std::size_t n = 1 << 20;
  DeviceArray d(n * 4);
  CudaAccess::write(d.buf.data(), std::vector<float>(n, 0.0f).data(), n * 4);
  HostBuffer<float, cuda::PinnedMemory> ones(n, b.pinned_memory());
  std::fill(ones.data(), ones.data() + n, 1.0f);
  // The "backward": held back 300 ms on the host, then it writes the gradient.
  cuda::check(cudaLaunchHostFunc(fs, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); }, nullptr),
              "cudaLaunchHostFunc");
  cuda::check(cudaMemcpyAsync(d.buf.data(), ones.data(), n * 4, cudaMemcpyHostToDevice, fs), "cudaMemcpyAsync");
  const auto start = std::chrono::steady_clock::now();
  b.wait_for_framework();
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::milliseconds(100));  // backward runs ahead
  CHECK(b.grad_stats(d.buf.data(), DType::f32, n).sum_squares == static_cast<double>(n));  // ...but dos waits
  int current = -1;
  cuda::check(cudaGetDevice(&current), "cudaGetDevice");
  CHECK(current == b.config().device);
  cuda::check(cudaStreamDestroy(fs), "cudaStreamDestroy");
}

TEST_CASE("register_host pins pageable memory in place, once, and releases only what it pinned") {
  CudaBackend b;
  std::vector<float> pageable(1 << 20, 1.0f);
  const auto type = [](const void* p) {
    cudaPointerAttributes a{};
    cuda::check(cudaPointerGetAttributes(&a, p), "cudaPointerGetAttributes");
    return a.type;
  };
  CHECK(type(pageable.data()) != cudaMemoryTypeHost);
  CHECK(b.register_host(pageable.data(), pageable.size() * 4));
  CHECK(type(pageable.data()) == cudaMemoryTypeHost);
  CHECK(b.register_host(pageable.data() + 10, 40));  // inside: pinned already
  b.unregister_host(pageable.data() + 10);            // not its own: nothing happens
  CHECK(type(pageable.data()) == cudaMemoryTypeHost);
  b.unregister_host(pageable.data());
  CHECK(type(pageable.data()) != cudaMemoryTypeHost);
}

TEST_CASE("InterleavedOptimizer<CudaBackend> is bit-identical to CpuOptimizer over 50 steps, every policy") {
  for (const AnyPolicy& policy : test::every_policy()) {
    CAPTURE(policy.name());
    test::compare_trajectories<CudaBackend, CudaAccess>(test::one_per_subgroup(13, 4096, 5), policy, 4096, 2, 50, 13);
  }
  test::compare_trajectories<CudaBackend, CudaAccess>(test::any_sizes(20, 20000, 9), {}, 8192, 0, 50);
}

TEST_CASE("on the GPU: clipping through the device reduction, and begin_backward/grad_ready's early fetches") {
  // Device gradients' statistics come from CUB here, host ones from the CPU: the norm and
  // the state must still be the CPU optimizer's bits.
  const auto specs = test::one_per_subgroup(6, 4096, 12);
  for (const AnyPolicy& policy : {AnyPolicy(FixedStride{2}), AnyPolicy(ResidentThenStride{})}) {
    CAPTURE(policy.name());
    const auto clipped =
        test::compare_trajectories<CudaBackend, CudaAccess>(specs, policy, 4096, 2, 20, 6, {.max_grad_norm = 0.05});
    CHECK(clipped.front().clip_coef < 1);
    const auto early = test::compare_trajectories<CudaBackend, CudaAccess>(specs, policy, 4096, 2, 20, 6,
                                                                           {.max_grad_norm = 0.05, .backward_api = true});
    for (std::size_t i = 0; i < early.size(); ++i) CHECK(early[i].grad_norm == clipped[i].grad_norm);
  }
}

TEST_CASE("on the GPU: loss scaling through grad_stats (growth, an overflow in a device gradient, back-off)") {
  // The overflow check and the unscaled norm of device gradients come from the CUB
  // reduction: the scale, the skipped step and the state must be the CPU optimizer's.
  const auto specs = test::one_per_subgroup(6, 4096, 12);
  for (const AnyPolicy& policy : {AnyPolicy(FixedStride{2}), AnyPolicy(ResidentThenStride{})}) {
    CAPTURE(policy.name());
    for (const bool early : {false, true}) {
      CAPTURE(early);
      const auto reports = test::compare_trajectories<CudaBackend, CudaAccess>(
          specs, policy, 4096, 2, 12, 6,
          {.max_grad_norm = 0.05, .backward_api = early,
           .loss_scaling = LossScaling{.init_scale = 1024, .growth_interval = 3}, .overflow_at = 7});
      CHECK(reports[3].loss_scale == 2048);
      CHECK(reports[6].overflow);
    }
  }
}

TEST_CASE("on the GPU: read_state/write_state move device, mirrored and resident state between optimizers") {
  const auto specs = test::one_per_subgroup(6, 4096, 21);
  test::check_state_transfer<CudaBackend, CudaAccess>(specs, StaticFraction{0.5}, FixedStride{2}, 4096, 5);
  test::check_state_transfer<CudaBackend, CudaAccess>(specs, ResidentThenStride{}, AllCpu{}, 4096, 5);
}

int main(int argc, char** argv) {
  if (const std::string why = cuda::unavailable_reason(); !why.empty()) {
    std::printf("skipped: %s\n", why.c_str());
    return 77;  // CTest's SKIP_RETURN_CODE
  }
  doctest::Context context(argc, argv);
  return context.run();
}
