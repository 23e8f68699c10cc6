// The first-order cost model, the assignment policies and calibration: predictions
// against closed forms, refinement toward measured rates, the automatic stride
// against brute force, and a calibration that sees the emulated device's throttles.

#include "support/inputs.hpp"
#include "support/wrapped_device.hpp"

#include <doctest/doctest.h>
#include <dos/backend/emulated_device.hpp>
#include <dos/cpu/cpu_adam.hpp>
#include <dos/engine/calibrate.hpp>
#include <dos/schedule/any_policy.hpp>
#include <dos/schedule/cost_model.hpp>
#include <dos/schedule/policy.hpp>
#include <dos/schedule/simulate.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <span>
#include <thread>
#include <vector>

using namespace dos;

namespace {

// Subgroups of n elements that stream 12 B/param each way, gradients on the device.
std::vector<SubgroupShape> uniform(std::size_t count, std::size_t n) {
  return std::vector<SubgroupShape>(count, SubgroupShape{.elements = n, .slot_bytes = 16 * n, .upload_bytes = 12 * n,
                                                         .download_bytes = 12 * n, .cpu_bytes = 28 * n});
}

constexpr HardwareProfile profile{.cpu_rate = 1e9, .device_rate = 1e12, .h2d_bandwidth = 12e9,
                                  .d2h_bandwidth = 12e9, .duplex = true, .host_bandwidth = 0};

double predict_stride(const FirstOrderCostModel& m, const std::vector<SubgroupShape>& shapes, std::uint32_t k,
                      std::size_t slots = 2) {
  std::vector<Place> a;
  if (k == 0) a.assign(shapes.size(), Place::cpu);
  else stride_assignment(a, shapes.size(), k);
  Plan p;
  make_plan(p, shapes, a, {.budget = ~std::size_t{0}, .max_slots = slots}, k);
  return m.predict(p);
}

// A policy's choice for this step, as the optimizer asks for it.
template <class Model>
double choose_plan(Plan& plan, Plan& scratch, std::vector<Place>& a, std::span<const SubgroupShape> shapes,
                   std::span<const Place> resident, AnyPolicy policy, const PlanLimits& limits, const Model& model) {
  const auto predict = [&](const Plan& p) { return model.predict(p); };
  return policy.choose({shapes, resident, limits, model.profile(), predict, scratch, a}, plan);
}

// The residents a policy picks at construction, with all the device memory it wants.
std::vector<Place> residency_of(const AnyPolicy& policy, std::span<const SubgroupShape> shapes) {
  const FirstOrderCostModel m(profile);
  const auto predict = [&](const Plan& p) { return m.predict(p); };
  Plan scratch;
  std::vector<Place> a, out;
  policy.residency({shapes, ~std::size_t{0} / 2, {.budget = 0, .max_slots = 2}, predict, scratch, a}, out);
  return out;
}

}  // namespace

TEST_CASE("all-CPU: the sum of subgroup sizes over the CPU rate") {
  FirstOrderCostModel m(profile);
  CHECK(predict_stride(m, uniform(10, 1'000'000), 0) == doctest::Approx(10e6 / 1e9));
}

TEST_CASE("one streamed subgroup: upload, update and download in sequence") {
  FirstOrderCostModel m(profile);
  const double n = 1e6;
  CHECK(predict_stride(m, uniform(1, 1'000'000), 1) == doctest::Approx(12 * n / 12e9 + n / 1e12 + 12 * n / 12e9));
}

TEST_CASE("a duplex pipeline overlaps uploads with downloads; a shared link does not") {
  HardwareProfile p = profile;
  p.device_rate = 0;  // free updates: only the link counts
  FirstOrderCostModel duplex(p);
  const double u = 12e6 / 12e9;  // one subgroup's transfer each way
  CHECK(predict_stride(duplex, uniform(8, 1'000'000), 1) == doctest::Approx(9 * u));
  p.duplex = false;
  FirstOrderCostModel shared(p);
  CHECK(predict_stride(shared, uniform(8, 1'000'000), 1) == doctest::Approx(16 * u));
}

