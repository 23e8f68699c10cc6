// The bandwidth probe (cpu/bandwidth_probe.hpp): every variant, whatever its stores or
// prefetches, computes what the plain loop does, bit for bit, in any split over
// threads and at any alignment; the limit is the fastest variant it timed.

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

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
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
  CHECK(std::find(probe_variants.begin(), probe_variants.end(), limit.variant) != probe_variants.end());
  // The passes ran: m grew by g at each of 4 variants x (1 untimed + 2 timed) passes.
  CHECK(arrays.m[0] == doctest::Approx(1e-3 * 4 * 3).epsilon(1e-3));
}
