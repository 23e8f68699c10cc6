// step() allocates nothing: every buffer, chunk list and view table is built at
// construction. Counts every global operator new in this process.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "support/inputs.hpp"

#include <doctest/doctest.h>
#include <dos/backend/emulated_device.hpp>
#include <dos/optimizer.hpp>

#include <atomic>
#include <cstdlib>
#include <new>
#include <variant>
#include <vector>

namespace {
std::atomic<long> allocations{0};
}

// The replacements pair malloc with free on purpose; GCC cannot see that they match.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

void* operator new(std::size_t n) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

TEST_CASE("step allocates nothing, from the first step on, with any policy") {
  for (auto policy : {dos::NonFinitePolicy::propagate, dos::NonFinitePolicy::skip_step}) {
    std::vector<float> a(100'000, 0.5f), ga(100'000, 0.1f);
    std::vector<dos::bf16> b(3'000, dos::bf16(0.5f)), gb(3'000, dos::bf16(0.1f));
    using Any = std::variant<dos::HostParam<float>, dos::HostParam<dos::bf16>>;
    std::vector<Any> params{dos::HostParam<float>{a, ga}, dos::HostParam<dos::bf16>{b, gb}};
    dos::CpuOptimizer opt(params, dos::AdamW{.amsgrad = true},
                          {.subgroup_elements = 20'000, .threads = 2, .nonfinite = policy});
    const long before = allocations.load();
    for (int t = 0; t < 5; ++t) {
      opt.set_lr(0, 1e-3 / (t + 1));
      CHECK(opt.step().applied);
    }
    CHECK(allocations.load() == before);
  }
}

TEST_CASE("an interleaved step allocates nothing once warm, whatever the policy chooses") {
  using Policy = dos::Policy;
  for (const Policy& policy : {Policy{.kind = dos::PolicyKind::automatic_stride}, Policy{.kind = dos::PolicyKind::balanced},
                               Policy{.kind = dos::PolicyKind::fixed_stride, .stride = 3},
                               Policy{.kind = dos::PolicyKind::static_fraction, .fraction = 0.5}}) {
    std::vector<float> a(100'000, 0.5f), ga(100'000, 0.1f);
    std::vector<dos::bf16> b(30'000, dos::bf16(0.5f)), gb(30'000, dos::bf16(0.1f));
    using Any = std::variant<dos::HostParam<float>, dos::HostParam<dos::bf16>>;
    std::vector<Any> params{dos::HostParam<float>{a, ga}, dos::HostParam<dos::bf16>{b, gb}};
    dos::Options o{.subgroup_elements = 10'000, .threads = 2};
    o.interleave.policy = policy;
    o.interleave.profile = dos::HardwareProfile{.cpu_rate = 1e9, .device_rate = 1e10, .h2d_bandwidth = 1e10,
                                                .d2h_bandwidth = 1e10};
    o.interleave.validate_plans = false;  // the validator allocates its report; it is a debugging aid
    dos::InterleavedOptimizer<dos::EmulatedDeviceBackend> opt(params, dos::AdamW{.amsgrad = true}, o);
    CAPTURE(dos::policy_name(policy.kind));
    opt.step();  // the first step sizes the cost model's scratch
    const long before = allocations.load();
    for (int t = 0; t < 5; ++t) {
      opt.set_staging_budget(t % 2 == 0 ? 1 : opt.staging_slot_bytes() * 2);  // falls back every other step
      CHECK(opt.step().applied);
    }
    CHECK(allocations.load() == before);
  }
}

TEST_CASE("the counter sees allocations (the test above can fail)") {
  const long before = allocations.load();
  auto* v = new std::vector<int>(10);
  delete v;
  CHECK(allocations.load() > before);
}
