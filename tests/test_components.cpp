// Every policy-based component plugs into InterleavedOptimizer: a user-written
// partitioner, cost model, assignment policy, CPU executor and device backend, each
// checked bit for bit against the defaults where the maths must not change.

#include "support/backend_compare.hpp"
#include "support/mixed_model.hpp"
#include "support/wrapped_device.hpp"

#include <doctest/doctest.h>
#include <dos/optimizer.hpp>

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

using namespace dos;
using test::all_state;
using test::MixedModel;
using test::same_bits;
using test::two_groups;

namespace {

// A partitioner that takes no size: each tensor is a subgroup of its own.
struct OnePerTensor {
  std::vector<Subgroup> partition(std::span<const std::size_t> sizes) const {
    std::vector<Subgroup> out;
    for (std::uint32_t t = 0; t < sizes.size(); ++t)
      if (sizes[t] > 0) out.push_back({{{t, 0, sizes[t], 0}}, sizes[t], sizes[t]});
    return out;
  }
};
static_assert(Partitioner<OnePerTensor>);

// A cost model with fixed rates that never learns.
struct FixedRates {
  FirstOrderCostModel inner;
  explicit FixedRates(const HardwareProfile& p) : inner(p) {}
  double predict(const Plan& plan, std::vector<OpTiming>* t = nullptr) const { return inner.first_order(plan, t); }
  void refine(const StepTimeline&) {}
  const HardwareProfile& profile() const { return inner.profile(); }
};
static_assert(CostModel<FixedRates>);

// A user policy: the last subgroup on the device, and a count of the steps it saw;
// it keeps records (room made in reserve) and calls every other step an exploration.
struct LastOnDevice {
  int* observed = nullptr;
  std::size_t* reserved = nullptr;
  int calls = 0;
  std::string_view name() const { return "last_on_device"; }
  void validate() const {}
  void residency(const ResidencyRequest& r, std::vector<Place>& out) const { out.assign(r.shapes.size(), Place::cpu); }
  double choose(const PlanRequest& r, Plan& plan) {
    r.assignment.assign(r.residency.begin(), r.residency.end());
    r.assignment.back() = Place::device;
    make_plan(plan, r.shapes, r.assignment, r.limits);
    plan.explored = calls++ % 2 == 1;
    return r.predict(plan);
  }
  void reserve(std::size_t subgroups) { *reserved = subgroups; }
  void observe(const StepTimeline&) { ++*observed; }
};
static_assert(AssignmentPolicy<LastOnDevice>);

// A one-thread executor with the scalar kernels: the same bits, by the contract of
// the one Adam step.
struct Serial {
  explicit Serial(const cpu::CpuConfig&) {}
  unsigned threads() const { return 1; }
  cpu::RangeKernel kernel(DType v, DType g, bool a) const { return select_kernel(SimdLevel::scalar, v, g, a); }
  void run(std::span<const cpu::Chunk> chunks, std::span<const cpu::SegmentWork> work) {
    for (const auto& c : chunks) work[c.segment].kernel(work[c.segment].args, c.begin, c.end, *work[c.segment].coefficients);
  }
  void parallel_for(std::size_t n, FunctionRef<void(std::size_t)> body) {
    for (std::size_t i = 0; i < n; ++i) body(i);
  }
  int runs = 0;
};
static_assert(cpu::CpuExecutor<Serial>);

// A minimal device backend: the emulated device, wrapped, counting its Adam launches.
using Wrapped = test::WrappedDevice<>;
static_assert(DeviceBackend<Wrapped>);

struct UserParts : DefaultComponents {
  using partitioner = OnePerTensor;
  using cost_model = FixedRates;
  using cpu_executor = Serial;
};

// Runs both optimizers over the same gradients, checking every value and state bit.
template <class A, class B>
void same_trajectory(A& a, MixedModel& ma, B& b, MixedModel& mb, int steps) {
  for (int t = 1; t <= steps; ++t) {
    ma.set_gradients(t);
    mb.set_gradients(t);
    a.step();
    b.step();
    REQUIRE(same_bits(all_state(a), all_state(b)));
  }
  CHECK(ma.value_bytes() == mb.value_bytes());
}

}  // namespace

TEST_CASE("a user partitioner, cost model and CPU executor give the default optimizer's bits") {
  const auto specs = test::any_sizes(7, 700, 3);
  MixedModel ref_model(specs, two_groups, true), user_model(specs, two_groups, true);
  CpuOptimizer reference(ref_model.groups(), Options{.subgroup_elements = 1 << 20, .threads = 2});
  InterleavedOptimizer<CpuBackend, UserParts> user(user_model.groups(), Options{.subgroup_elements = 64});
  for (const Subgroup& s : user.subgroups()) {  // one subgroup per tensor, whatever the size asked
    REQUIRE(s.segments.size() == 1);
    CHECK(s.segments[0].count == user.param_numel(s.segments[0].tensor));
  }
  CHECK(user.threads() == 1);
  same_trajectory(reference, ref_model, user, user_model, 20);
}

TEST_CASE("a user policy and a user device backend run the interleaved engine, bit for bit") {
  const auto specs = test::one_per_subgroup(6, 256, 9);
  MixedModel ref_model(specs, two_groups, true), user_model(specs, two_groups);
  CpuOptimizer reference(ref_model.groups(), Options{.subgroup_elements = 256, .threads = 1});
  int observed = 0;
  std::size_t reserved = 0;
  Options o = test::device_options(LastOnDevice{&observed, &reserved}, 256);
  InterleavedOptimizer<Wrapped, UserParts> user(user_model.groups(), o);
  CHECK(reserved == 6);  // at construction, one subgroup per tensor
  same_trajectory(reference, ref_model, user, user_model, 10);
  CHECK(observed == 10);
  const bool first = user.step().explored, second = user.step().explored;
  CHECK(first != second);  // the report says what the policy said of its plan
  CHECK(user.backend().launches >= 10);
  CHECK(user.policy().name() == "last_on_device");
  CHECK(user.timeline().plan.placement.back() == Place::device);
  CHECK(user.timeline().plan.device_subgroups() == 1);
}

TEST_CASE("a fixed-rate cost model predicts without learning; the default one learns") {
  const auto specs = test::one_per_subgroup(4, 256, 2);
  MixedModel model(specs, two_groups);
  Options o = test::device_options(FixedStride{2}, 256);
  InterleavedOptimizer<EmulatedDeviceBackend, UserParts> user(model.groups(), o);
  const HardwareProfile before = user.cost_model().profile();
  for (int t = 1; t <= 3; ++t) {
    model.set_gradients(t);
    user.step();
  }
  CHECK(user.cost_model().profile().cpu_rate == before.cpu_rate);
}
