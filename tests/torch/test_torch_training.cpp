// dos in a libtorch training loop, against torch::optim::AdamW: 200 steps with
// global-norm clipping, weight-decay groups and a warmup schedule; gradient
// accumulation; an overflowing step under dynamic loss scaling, against GradScaler's
// rules; and the same bits on the all-CPU and the emulated-device backends.

#include "tiny_model.hpp"

#include <doctest/doctest.h>
#include <dos/adapters/torch.hpp>
#include <dos/backend/emulated_device.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <limits>
#include <optional>
#include <vector>

using namespace dos;
using test::TinyLm;

namespace {

constexpr int kSteps = 200;
constexpr double kPeak = 3e-3, kWeightDecay = 0.1, kMaxNorm = 0.5;

double warmup(std::int64_t i) { return kPeak * std::min<double>(1.0, static_cast<double>(i + 1) / 20.0); }

Options dos_options() {
  Options o{.subgroup_elements = 1000, .threads = 2};
  o.max_grad_norm = kMaxNorm;
  o.interleave.policy = FixedStride{2};
  o.interleave.profile = HardwareProfile{.cpu_rate = 1e9, .device_rate = 1e10, .h2d_bandwidth = 1e10,
                                         .d2h_bandwidth = 1e10};
  o.interleave.validate_plans = true;
  return o;
}

template <class Backend>
std::unique_ptr<TorchOptimizer<Backend>> make_dos(TinyLm& m, Options o = dos_options()) {
  auto [decay, no_decay] = test::decay_groups(m);
  std::vector<ParamGroup<at::Tensor>> groups{{decay, AdamW{.lr = kPeak, .weight_decay = kWeightDecay}},
                                             {no_decay, AdamW{.lr = kPeak, .weight_decay = 0.0}}};
  auto opt = std::make_unique<TorchOptimizer<Backend>>(std::move(groups), o);
  opt->engine().set_schedule(0, warmup);
  opt->engine().set_schedule(1, warmup);
  return opt;
}

torch::optim::AdamW make_torch(TinyLm& m) {
  auto [decay, no_decay] = test::decay_groups(m);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(
                                 torch::optim::AdamWOptions(kPeak).weight_decay(kWeightDecay)));
  groups.emplace_back(no_decay,
                      std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(kPeak).weight_decay(0.0)));
  return torch::optim::AdamW(std::move(groups), torch::optim::AdamWOptions(kPeak));
}

void set_lr(torch::optim::AdamW& opt, double lr) {
  for (auto& g : opt.param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
}

std::vector<std::uint8_t> weights(TinyLm& m) {
  std::vector<std::uint8_t> out;
  for (auto& p : m->parameters()) {
    const auto* b = static_cast<const std::uint8_t*>(p.data_ptr());
    out.insert(out.end(), b, b + p.numel() * 4);
  }
  return out;
}
bool same(const std::vector<std::uint8_t>& a, const std::vector<std::uint8_t>& b) { return a == b; }

bool close(double a, double b, double rel) { return std::abs(a - b) <= rel * std::abs(a); }

// dos's run of the recipe; the losses it saw, step by step.
template <class Backend>
std::vector<double> train_dos(TinyLm& m, int steps) {
  auto opt = make_dos<Backend>(m);
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    opt->zero_grad();
    auto loss = test::loss_of(m, test::batch(s, 16));
    loss.backward();
    losses.push_back(loss.item<double>());
    const StepReport r = opt->step();
    REQUIRE(r.applied);
  }
  return losses;
}

}  // namespace

TEST_CASE("torch equivalence: 200 steps with clipping, decay groups and warmup match torch::optim::AdamW") {
  torch::set_num_threads(1);
  TinyLm a = test::make_model(), b = test::make_model();
  REQUIRE(same(weights(a), weights(b)));
  auto reference = make_torch(a);
  auto opt = make_dos<CpuBackend>(b);
  int clipped = 0;
  double worst = 0;
  for (int s = 0; s < kSteps; ++s) {
    const auto data = test::batch(s, 16);
    reference.zero_grad();
    auto la = test::loss_of(a, data);
    la.backward();
    torch::nn::utils::clip_grad_norm_(a->parameters(), kMaxNorm);
    set_lr(reference, warmup(s));
    reference.step();

    opt->zero_grad();
    auto lb = test::loss_of(b, data);
    lb.backward();
    const StepReport r = opt->step();
    REQUIRE(r.applied);
    clipped += r.clip_coef < 1 ? 1 : 0;
    const double x = la.item<double>(), y = lb.item<double>();
    worst = std::max(worst, std::abs(x - y) / std::abs(x));
    INFO("step " << s << ": torch " << x << ", dos " << y);
    REQUIRE(close(x, y, 1e-4));
  }
  MESSAGE("worst relative loss difference over " << kSteps << " steps: " << worst << "; clipped steps: " << clipped);
  CHECK(clipped > 0);                                     // clipping was exercised
  CHECK(test::loss_of(b, test::batch(0, 16)).item<double>() < 3.0);  // and it learned (ln 48 = 3.87)
}

