// dos in a libtorch training loop, against torch::optim::AdamW: 200 steps with
// global-norm clipping, weight-decay groups and a warmup schedule; gradient
// accumulation; an overflowing step under dynamic loss scaling, against GradScaler's
// rules; and the same bits on the all-CPU and the emulated-device backends.

#include "tiny_model.hpp"

#include <doctest/doctest.h>
#include <dos/adapters/torch.hpp>
#include <dos/backend/emulated_device.hpp>

#include <cmath>
#include <cstring>
#include <memory>
#include <limits>
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
    (loss * opt->engine().loss_scale()).backward();
    if (s == overflow_at) poison(m);
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

TEST_CASE("bad input: an undefined gradient and an unsupported dtype are named") {
  auto p = torch::zeros({4}, torch::requires_grad());
  std::vector<at::Tensor> params{p};
  TorchOptimizer<> opt(params, AdamW{});
  CHECK_THROWS_WITH_AS(opt.step(), "dos: parameter 0: gradient has 0 elements, but the value has 4",
                       std::invalid_argument);
  auto d = torch::zeros({4}, torch::TensorOptions().dtype(torch::kFloat64).requires_grad(true));
  std::vector<at::Tensor> doubles{d};
  CHECK_THROWS_WITH_AS(TorchOptimizer<>(doubles, AdamW{}),
                       "dos: a torch tensor of type Double cannot be optimised (float32, bfloat16 and float16 can)",
                       std::invalid_argument);
}
