// InterleavedOptimizer<EmulatedDeviceBackend>: bit-identical to the all-CPU backend
// for every policy, stride, subgroup count and budget, with fp32/bf16/fp16 tensors on
// the host and on the device; the traps of docs/design.md; budget fallback;
// bad input; checkpoints of device and resident state.

#include "support/backend_compare.hpp"
#include "support/mixed_model.hpp"

#include <doctest/doctest.h>
#include <dos/backend/emulated_device.hpp>
#include <dos/optimizer.hpp>

#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace dos;
using test::MixedModel;
using test::TensorSpec;
using DeviceOptimizer = InterleavedOptimizer<EmulatedDeviceBackend>;

using test::all_state;
using test::compare_trajectories;
using test::device_options;
using test::every_policy;
using test::same_bits;
using test::two_groups;

}  // namespace

TEST_CASE("bit-identical to the all-CPU backend: every policy, k = 1..8, counts divisible or not, three budgets") {
  constexpr std::size_t subgroup = 256;
  for (std::size_t count : {8u, 12u, 13u})
    for (std::size_t slots : {1u, 2u, 0u})
      for (const AnyPolicy& policy : every_policy()) {
        CAPTURE(count);
        CAPTURE(slots);
        CAPTURE(policy.name());
        const auto* fixed = policy.target<FixedStride>();
        CAPTURE((fixed != nullptr ? fixed->stride : 0u));
        const auto specs = test::one_per_subgroup(count, subgroup, count * 7 + slots);
        const auto reports = compare_trajectories(specs, policy, subgroup, slots, 50, count);
        for (const StepReport& r : reports) {
          CHECK(r.fallback.empty());
          if (fixed != nullptr) {
            CHECK(r.stride == fixed->stride);
            CHECK(r.device_subgroups == (count + fixed->stride - 1) / fixed->stride);
          }
          if (policy.target<AllCpu>() != nullptr) CHECK(r.device_subgroups == 0);
        }
      }
}

TEST_CASE("bit-identical with tensors packed several to a subgroup and split across subgroups") {
  for (std::uint64_t seed = 1; seed <= 4; ++seed)
    for (const AnyPolicy& policy : every_policy()) {
      CAPTURE(seed);
      CAPTURE(policy.name());
      compare_trajectories(test::any_sizes(9, 900, seed), policy, 320, 2, 12);
    }
}

TEST_CASE("trap 5.1: 16-bit formats are never reinterpreted as each other") {
  // bf16 and fp16 tensors on both sides of the link, updated on both sides: a value
  // written in the wrong 16-bit format differs from its master rounded once.
  std::vector<TensorSpec> specs;
  for (DType t : {DType::bf16, DType::f16})
    for (Device d : {Device::host, Device::device}) specs.push_back({300, t, d, 0});
  MixedModel device(specs, {AdamW{.lr = 1e-2}});
  DeviceOptimizer opt(device.groups(), device_options(FixedStride{2}, 256));
  for (int t = 1; t <= 10; ++t) {
    device.set_gradients(t);
    opt.step();
  }
  for (std::size_t p = 0; p < specs.size(); ++p) {
    std::vector<float> master(specs[p].numel);
    opt.read_state(p, StateKind::master, master);
    for (std::size_t i = 0; i < master.size(); ++i) {
      const float expect = specs[p].dtype == DType::bf16 ? static_cast<float>(bf16(master[i]))
                                                        : static_cast<float>(fp16(master[i]));
      REQUIRE(test::load_as(device.value(p), specs[p].dtype, i) == expect);
    }
  }
  CHECK(opt.timeline().plan.device_subgroups() > 0);
  compare_trajectories(specs, FixedStride{1}, 256, 2, 20);
}

TEST_CASE("trap 5.2: the last subgroup is written back when it is a device subgroup with nothing after it") {
  // Device subgroups are 0, k, 2k, ...: with 4k + 1 subgroups the last one is a device
  // subgroup that no CPU subgroup follows, the case the authors' code lost.
  for (std::uint32_t k = 1; k <= 6; ++k) {
    CAPTURE(k);
    const std::size_t count = 4 * k + 1;
    const auto specs = test::one_per_subgroup(count, 128, k);
    for (std::size_t slots : {1u, 2u}) {
      const auto reports =
          compare_trajectories(specs, FixedStride{k}, 128, slots, 5, count);
      CHECK(reports.back().device_subgroups == 5);
    }
  }
}

