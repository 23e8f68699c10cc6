// Hyperparameters, validation and the per-step coefficients; the scalar step against
// the textbook formula in double precision.

#include "support/inputs.hpp"

#include <doctest/doctest.h>
#include <dos/cpu/isa/scalar.hpp>
#include <dos/optim/adam.hpp>

#include <cmath>
#include <string>

TEST_CASE("defaults are torch's") {
  const dos::Adam a;
  const dos::AdamW w;
  CHECK(a.lr == 1e-3);
  CHECK(a.beta1 == 0.9);
  CHECK(a.beta2 == 0.999);
  CHECK(a.eps == 1e-8);
  CHECK(a.weight_decay == 0.0);
  CHECK(w.weight_decay == 1e-2);
  CHECK_FALSE(a.amsgrad);
  CHECK_FALSE(a.maximize);
  CHECK_FALSE(dos::AdamConfig(a).decoupled_weight_decay);
  CHECK(dos::AdamConfig(w).decoupled_weight_decay);
}

TEST_CASE("invalid hyperparameters are rejected with the field and value named") {
  const auto message = [](dos::AdamConfig c) {
    try {
      dos::validate(c, 3);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  dos::AdamW ok;
  CHECK(message(ok) == "accepted");
  CHECK(message(dos::AdamW{.lr = -1}).find("dos: parameter group 3: lr must be finite and >= 0, got -1") != std::string::npos);
  CHECK(message(dos::AdamW{.lr = NAN}).find("lr") != std::string::npos);
  CHECK(message(dos::AdamW{.beta1 = 1.0}).find("beta1 must be in [0, 1), got 1") != std::string::npos);
  CHECK(message(dos::AdamW{.beta1 = -0.1}).find("beta1") != std::string::npos);
  CHECK(message(dos::AdamW{.beta2 = 1.5}).find("beta2 must be in [0, 1), got 1.5") != std::string::npos);
  CHECK(message(dos::AdamW{.eps = 0}).find("eps must be finite and > 0, got 0") != std::string::npos);
  CHECK(message(dos::AdamW{.eps = -1e-8}).find("eps") != std::string::npos);
  CHECK(message(dos::AdamW{.weight_decay = -0.1}).find("weight_decay must be finite and >= 0") != std::string::npos);
  CHECK(message(dos::AdamW{.lr = 10, .weight_decay = 1}).find("lr * weight_decay") != std::string::npos);
  CHECK(message(dos::Adam{.lr = 10, .weight_decay = 1}) == "accepted");  // L2 has no such limit
  CHECK(message(dos::AdamW{.beta1 = 0, .beta2 = 0}) == "accepted");
}

TEST_CASE("coefficients follow the bias corrections of step t") {
  const dos::AdamConfig c = dos::AdamW{.lr = 0.01, .beta1 = 0.8, .beta2 = 0.9, .weight_decay = 0.5};
  for (std::int64_t t : {1, 2, 10, 1000}) {
    const auto k = dos::coefficients(c, t);
    CHECK(k.neg_step_size == static_cast<float>(-0.01 / (1 - std::pow(0.8, double(t)))));
    CHECK(k.inv_sqrt_bias_correction2 == static_cast<float>(1 / std::sqrt(1 - std::pow(0.9, double(t)))));
    CHECK(k.decay == static_cast<float>(1 - 0.01 * 0.5));
    CHECK(k.l2 == 0.0f);
    CHECK(k.grad_sign == 1.0f);
  }
  const auto l2 = dos::coefficients(dos::Adam{.weight_decay = 0.25, .maximize = true}, 1);
  CHECK(l2.l2 == 0.25f);
  CHECK(l2.decay == 1.0f);
  CHECK(l2.grad_sign == -1.0f);
}

TEST_CASE("the scalar step agrees with the formula in double precision") {
  dos::test::Rng rng(3);
  for (int trial = 0; trial < 2000; ++trial) {
    const bool decoupled = trial % 2 == 0, amsgrad = trial % 3 == 0, maximize = trial % 5 == 0;
    dos::AdamConfig c = dos::Adam{.lr = 1e-3, .weight_decay = 0.1, .amsgrad = amsgrad, .maximize = maximize};
    c.decoupled_weight_decay = decoupled;
    const std::int64_t t = 1 + static_cast<std::int64_t>(rng.below(50));
    float p = rng.uniform(-2, 2), g = rng.uniform(-1, 1), m = rng.uniform(-0.1f, 0.1f), v = rng.uniform(0, 0.01f);
    float vmax = v + rng.uniform(0, 0.01f);
    double pd = p, gd = maximize ? -double(g) : g, md = m, vd = v, vmaxd = vmax;
    if (!decoupled) gd += 0.1 * pd;
    if (decoupled) pd *= 1 - 1e-3 * 0.1;
    md = 0.9 * md + 0.1 * gd;
    vd = 0.999 * vd + 0.001 * gd * gd;
    const double vhat = amsgrad ? (vmaxd = std::max(vmaxd, vd)) : vd;
    const double bc1 = 1 - std::pow(0.9, double(t)), bc2 = 1 - std::pow(0.999, double(t));
    pd -= 1e-3 / bc1 * md / (std::sqrt(vhat) / std::sqrt(bc2) + 1e-8);

    const auto k = dos::coefficients(c, t);
    if (amsgrad)
      dos::cpu::isa::scalar::adam_step<true>(p, g, m, v, vmax, k);
    else
      dos::cpu::isa::scalar::adam_step<false>(p, g, m, v, vmax, k);
    CHECK(p == doctest::Approx(pd).epsilon(1e-6));
    CHECK(m == doctest::Approx(md).epsilon(1e-5));
    CHECK(v == doctest::Approx(vd).epsilon(1e-5));
  }
}

TEST_CASE("max_nonneg propagates NaN like torch.maximum") {
  using dos::cpu::isa::scalar::max_nonneg;
  CHECK(max_nonneg(1.0f, 2.0f) == 2.0f);
  CHECK(max_nonneg(3.0f, 2.0f) == 3.0f);
  CHECK(std::isnan(max_nonneg(NAN, 2.0f)));
  CHECK(std::isnan(max_nonneg(2.0f, NAN)));
  CHECK(max_nonneg(INFINITY, 2.0f) == INFINITY);
  CHECK(max_nonneg(0.0f, 1e-45f) == 1e-45f);
}