TEST_CASE("the host DRAM bound: CPU updates and DMA share host bandwidth") {
  HardwareProfile p = profile;
  p.host_bandwidth = 10e9;
  FirstOrderCostModel m(p);
  // k = 2 over 8 subgroups of 1M: 4M CPU params at 28 B, 4M streamed at 24 B.
  const double bound = (4e6 * 28 + 4e6 * 24) / 10e9;
  CHECK(predict_stride(m, uniform(8, 1'000'000), 2) == doctest::Approx(bound));
}

namespace {
// A step of `count` subgroups at stride k, not yet measured.
StepTimeline stride_step(std::size_t count, std::uint32_t k) {
  StepTimeline t;
  std::vector<Place> a;
  stride_assignment(a, count, k);
  make_plan(t.plan, uniform(count, 1'000'000), a, {.budget = ~std::size_t{0}, .max_slots = 2}, k);
  return t;
}
}  // namespace

TEST_CASE("refinement moves each rate toward what its lane achieved") {
  FirstOrderCostModel m(profile, 0.5);
  StepTimeline t = stride_step(4, 2);
  t.measured.resize(t.plan.ops.size());
  std::array<double, lane_count> clock{};
  for (std::size_t i = 0; i < t.plan.ops.size(); ++i) {
    const Op& op = t.plan.ops[i];
    double& now = clock[static_cast<std::size_t>(op.lane)];
    const double seconds = std::max(2 * m.duration(op), 1e-3);  // everything at half the modelled rate
    t.measured[i] = {now, now + seconds};
    now += seconds;
  }
  m.refine(t);
  CHECK(m.profile().cpu_rate == doctest::Approx(0.75 * profile.cpu_rate));
  CHECK(m.profile().h2d_bandwidth == doctest::Approx(0.75 * profile.h2d_bandwidth));
  CHECK(m.profile().d2h_bandwidth == doctest::Approx(0.75 * profile.d2h_bandwidth));
  // Too-short measurements are noise and do not move a rate.
  FirstOrderCostModel quiet(profile);
  for (auto& x : t.measured) x = {0, 1e-6};
  quiet.refine(t);
  CHECK(quiet.profile().cpu_rate == profile.cpu_rate);
}

TEST_CASE("refinement divides by the time a shared link was busy, not by the sum of waiting transfers") {
  // An upload and a push overlap on the host-to-device link: each measured 2 s, the
  // link was busy for 2 s and moved both. Its rate is 2 GB / 2 s, not 2 GB / 4 s.
  StepTimeline t;
  t.plan.placement = {Place::device, Place::cpu};
  Op up;
  up.kind = OpKind::upload;
  up.lane = Lane::h2d;
  up.bytes = 1'000'000'000;
  Op push = up;
  push.kind = OpKind::push_params;
  push.lane = Lane::push;
  push.subgroup = 1;
  t.plan.ops = {up, push};
  t.measured = {{0.0, 2.0}, {0.0, 2.0}};
  FirstOrderCostModel m({.cpu_rate = 1, .device_rate = 1, .h2d_bandwidth = 1e9, .d2h_bandwidth = 1e9}, 1.0);
  m.refine(t);
  CHECK(m.profile().h2d_bandwidth == doctest::Approx(1e9));
}

TEST_CASE("where the model is the truth (simulation), the automatic stride settles on the best predicted k, or all-CPU") {
  test::Rng rng(9);
  for (int trial = 0; trial < 50; ++trial) {
    HardwareProfile p = profile;
    p.cpu_rate = 1e8 * (1 + static_cast<double>(rng.below(40)));
    p.h2d_bandwidth = p.d2h_bandwidth = 1e9 * (1 + static_cast<double>(rng.below(40)));
    const FirstOrderCostModel m(p);
    const auto shapes = uniform(1 + rng.below(30), 1'000'000);
    double best = predict_stride(m, shapes, 0);
    for (std::uint32_t k = 1; k <= 8; ++k) best = std::min(best, predict_stride(m, shapes, k));
    const auto chosen = simulate_policy(m, shapes, AutomaticStride{}, {.budget = ~std::size_t{0}, .max_slots = 2}, 0);
    CHECK(chosen.seconds == best);
    CHECK(predict_stride(m, shapes, chosen.stride) == chosen.seconds);
  }
}

