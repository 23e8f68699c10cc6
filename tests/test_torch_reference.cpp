// Trajectories against torch.optim.Adam / AdamW (1.13), at torch.testing's float32
// tolerance, for every scenario, parameter type, CPU kernel family and a range of
// subgroup sizes and thread counts.

#include "support/trajectory.hpp"

#include <doctest/doctest.h>
#include <dos/optimizer.hpp>

#include <cmath>
#include <string>

namespace {

using namespace dos;
using namespace dos::test;

constexpr double rtol = 1.3e-6, atol = 1e-5;

const std::vector<Scenario>& scenarios() {
  static const std::vector<Scenario> s = load_scenarios(DOS_REFERENCE_DIR);
  return s;
}

// torch.testing's float32 tolerance; `relative_only` adds a purely relative bound for
// quantities so small (second moments of the 1/64-scaled tensors, ~2e-6) that atol
// alone could never fail.
void check_close(const std::vector<float>& got, const float* want, const std::string& what,
                 bool relative_only = false) {
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double d = std::abs(double(got[i]) - double(want[i]));
    const double bound = relative_only ? 1e-5 * std::abs(double(want[i])) : atol + rtol * std::abs(double(want[i]));
    if (!(d <= bound)) {
      if (bad++ == 0) first = i;
    }
  }
  INFO(what, ": first mismatch at ", first, " got ", got.empty() ? 0.f : got[first], " want ", want[first]);
  CHECK(bad == 0);
}

template <class T>
void run(const Scenario& s, Options options) {
  Model<T> model(s);
  InterleavedOptimizer<CpuBackend> opt(model.groups, options);
  std::size_t snap = 0;
  for (std::int64_t t = 1; t <= s.steps; ++t) {
    advance(opt, model, s, t);
    if (snap < s.snapshots.size() && s.snapshots[snap] == t) {
      const std::vector<float> master = read_all(opt, StateKind::master);
      check_close(master, s.params_at(snap), s.name + " params after step " + std::to_string(t));
      // The framework's copy is the master rounded once to its own format.
      std::size_t e = 0;
      bool rounded_once = true;
      for (const auto& v : model.values)
        for (const T& x : v) rounded_once &= (x == T(master[e++]));
      CHECK(rounded_once);
      ++snap;
    }
  }
  check_close(read_all(opt, StateKind::exp_avg), s.exp_avg(), s.name + " exp_avg");
  for (bool relative : {false, true}) {
    check_close(read_all(opt, StateKind::exp_avg_sq), s.exp_avg_sq(), s.name + " exp_avg_sq", relative);
    if (s.amsgrad)
      check_close(read_all(opt, StateKind::max_exp_avg_sq), s.max_exp_avg_sq(), s.name + " max_exp_avg_sq", relative);
  }
  CHECK(opt.step_count() == s.steps);
}

std::vector<SimdLevel> levels() {
  std::vector<SimdLevel> out{SimdLevel::scalar};
  if (simd_supported(SimdLevel::avx2)) out.push_back(SimdLevel::avx2);
  if (simd_supported(SimdLevel::avx512)) out.push_back(SimdLevel::avx512);
  return out;
}

}  // namespace

TEST_CASE("the reference data covers the required scenarios") {
  std::vector<std::string> names;
  for (const auto& s : scenarios()) {
    names.push_back(s.name);
    CHECK(s.steps >= 25);
  }
  for (const char* want : {"adamw", "adam_l2", "amsgrad", "maximize", "groups"})
    CHECK(std::find(names.begin(), names.end(), want) != names.end());
}

TEST_CASE("fp32 trajectories match torch for every kernel family") {
  for (const auto& s : scenarios())
    for (SimdLevel level : levels()) {
      CAPTURE(s.name);
      CAPTURE(simd_name(level));
      run<float>(s, {.subgroup_elements = 100'000'000, .threads = 1, .simd = level});
    }
}

TEST_CASE("fp32 trajectories match torch with small subgroups and several threads") {
  for (const auto& s : scenarios())
    for (std::size_t sub : {std::size_t{1}, std::size_t{100}, std::size_t{4096}}) {
      CAPTURE(s.name);
      CAPTURE(sub);
      run<float>(s, {.subgroup_elements = sub, .threads = 3});
    }
}

TEST_CASE("bf16 and fp16 parameters keep an fp32 master that matches torch in fp32") {
  for (const auto& s : scenarios())
    for (SimdLevel level : levels()) {
      CAPTURE(s.name);
      CAPTURE(simd_name(level));
      run<bf16>(s, {.subgroup_elements = 5000, .threads = 2, .simd = level});
      run<fp16>(s, {.subgroup_elements = 5000, .threads = 2, .simd = level});
    }
}