TEST_CASE("torch: the all-CPU and emulated-device backends give the same bits") {
  torch::set_num_threads(1);
  TinyLm a = test::make_model(), b = test::make_model();
  const auto la = train_dos<CpuBackend>(a, 60);
  const auto lb = train_dos<EmulatedDeviceBackend>(b, 60);
  CHECK(la == lb);
  CHECK(same(weights(a), weights(b)));
}

namespace {
// Four micro-batches of 4 rows, each loss scaled by 1/4, or one batch of 16.
template <class Backend>
void train_accumulating(TinyLm& m, int steps, bool micro) {
  Options o = dos_options();
  auto opt = make_dos<Backend>(m, o);
  for (int s = 0; s < steps; ++s) {
    opt->zero_grad();
    if (micro) {
      for (int k = 0; k < 4; ++k) {
        opt->zero_grad();
        (test::loss_of(m, test::batch(s, 4, 4 * k)) / 4).backward();
        opt->engine().accumulate();
      }
      REQUIRE(opt->engine().micro_batches() == 4);
    } else {
      test::loss_of(m, test::batch(s, 16)).backward();
    }
    REQUIRE(opt->step().applied);
    REQUIRE(opt->engine().micro_batches() == 0);
  }
}
}  // namespace

TEST_CASE("accumulation: four micro-batches equal one big batch") {
  torch::set_num_threads(1);
  TinyLm big = test::make_model(), small = test::make_model(), small_dev = test::make_model();
  train_accumulating<CpuBackend>(big, 20, false);
  train_accumulating<CpuBackend>(small, 20, true);
  train_accumulating<EmulatedDeviceBackend>(small_dev, 20, true);
  const auto pb = big->parameters(), ps = small->parameters();
  for (std::size_t i = 0; i < pb.size(); ++i) {
    const double diff = (pb[i] - ps[i]).abs().max().item<double>();
    const double scale = pb[i].abs().max().item<double>();
    CAPTURE(i);
    CHECK(diff <= 1e-5 * std::max(scale, 1.0));  // only the summation order differs
  }
  CHECK(same(weights(small), weights(small_dev)));
}

namespace {
struct GradScalerRules {  // torch.cuda.amp.GradScaler's update, for the reference
  double scale = 1024, growth = 2, backoff = 0.5;
  int interval = 3, tracker = 0;
  void update(bool found_inf) {
    if (found_inf) {
      scale *= backoff;
      tracker = 0;
    } else if (++tracker == interval) {
      scale *= growth;
      tracker = 0;
    }
  }
};

void poison(TinyLm& m) {
  auto g = m->fc1->weight.mutable_grad();
  g.view({-1})[5] = std::numeric_limits<float>::infinity();
}

template <class Backend>
std::vector<double> train_scaled(TinyLm& m, int steps, int overflow_at, std::vector<double>* scales) {
  Options o = dos_options();
  o.loss_scaling = LossScaling{.init_scale = 1024, .growth_factor = 2, .backoff_factor = 0.5, .growth_interval = 3};
  auto opt = make_dos<Backend>(m, o);
  std::vector<double> losses;
  int skipped = 0;
  for (int s = 0; s < steps; ++s) {
    opt->zero_grad();
    auto loss = test::loss_of(m, test::batch(s, 16));
    // The inf arises inside backward (a tensor hook, before the gradient is final), so
    // the optimizer's own backward hooks see it, as they would a real overflow.
    const auto poisoned = s == overflow_at ? std::optional<unsigned>(m->fc1->weight.register_hook([](at::Tensor g) {
      g = g.clone();
      g.view({-1})[5] = std::numeric_limits<float>::infinity();
      return g;
    })) : std::nullopt;
    (loss * opt->engine().loss_scale()).backward();
    if (poisoned) m->fc1->weight.remove_hook(*poisoned);
    if (scales != nullptr) scales->push_back(opt->engine().loss_scale());
    const auto params_before = weights(m);
    const std::int64_t count = opt->engine().step_count();
    const StepReport r = opt->step();
    if (s == overflow_at) {
      REQUIRE(r.overflow);
      REQUIRE_FALSE(r.applied);
      REQUIRE(same(weights(m), params_before));        // nothing changed
      REQUIRE(opt->engine().step_count() == count);  // not even the step count
      ++skipped;
    } else {
      REQUIRE(r.applied);
    }
    losses.push_back(loss.item<double>());
  }
  REQUIRE(skipped == (overflow_at < steps ? 1 : 0));
  return losses;
}
}  // namespace