TEST_CASE("in simulation, the automatic policies settle on exactly the best candidate: the paper's node and sweeps") {
  // One rank of the paper's 4xH100 node (examples/simulate.cpp), at several model sizes
  // and link speeds; subgroups of 100M parameters, two staging slots.
  for (const double link : {5e9, 10e9, 20e9, 40e9, 80e9})
    for (const double params : {2e9, 7e9, 20e9, 70e9}) {
      const HardwareProfile node{.cpu_rate = 8.6e9 / 4, .device_rate = 3.0e12 / 16, .h2d_bandwidth = link,
                                 .d2h_bandwidth = link, .duplex = true, .host_bandwidth = 0};
      const FirstOrderCostModel m(node);
      const auto shapes = uniform_shapes(static_cast<std::size_t>(params / 4), 100'000'000);
      const PlanLimits limits{.budget = 2 * shapes.front().slot_bytes, .max_slots = 2};
      const auto curve = simulate_strides(m, shapes, 10, limits);
      const auto best = std::min_element(curve.begin(), curve.end(),
                                         [](const auto& a, const auto& b) { return a.seconds < b.seconds; });
      CAPTURE(link);
      CAPTURE(params);
      const auto automatic = simulate_policy(m, shapes, AutomaticStride{10}, limits, 0);
      CHECK(automatic.stride == best->stride);
      CHECK(automatic.seconds == best->seconds);
      // With device memory for residents: the stride over the others is the best one
      // for the residency chosen at construction.
      for (const double gb : {20e9, 40e9, 80e9}) {
        const auto combined = simulate_policy(m, shapes, ResidentThenStride{10}, limits, static_cast<std::size_t>(gb));
        std::vector<Place> residents, a;
        resident_prefix(residents, shapes.size(), combined.resident);
        double best_over_residents = 1e300;
        for (std::uint32_t k = 0; k <= 10; ++k) {
          stride_assignment(a, residents, k);
          Plan p;
          make_plan(p, shapes, a, limits, k);
          if (p.fallback.empty()) best_over_residents = std::min(best_over_residents, m.predict(p));
        }
        CAPTURE(gb);
        CHECK(combined.seconds == best_over_residents);
      }
    }
}

TEST_CASE("with CPU and device path equally fast, the automatic stride is 2 (k = 1 + R_c / R_g)") {
  const FirstOrderCostModel m(profile);  // R_c = 1e9, R_g = 12e9 / 12 = 1e9
  const auto shapes = uniform(64, 1'000'000);
  CHECK(simulate_policy(m, shapes, AutomaticStride{}, {.budget = ~std::size_t{0}, .max_slots = 2}, 0).stride == 2);
}

TEST_CASE("balanced assignment evens out uneven subgroups") {
  std::vector<SubgroupShape> shapes;
  test::Rng rng(3);
  for (int i = 0; i < 20; ++i) {
    const std::size_t n = 100'000 * (1 + rng.below(20));
    shapes.push_back({.elements = n, .slot_bytes = 16 * n, .upload_bytes = 12 * n, .download_bytes = 12 * n,
                      .cpu_bytes = 28 * n});
  }
  const FirstOrderCostModel m(profile);
  Plan plan, scratch;
  std::vector<Place> a, resident(shapes.size(), Place::cpu);
  const double balanced = choose_plan(plan, scratch, a, shapes, resident, Balanced{},
                                      {.budget = ~std::size_t{0}, .max_slots = 2}, m);
  CHECK(plan.device_subgroups() > 0);
  CHECK(balanced < 0.75 * predict_stride(m, shapes, 0));
  // A device path that is hopeless gets nothing.
  HardwareProfile slow = profile;
  slow.h2d_bandwidth = slow.d2h_bandwidth = 1;
  choose_plan(plan, scratch, a, shapes, resident, Balanced{},
              {.budget = ~std::size_t{0}, .max_slots = 2}, FirstOrderCostModel(slow));
  CHECK(plan.device_subgroups() == 0);
}