TEST_CASE("trap 5.4: pinned state starts at zero although pinned memory arrives poisoned") {
  EmulatedDeviceBackend b;
  HostBuffer<float, emulated::PinnedMemory> raw(16, b.pinned_memory());
  float fresh = 0;
  void* p = b.pinned_memory().allocate(64, 64);
  std::memcpy(&fresh, p, sizeof fresh);
  b.pinned_memory().deallocate(p, 64, 64);
  CHECK(std::isnan(fresh));
  for (float x : raw.span()) CHECK(x == 0.0f);

  MixedModel device(test::one_per_subgroup(6, 128, 3), two_groups);
  DeviceOptimizer opt(device.groups(), device_options(StaticFraction{0.5}, 128));
  for (std::size_t q = 0; q < opt.num_params(); ++q) {
    std::vector<float> m(opt.param_numel(q)), v(opt.param_numel(q));
    opt.read_state(q, StateKind::exp_avg, m);
    opt.read_state(q, StateKind::exp_avg_sq, v);
    for (std::size_t i = 0; i < m.size(); ++i) REQUIRE((m[i] == 0.0f && v[i] == 0.0f));
  }
}

TEST_CASE("a budget smaller than one subgroup falls back to the CPU with a reason, not an error") {
  const auto specs = test::one_per_subgroup(6, 256, 11);
  MixedModel host(specs, two_groups, true), device(specs, two_groups);
  CpuOptimizer reference(host.groups(), Options{.subgroup_elements = 256, .threads = 1});
  for (const AnyPolicy& policy : {AnyPolicy(FixedStride{2}), AnyPolicy(AutomaticStride{}), AnyPolicy(Balanced{})}) {
    CAPTURE(policy.name());
    DeviceOptimizer opt(device.groups(), device_options(policy, 256));
    std::size_t smallest = opt.staging_slot_bytes();
    for (const SubgroupShape& s : opt.subgroup_shapes()) smallest = std::min(smallest, s.slot_bytes);
    opt.set_staging_budget(smallest - 1);
    host.set_gradients(1);
    device.set_gradients(1);
    const StepReport r = opt.step();
    CHECK(r.applied);
    CHECK(r.device_subgroups == 0);
    CHECK(std::string(r.fallback).find("staging budget") != std::string::npos);
    opt.set_staging_budget(opt.staging_slot_bytes());
    device.set_gradients(2);
    const StepReport again = opt.step();
    if (policy.target<AutomaticStride>() == nullptr) CHECK(again.device_subgroups > 0);
    CHECK(again.fallback.empty());
  }
  // A budget below one slot at construction: no pool at all, and every step falls back.
  Options o = device_options(FixedStride{1}, 256);
  o.interleave.staging_budget = 1000;
  DeviceOptimizer tiny(device.groups(), o);
  CHECK(tiny.staging_pool().capacity == 0);
  device.set_gradients(3);
  const StepReport r = tiny.step();
  CHECK(r.applied);
  CHECK(r.device_subgroups == 0);
  CHECK(!r.fallback.empty());
}

TEST_CASE("plans use at most the budget's slots, and the pool reports its peak") {
  const auto specs = test::one_per_subgroup(9, 256, 5);
  MixedModel device(specs, two_groups);
  DeviceOptimizer opt(device.groups(), device_options(FixedStride{1}, 256, 0));
  CHECK(opt.staging_pool().capacity == 9);
  for (std::size_t slots : {1u, 2u, 9u}) {
    opt.set_staging_budget(slots * opt.staging_slot_bytes());
    device.set_gradients(static_cast<std::int64_t>(slots));
    opt.step();
    CHECK(opt.timeline().plan.slots == slots);
    CHECK(opt.timeline().plan.staging_bytes() <= slots * opt.staging_slot_bytes());
  }
  CHECK(opt.staging_pool().peak_in_use == 9);
  CHECK(opt.staging_pool().in_use == 0);
}

TEST_CASE("bad input: invalid policies are rejected with messages that name them") {
  const auto specs = test::one_per_subgroup(4, 128, 2);
  MixedModel device(specs, two_groups);
  CHECK_THROWS_WITH_AS(DeviceOptimizer(device.groups(), device_options(FixedStride{0}, 128)),
                       "dos: policy stride must be >= 1, got 0", std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      DeviceOptimizer(device.groups(), device_options(StaticFraction{1.5}, 128)),
      "dos: policy fraction must be in [0, 1], got 1.5", std::invalid_argument);
  DeviceOptimizer opt(device.groups(), device_options(FixedStride{2}, 128));
  CHECK_THROWS_WITH_AS(opt.set_policy(AutomaticStride{0}),
                       "dos: policy max_stride must be >= 1, got 0", std::invalid_argument);
  REQUIRE(opt.policy().target<FixedStride>() != nullptr);
  CHECK(opt.policy().target<FixedStride>()->stride == 2);
}

