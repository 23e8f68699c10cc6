// A stateful fuzzer of the optimizer's API. From a seed it builds a random model
// (sizes including 0 and 1, random dtypes and groups, host or emulated-device
// placement) and runs a random sequence of calls mixing valid and invalid arguments
// (new gradients may leave a random subset absent: torch's None, skipped).
// After every call:
//  - a call that threw left every parameter and every state tensor bit-identical;
//  - a call that succeeded left the optimizer bit-identical to a reference
//    CpuOptimizer fed the same successful calls;
//  - no call took longer than a time limit, and a step that ran allocated nothing.
// DOS_FUZZ_SEEDS (default 1500) and DOS_FUZZ_FIRST_SEED choose the seeds; a failure
// prints its seed and the call, to replay it alone.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "support/counting_new.hpp"
#include "support/backend_compare.hpp"
#include "support/mixed_model.hpp"

#include <doctest/doctest.h>
#include <dos/optimizer.hpp>
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

using dos::test::allocations;

using namespace dos;
using test::MixedParam;

namespace {

// A parameter seen through a pointer, so the fuzzer can move its views between calls.
struct Live {
  MixedParam* p;
};

}  // namespace

template <>
struct dos::tensor_traits<Live> {
  static TensorView value(const Live& l) { return {l.p->value, l.p->numel, l.p->dtype, l.p->device}; }
  static ConstTensorView grad(const Live& l) {
    if (l.p->absent != nullptr && *l.p->absent != 0) return ConstTensorView::absent();  // torch's None
    return {l.p->grad, l.p->numel, l.p->dtype, l.p->device};
  }
};

