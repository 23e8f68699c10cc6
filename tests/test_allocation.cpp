// step() allocates nothing: every buffer, chunk list and view table is built at
// construction. Counts every global operator new in this process.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "support/counting_new.hpp"
#include "support/inputs.hpp"
#include "support/switched_param.hpp"

#include <doctest/doctest.h>
#include <dos/backend/emulated_device.hpp>
#include <dos/optimizer.hpp>

#include <atomic>
#include <cstdlib>
#include <new>
#include <variant>
#include <vector>

using dos::test::allocations;
using dos::test::SwitchedParam;

TEST_CASE("step allocates nothing, from the first step on, with any policy") {
  for (auto policy : {dos::NonFinitePolicy::propagate, dos::NonFinitePolicy::skip_step}) {
    std::vector<float> a(100'000, 0.5f), ga(100'000, 0.1f);
    std::vector<dos::bf16> b(3'000, dos::bf16(0.5f)), gb(3'000, dos::bf16(0.1f));
    std::vector<float> c(5'000, 0.5f), gc(5'000, 0.1f);
    std::uint8_t absent = 0;  // parameter 2 skips every other step: per-parameter counts
    using Any = std::variant<dos::HostParam<float>, dos::HostParam<dos::bf16>, SwitchedParam>;
    std::vector<Any> params{dos::HostParam<float>{a, ga}, dos::HostParam<dos::bf16>{b, gb}, SwitchedParam{{c, gc}, &absent}};
    dos::CpuOptimizer opt(params, dos::AdamW{.amsgrad = true},
                          {.subgroup_elements = 20'000, .threads = 2, .nonfinite = policy});
    const long before = allocations.load();
    for (int t = 0; t < 5; ++t) {
      absent = t % 2 == 1 ? 1 : 0;
      opt.set_lr(0, 1e-3 / (t + 1));
      CHECK(opt.step().applied);
    }
    CHECK(allocations.load() == before);
  }
}

TEST_CASE("a ZeRO-1 or ZeRO-2 step on one rank allocates nothing of its own from the first step on") {
  for (const auto mode : {dos::Sharding::zero1, dos::Sharding::zero2}) {
    std::vector<float> a(100'000, 0.5f), ga(100'000, 0.1f), c(5'000, 0.5f), gc(5'000, 0.1f);
    std::vector<dos::HostParam<float>> params{{a, ga}, {c, gc}};
    dos::Options o{.subgroup_elements = 20'000, .threads = 2, .max_grad_norm = 1.0, .sharding = mode};
    dos::ShardedOptimizer<> opt(params, dos::AdamW{}, o);
    const long before = allocations.load();
    for (int t = 0; t < 3; ++t) CHECK(opt.step().applied);
    CHECK(allocations.load() == before);
  }
}

TEST_CASE("an interleaved step allocates nothing from the first step on: every policy, validation and the training loop") {
  using dos::AnyPolicy;
  for (const AnyPolicy& policy : {AnyPolicy(dos::AutomaticStride{}), AnyPolicy(dos::Balanced{}), AnyPolicy(dos::FixedStride{3}),
                                  AnyPolicy(dos::StaticFraction{0.5}), AnyPolicy(dos::ResidentThenStride{}),
                                  AnyPolicy(dos::AllCpu{})})
    for (int variant = 0; variant < 4; ++variant) {
      std::vector<float> a(100'000, 0.5f), ga(100'000, 0.1f);
      std::vector<dos::bf16> b(30'000, dos::bf16(0.5f)), gb(30'000, dos::bf16(0.1f));
      std::vector<float> c(5'000, 0.5f), gc(5'000, 0.1f);
      std::uint8_t absent = 0;  // parameter 2 skips every other step
      using Any = std::variant<dos::HostParam<float>, dos::HostParam<dos::bf16>, SwitchedParam>;
      std::vector<Any> params{dos::HostParam<float>{a, ga}, dos::HostParam<dos::bf16>{b, gb}, SwitchedParam{{c, gc}, &absent}};
      dos::Options o{.subgroup_elements = 10'000, .threads = 2};
      o.interleave.policy = policy;
      o.interleave.profile = dos::HardwareProfile{.cpu_rate = 1e9, .device_rate = 1e10, .h2d_bandwidth = 1e10,
                                                  .d2h_bandwidth = 1e10};
      o.interleave.validate_plans = true;
      if (variant == 1) o.max_grad_norm = 1.0;  // clipping: the gradient statistics pass
      if (variant == 2) o.loss_scaling = dos::LossScaling{.init_scale = 1024};
      // Variant 3: registration refused, host tensors staged through pinned buffers.
      dos::InterleavedOptimizer<dos::EmulatedDeviceBackend> opt(params, dos::AdamW{.amsgrad = true}, o,
                                                                {.refuse_registration = variant == 3});
      CAPTURE(policy.name());
      CAPTURE(variant);
      const long before = allocations.load();
      std::size_t fewest = ~std::size_t{0}, most = 0;  // resident subgroups
      // ResidentThenStride first sweeps the strides over the model's count, then compares
      // counts, moving the residents between steps: it runs until a move (at most 60).
      const bool resident = policy.target<dos::ResidentThenStride>() != nullptr;
      for (int t = 0; t < (resident ? 60 : 5) && !(t >= 5 && fewest < most); ++t) {
        absent = t % 2 == 0 ? 1 : 0;
        opt.set_staging_budget(t % 2 == 1 ? 1 : opt.staging_slot_bytes() * 2);  // falls back every other step
        if (t == 3) {
          opt.begin_backward();
          opt.grad_ready(2);
          opt.grad_ready(1);
          opt.grad_ready(0);
        }
        const dos::StepReport r = opt.step();
        CHECK(r.applied);
        fewest = std::min(fewest, r.resident_subgroups);
        most = std::max(most, r.resident_subgroups);
      }
      CHECK(allocations.load() == before);
      // (Those moves allocate nothing either.)
      if (resident) CHECK(fewest < most);
    }
}

TEST_CASE("the counter sees allocations (the test above can fail)") {
  const long before = allocations.load();
  auto* v = new std::vector<int>(10);
  delete v;
  CHECK(allocations.load() > before);
}