namespace {
// Keeps the subgroups it is told resident, or a residency of the wrong length.
struct Residents {
  std::vector<Place> places;
  std::string_view name() const { return "residents"; }
  void validate() const {}
  void residency(const ResidencyRequest&, std::vector<Place>& out) const { out = places; }
  double choose(const PlanRequest& r, Plan& plan) { return detail::stride_plan(r, r.residency, plan, 0); }
};
// Every other subgroup resident, from subgroup `first` (0 or 1).
std::vector<Place> alternate(std::size_t count, std::size_t first) {
  std::vector<Place> out(count, Place::cpu);
  for (std::size_t s = first; s < count; s += 2) out[s] = Place::resident;
  return out;
}

}  // namespace

TEST_CASE("set_policy moves subgroups in and out of residency between steps; the bits stay the all-CPU backend's") {
  // Residents grow, shrink, vanish, fill the device, come back under policies of every
  // kind, and swap places all at once; with and without the backward-phase API, whose
  // plan is chosen ahead.
  for (const bool backward : {false, true})
    for (const std::size_t count : {8u, 13u}) {
      CAPTURE(backward);
      CAPTURE(count);
      const auto specs = test::one_per_subgroup(count, 256, 41 + count);
      test::Drive drive;
      drive.policies = {{4, StaticFraction{0.5}},     {8, StaticFraction{0.25}},
                        {12, AllCpu{}},               {16, StaticFraction{1.0}},
                        {20, FixedStride{2}},         {24, ResidentThenStride{}},
                        {28, StaticFraction{0.3}},    {30, Residents{alternate(count, 0)}},
                        {31, Residents{alternate(count, 1)}}};
      drive.backward_api = backward;
      const auto reports = compare_trajectories(specs, StaticFraction{0.75}, 256, 0, 33, count, drive);
      const auto residents = [&](double f) { return static_cast<std::size_t>(std::lround(f * double(count))); };
      CHECK(reports[0].device_subgroups == residents(0.75));
      CHECK(reports[4].device_subgroups == residents(0.5));
      CHECK(reports[8].device_subgroups == residents(0.25));
      CHECK(reports[12].device_subgroups == 0);
      CHECK(reports[16].device_subgroups == count);
      CHECK(reports[20].device_subgroups == (count + 1) / 2);
      CHECK(reports[28].device_subgroups == residents(0.3));
      CHECK(reports[29].device_subgroups == (count + 1) / 2);
      CHECK(reports[31].device_subgroups == count / 2);
    }
}

TEST_CASE("bad input: a residency of the wrong shape, or changed during backward, is refused and changes nothing") {
  const auto specs = test::one_per_subgroup(4, 128, 3);
  MixedModel device(specs, two_groups);
  const std::vector<Place> first_resident{Place::resident, Place::cpu, Place::cpu, Place::cpu};
  CHECK_THROWS_WITH_AS(DeviceOptimizer(device.groups(), device_options(Residents{{Place::resident}}, 128)),
                       "dos: policy residents chose a residency of 1 places for 4 subgroups", std::invalid_argument);
  DeviceOptimizer opt(device.groups(), device_options(Residents{first_resident}, 128));
  CHECK(opt.residency() == first_resident);
  CHECK_THROWS_WITH_AS(opt.set_policy(Residents{{Place::cpu, Place::device, Place::cpu, Place::cpu}}),
                       "dos: policy residents chose place 1 for subgroup 1; a residency is resident or cpu",
                       std::invalid_argument);
  CHECK(opt.residency() == first_resident);
  device.set_gradients(1);
  opt.begin_backward();
  CHECK_THROWS_WITH_AS(opt.set_policy(AllCpu{}),
                       "dos: policy all_cpu would keep other subgroups resident than policy residents, and the "
                       "coming step's plan is already chosen: change the residency before begin_backward() or after "
                       "step()",
                       std::invalid_argument);
  CHECK(opt.residency() == first_resident);
  opt.set_policy(Residents{first_resident});  // the same residents: allowed during backward
  CHECK(opt.step().device_subgroups == 1);
  opt.set_policy(AllCpu{});
  CHECK(opt.residency() == std::vector<Place>(4, Place::cpu));
  device.set_gradients(2);
  CHECK(opt.step().device_subgroups == 0);
}

