// Regression tests for the eight defects an adversarial test found at the edges of
// numeric ranges, enums, threads and aliasing: each must be refused with a clear
// error that changes nothing, or handled as torch would.

#include "support/backend_compare.hpp"
#include "support/mixed_model.hpp"

#include <doctest/doctest.h>
#include <dos/optimizer.hpp>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace dos;
using test::all_state;
using test::same_bits;

namespace {

std::vector<HostParam<float>> one_param(std::vector<float>& v, std::vector<float>& g) { return {{v, g}}; }

}  // namespace

TEST_CASE("1. a loss scale whose inverse is not a finite float is refused; back-off stops at 2^-126") {
  std::vector<float> v(64, 1.0f), g(64, 0.5f);
  for (const double bad : {0x1p-130, 0x1p-127, 0x1p128}) {
    CAPTURE(bad);
    Options o;
    o.loss_scaling = LossScaling{.init_scale = bad};
    CHECK_THROWS_AS(CpuOptimizer(one_param(v, g), Adam{}, o), std::invalid_argument);
  }
  // 200 overflowing steps from 2^16 would reach 2^-184 without a floor.
  Options o{.threads = 1};
  o.loss_scaling = LossScaling{};
  CpuOptimizer opt(one_param(v, g), Adam{}, o);
  g[3] = std::numeric_limits<float>::infinity();
  for (int i = 0; i < 200; ++i) CHECK(opt.step().overflow);
  CHECK(opt.loss_scale() == LossScaler::min_scale);
  // At the floor, a finite gradient that unscaling would blow past the float range is
  // an overflow too: nothing changes.
  std::fill(g.begin(), g.end(), 1e30f);
  const std::vector<float> before = v;
  const StepReport r = opt.step();
  CHECK(r.overflow);
  CHECK_FALSE(r.applied);
  CHECK(v == before);
  CHECK(opt.step_count() == 0);
  // An ordinary gradient at the floor is applied, and finite.
  std::fill(g.begin(), g.end(), 0x1p-130f);
  CHECK(opt.step().applied);
  for (float x : v) CHECK(std::isfinite(x));
}

TEST_CASE("2. automatic_stride with max_stride = UINT32_MAX returns: strides stop at the subgroup count") {
  const auto specs = test::one_per_subgroup(5, 128, 4);
  test::MixedModel model(specs, test::two_groups);
  InterleavedOptimizer<EmulatedDeviceBackend> opt(
      model.groups(), test::device_options(AutomaticStride{std::numeric_limits<std::uint32_t>::max()}, 128));
  model.set_gradients(1);
  CHECK(opt.step().applied);
  CHECK(opt.timeline().plan.stride <= 5);
}

namespace {
// A parameter whose gradient's dtype the test can change.
struct TwoTypes {
  float* v;
  const float* g;
  std::size_t n;
  DType* grad_type;
};
}  // namespace

template <>
struct dos::tensor_traits<TwoTypes> {
  static TensorView value(const TwoTypes& p) { return {p.v, p.n, DType::f32, Device::host}; }
  static ConstTensorView grad(const TwoTypes& p) { return {p.g, p.n, *p.grad_type, Device::host}; }
};

TEST_CASE("3. a view with an out-of-range dtype is refused, naming the parameter") {
  std::vector<float> v(16, 1.0f), g(16, 0.0f), v2(16, 1.0f);
  std::vector<test::MixedParam> params{{v.data(), g.data(), 16, DType::f32, Device::host},
                                       {v2.data(), g.data(), 16, static_cast<DType>(7), Device::host}};
  CHECK_THROWS_WITH_AS(CpuOptimizer(params, Adam{}, {.threads = 1}), "dos: parameter 1: value has an invalid dtype (7)",
                       std::invalid_argument);
  // A gradient whose dtype goes bad after construction: refused at step, nothing changes.
  DType grad_type = DType::f32;
  std::vector<TwoTypes> params2{{v.data(), g.data(), 16, &grad_type}};
  CpuOptimizer opt(params2, Adam{}, {.threads = 1});
  opt.step();
  const std::vector<float> before = all_state(opt);
  grad_type = static_cast<DType>(9);
  CHECK_THROWS_WITH_AS(opt.step(), "dos: parameter 0: gradient has an invalid dtype (9)", std::invalid_argument);
  CHECK_THROWS_AS(opt.grad_ready(0), std::invalid_argument);
  CHECK(same_bits(all_state(opt), before));
  CHECK(opt.step_count() == 1);
}

