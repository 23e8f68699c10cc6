#pragma once
// Runs one mixed-precision model through the all-CPU backend and through a device
// backend, step by step, and requires the same bits everywhere. Shared by the
// emulated-device tests and the GPU tests.

#include "mixed_model.hpp"

#include <doctest/doctest.h>
#include <dos/optimizer.hpp>

#include <cstring>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

namespace dos::test {

// A fixed profile: no calibration, so tests are quick and plans reproducible. Rates
// still refine from measured steps, so automatic plans move between steps.
inline constexpr HardwareProfile test_profile{
    .cpu_rate = 2e8, .device_rate = 2e9, .h2d_bandwidth = 2e9, .d2h_bandwidth = 2e9, .duplex = true,
    .host_bandwidth = 0};

inline const std::vector<AdamConfig> two_groups{AdamW{.lr = 1e-2, .weight_decay = 0.1},
                                         Adam{.lr = 5e-3, .weight_decay = 0.01, .amsgrad = true}};

inline Options device_options(const AnyPolicy& policy, std::size_t subgroup, std::size_t slots = 2) {
  Options o;
  o.subgroup_elements = subgroup;
  o.threads = 2;
  o.interleave.policy = policy;
  o.interleave.staging_slots = slots;
  o.interleave.profile = test_profile;
  o.interleave.validate_plans = true;
  return o;
}

template <class Opt>
std::vector<float> all_state(Opt& opt) {
  std::vector<float> out;
  for (std::size_t p = 0; p < opt.num_params(); ++p) {
    std::vector<float> tmp(opt.param_numel(p));
    for (auto kind : {StateKind::master, StateKind::exp_avg, StateKind::exp_avg_sq}) {
      opt.read_state(p, kind, tmp);
      out.insert(out.end(), tmp.begin(), tmp.end());
    }
  }
  return out;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Runs `steps` steps on the all-CPU backend and on the emulated device, comparing
// every value and every state element after each step. Returns the reports seen.
/// How the device side is driven, beyond the policy.
struct Drive {
  double max_grad_norm = 0;    ///< clipping on both sides
  bool backward_api = false;   ///< begin_backward() and grad_ready() (last parameter first)
  std::optional<LossScaling> loss_scaling{};  ///< dynamic loss scaling on both sides
  int overflow_at = 0;  ///< this step, element 0 of the first device tensor's gradient is +inf
  unsigned absent_percent = 0;  ///< each step, each tensor has no gradient with this chance (both sides)
  std::uint64_t absent_seed = 1;
  std::vector<std::pair<int, AnyPolicy>> policies{};  ///< before step t, the device side takes this policy
};

// Element @p i of a gradient, set to @p x where it lies (host or device memory).
template <class Access>
void store_element(void* data, DType t, Device where, std::size_t i, float x) {
  std::byte tmp[4];
  store_as(tmp, t, 0, x);
  void* at = static_cast<std::byte*>(data) + i * dtype_size(t);
  if (where == Device::host) std::memcpy(at, tmp, dtype_size(t));
  else Access::write(at, tmp, dtype_size(t));
}

template <class Backend = EmulatedDeviceBackend, class Access = EmulatedAccess>
std::vector<StepReport> compare_trajectories(const std::vector<TensorSpec>& specs, const AnyPolicy& policy,
                                             std::size_t subgroup, std::size_t budget_slots, int steps,
                                             std::size_t expect_subgroups = 0, Drive drive = {}) {
  BasicMixedModel<Access> host(specs, two_groups, true), device(specs, two_groups);
  Options reference_options{.subgroup_elements = subgroup, .threads = 1};
  reference_options.max_grad_norm = drive.max_grad_norm;
  Options options = device_options(policy, subgroup, 0);
  options.max_grad_norm = drive.max_grad_norm;
  reference_options.loss_scaling = options.loss_scaling = drive.loss_scaling;
  std::size_t dev_param = 0;
  while (dev_param < specs.size() && specs[dev_param].device != Device::device) ++dev_param;
  if (drive.overflow_at != 0) REQUIRE(dev_param < specs.size());
  CpuOptimizer reference(host.groups(), reference_options);
  InterleavedOptimizer<Backend> opt(device.groups(), options);
  if (expect_subgroups != 0) REQUIRE(opt.subgroups().size() == expect_subgroups);
  if (budget_slots != 0) opt.set_staging_budget(budget_slots * opt.staging_slot_bytes());
  std::vector<StepReport> reports;
  Rng absent(drive.absent_seed);
  for (int t = 1; t <= steps; ++t) {
    for (const auto& [at, policy_then] : drive.policies)
      if (at == t) opt.set_policy(policy_then);
    if (drive.backward_api) opt.begin_backward();
    host.set_gradients(t);
    device.set_gradients(t);
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const bool none = absent.below(100) < drive.absent_percent && !(t == drive.overflow_at && i == dev_param);
      host.set_absent(i, none);
      device.set_absent(i, none);
    }
    if (t == drive.overflow_at) {
      const float inf = std::numeric_limits<float>::infinity();
      store_element<Access>(host.grad(dev_param), specs[dev_param].dtype, Device::host, 0, inf);
      store_element<Access>(device.grad(dev_param), specs[dev_param].dtype, Device::device, 0, inf);
    }
    if (drive.backward_api)
      for (std::size_t p = opt.num_params(); p-- > 0;) opt.grad_ready(p);
    if (t == 20) {
      reference.set_lr(0, 3e-3);
      opt.set_lr(0, 3e-3);
    }
    INFO("step " << t);
    const StepReport expected = reference.step();
    reports.push_back(opt.step());
    REQUIRE(reports.back().applied == expected.applied);
    REQUIRE(reports.back().overflow == expected.overflow);
    REQUIRE(reports.back().grad_norm == expected.grad_norm);
    REQUIRE(reports.back().applied == (t != drive.overflow_at));
    REQUIRE(opt.loss_scale() == reference.loss_scale());
    REQUIRE(host.value_bytes() == device.value_bytes());
  }
  CHECK(same_bits(all_state(reference), all_state(opt)));
  for (std::size_t p = 0; p < opt.num_params(); ++p) CHECK(opt.step_count(p) == reference.step_count(p));
  const auto order = device.optimizer_order();
  for (std::size_t p = 0; p < opt.num_params(); ++p)
    if (opt.hyperparameters(specs[order[p]].group).amsgrad) {
      std::vector<float> a(opt.param_numel(p)), b(opt.param_numel(p));
      reference.read_state(p, StateKind::max_exp_avg_sq, a);
      opt.read_state(p, StateKind::max_exp_avg_sq, b);
      CHECK(same_bits(a, b));
    }
  return reports;
}

// Runs @p steps steps on one device optimizer, moves its state with read_state and
// write_state into a second one over a fresh model (another policy), then runs both
// @p steps more: values and state must stay bit-identical.
template <class Backend = EmulatedDeviceBackend, class Access = EmulatedAccess>
void check_state_transfer(const std::vector<TensorSpec>& specs, const AnyPolicy& from, const AnyPolicy& to,
                          std::size_t subgroup, int steps) {
  BasicMixedModel<Access> a(specs, two_groups), b(specs, two_groups);
  InterleavedOptimizer<Backend> first(a.groups(), device_options(from, subgroup));
  for (int t = 1; t <= steps; ++t) {
    a.set_gradients(t);
    first.step();
  }
  InterleavedOptimizer<Backend> second(b.groups(), device_options(to, subgroup));
  const auto order = a.optimizer_order();
  for (std::size_t p = 0; p < first.num_params(); ++p) {
    std::vector<float> tmp(first.param_numel(p));
    for (auto kind : {StateKind::master, StateKind::exp_avg, StateKind::exp_avg_sq}) {
      first.read_state(p, kind, tmp);
      second.write_state(p, kind, tmp);
    }
    if (first.hyperparameters(specs[order[p]].group).amsgrad) {
      first.read_state(p, StateKind::max_exp_avg_sq, tmp);
      second.write_state(p, StateKind::max_exp_avg_sq, tmp);
    }
  }
  second.set_step_count(first.step_count());
  CHECK(a.value_bytes() == b.value_bytes());  // write_state(master) wrote the values too
  for (int t = steps + 1; t <= 2 * steps; ++t) {
    a.set_gradients(t);
    b.set_gradients(t);
    first.step();
    second.step();
  }
  CHECK(a.value_bytes() == b.value_bytes());
  CHECK(same_bits(all_state(first), all_state(second)));
}

inline std::vector<AnyPolicy> every_policy() {
  std::vector<AnyPolicy> out{AllCpu{}, StaticFraction{0.3}, AutomaticStride{}, Balanced{}, ResidentThenStride{}};
  for (std::uint32_t k = 1; k <= 8; ++k) out.push_back(FixedStride{k});
  return out;
}

}  // namespace dos::test