namespace {
// A parameter whose reported places a test can change between steps.
struct Movable {
  float* value;
  float* grad;
  std::size_t numel;
  const Device* value_device;
  const Device* grad_device;
};
}  // namespace
template <>
struct dos::tensor_traits<Movable> {
  static TensorView value(const Movable& p) { return {p.value, p.numel, DType::f32, *p.value_device}; }
  static ConstTensorView grad(const Movable& p) { return {p.grad, p.numel, DType::f32, *p.grad_device}; }
};

TEST_CASE("a value or gradient that moves between places is rejected before any change") {
  std::vector<float> value(64, 1.0f), grad(64, 0.5f);
  Device value_device = Device::host, grad_device = Device::host;
  std::vector<Movable> params{{value.data(), grad.data(), 64, &value_device, &grad_device}};
  DeviceOptimizer opt(params, Adam{}, device_options(FixedStride{1}, 64));
  opt.step();
  const auto before = all_state(opt);
  const auto value_before = value;
  grad_device = Device::device;
  CHECK_THROWS_WITH_AS(opt.step(),
                       "dos: parameter 0: its gradient is on the device but its value on the host; dos needs both "
                       "in one place",
                       std::invalid_argument);
  value_device = Device::device;
  CHECK_THROWS_WITH_AS(opt.step(),
                       "dos: parameter 0: value moved to the device, but was on the host when the optimizer was built",
                       std::invalid_argument);
  value_device = grad_device = Device::host;
  CHECK(same_bits(before, all_state(opt)));
  CHECK(value == value_before);
  CHECK(opt.step_count() == 1);
  CHECK(opt.step().applied);
}

TEST_CASE("checkpoints: read_state and write_state round-trip device, mirrored and resident state") {
  test::check_state_transfer(test::one_per_subgroup(6, 128, 21), StaticFraction{0.5}, FixedStride{2}, 128, 5);
}

TEST_CASE("loss scaling with device gradients: growth, an overflow in a device gradient, back-off; the CPU's bits") {
  // The path the GPU tests take with CudaBackend (statistics from grad_stats).
  const auto reports = test::compare_trajectories(test::one_per_subgroup(6, 256, 12), FixedStride{2}, 256, 2, 12, 6,
                                                  {.loss_scaling = LossScaling{.init_scale = 1024, .growth_interval = 3},
                                                   .overflow_at = 7});
  CHECK(reports[3].loss_scale == 2048);  // grown after three clean steps
  CHECK(reports[6].overflow);
}

TEST_CASE("skip_step sees non-finite gradients on the device and changes nothing") {
  const auto specs = test::one_per_subgroup(6, 128, 4);
  MixedModel device(specs, two_groups);
  Options o = device_options(FixedStride{2}, 128);
  o.nonfinite = NonFinitePolicy::skip_step;
  DeviceOptimizer opt(device.groups(), o);
  device.set_gradients(1);
  opt.step();
  std::size_t dev_param = 0;
  while (specs[dev_param].device != Device::device) ++dev_param;
  device.set_gradients(2);
  test::store_as(device.grad(dev_param), specs[dev_param].dtype, 3, std::numeric_limits<float>::infinity());
  const auto before = all_state(opt);
  const auto values = device.value_bytes();
  const StepReport r = opt.step();
  CHECK_FALSE(r.applied);
  const auto order = device.optimizer_order();
  CHECK(order[r.first_nonfinite_param] == dev_param);
  CHECK(opt.step_count() == 1);
  CHECK(same_bits(before, all_state(opt)));
  CHECK(values == device.value_bytes());
}

TEST_CASE("every step leaves a timeline: one measured and one predicted entry per op, a summary and a trace") {
  const auto specs = test::one_per_subgroup(7, 256, 8);
  MixedModel device(specs, two_groups);
  DeviceOptimizer opt(device.groups(), device_options(FixedStride{3}, 256));
  device.set_gradients(1);
  const StepReport r = opt.step();
  const StepTimeline& t = opt.timeline();
  REQUIRE(t.measured.size() == t.plan.ops.size());
  REQUIRE(t.predicted.size() == t.plan.ops.size());
  for (std::size_t i = 0; i < t.plan.ops.size(); ++i) {
    CHECK(t.measured[i].end >= t.measured[i].begin);
    CHECK(t.measured[i].begin >= 0);
    for (const Dependency& d : t.plan.ops[i].dependencies()) CHECK(t.measured[i].begin >= t.measured[d.op].end - 1e-4);
  }
  CHECK(r.stride == 3);
  CHECK(r.bytes_moved == bytes_moved(t.plan));
  CHECK(r.predicted_seconds > 0);
  const std::string line = summary(t);
  CHECK(line.find("k=3") != std::string::npos);
  CHECK(line.find("fixed_stride") != std::string::npos);
  const std::string trace = chrome_trace(t);
  CHECK(trace.find("\"predicted") != std::string::npos);
  CHECK(trace.find("\"measured") != std::string::npos);
}