TEST_CASE("static fraction keeps its residents and runs the rest on the CPU") {
  const auto shapes = uniform(10, 1000);
  std::vector<Place> resident = residency_of(StaticFraction{0.3}, shapes);
  CHECK(std::count(resident.begin(), resident.end(), Place::resident) == 3);
  Plan plan, scratch;
  std::vector<Place> a;
  choose_plan(plan, scratch, a, shapes, resident, StaticFraction{0.3},
              {.budget = 0, .max_slots = 2}, FirstOrderCostModel(profile));
  CHECK(plan.device_subgroups() == 3);
  CHECK(plan.slots == 0);
}

TEST_CASE("calibrate measures the emulated device's throttles and link") {
  const CalibrationSizes small{.cpu_elements = 1 << 16, .copy_bytes = 2 << 20, .device_elements = 1 << 14,
                               .repetitions = 2};
  cpu::CpuAdamExecutor cpu({.threads = 1});
  EmulatedDeviceBackend duplex({.threads = 1}, {.h2d_bandwidth = 100e6, .d2h_bandwidth = 50e6, .device_rate = 2e7});
  const HardwareProfile p = calibrate(duplex, cpu, small);
  CHECK(p.cpu_rate > 0);
  CHECK(p.host_bandwidth > 0);
  CHECK(p.h2d_bandwidth <= 100e6 * 1.01);  // a throttle is an upper bound
  CHECK(p.d2h_bandwidth <= 50e6 * 1.01);
  CHECK(p.h2d_bandwidth > p.d2h_bandwidth);
  CHECK(p.device_rate <= 2e7 * 1.01);
  CHECK(p.duplex);
  // Each emulated copy sleeps out its throttle, then does its memcpy, and two streams'
  // memcpys run at once even on a shared link: each memcpy's time counts twice in
  // t_up + t_down but once in t_both. Under TSan on two cores a 2 MB memcpy (and the
  // wake-ups around it) took over the 20 ms the throttle gave, and the shared link read
  // duplex. A smaller copy on a slower link keeps the throttle (52 ms a direction) far
  // above the memcpy, as it is on a real link.
  CalibrationSizes slow_link = small;
  slow_link.copy_bytes = 256 << 10;
  EmulatedDeviceBackend shared({.threads = 1}, {.h2d_bandwidth = 5e6, .d2h_bandwidth = 5e6, .duplex = false});
  CHECK_FALSE(calibrate(shared, cpu, slow_link).duplex);
}

namespace {
// A device whose host synchronisation costs 50 ms, as a launch and a synchronize cost
// microseconds next to a kernel of microseconds on a GPU, and that asks calibration
// for a larger scratch, as a GPU with a large L2 cache does.
struct SlowHostDevice : test::WrappedDevice<> {
  using WrappedDevice::WrappedDevice;
  static constexpr std::size_t calibration_device_elements = std::size_t{1} << 16;
  void synchronize(Event& e) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    WrappedDevice::synchronize(e);
  }
  void synchronize(Stream& s) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    WrappedDevice::synchronize(s);
  }
  void launch_adam(std::span<const DeviceSegment> segs, Stream& st) {
    largest = std::max(largest, segs[0].count);
    WrappedDevice::launch_adam(segs, st);
  }
  std::size_t largest = 0;
};
static_assert(DeviceBackend<SlowHostDevice>);
}  // namespace

