// Parameters without a gradient (ConstTensorView::absent(), torch's `.grad is None`)
// and the per-parameter step counts of state/step_counts.hpp:
//  - with a random subset absent at every step, the CPU optimizer equals a reference
//    built from the scalar adam_step per parameter, with per-parameter counts, bit for
//    bit (fp32, bf16, fp16 values; two groups, one amsgrad; clipping; loss scaling);
//  - skipped parameters keep every bit of value and state;
//  - the norm is the norm over the present gradients (bit for bit that of zeros there);
//  - the emulated device equals the CPU optimizer under every policy;
//  - accumulate(), grad_ready(), and the step-count API with its validation.

#include "support/backend_compare.hpp"
#include "support/mixed_model.hpp"

#include <doctest/doctest.h>
#include <dos/cpu/isa/scalar.hpp>
#include <dos/optimizer.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace {

using namespace dos;
using test::MixedModel;
using test::TensorSpec;

// One parameter's state as the reference keeps it.
struct RefParam {
  std::vector<float> master, m, v, vmax;
  std::int64_t count = 0;
};

// Every tensor on the host, of every type, some split across subgroups.
std::vector<TensorSpec> host_specs(std::uint64_t seed) {
  auto specs = test::any_sizes(9, 150, seed);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    specs[i].device = Device::host;
    specs[i].dtype = static_cast<DType>(i % 3);
  }
  return specs;
}

struct Setting {
  double max_grad_norm = 0;
  bool loss_scaling = false;
};

void check_against_reference(std::uint64_t seed, const Setting& setting) {
  CAPTURE(seed);
  CAPTURE(setting.max_grad_norm);
  CAPTURE(setting.loss_scaling);
  const auto specs = host_specs(seed);
  MixedModel model(specs, test::two_groups, true), zeros(specs, test::two_groups, true);
  Options o{.subgroup_elements = 64, .threads = 2};
  o.max_grad_norm = setting.max_grad_norm;
  if (setting.loss_scaling) o.loss_scaling = LossScaling{.init_scale = 1024, .growth_interval = 5};
  // `zeros` gets zero gradients where `model` has none: the same norm, bit for bit.
  Options zo = o;
  zo.max_grad_norm = setting.max_grad_norm > 0 ? setting.max_grad_norm : 1e30;
  CpuOptimizer opt(model.groups(), o), with_zeros(zeros.groups(), zo);
  const auto order = model.optimizer_order();
  std::vector<RefParam> ref(order.size());
  for (std::size_t p = 0; p < order.size(); ++p) {
    const TensorSpec& s = specs[order[p]];
    ref[p].m.assign(s.numel, 0);
    ref[p].v.assign(s.numel, 0);
    ref[p].vmax.assign(s.numel, 0);
    for (std::size_t i = 0; i < s.numel; ++i) ref[p].master.push_back(test::load_as(model.value(order[p]), s.dtype, i));
  }
  test::Rng rng(seed * 31 + 7);
  int skipped_somewhere = 0;
  for (int t = 1; t <= 32; ++t) {
    INFO("step " << t);
    model.set_gradients(t);
    zeros.set_gradients(t);
    std::vector<bool> absent(specs.size());
    double present_squares = 0;
    for (std::size_t i = 0; i < specs.size(); ++i) {
      absent[i] = rng.below(3) == 0;
      model.set_absent(i, absent[i]);
      skipped_somewhere += absent[i] ? 1 : 0;
      if (absent[i]) std::memset(zeros.grad(i), 0, specs[i].numel * dtype_size(specs[i].dtype));
      else
        for (std::size_t e = 0; e < specs[i].numel; ++e) {
          const double g = test::load_as(model.grad(i), specs[i].dtype, e);
          present_squares += g * g;
        }
    }
    const StepReport r = opt.step();
    const StepReport rz = with_zeros.step();
    REQUIRE(r.applied);
    if (setting.max_grad_norm > 0 || setting.loss_scaling) {
      CHECK(r.grad_norm == rz.grad_norm);  // zeros add nothing: absent gradients are left out
      CHECK(r.grad_norm == doctest::Approx(std::sqrt(present_squares) / r.loss_scale).epsilon(1e-6));
    }
    const float multiplier = static_cast<float>(1.0 / r.loss_scale) * static_cast<float>(r.clip_coef);
    std::size_t elements = 0;
    for (std::size_t p = 0; p < order.size(); ++p) {
      const std::size_t tensor = order[p];
      const TensorSpec& s = specs[tensor];
      const AdamConfig& hyper = test::two_groups[s.group];
      RefParam& q = ref[p];
      if (!absent[tensor]) {
        AdamCoefficients<float> k = coefficients(hyper, ++q.count);
        k.grad_sign *= multiplier;
        for (std::size_t e = 0; e < s.numel; ++e) {
          const float g = test::load_as(model.grad(tensor), s.dtype, e);
          if (hyper.amsgrad) cpu::isa::scalar::adam_step<true>(q.master[e], g, q.m[e], q.v[e], q.vmax[e], k);
          else cpu::isa::scalar::adam_step<false>(q.master[e], g, q.m[e], q.v[e], q.vmax[e], k);
        }
        elements += s.numel;
      }
      CHECK(opt.step_count(p) == q.count);
      std::vector<float> got(s.numel);
      opt.read_state(p, StateKind::master, got);
      CHECK(test::same_bits(got, q.master));
      opt.read_state(p, StateKind::exp_avg, got);
      CHECK(test::same_bits(got, q.m));
      opt.read_state(p, StateKind::exp_avg_sq, got);
      CHECK(test::same_bits(got, q.v));
      if (hyper.amsgrad) {
        opt.read_state(p, StateKind::max_exp_avg_sq, got);
        CHECK(test::same_bits(got, q.vmax));
      }
      for (std::size_t e = 0; e < s.numel; ++e) {
        std::byte expected[4], actual[4];
        test::store_as(expected, s.dtype, 0, q.master[e]);
        std::memcpy(actual, static_cast<std::byte*>(model.value(tensor)) + e * dtype_size(s.dtype), dtype_size(s.dtype));
        REQUIRE(std::memcmp(expected, actual, dtype_size(s.dtype)) == 0);
      }
    }
    CHECK(r.elements == elements);
    CHECK(opt.step_count() == t);
  }
  CHECK(skipped_somewhere > 0);
}

}  // namespace