TEST_CASE("resident subgroups keep edits the framework makes to fp32 host values, like every other path") {
  // The fp32 host value is the master on every path; a resident subgroup uploads it.
  std::vector<float> value(64, 1.0f), grad(64, 0.0f);
  for (const AnyPolicy& policy : {AnyPolicy(StaticFraction{1.0}), AnyPolicy(FixedStride{1}), AnyPolicy(AllCpu{})}) {
    CAPTURE(policy.name());
    std::fill(value.begin(), value.end(), 1.0f);
    std::vector<HostParam<float>> params{{value, grad}};
    DeviceOptimizer opt(params, Adam{}, device_options(policy, 64));
    opt.step();
    std::fill(value.begin(), value.end(), 5.0f);  // e.g. a weight the framework re-initialised
    opt.step();  // a zero gradient leaves the value as it is
    CHECK(value[0] == 5.0f);
    CHECK(value[63] == 5.0f);
  }
}

namespace {
// A parameter whose storage the framework may move between calls.
struct Relocatable {
  float* const* value;
  const float* grad;
  std::size_t numel;
};
}  // namespace
template <>
struct dos::tensor_traits<Relocatable> {
  static TensorView value(const Relocatable& p) { return {*p.value, p.numel, DType::f32, Device::host}; }
  static ConstTensorView grad(const Relocatable& p) { return {p.grad, p.numel, DType::f32, Device::host}; }
};

TEST_CASE("write_state on a resident subgroup follows a value the framework moved") {
  std::vector<float> first(64, 1.0f), second(64, 1.0f), grad(64, 0.0f);
  float* where = first.data();
  std::vector<Relocatable> params{{&where, grad.data(), 64}};
  DeviceOptimizer opt(params, Adam{}, device_options(StaticFraction{1.0}, 64));
  opt.step();
  where = second.data();                          // the framework moved the storage
  std::fill(first.begin(), first.end(), -7.0f);   // and reused the old buffer
  const std::vector<float> three(64, 3.0f);
  opt.write_state(0, StateKind::master, three);
  CHECK(second[0] == 3.0f);
  opt.step();  // zero gradient: the value stays what was written
  CHECK(second[0] == 3.0f);
  CHECK(second[63] == 3.0f);
  CHECK(first[0] == -7.0f);  // the old buffer is not read or written
}

namespace {
// bf16 values with fp32 gradients, as with fp32 gradient accumulation.
struct Bf16WithFp32Grad {
  bf16* value;
  const float* grad;
  std::size_t numel;
};
}  // namespace
template <>
struct dos::tensor_traits<Bf16WithFp32Grad> {
  static TensorView value(const Bf16WithFp32Grad& p) { return {p.value, p.numel, DType::bf16, Device::host}; }
  static ConstTensorView grad(const Bf16WithFp32Grad& p) { return {p.grad, p.numel, DType::f32, Device::host}; }
};

TEST_CASE("bytes moved count each gradient at its own type") {
  constexpr std::size_t n = 1024;
  std::vector<bf16> value(n, bf16(0.5f));
  std::vector<float> grad(n, 0.25f);
  std::vector<Bf16WithFp32Grad> params{{value.data(), grad.data(), n}};
  DeviceOptimizer opt(params, Adam{}, device_options(FixedStride{1}, n));
  const StepReport r = opt.step();
  // Up: m, v, master (12 B) and the fp32 gradient (4 B); down: m, v, master and the bf16 value (2 B).
  CHECK(opt.subgroup_shapes()[0].upload_bytes == n * 16);
  CHECK(opt.subgroup_shapes()[0].download_bytes == n * 14);
  CHECK(r.bytes_moved == n * 30);
}