TEST_CASE("overflow: an inf gradient skips exactly one step, then training continues as GradScaler would") {
  torch::set_num_threads(1);
  constexpr int steps = 30, overflow_at = 7;
  TinyLm a = test::make_model(), b = test::make_model(), c = test::make_model();
  // The reference: torch AdamW with GradScaler's rules written out.
  auto reference = make_torch(a);
  GradScalerRules rules;
  std::vector<double> reference_losses, reference_scales;
  int schedule_index = 0;
  for (int s = 0; s < steps; ++s) {
    reference.zero_grad();
    auto loss = test::loss_of(a, test::batch(s, 16));
    (loss * rules.scale).backward();
    if (s == overflow_at) poison(a);
    reference_scales.push_back(rules.scale);
    bool found_inf = false;
    const float inv = static_cast<float>(1.0 / rules.scale);
    for (auto& p : a->parameters()) {
      p.mutable_grad().mul_(inv);
      found_inf |= !torch::isfinite(p.grad()).all().item<bool>();
    }
    set_lr(reference, warmup(schedule_index++));  // a scheduler steps every iteration
    if (!found_inf) {
      torch::nn::utils::clip_grad_norm_(a->parameters(), kMaxNorm);
      reference.step();
    }
    rules.update(found_inf);
    reference_losses.push_back(loss.item<double>());
  }
  std::vector<double> scales;
  const auto losses = train_scaled<CpuBackend>(b, steps, overflow_at, &scales);
  CHECK(scales == reference_scales);
  for (int s = 0; s < steps; ++s) {
    INFO("step " << s);
    CHECK(close(reference_losses[s], losses[s], 1e-4));
  }
  CHECK(train_scaled<EmulatedDeviceBackend>(c, steps, overflow_at, nullptr) == losses);
  CHECK(same(weights(b), weights(c)));
}

TEST_CASE("an undefined gradient skips its parameter; an unsupported dtype is named") {
  auto p = torch::ones({4}, torch::requires_grad());
  std::vector<at::Tensor> params{p};
  TorchOptimizer<> opt(params, AdamW{});
  CHECK(opt.step().applied);  // torch's None: nothing to do, as torch's AdamW does nothing
  CHECK(torch::equal(p, torch::ones({4})));
  CHECK(opt.engine().step_count(0) == 0);
  auto d = torch::zeros({4}, torch::TensorOptions().dtype(torch::kFloat64).requires_grad(true));
  std::vector<at::Tensor> doubles{d};
  CHECK_THROWS_WITH_AS(TorchOptimizer<>(doubles, AdamW{}),
                       "dos: a torch tensor of type Double cannot be optimised (float32, bfloat16 and float16 can)",
                       std::invalid_argument);
}

namespace {

// A small LCG: the same random choices on both sides.
struct Lcg {
  std::uint64_t s;
  bool chance(unsigned percent) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return (s >> 33) % 100 < percent;
  }
};

// Six parameters, each used by the loss only at random steps (an unused branch: its
// gradient stays undefined), and a frozen one; `torch` and `dos` get the same draws.
struct Branches {
  std::vector<at::Tensor> params;
  at::Tensor frozen;
  explicit Branches(std::uint64_t seed) {
    torch::manual_seed(seed);
    for (int i = 0; i < 6; ++i) params.push_back(torch::randn({7 + 5 * i}).requires_grad_());
    frozen = torch::randn({3});  // requires_grad false
  }
  Branches clone() const {
    Branches b(0);
    for (std::size_t i = 0; i < params.size(); ++i) b.params[i] = params[i].detach().clone().requires_grad_();
    b.frozen = frozen.clone();
    return b;
  }
  std::vector<at::Tensor> all() const {
    std::vector<at::Tensor> out = params;
    out.push_back(frozen);
    return out;
  }
  at::Tensor loss(int step, const std::vector<bool>& used) const {
    at::Tensor l = torch::zeros({});
    for (std::size_t i = 0; i < params.size(); ++i)
      if (used[i]) {
        const at::Tensor target = torch::sin(torch::arange(params[i].numel(), torch::kFloat) * (0.3 + 0.1 * step));
        l = l + ((params[i] - target).pow(2) * (1.0 + static_cast<double>(i))).sum() + (params[i] * frozen.sum()).sum();
      }
    return l;
  }
};