TEST_CASE("4. read_state and write_state refuse a StateKind that does not exist") {
  std::vector<float> v(16, 1.0f), g(16, 0.5f), buf(16);
  CpuOptimizer opt(one_param(v, g), Adam{}, {.threads = 1});
  opt.step();
  const std::vector<float> before = all_state(opt);
  for (const int kind : {4, 255}) {
    CHECK_THROWS_WITH_AS(opt.read_state(0, static_cast<StateKind>(kind), buf),
                         ("dos: parameter 0: state kind " + std::to_string(kind) + " does not exist").c_str(),
                         std::invalid_argument);
    CHECK_THROWS_AS(opt.write_state(0, static_cast<StateKind>(kind), buf), std::invalid_argument);
  }
  CHECK(same_bits(all_state(opt), before));
}

namespace {
// A framework whose value view calls back into the optimizer: the re-entrant call
// stands in for a second thread calling step() on the same optimizer.
struct Reentrant {
  float* v;
  const float* g;
  std::size_t n;
  InterleavedOptimizer<CpuBackend>** opt;
  std::string* seen;
};
}  // namespace

template <>
struct dos::tensor_traits<Reentrant> {
  static TensorView value(const Reentrant& p) {
    if (*p.opt != nullptr && p.seen->empty()) {
      try {
        (*p.opt)->step();
        *p.seen = "no error";
      } catch (const std::logic_error& e) {
        *p.seen = e.what();
      }
    }
    return {p.v, p.n, DType::f32, Device::host};
  }
  static ConstTensorView grad(const Reentrant& p) { return {p.g, p.n, DType::f32, Device::host}; }
};

TEST_CASE("5. a step() that overlaps another call throws a clear logic_error; grad_ready may run concurrently") {
  std::vector<float> v(64, 1.0f), g(64, 0.5f);
  InterleavedOptimizer<CpuBackend>* handle = nullptr;
  std::string seen;
  std::vector<Reentrant> params{{v.data(), g.data(), 64, &handle, &seen}};
  InterleavedOptimizer<CpuBackend> opt(params, Adam{}, {.threads = 1});
  handle = &opt;
  CHECK(opt.step().applied);
  CHECK(seen.find("step() was called while another call was running on this optimizer") != std::string::npos);
  CHECK(opt.step_count() == 1);  // the overlapping call changed nothing
  handle = nullptr;

  // Backward hooks on several threads at once: the statistics match those taken at step().
  const auto specs = test::any_sizes(16, 3000, 8);
  test::MixedModel a(specs, test::two_groups, true), b(specs, test::two_groups, true);
  Options o{.subgroup_elements = 1000, .threads = 2};
  o.max_grad_norm = 0.01;
  CpuOptimizer hooks(a.groups(), o), plain(b.groups(), o);
  for (int t = 1; t <= 3; ++t) {
    a.set_gradients(t);
    b.set_gradients(t);
    hooks.begin_backward();
    std::vector<std::thread> threads;
    std::atomic<std::size_t> next{0};
    for (int k = 0; k < 4; ++k)
      threads.emplace_back([&] {
        for (std::size_t p = next++; p < hooks.num_params(); p = next++) hooks.grad_ready(p);
      });
    for (auto& th : threads) th.join();
    const StepReport ra = hooks.step(), rb = plain.step();
    CHECK(ra.grad_norm == rb.grad_norm);
    CHECK(same_bits(all_state(hooks), all_state(plain)));
  }
}

namespace {
// A parameter whose views the test can move after construction.
struct Indirect {
  test::MixedParam* p;
};
}  // namespace