TEST_CASE("bf16/fp16 device tensors: the pinned mirror takes 2 + 2 B per element, and the CPU's bits") {
  // Odd sizes, packed several to a subgroup and split across subgroups, so segments
  // start at odd offsets within their tensors and within their subgroups' mirrors.
  const std::vector<TensorSpec> specs{{301, DType::bf16, Device::device, 0}, {77, DType::f16, Device::device, 1},
                                      {45, DType::f32, Device::host, 0},     {513, DType::bf16, Device::device, 1},
                                      {129, DType::f16, Device::device, 0},  {33, DType::f32, Device::device, 1},
                                      {3, DType::bf16, Device::host, 0},     {95, DType::bf16, Device::device, 0}};
  for (const AnyPolicy& policy : every_policy()) {
    CAPTURE(policy.name());
    compare_trajectories(specs, policy, 160, 2, 8);
    compare_trajectories(specs, policy, 160, 1, 6, 0, {.backward_api = true});
  }
  // One 16-bit device tensor per subgroup: gradient and value pieces of 2 B per
  // element, each rounded up to 64 B (an fp32 one takes 4 + 4).
  for (DType t : {DType::bf16, DType::f16, DType::f32}) {
    CAPTURE(std::string(dtype_name(t)));
    MixedModel device({{1000, t, Device::device, 0}, {999, t, Device::device, 0}}, {Adam{}});
    DeviceOptimizer opt(device.groups(), device_options(FixedStride{2}, 1024));
    REQUIRE(opt.subgroup_shapes().size() == 2);
    const std::size_t size = dtype_size(t);
    CHECK(opt.subgroup_shapes()[0].mirror_bytes == 2 * ((1000 * size + 63) / 64 * 64));
    CHECK(opt.subgroup_shapes()[1].mirror_bytes == 2 * ((999 * size + 63) / 64 * 64));
  }
  MixedModel host_only({{1000, DType::bf16, Device::host, 0}}, {Adam{}});
  DeviceOptimizer opt(host_only.groups(), device_options(FixedStride{1}, 1024));
  CHECK(opt.subgroup_shapes()[0].mirror_bytes == 0);
}

namespace {
// A device parameter whose gradient's type the test sets.
struct DeviceBf16 {
  bf16* value = nullptr;
  void* grad = nullptr;
  std::size_t numel = 0;
  const DType* grad_dtype = nullptr;
};
}  // namespace
template <>
struct dos::tensor_traits<DeviceBf16> {
  static TensorView value(const DeviceBf16& p) { return {p.value, p.numel, DType::bf16, Device::device}; }
  static ConstTensorView grad(const DeviceBf16& p) { return {p.grad, p.numel, *p.grad_dtype, Device::device}; }
};

TEST_CASE("a device gradient wider than its value is refused at step() and grad_ready(), before any change") {
  constexpr std::size_t n = 100;
  std::vector<bf16> value(n, bf16(0.5f));
  std::vector<float> grad(n, 0.25f);  // room for fp32; the bf16 gradient uses its first half
  DType grad_dtype = DType::bf16;
  std::vector<DeviceBf16> params{{value.data(), grad.data(), n, &grad_dtype}};
  DeviceOptimizer opt(params, Adam{}, device_options(AllCpu{}, 128));
  opt.step();
  const auto before = all_state(opt);
  const auto value_before = value;
  grad_dtype = DType::f32;
  const char* message = "dos: parameter 0: its gradient on the device is float32, wider than its bfloat16 value; a device "
                        "parameter's gradient may be no wider than its value";
  CHECK_THROWS_WITH_AS(opt.step(), message, std::invalid_argument);
  opt.begin_backward();
  CHECK_THROWS_WITH_AS(opt.grad_ready(0), message, std::invalid_argument);
  CHECK(same_bits(before, all_state(opt)));
  CHECK(std::memcmp(value.data(), value_before.data(), n * sizeof(bf16)) == 0);
  CHECK(opt.step_count() == 1);
  grad_dtype = DType::f16;  // as wide as the value: accepted
  CHECK(opt.step().applied);
}

TEST_CASE("calibration runs before the staging pool takes the free device memory") {
  const auto specs = test::one_per_subgroup(6, 1 << 20, 4);
  MixedModel device(specs, two_groups);
  Options o = device_options(FixedStride{2}, 1 << 20, 0);
  o.interleave.profile.reset();  // measure
  // Room for the model's slots and the calibration scratch, but not both at once.
  InterleavedOptimizer<EmulatedDeviceBackend> opt(device.groups(), o,
                                                  EmulatedDeviceConfig{.memory_bytes = std::size_t{80} << 20});
  CHECK(opt.staging_pool().capacity >= 1);
  CHECK(opt.cost_model().profile().cpu_rate > 0);
  device.set_gradients(1);
  CHECK(opt.step().applied);
}