namespace {

// Calls refused and accepted over all seeds: both paths must be exercised.
long refused_calls = 0, accepted_calls = 0;

std::uint64_t env(const char* name, std::uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::strtoull(v, nullptr, 10) : fallback;
}

// Everything one optimizer holds, as bits: values, state of every kind, step count, scale.
template <class Opt>
std::vector<float> snapshot(Opt& opt, test::MixedModel& model, const std::vector<bool>& amsgrad) {
  std::vector<float> out = test::all_state(opt);
  for (std::size_t p = 0; p < opt.num_params(); ++p)
    if (amsgrad[p]) {
      std::vector<float> tmp(opt.param_numel(p));
      opt.read_state(p, StateKind::max_exp_avg_sq, tmp);
      out.insert(out.end(), tmp.begin(), tmp.end());
    }
  const auto bytes = model.value_bytes();
  const std::size_t floats = bytes.size() / 4 + 1;
  std::vector<float> tail(floats, 0.0f);
  if (!bytes.empty()) std::memcpy(tail.data(), bytes.data(), bytes.size());
  out.insert(out.end(), tail.begin(), tail.end());
  out.push_back(static_cast<float>(opt.step_count()));
  for (std::size_t p = 0; p < opt.num_params(); ++p) out.push_back(static_cast<float>(opt.step_count(p)));
  out.push_back(static_cast<float>(opt.loss_scale()));
  return out;
}

float special(test::Rng& rng) {
  switch (rng.below(5)) {
    case 0: return std::numeric_limits<float>::infinity();
    case 1: return std::numeric_limits<float>::quiet_NaN();
    case 2: return 1e-42f;  // denormal
    case 3: return 3e38f;   // near the float range: overflows a bf16 or fp16 gradient too
    default: return -1e30f;
  }
}

AdamConfig random_hyper(test::Rng& rng, bool amsgrad) {
  const double lr = 1e-4 * static_cast<double>(1 + rng.below(100));
  if (rng.below(2) == 0) return AdamW{.lr = lr, .weight_decay = 0.01 * static_cast<double>(rng.below(3)), .amsgrad = amsgrad};
  return Adam{.lr = lr, .weight_decay = 0.001 * static_cast<double>(rng.below(2)), .amsgrad = amsgrad,
              .maximize = rng.below(4) == 0};
}

template <class Backend>
void fuzz_one(std::uint64_t seed) {
  test::Rng rng(seed * 7919 + 17);
  // The model.
  const std::size_t groups = 1 + rng.below(2);
  std::vector<test::TensorSpec> specs;
  const std::size_t tensors = 1 + rng.below(5);
  for (std::size_t t = 0; t < tensors; ++t) {
    const std::size_t size_kind = rng.below(6);
    const std::size_t numel = size_kind == 0 ? 0 : size_kind == 1 ? 1 : 1 + rng.below(600);
    test::TensorSpec s = test::random_spec(rng, numel, groups);
    if constexpr (!DeviceBackend<Backend>) s.device = Device::host;
    specs.push_back(s);
  }
  std::vector<AdamConfig> hyper;
  for (std::size_t g = 0; g < groups; ++g) hyper.push_back(random_hyper(rng, rng.below(3) == 0));
  test::MixedModel sm(specs, hyper), rm(specs, hyper, true);
  std::vector<MixedParam> sv, rv;
  std::vector<bool> amsgrad;
  for (const auto& g : sm.groups())
    for (const auto& p : g.params) sv.push_back(p), amsgrad.push_back(g.hyper.amsgrad);
  for (const auto& g : rm.groups())
    for (const auto& p : g.params) rv.push_back(p);
  const auto live_groups = [&](std::vector<MixedParam>& views) {
    std::vector<ParamGroup<Live>> out(groups);
    std::size_t i = 0;
    for (std::size_t g = 0; g < groups; ++g) {
      out[g].hyper = hyper[g];
      for (std::size_t t = 0; t < specs.size(); ++t)
        if (specs[t].group == g) out[g].params.push_back({&views[i++]});
    }
    return out;
  };
  // The options.
  Options o{.subgroup_elements = 16 + rng.below(700), .threads = static_cast<unsigned>(1 + rng.below(2))};
  if (rng.below(3) == 0) o.nonfinite = NonFinitePolicy::skip_step;
  if (rng.below(3) == 0) o.max_grad_norm = 0.001 * static_cast<double>(1 + rng.below(1000));
  if (rng.below(3) == 0) o.loss_scaling = LossScaling{.init_scale = std::ldexp(1.0, static_cast<int>(rng.below(20))) ,
                                                      .growth_interval = static_cast<std::int64_t>(1 + rng.below(4))};
  Options so = test::device_options(FixedStride{static_cast<std::uint32_t>(1 + rng.below(4))}, o.subgroup_elements);
  so.threads = o.threads;
  so.nonfinite = o.nonfinite;
  so.max_grad_norm = o.max_grad_norm;
  so.loss_scaling = o.loss_scaling;
  if (rng.below(4) == 0) so.interleave.policy = ResidentThenStride{};
  else if (rng.below(3) == 0) so.interleave.policy = StaticFraction{0.5};
  InterleavedOptimizer<Backend> subject(live_groups(sv), so);
  CpuOptimizer reference(live_groups(rv), o);

  std::string call;
  int n = 0;
  bool failed = false;  // the first failure of a seed is reported; what follows would only echo it
  const auto fail = [&](const std::string& what) {
    FAIL_CHECK(fmt::format("seed {} ({}), call {} '{}': {}", seed, DeviceBackend<Backend> ? "emulated" : "cpu", n, call,
                           what));
    failed = true;
  };
  const bool verbose = env("DOS_FUZZ_VERBOSE", 0) != 0;
  if (verbose)
    fmt::print("seed {}: {} tensors, {} groups, subgroup {}, threads {}, skip {}, clip {}, scaling {}, policy {}\n", seed,
               specs.size(), groups, o.subgroup_elements, o.threads, o.nonfinite == NonFinitePolicy::skip_step,
               o.max_grad_norm, o.loss_scaling.has_value(), so.interleave.policy.name());
  std::int64_t grad_step = 1;
  sm.set_gradients(grad_step);
  rm.set_gradients(grad_step);

  for (n = 0; n < 90 && !failed; ++n) {
    const auto before = snapshot(subject, sm, amsgrad);
    const std::size_t choice = rng.below(100);
    bool threw = false, mirror = true, stepped = false;
    long allocated = 0;
    const auto t0 = std::chrono::steady_clock::now();
    // Each entry runs the call on the subject; `mirror` runs it on the reference.
    std::function<void(CpuOptimizer&)> on_reference;
    try {
      if (choice < 28) {
        call = "step";
        on_reference = [](CpuOptimizer& r) { r.step(); };
        const long a0 = allocations.load();
        subject.step();
        allocated = allocations.load() - a0;
        stepped = true;
      } else if (choice < 40) {
        // A new backward pass: what grad_ready reported of the last one is stale.
        call = "new gradients";
        subject.begin_backward();
        reference.begin_backward();
        ++grad_step;
        sm.set_gradients(grad_step);
        rm.set_gradients(grad_step);
        const bool some_absent = rng.below(2) == 0;  // a random subset has no gradient (torch's None)
        for (std::size_t t = 0; t < specs.size(); ++t) {
          const bool none = some_absent && rng.below(3) == 0;
          sm.set_absent(t, none);
          rm.set_absent(t, none);
        }
        if (rng.below(3) == 0) {
          const std::size_t t = rng.below(specs.size());
          if (specs[t].numel > 0) {
            const std::size_t i = rng.below(specs[t].numel);
            const float x = special(rng);
            test::store_as(sm.grad(t), specs[t].dtype, i, x);
            test::store_as(rm.grad(t), specs[t].dtype, i, x);
            call = fmt::format("gradient {}[{}] = {}", t, i, x);
          }
        }
        mirror = false;
      } else if (choice < 48) {
        const std::size_t p = rng.below(sv.size() + 1);
        call = fmt::format("begin_backward, grad_ready({})", p);
        subject.begin_backward();
        reference.begin_backward();
        on_reference = [p](CpuOptimizer& r) { r.grad_ready(p); };
        subject.grad_ready(p);
      } else if (choice < 52) {
        call = "accumulate";
        on_reference = [](CpuOptimizer& r) { r.accumulate(); };
        subject.accumulate();
      } else if (choice < 60) {
        const std::size_t g = rng.below(groups + 1);
        const double lr = rng.below(4) == 0 ? -1.0 : rng.below(8) == 0 ? std::nan("") : 1e-3 * static_cast<double>(rng.below(10));
        call = fmt::format("set_lr({}, {})", g, lr);
        on_reference = [g, lr](CpuOptimizer& r) { r.set_lr(g, lr); };
        subject.set_lr(g, lr);
      } else if (choice < 64) {
        const std::size_t g = rng.below(groups);
        AdamConfig c = random_hyper(rng, rng.below(4) == 0 ? !hyper[g].amsgrad : hyper[g].amsgrad);
        if (rng.below(4) == 0) c.beta1 = 1.5;
        call = fmt::format("set_hyperparameters({})", g);
        on_reference = [g, c](CpuOptimizer& r) { r.set_hyperparameters(g, c); };
        subject.set_hyperparameters(g, c);
      } else if (choice < 68) {
        const std::int64_t t = rng.below(4) == 0 ? -static_cast<std::int64_t>(rng.below(5)) - 1
                                                 : static_cast<std::int64_t>(rng.below(50));
        call = fmt::format("set_step_count({})", t);
        on_reference = [t](CpuOptimizer& r) { r.set_step_count(t); };
        subject.set_step_count(t);
      } else if (choice < 74) {
        const std::size_t p = rng.below(sv.size() + 1);
        const auto kind = static_cast<StateKind>(rng.below(5));
        const std::size_t size = p < sv.size() ? sv[p].numel + (rng.below(6) == 0 ? 1 : 0) : 3;
        call = fmt::format("read_state({}, {}, {})", p, static_cast<int>(kind), size);
        std::vector<float> a(size), b(size);
        subject.read_state(p, kind, a);
        reference.read_state(p, kind, b);
        if (!test::same_bits(a, b)) fail("read_state differs from the reference");
        mirror = false;
      } else if (choice < 80) {
        const std::size_t p = rng.below(sv.size() + 1);
        const auto kind = static_cast<StateKind>(rng.below(5));
        const std::size_t size = p < sv.size() ? sv[p].numel + (rng.below(6) == 0 ? 1 : 0) : 3;
        std::vector<float> in(size);
        for (float& x : in) x = kind == StateKind::exp_avg_sq || kind == StateKind::max_exp_avg_sq
                                    ? 1e-4f * static_cast<float>(rng.below(100))
                                    : 0.01f * static_cast<float>(rng.below(200)) - 1.0f;
        call = fmt::format("write_state({}, {}, {})", p, static_cast<int>(kind), size);
        on_reference = [p, kind, in](CpuOptimizer& r) { r.write_state(p, kind, in); };
        subject.write_state(p, kind, in);
      } else if (choice < 86) {
        mirror = false;
        if constexpr (DeviceBackend<Backend>) {
          if (rng.below(2) == 0) {
            const std::size_t bytes = rng.below(3) == 0 ? 1 : ~std::size_t{0};
            call = fmt::format("set_staging_budget({})", bytes);
            subject.set_staging_budget(bytes);
          } else {
            const std::uint32_t k = static_cast<std::uint32_t>(rng.below(5));
            call = fmt::format("set_policy(fixed_stride {})", k);
            subject.set_policy(FixedStride{k});
          }
        } else {
          call = "set_schedule";
          subject.set_schedule(rng.below(groups + 1), {});
        }
      } else {
        // A view that no longer matches: the next step or grad_ready must refuse it.
        const std::size_t p = rng.below(sv.size());
        const MixedParam saved = sv[p];
        switch (rng.below(5)) {
          case 0: sv[p].numel += 1; call = "view: more elements"; break;
          case 1: sv[p].dtype = static_cast<DType>((static_cast<int>(sv[p].dtype) + 1) % 3); call = "view: other dtype"; break;
          case 2: sv[p].value = nullptr; sv[p].numel = std::max<std::size_t>(sv[p].numel, 1); call = "view: null"; break;
          case 3: sv[p].grad = static_cast<std::byte*>(sv[p].grad) + 1; call = "view: misaligned gradient"; break;
          default: {
            // Another parameter's storage, in the same place (a pointer that lies about
            // where it lives is beyond what any check can see).
            const MixedParam& other = sv[(p + 1) % sv.size()];
            if (other.device == sv[p].device) {
              sv[p].value = other.value;
              sv[p].numel = other.numel;
              sv[p].dtype = other.dtype;
            }
            call = "view: aliased";
            break;
          }
        }
        mirror = false;
        const bool as_step = rng.below(2) == 0;
        call += as_step ? ", then step" : ", then grad_ready";
        bool refused = false;
        try {
          if (as_step) subject.step();
          else subject.grad_ready(p);
        } catch (const std::invalid_argument&) {
          refused = true;
        }
        sv[p] = saved;
        // Some of these stay valid (an aliased view of 0 elements): then the step
        // really ran, and the reference runs it too. A refused call is checked below.
        if (!refused && as_step) reference.step();
        threw = refused;
      }
    } catch (const std::invalid_argument&) {
      threw = true;
    }
    if (verbose) fmt::print("seed {} call {}: {}{}\n", seed, n, call, threw ? " (refused)" : "");
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (seconds > 5) fail(fmt::format("took {:.1f} s", seconds));
    ++(threw ? refused_calls : accepted_calls);
    if (threw) {
      if (!test::same_bits(snapshot(subject, sm, amsgrad), before)) fail("a refused call changed the optimizer");
      continue;
    }
    if (stepped && allocated != 0) fail(fmt::format("step() allocated {} times", allocated));
    if (mirror && on_reference) {
      try {
        on_reference(reference);
      } catch (const std::exception& e) {
        fail(std::string("the reference refused what the subject accepted: ") + e.what());
      }
    }
    if (!test::same_bits(snapshot(subject, sm, amsgrad), snapshot(reference, rm, amsgrad)))
      fail("the subject and the reference differ");
  }
}

}  // namespace

TEST_CASE("API fuzz: the CPU backend and the emulated device against a reference, call by call") {
  const std::uint64_t first = env("DOS_FUZZ_FIRST_SEED", 1), seeds = env("DOS_FUZZ_SEEDS", 1500);
  for (std::uint64_t s = first; s < first + seeds; ++s) {
    fuzz_one<CpuBackend>(s);
    fuzz_one<EmulatedDeviceBackend>(s);
  }
  CHECK(refused_calls > 0);
  CHECK(accepted_calls > refused_calls);
}
