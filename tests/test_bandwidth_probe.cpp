// The bandwidth probe (cpu/bandwidth_probe.hpp): every variant of both shapes, whatever
// its stores or prefetches, computes what the plain loop of its shape does, bit for
// bit, in any split over threads and at any alignment; the limit is the fastest
// variant it timed.

#include "support/inputs.hpp"

#include <doctest/doctest.h>
#include <dos/cpu/bandwidth_probe.hpp>

#include <algorithm>
#include <cstring>
#include <vector>

namespace {

using namespace dos;

struct Arrays {
  std::vector<float> p, g, m, v;
};

Arrays random_arrays(std::size_t n, test::Rng& rng) {
  Arrays a{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
  for (auto* x : {&a.p, &a.g, &a.m, &a.v})
    for (float& e : *x) e = rng.uniform(-4.0f, 4.0f);
  return a;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// The 16-bit arrays of the mixed16 shape: bf16 bits of values in [-4, 4).
std::vector<std::uint16_t> random_halves(std::size_t n, test::Rng& rng) {
  std::vector<std::uint16_t> h(n);
  for (auto& e : h) e = static_cast<std::uint16_t>(detail::float_bits(rng.uniform(-4.0f, 4.0f)) >> 16);
  return h;
}

}  // namespace

TEST_CASE("every probe variant computes the plain loop's arrays, at any length, offset and thread count") {
  test::Rng rng(12);
  for (unsigned threads : {1u, 2u, 3u}) {
    ThreadPool pool(threads);
    for (int trial = 0; trial < 12; ++trial) {
      // Lengths around the chunk size and tiny ones; offsets that misalign each array
      // differently, so the streaming variant's fallback and every tail run.
      const std::size_t n = trial % 3 == 0 ? rng.below(40) : cpu::chunk_elements + rng.below(3 * cpu::chunk_elements);
      const std::size_t off[4] = {rng.below(16), rng.below(16), rng.below(16), rng.below(16)};
      const Arrays start = random_arrays(n + 16, rng);
      Arrays want = start;
      adam_shaped_pass(want.p.data() + off[0], want.g.data() + off[1], want.m.data() + off[2], want.v.data() + off[3], 0, n);
      for (const ProbeVariant variant : probe_variants) {
        CAPTURE(probe_name(variant));
        CAPTURE(threads);
        CAPTURE(n);
        Arrays got = start;
        adam_shaped_pass(pool, std::span(got.p).subspan(off[0], n), std::span<const float>(got.g).subspan(off[1], n),
                         std::span(got.m).subspan(off[2], n), std::span(got.v).subspan(off[3], n), variant);
        CHECK(same_bits(got.p, want.p));
        CHECK(same_bits(got.m, want.m));
        CHECK(same_bits(got.v, want.v));
        CHECK(same_bits(got.g, want.g));
      }
    }
  }
}

TEST_CASE("every mixed16 variant computes the plain mixed16 loop's arrays, at any length, offset and thread count") {
  test::Rng rng(13);
  for (unsigned threads : {1u, 2u, 3u}) {
    ThreadPool pool(threads);
    for (int trial = 0; trial < 12; ++trial) {
      const std::size_t n = trial % 3 == 0 ? rng.below(40) : cpu::chunk_elements + rng.below(3 * cpu::chunk_elements);
      // The copy's offset decides whether the streaming variants stream (at a multiple
      // of the vector's 16-bit width) or run their scalar head first.
      const std::size_t off[5] = {rng.below(16), rng.below(16), rng.below(16), rng.below(16), rng.below(16)};
      const Arrays start = random_arrays(n + 16, rng);
      const std::vector<std::uint16_t> g16 = random_halves(n + 16, rng), copy_start = random_halves(n + 16, rng);
      Arrays want = start;
      std::vector<std::uint16_t> want_copy = copy_start;
      mixed16_shaped_pass(want.p.data() + off[0], g16.data() + off[1], want.m.data() + off[2], want.v.data() + off[3],
                          want_copy.data() + off[4], 0, n);
      for (const ProbeVariant variant : probe_variants) {
        CAPTURE(probe_name(variant));
        CAPTURE(threads);
        CAPTURE(n);
        Arrays got = start;
        std::vector<std::uint16_t> got_copy = copy_start;
        mixed16_shaped_pass(pool, std::span(got.p).subspan(off[0], n), std::span(g16).subspan(off[1], n),
                            std::span(got.m).subspan(off[2], n), std::span(got.v).subspan(off[3], n),
                            std::span(got_copy).subspan(off[4], n), variant);
        CHECK(same_bits(got.p, want.p));
        CHECK(same_bits(got.m, want.m));
        CHECK(same_bits(got.v, want.v));
        CHECK(same_bits(got_copy, want_copy));
      }
    }
  }
}

TEST_CASE("the mixed16 copy is the truncated master, and a step's value type names its shape") {
  std::vector<float> master{1.0f, -2.5f, 3.0e-3f}, m(3, 0.0f), v(3, 0.0f);
  const std::vector<std::uint16_t> g(3, 0);  // +0.0: the master only loses m + v = 0
  std::vector<std::uint16_t> copy(3, 0xFFFF);
  mixed16_shaped_pass(master.data(), g.data(), m.data(), v.data(), copy.data(), 0, 3);
  for (std::size_t i = 0; i < 3; ++i) CHECK(copy[i] == detail::float_bits(master[i]) >> 16);
  CHECK(probe_shape_of(DType::f32) == ProbeShape::fp32);
  CHECK(probe_shape_of(DType::bf16) == ProbeShape::mixed16);
  CHECK(probe_shape_of(DType::f16) == ProbeShape::mixed16);
  CHECK(probe_shape_name(ProbeShape::fp32) != probe_shape_name(ProbeShape::mixed16));
}

TEST_CASE("every variant has its own name, and the limit is a variant's measured rate") {
  std::vector<std::string_view> names;
  for (const ProbeVariant variant : probe_variants) names.push_back(probe_name(variant));
  std::sort(names.begin(), names.end());
  CHECK(std::adjacent_find(names.begin(), names.end()) == names.end());
  CHECK(std::find(names.begin(), names.end(), "?") == names.end());

  ThreadPool pool(2);
  ProbeArrays arrays(std::size_t{1} << 16);
  const ProbeLimit limit = measure_probe_limit(pool, arrays, 2);
  CHECK(limit.elements_per_second > 0);
  CHECK(limit.shape == ProbeShape::fp32);
  CHECK(std::find(probe_variants.begin(), probe_variants.end(), limit.variant) != probe_variants.end());
  // The passes ran: m grew by g at each variant's 1 untimed + 2 timed passes.
  const double passes = 3.0 * probe_variants.size();
  CHECK(arrays.m[0] == doctest::Approx(1e-3 * passes).epsilon(1e-3));

  const ProbeLimit mixed = measure_probe_limit(pool, arrays, 2, ProbeShape::mixed16);
  CHECK(mixed.elements_per_second > 0);
  CHECK(mixed.shape == ProbeShape::mixed16);
  // The mixed16 passes read the 16-bit gradient (0x3B00, 2^-9 in bf16, about twice
  // the fp32 g) into m, not the fp32 one.
  const double g16 = detail::bits_float(std::uint32_t{0x3B00} << 16);
  CHECK(g16 == 1.0 / 512);
  CHECK(arrays.m[0] == doctest::Approx(1e-3 * passes + g16 * passes).epsilon(1e-3));
  CHECK(arrays.copy16[0] == detail::float_bits(arrays.p[0]) >> 16);

  // Arrays built for the fp32 shape only refuse a mixed16 pass, and say why.
  ProbeArrays fp32_only(std::size_t{1} << 10, false);
  CHECK(fp32_only.g16.empty());
  CHECK_THROWS_WITH_AS(fp32_only.pass(pool, ProbeVariant::native, ProbeShape::mixed16),
                       doctest::Contains("with_mixed16 = false"), std::invalid_argument);
  fp32_only.pass(pool, ProbeVariant::native);
  CHECK(fp32_only.m[0] == doctest::Approx(1e-3));
}