TEST_CASE("clipping and the backward-phase API give the all-CPU backend's bits, with device gradients") {
  const auto specs = test::one_per_subgroup(9, 256, 31);
  for (const AnyPolicy& policy : {AnyPolicy(FixedStride{3}), AnyPolicy(AutomaticStride{}), AnyPolicy(StaticFraction{0.3}),
                                  AnyPolicy(ResidentThenStride{})}) {
    CAPTURE(policy.name());
    const auto clipped = compare_trajectories(specs, policy, 256, 2, 20, 9, {.max_grad_norm = 0.05});
    CHECK(clipped.front().clip_coef < 1);
    const auto early = compare_trajectories(specs, policy, 256, 2, 20, 9, {.max_grad_norm = 0.05, .backward_api = true});
    for (std::size_t i = 0; i < early.size(); ++i) CHECK(early[i].grad_norm == clipped[i].grad_norm);
  }
}

TEST_CASE("grad_ready() starts device-gradient copies for CPU subgroups during backward") {
  const auto specs = test::one_per_subgroup(6, 256, 12);
  MixedModel device(specs, two_groups);
  DeviceOptimizer opt(device.groups(), device_options(FixedStride{2}, 256));
  opt.begin_backward();
  device.set_gradients(1);
  for (std::size_t p = opt.num_params(); p-- > 0;) opt.grad_ready(p);
  const StepReport r = opt.step();
  std::size_t expected = 0;
  const auto order = device.optimizer_order();
  for (std::size_t s = 0; s < opt.subgroups().size(); ++s)
    if (opt.timeline().plan.placement[s] == Place::cpu) expected += opt.subgroup_shapes()[s].fetch_bytes;
  CHECK(expected > 0);
  CHECK(r.early_fetch_bytes == expected);
  // Without the backward-phase API, the fetches happen in step().
  device.set_gradients(2);
  CHECK(opt.step().early_fetch_bytes == 0);
  (void)order;
}

TEST_CASE("grad_ready() from several threads at once (autograd's device and CPU threads): the one-thread result") {
  // Under ThreadSanitizer (the tsan preset runs this file) this is the race check too:
  // device statistics, early fetches and the norm are all reached from every thread.
  const auto specs = test::any_sizes(16, 3000, 8);
  MixedModel host(specs, two_groups, true), device(specs, two_groups);
  Options ro{.subgroup_elements = 1000, .threads = 2};
  ro.max_grad_norm = 0.01;
  Options o = device_options(FixedStride{2}, 1000);
  o.max_grad_norm = ro.max_grad_norm;
  CpuOptimizer reference(host.groups(), ro);
  DeviceOptimizer opt(device.groups(), o);
  for (int t = 1; t <= 3; ++t) {
    host.set_gradients(t);
    device.set_gradients(t);
    opt.begin_backward();
    std::vector<std::thread> threads;
    std::atomic<std::size_t> next{0};
    for (int k = 0; k < 4; ++k)
      threads.emplace_back([&] {
        for (std::size_t p = next++; p < opt.num_params(); p = next++) opt.grad_ready(p);
      });
    for (auto& th : threads) th.join();
    const StepReport want = reference.step(), got = opt.step();
    CHECK(got.grad_norm == want.grad_norm);
    CHECK(got.early_fetch_bytes > 0);
    CHECK(host.value_bytes() == device.value_bytes());
    CHECK(same_bits(all_state(reference), all_state(opt)));
  }
}

namespace {
// The emulated device without `register_host`: as on a GPU that cannot pin the
// framework's pageable host tensors, copies from and to them would be synchronous.
struct CannotRegister : EmulatedDeviceBackend {
  using EmulatedDeviceBackend::EmulatedDeviceBackend;
  bool register_host(const void*, std::size_t) = delete;
};
static_assert(DeviceBackend<CannotRegister> && !engine::RegistersHost<CannotRegister>);

// The emulated device whose `register_host` refuses, as cudaHostRegister may; no copy
// it is given may come from or go to unregistered memory.
struct RefusesRegistration : EmulatedDeviceBackend {
  explicit RefusesRegistration(const cpu::CpuConfig& host = {}, Config config = {})
      : EmulatedDeviceBackend(host, refusing(config)) {}
  ~RefusesRegistration() { CHECK(pageable_copies() == 0); }
  static Config refusing(Config c) {
    c.refuse_registration = true;
    return c;
  }
};
static_assert(DeviceBackend<RefusesRegistration>);

struct LaneTimes {
  double cpu_start = 0, device_end = 0;
  std::size_t pageable_copies = 0;
};

// When the CPU lane's first update began, and when the device's last operation ended,
// in a step of fp32 host tensors in pageable memory (std::vector), half of them on a
// device whose Adam takes 100 ms a subgroup; and the copies issued from pageable memory.
template <class B>
LaneTimes cpu_start_and_device_end(EmulatedDeviceConfig config = {}) {
  constexpr std::size_t n = 1 << 14;
  std::vector<std::vector<float>> values(4, std::vector<float>(n, 1.0f)), grads(4, std::vector<float>(n, 0.5f));
  std::vector<HostParam<float>> params;
  for (std::size_t t = 0; t < 4; ++t) params.push_back({values[t], grads[t]});
  config.device_rate = n / 0.1;
  InterleavedOptimizer<B> opt(params, Adam{}, device_options(FixedStride{2}, n), config);
  opt.step();
  const StepTimeline& t = opt.timeline();
  LaneTimes out{1e30, 0, opt.backend().pageable_copies()};
  for (std::size_t i = 0; i < t.plan.ops.size(); ++i)
    if (t.plan.ops[i].kind == OpKind::cpu_update) out.cpu_start = std::min(out.cpu_start, t.measured[i].begin);
    else out.device_end = std::max(out.device_end, t.measured[i].end);
  return out;
}
}  // namespace