TEST_CASE("calibrate times the device's Adam on the device, over the scratch size the backend asks for") {
  const CalibrationSizes small{.cpu_elements = 1 << 16, .copy_bytes = 2 << 20, .device_elements = 1 << 14,
                               .repetitions = 2};
  cpu::CpuAdamExecutor cpu({.threads = 1});
  // The throttle (65 ms for the scratch) dominates the emulated kernel's own work even
  // under the sanitizers (about 1 ms under ASan, 5 ms under TSan), so timing on the
  // device sees over 0.9x of the rate.
  SlowHostDevice dev({.threads = 1}, {.device_rate = 1e6});
  const HardwareProfile p = calibrate(dev, cpu, small);
  CHECK(dev.largest == SlowHostDevice::calibration_device_elements);
  CHECK(p.device_rate <= 1e6 * 1.01);
  CHECK(p.device_rate > 1e6 * 0.8);  // a host clock would see 65 ms of kernel + 50 ms: 0.57x
}

namespace {
// Pinned memory that records the size of each block it hands out (the blocks are the
// emulated device's own, so its copies accept them).
struct RecordingPinned {
  emulated::PinnedMemory* inner = nullptr;
  std::vector<std::size_t>* sizes = nullptr;
  void* allocate(std::size_t bytes, std::size_t alignment) {
    sizes->push_back(bytes);
    return inner->allocate(bytes, alignment);
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) { inner->deallocate(p, bytes, alignment); }
};
struct RecordingPinnedDevice : test::WrappedDevice<> {
  using WrappedDevice::WrappedDevice;
  RecordingPinned& pinned_memory() { return recording; }
  std::vector<std::size_t> sizes;
  RecordingPinned recording{&WrappedDevice::pinned_memory(), &sizes};
};
static_assert(DeviceBackend<RecordingPinnedDevice>);
}  // namespace

TEST_CASE("calibrate runs the CPU's Adam over the backend's pinned memory, where the state lives") {
  // On the 2-vCPU EPYC VM the same Adam ran 1.5-2.5x faster over huge pages, the
  // emulated device's pinned memory, than over the 4 KiB pages of a plain buffer: a
  // rate measured elsewhere than the state predicted the all-CPU step 3-5x slow.
  const CalibrationSizes small{.cpu_elements = 1 << 16, .copy_bytes = 2 << 20, .device_elements = 1 << 14,
                               .repetitions = 1};
  cpu::CpuAdamExecutor cpu({.threads = 1});
  RecordingPinnedDevice dev({.threads = 1}, {});
  const HardwareProfile p = calibrate(dev, cpu, small);
  CHECK(p.cpu_rate > 0);
  // p, g, m and v, each cpu_elements floats; the link's two buffers besides.
  CHECK(std::count(dev.sizes.begin(), dev.sizes.end(), small.cpu_elements * sizeof(float)) == 4);
  CHECK(std::count(dev.sizes.begin(), dev.sizes.end(), small.copy_bytes) == 2);
}

TEST_CASE("refinement learns each kind of plan's residual: a plan measured 20% slow is predicted slower") {
  FirstOrderCostModel m(profile, 0.5);
  StepTimeline t = stride_step(8, 2);
  const double raw = m.first_order(t.plan);
  CHECK(m.predict(t.plan) == doctest::Approx(raw));
  t.measured_seconds = 1.2 * raw;  // no op timings: the rates stay, only the residual moves
  m.refine(t);
  CHECK(m.residual(4) == doctest::Approx(1.1));
  CHECK(m.predict(t.plan) == doctest::Approx(1.1 * raw));
  CHECK(m.residual(0) == 1.0);  // an all-CPU plan is another kind
  Plan cpu_only;
  std::vector<Place> none(8, Place::cpu);
  make_plan(cpu_only, uniform(8, 1'000'000), none, {.budget = 0, .max_slots = 2});
  CHECK(m.predict(cpu_only) == doctest::Approx(m.first_order(cpu_only)));
}