template <>
struct dos::tensor_traits<Indirect> {
  static TensorView value(const Indirect& i) { return {i.p->value, i.p->numel, i.p->dtype, i.p->device}; }
  static ConstTensorView grad(const Indirect& i) { return {i.p->grad, i.p->numel, i.p->dtype, i.p->device}; }
};

TEST_CASE("6. parameters that share or overlap storage are refused, naming both") {
  std::vector<float> v(100, 1.0f), g(100, 0.5f);
  std::vector<HostParam<float>> same{{v, g}, {v, g}};
  CHECK_THROWS_WITH_AS(CpuOptimizer(same, Adam{}, {.threads = 1}),
                       "dos: parameters 0 and 1 overlap in memory (the same storage passed twice?); every parameter "
                       "needs storage of its own",
                       std::invalid_argument);
  std::vector<HostParam<float>> partial{{std::span(v).first(60), std::span<const float>(g).first(60)},
                                        {std::span(v).subspan(70), std::span<const float>(g).subspan(70)},
                                        {std::span(v).subspan(50, 0), std::span<const float>(g).first(0)},
                                        {std::span(v).subspan(59, 5), std::span<const float>(g).first(5)}};
  CHECK_THROWS_WITH_AS(CpuOptimizer(partial, Adam{}, {.threads = 1}),
                       "dos: parameters 0 and 3 overlap in memory (the same storage passed twice?); every parameter "
                       "needs storage of its own",
                       std::invalid_argument);
  // A view that moves onto another parameter's storage between steps: refused at step.
  std::vector<float> w(100, 2.0f);
  std::vector<test::MixedParam> moving{{v.data(), g.data(), 100, DType::f32, Device::host},
                                       {w.data(), g.data(), 100, DType::f32, Device::host}};
  std::vector<Indirect> seen{{&moving[0]}, {&moving[1]}};
  CpuOptimizer opt(seen, Adam{}, {.threads = 1});
  opt.step();
  const std::vector<float> before = all_state(opt);
  moving[1].value = v.data() + 10;
  CHECK_THROWS_AS(opt.step(), std::invalid_argument);
  moving[1].value = w.data();
  CHECK(same_bits(all_state(opt), before));
}

TEST_CASE("7. a step count that cannot advance is refused, and nothing changes") {
  std::vector<float> v(16, 1.0f), g(16, 0.5f);
  CpuOptimizer opt(one_param(v, g), Adam{}, {.threads = 1});
  CHECK_THROWS_AS(opt.set_step_count(std::numeric_limits<std::int64_t>::max()), std::invalid_argument);
  opt.set_step_count(std::numeric_limits<std::int64_t>::max() - 1);
  CHECK(opt.step().applied);
  CHECK(opt.step_count() == std::numeric_limits<std::int64_t>::max());
  const std::vector<float> before = all_state(opt);
  CHECK_THROWS_WITH_AS(opt.step(), "dos: the step count is 9223372036854775807, the largest there is: it cannot advance",
                       std::invalid_argument);
  CHECK(same_bits(all_state(opt), before));
  for (float x : v) CHECK(std::isfinite(x));
}

TEST_CASE("an optimizer destroyed during backward waits for the gradient copies it started (found by the fuzzer)") {
  // Early fetches write into pinned mirrors the optimizer owns; destroying it with one
  // in flight must not free them first (AddressSanitizer reports the write otherwise).
  std::vector<test::TensorSpec> specs{{.numel = 4096, .dtype = DType::f32, .device = Device::device, .group = 0},
                                      {.numel = 4096, .dtype = DType::f32, .device = Device::device, .group = 0}};
  test::MixedModel model(specs, {AdamW{}});
  Options o = test::device_options(FixedStride{2}, 4096);  // subgroup 1 runs on the CPU: its gradient is fetched
  for (int round = 0; round < 3; ++round) {
    InterleavedOptimizer<EmulatedDeviceBackend> opt(model.groups(), o, EmulatedDeviceConfig{.d2h_bandwidth = 2e6});
    model.set_gradients(round + 1);
    opt.begin_backward();
    opt.grad_ready(1);  // 16 KB at 2 MB/s: still in flight when the optimizer goes
  }
  CHECK(model.value_bytes().size() == 2 * 4096 * 4);
}
