// Dispatch: every kernel family computes the same bits as the scalar reference, for
// every value type, gradient type, amsgrad, maximize and weight-decay mode, on
// random data with awkward lengths, special values included.

#include "support/inputs.hpp"

#include <doctest/doctest.h>
#include <dos/cpu/simd.hpp>
#include <dos/optim/adam.hpp>

#include <cmath>
#include <cstring>
#include <vector>

namespace {

using namespace dos;

template <class T>
std::vector<T> convert(const std::vector<float>& f) {
  std::vector<T> out(f.size());
  for (std::size_t i = 0; i < f.size(); ++i) out[i] = T(f[i]);
  return out;
}

struct Run {
  std::vector<std::uint8_t> param_bytes;
  std::vector<float> master, m, v, vmax;
};

template <class P, class G>
Run run_level(SimdLevel level, bool amsgrad, const AdamConfig& c, std::size_t n, std::uint64_t seed) {
  test::Rng rng(seed);
  std::vector<float> p(n), g(n), m(n), v(n), vmax(n);
  for (std::size_t i = 0; i < n; ++i) {
    p[i] = rng.uniform(-3, 3);
    g[i] = rng.uniform(-1, 1) * (i % 7 == 0 ? 1e-20f : 1.0f);  // subnormal squares too
    m[i] = rng.uniform(-0.1f, 0.1f);
    v[i] = rng.uniform(0, 1e-3f);
    vmax[i] = v[i] * 1.5f;
  }
  if (n > 5) {
    g[1] = INFINITY;
    g[2] = NAN;
    p[3] = 70000.0f;  // overflows fp16
    g[4] = -0.0f;
  }
  std::vector<P> param = convert<P>(p);
  std::vector<G> grad = convert<G>(g);
  std::vector<float> master(n);
  for (std::size_t i = 0; i < n; ++i) master[i] = static_cast<float>(param[i]);
  cpu::SegmentArgs a{param.data(), grad.data(), std::is_same_v<P, float> ? nullptr : master.data(),
                     m.data(), v.data(), amsgrad ? vmax.data() : nullptr};
  const cpu::RangeKernel k = select_kernel(level, dtype_of<P>, dtype_of<G>, amsgrad);
  for (std::int64_t t = 1; t <= 3; ++t) {
    // Split the range unevenly, as threads do: results are element-wise.
    const std::size_t mid = n / 3;
    k(a, 0, mid, coefficients(c, t));
    k(a, mid, n, coefficients(c, t));
  }
  Run r;
  r.param_bytes.resize(n * sizeof(P));
  std::memcpy(r.param_bytes.data(), param.data(), r.param_bytes.size());
  r.master = master;
  r.m = m;
  r.v = v;
  r.vmax = vmax;
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

template <class P, class G>
void compare_levels() {
  for (bool amsgrad : {false, true})
    for (int mode = 0; mode < 3; ++mode)
      for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{16}, std::size_t{33}, std::size_t{1031}}) {
        AdamConfig c = mode == 0 ? AdamConfig(AdamW{.lr = 1e-2, .weight_decay = 0.1, .amsgrad = amsgrad})
                       : mode == 1 ? AdamConfig(Adam{.weight_decay = 0.2, .amsgrad = amsgrad, .maximize = true})
                                   : AdamConfig(Adam{.lr = 0.1, .beta1 = 0.5, .beta2 = 0.6, .eps = 1e-3, .amsgrad = amsgrad});
        const Run ref = run_level<P, G>(SimdLevel::scalar, amsgrad, c, n, n * 31 + mode);
        for (SimdLevel level : {SimdLevel::avx2, SimdLevel::avx512}) {
          if (!simd_supported(level)) continue;
          CAPTURE(simd_name(level));
          CAPTURE(n);
          CAPTURE(mode);
          CAPTURE(amsgrad);
          const Run got = run_level<P, G>(level, amsgrad, c, n, n * 31 + mode);
          CHECK(got.param_bytes == ref.param_bytes);
          CHECK(same_bits(got.master, ref.master));
          CHECK(same_bits(got.m, ref.m));
          CHECK(same_bits(got.v, ref.v));
          if (amsgrad) CHECK(same_bits(got.vmax, ref.vmax));
        }
      }
}

}  // namespace

TEST_CASE("detection reports a usable level and automatic resolves to it") {
  const SimdLevel l = detect_simd();
  CHECK(l != SimdLevel::automatic);
  CHECK(resolve_simd(SimdLevel::automatic) == l);
  CHECK(simd_supported(SimdLevel::scalar));
  MESSAGE("this CPU runs the ", simd_name(l), " kernels");
}

TEST_CASE("forcing a level the CPU lacks is an error that names both levels") {
  if (detect_simd() == SimdLevel::avx512) return;  // nothing is missing here
  CHECK_THROWS_WITH_AS(resolve_simd(SimdLevel::avx512), doctest::Contains("avx512"), std::invalid_argument);
}

TEST_CASE("every kernel family gives the scalar kernel's bits: fp32 values") {
  compare_levels<float, float>();
  compare_levels<float, bf16>();
}
TEST_CASE("every kernel family gives the scalar kernel's bits: bf16 values") {
  compare_levels<bf16, bf16>();
  compare_levels<bf16, float>();
}
TEST_CASE("every kernel family gives the scalar kernel's bits: fp16 values") {
  compare_levels<fp16, fp16>();
  compare_levels<fp16, float>();
}
