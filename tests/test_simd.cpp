// Dispatch: every kernel family computes the same bits as the scalar reference, for
// every value type, gradient type, amsgrad, maximize and weight-decay mode, on
// random data with awkward lengths, special values included.

#include "support/inputs.hpp"

#include <doctest/doctest.h>
#include <dos/cpu/grad_stats.hpp>
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
      // Lengths whose ranges (run_level splits each in three) reach every part of the
      // loop (cpu/isa/segment_loop.inl): two vectors per iteration, one vector (AVX2:
      // n = 16, 24, 33; AVX-512: 24, 33, 57, 1031), the scalar tail.
      for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{16}, std::size_t{24}, std::size_t{33},
                            std::size_t{57}, std::size_t{1031}}) {
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

// The documented order, written out plainly: partial sum j takes elements begin + j,
// begin + j + 16, ...; then the tree j + 8, + 4, + 2, + 1.
template <class G>
double documented_sum(const std::vector<G>& g, std::size_t begin, std::size_t end) {
  double partial[16] = {};
  for (std::size_t i = begin; i < end; ++i) {
    const double x = static_cast<float>(g[i]);
    partial[(i - begin) % 16] += x * x;
  }
  for (std::size_t w = 8; w > 0; w /= 2)
    for (std::size_t j = 0; j < w; ++j) partial[j] += partial[j + w];
  return partial[0];
}

template <class G>
void compare_grad_stats() {
  test::Rng rng(7);
  std::vector<float> f(1000);
  for (auto& x : f) x = rng.uniform(-1, 1) * 1e-3f;
  f[3] = 1e-40f;  // a subnormal square
  const std::vector<G> g = convert<G>(f);
  for (std::size_t begin : {std::size_t{0}, std::size_t{5}})
    for (std::size_t end : {std::size_t{5}, std::size_t{21}, std::size_t{1000}}) {
      if (end < begin) continue;
      const double want = documented_sum(g, begin, end);
      for (SimdLevel level : {SimdLevel::scalar, SimdLevel::avx2, SimdLevel::avx512}) {
        if (!simd_supported(level)) continue;
        CAPTURE(simd_name(level));
        CAPTURE(begin);
        CAPTURE(end);
        const GradStats s = cpu::grad_stats(level, g.data(), dtype_of<G>, begin, end);
        CHECK(std::memcmp(&s.sum_squares, &want, sizeof want) == 0);
        CHECK_FALSE(s.nonfinite);
      }
    }
  for (float bad : {INFINITY, -INFINITY, NAN})
    for (std::size_t at : {std::size_t{0}, std::size_t{17}, std::size_t{998}}) {
      std::vector<G> h = g;
      h[at] = G(bad);
      for (SimdLevel level : {SimdLevel::scalar, SimdLevel::avx2, SimdLevel::avx512}) {
        if (!simd_supported(level)) continue;
        CAPTURE(simd_name(level));
        CAPTURE(at);
        CHECK(cpu::grad_stats(level, h.data(), dtype_of<G>, 0, h.size()).nonfinite);
      }
    }
}

}  // namespace

TEST_CASE("gradient statistics: every family sums in the documented order and flags inf and NaN") {
  compare_grad_stats<float>();
  compare_grad_stats<bf16>();
  compare_grad_stats<fp16>();
}

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