TEST_CASE("pageable host tensors are registered: the CPU lane does not wait behind the device's work") {
  const LaneTimes r = cpu_start_and_device_end<EmulatedDeviceBackend>();
  CHECK(r.device_end >= 0.1);
  CHECK(r.cpu_start < 0.5 * r.device_end);
  CHECK(r.pageable_copies == 0);
}

TEST_CASE("where registration is refused, host tensors go through pinned staging: no synchronous copy") {
  // The model the check relies on: the emulated device blocks the issuing thread on a
  // copy from pageable memory, so one unregistered copy would hold the CPU lane until
  // the device is nearly done (T_gpu + T_cpu); test_emulated_device shows it blocks.
  for (const LaneTimes r : {cpu_start_and_device_end<EmulatedDeviceBackend>({.refuse_registration = true}),
                            cpu_start_and_device_end<CannotRegister>()}) {
    CHECK(r.device_end >= 0.1);
    CHECK(r.cpu_start < 0.5 * r.device_end);
    CHECK(r.pageable_copies == 0);
  }
  // Every policy, with fp32 and 16-bit host tensors packed and split at odd offsets:
  // the CPU's bits (~RefusesRegistration checks that no copy touched pageable memory).
  const std::vector<TensorSpec> specs{{301, DType::f32, Device::host, 0},  {77, DType::bf16, Device::host, 1},
                                      {129, DType::f16, Device::device, 0}, {513, DType::f32, Device::host, 1},
                                      {45, DType::f16, Device::host, 0},    {95, DType::bf16, Device::device, 1}};
  for (const AnyPolicy& policy : every_policy()) {
    CAPTURE(policy.name());
    compare_trajectories<RefusesRegistration>(specs, policy, 160, 2, 8);
    compare_trajectories<RefusesRegistration>(specs, policy, 160, 1, 6, 0, {.max_grad_norm = 0.05, .backward_api = true});
  }
}

TEST_CASE("an overflowing step after early fetches leaves nothing behind for the next step") {
  const auto specs = test::one_per_subgroup(6, 256, 12);
  MixedModel host(specs, two_groups, true), device(specs, two_groups);
  Options ro{.subgroup_elements = 256, .threads = 1};
  ro.loss_scaling = LossScaling{.init_scale = 1};
  Options o = device_options(FixedStride{2}, 256);
  o.loss_scaling = ro.loss_scaling;
  CpuOptimizer reference(host.groups(), ro);
  DeviceOptimizer opt(device.groups(), o);
  std::size_t dev_param = 0;
  while (specs[dev_param].device != Device::device) ++dev_param;
  // Step 1 overflows, after grad_ready() copied device gradients of CPU subgroups.
  opt.begin_backward();
  host.set_gradients(1);
  device.set_gradients(1);
  test::store_as(host.grad(dev_param), specs[dev_param].dtype, 0, std::numeric_limits<float>::infinity());
  test::store_as(device.grad(dev_param), specs[dev_param].dtype, 0, std::numeric_limits<float>::infinity());
  for (std::size_t p = opt.num_params(); p-- > 0;) opt.grad_ready(p);
  CHECK(reference.step().overflow);
  CHECK(opt.step().overflow);
  // Step 2, plain: the device gradients must be fetched afresh.
  host.set_gradients(2);
  device.set_gradients(2);
  reference.step();
  const StepReport r = opt.step();
  CHECK(r.early_fetch_bytes == 0);
  CHECK(host.value_bytes() == device.value_bytes());
  CHECK(same_bits(all_state(reference), all_state(opt)));
}