TEST_CASE("random absent gradients: the CPU optimizer is the scalar reference with per-parameter counts") {
  for (std::uint64_t seed = 1; seed <= 3; ++seed)
    for (const Setting& s : {Setting{}, Setting{.max_grad_norm = 0.5}, Setting{.loss_scaling = true},
                             Setting{.max_grad_norm = 2, .loss_scaling = true}})
      check_against_reference(seed, s);
}

TEST_CASE("a parameter without a gradient keeps every bit of its value and state") {
  const auto specs = host_specs(11);
  MixedModel model(specs, test::two_groups, true);
  CpuOptimizer opt(model.groups(), {.subgroup_elements = 64, .threads = 2, .max_grad_norm = 1.0});
  model.set_gradients(1);
  opt.step();
  for (int t = 2; t <= 6; ++t) {
    model.set_gradients(t);
    model.set_absent(2, true);
    const auto order = model.optimizer_order();
    std::size_t p2 = 0;
    while (order[p2] != 2) ++p2;
    std::vector<float> before(specs[2].numel), after(specs[2].numel);
    std::vector<std::vector<float>> state_before;
    for (auto kind : {StateKind::master, StateKind::exp_avg, StateKind::exp_avg_sq}) {
      opt.read_state(p2, kind, before);
      state_before.push_back(before);
    }
    const auto value_before = model.value_bytes();
    CHECK(opt.step().applied);
    std::size_t k = 0;
    for (auto kind : {StateKind::master, StateKind::exp_avg, StateKind::exp_avg_sq}) {
      opt.read_state(p2, kind, after);
      CHECK(test::same_bits(after, state_before[k++]));
    }
    CHECK(opt.step_count(p2) == 1);
    CHECK(model.value_bytes() != value_before);  // the others moved
  }
}

TEST_CASE("random absent gradients: the emulated device equals the CPU, every policy and stride, resident ones too") {
  for (std::uint64_t seed = 1; seed <= 2; ++seed)
    for (const AnyPolicy& policy : test::every_policy()) {
      CAPTURE(seed);
      CAPTURE(policy.name());
      test::Drive d;
      d.absent_percent = 35;
      d.absent_seed = seed;
      test::compare_trajectories(test::one_per_subgroup(6, 256, seed), policy, 256, 0, 30, 6, d);
      d.max_grad_norm = 0.5;
      d.backward_api = true;
      test::compare_trajectories(test::any_sizes(10, 600, seed + 10), policy, 256, 2, 30, 0, d);
      d.loss_scaling = LossScaling{.init_scale = 256, .growth_interval = 4};
      d.overflow_at = 9;
      test::compare_trajectories(test::any_sizes(8, 400, seed + 20), policy, 128, 1, 30, 0, d);
    }
}