template <class TorchOpt, class TorchOptions, class State>
void skipping_trajectory(bool decoupled) {
  CAPTURE(decoupled);
  const Branches start(11);
  Branches a = start.clone(), b = start.clone();
  TorchOpt reference(a.all(), TorchOptions(1e-2).weight_decay(0.05));
  const AdamConfig hyper = decoupled ? AdamConfig(AdamW{.lr = 1e-2, .weight_decay = 0.05})
                                     : AdamConfig(Adam{.lr = 1e-2, .weight_decay = 0.05});
  TorchOptimizer<> opt(b.all(), hyper);
  Lcg rng{5};
  std::int64_t skipped = 0;
  for (int s = 0; s < 40; ++s) {
    std::vector<bool> used(start.params.size());
    for (std::size_t i = 0; i < used.size(); ++i) used[i] = rng.chance(60);
    for (auto& p : a.params) p.mutable_grad().reset();  // libtorch 1.13's zero_grad() zeroes; torch's default drops
    opt.zero_grad();
    if (std::any_of(used.begin(), used.end(), [](bool u) { return u; })) {
      a.loss(s, used).backward();
      b.loss(s, used).backward();
    }
    for (std::size_t i = 0; i < used.size(); ++i) {
      REQUIRE(b.params[i].grad().defined() == used[i]);
      skipped += used[i] ? 0 : 1;
    }
    reference.step();
    REQUIRE(opt.step().applied);
    for (std::size_t i = 0; i < used.size(); ++i) {
      INFO("step " << s << ", parameter " << i);
      REQUIRE(torch::allclose(a.params[i], b.params[i], 1e-5, 1e-6));
      const auto it = reference.state().find(c10::guts::to_string(a.params[i].unsafeGetTensorImpl()));
      const std::int64_t torch_step = it == reference.state().end() ? 0 : static_cast<State&>(*it->second).step();
      REQUIRE(opt.engine().step_count(i) == torch_step);
    }
  }
  CHECK(skipped > 20);
  CHECK(torch::equal(b.frozen, start.frozen));
  CHECK(opt.engine().step_count(start.params.size()) == 0);  // frozen: never stepped, as in torch
}

}  // namespace

TEST_CASE("parameters whose gradient is undefined at random steps: torch::optim::AdamW's and Adam's trajectories") {
  torch::set_num_threads(1);
  skipping_trajectory<torch::optim::AdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState>(true);
  skipping_trajectory<torch::optim::Adam, torch::optim::AdamOptions, torch::optim::AdamParamState>(false);
}

TEST_CASE("backward hooks: statistics taken during backward are those step() takes; once per parameter per pass") {
  torch::set_num_threads(1);
  TinyLm a = test::make_model(), b = test::make_model();
  auto with = make_dos<CpuBackend>(a), without = make_dos<CpuBackend>(b);
  without->remove_hooks();
  const std::int64_t params = static_cast<std::int64_t>(a->parameters().size());
  for (int s = 0; s < 20; ++s) {
    with->zero_grad();
    without->zero_grad();
    const std::int64_t before = with->hooks_fired();
    test::loss_of(a, test::batch(s, 16)).backward();
    test::loss_of(b, test::batch(s, 16)).backward();
    CHECK(with->hooks_fired() - before == params);  // each parameter's gradient, once
    const StepReport x = with->step(), y = without->step();
    REQUIRE(x.applied);
    CHECK(x.grad_norm == y.grad_norm);  // the same bits
    CHECK(same(weights(a), weights(b)));
  }
  CHECK(without->hooks_fired() == 0);

  // A parameter used twice in one graph: its accumulator runs once, so does the hook.
  auto p = torch::ones({5}, torch::requires_grad());
  auto unused = torch::ones({3}, torch::requires_grad());
  {
    TorchOptimizer<> opt(std::vector<at::Tensor>{p, unused}, AdamW{});
    opt.zero_grad();
    ((p * 2).sum() + (p * p).sum()).backward();
    CHECK(opt.hooks_fired() == 1);
    CHECK(opt.step().applied);
    CHECK(opt.engine().step_count(0) == 1);
    CHECK(opt.engine().step_count(1) == 0);
  }
  // The optimizer is gone and its hooks with it: backward still runs.
  p.mutable_grad().reset();
  (p * 3).sum().backward();
  CHECK(p.grad().defined());
}