TEST_CASE("accumulate(): an absent gradient adds nothing; a parameter absent in every micro-batch is skipped") {
  const std::vector<TensorSpec> specs{{100, DType::f32, Device::host, 0}, {70, DType::bf16, Device::host, 0},
                                      {50, DType::f32, Device::host, 1}};
  MixedModel model(specs, test::two_groups, true), direct(specs, test::two_groups, true);
  const Options o{.subgroup_elements = 64, .threads = 2};
  CpuOptimizer acc(model.groups(), o), ref(direct.groups(), o);
  // Micro-batch 1: tensor 0 absent; micro-batch 2: tensor 0 present. Tensor 2 absent in
  // both. The reference steps from micro-batch 2's gradients: tensor 0's sum is exactly
  // that (0 + g), tensor 2 has none; tensor 1 (a real sum) only advances its count.
  model.set_gradients(1);
  model.set_absent(0, true);
  model.set_absent(2, true);
  acc.accumulate();
  model.set_absent(0, false);
  model.set_gradients(2);
  acc.accumulate();
  direct.set_gradients(2);
  direct.set_absent(2, true);
  acc.step();
  ref.step();
  CHECK(acc.step_count(0) == 1);
  CHECK(acc.step_count(1) == 1);
  CHECK(acc.step_count(2) == 0);
  std::vector<float> a(100), b(100);
  acc.read_state(0, StateKind::master, a);
  ref.read_state(0, StateKind::master, b);
  CHECK(test::same_bits(a, b));
  std::vector<float> a2(50);
  acc.read_state(2, StateKind::exp_avg, a2);
  CHECK(a2 == std::vector<float>(50, 0.0f));
  acc.read_state(2, StateKind::master, a2);
  for (std::size_t i = 0; i < 50; ++i) CHECK(a2[i] == test::initial_param(2, i));
  CHECK(acc.micro_batches() == 0);
}

TEST_CASE("grad_ready() ignores an absent gradient: the norm is the one step() reads") {
  const auto specs = host_specs(5);
  MixedModel a(specs, test::two_groups, true), b(specs, test::two_groups, true);
  const Options o{.subgroup_elements = 64, .threads = 2, .max_grad_norm = 0.25};
  CpuOptimizer hooks(a.groups(), o), plain(b.groups(), o);
  for (int t = 1; t <= 5; ++t) {
    a.set_gradients(t);
    b.set_gradients(t);
    a.set_absent(static_cast<std::size_t>(t) % specs.size(), true);
    b.set_absent(static_cast<std::size_t>(t) % specs.size(), true);
    hooks.begin_backward();
    for (std::size_t p = 0; p < hooks.num_params(); ++p) hooks.grad_ready(p);
    const StepReport x = hooks.step(), y = plain.step();
    CHECK(x.grad_norm == y.grad_norm);
    CHECK(a.value_bytes() == b.value_bytes());
    a.set_absent(static_cast<std::size_t>(t) % specs.size(), false);
    b.set_absent(static_cast<std::size_t>(t) % specs.size(), false);
  }
}

TEST_CASE("step_count(param) and set_step_count(param, t): validated, per parameter, for resuming") {
  const auto specs = host_specs(3);
  MixedModel model(specs, test::two_groups, true);
  CpuOptimizer opt(model.groups(), {.subgroup_elements = 64, .threads = 2});
  CHECK_THROWS_WITH_AS(opt.step_count(99), doctest::Contains("parameter 99 does not exist"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(opt.set_step_count(99, 1), doctest::Contains("parameter 99 does not exist"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(opt.set_step_count(std::size_t{0}, -1), doctest::Contains("step count must be in"),
                       std::invalid_argument);
  opt.set_step_count(7);
  for (std::size_t p = 0; p < opt.num_params(); ++p) CHECK(opt.step_count(p) == 7);
  opt.set_step_count(std::size_t{1}, 3);
  CHECK(opt.step_count(1) == 3);
  CHECK(opt.step_count() == 7);
  // A parameter's count at the largest value refuses the step, unless it has no gradient.
  constexpr std::int64_t max = std::numeric_limits<std::int64_t>::max();
  opt.set_step_count(std::size_t{0}, max - 1);
  model.set_gradients(1);
  CHECK(opt.step().applied);
  CHECK(opt.step_count(0) == max);
  const auto before = model.value_bytes();
  CHECK_THROWS_WITH_AS(opt.step(), doctest::Contains("parameter 0: its step count is"), std::invalid_argument);
  CHECK(model.value_bytes() == before);
  model.set_absent(model.optimizer_order()[0], true);
  CHECK(opt.step().applied);
  CHECK(opt.step_count(0) == max);
  CHECK(opt.step_count(1) == 5);
}
