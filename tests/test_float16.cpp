// bf16 and fp16: round to nearest even, NaN preserved, exact round trips, and the
// software fp16 conversion identical to the F16C hardware the SIMD kernels use.

#include "support/inputs.hpp"

#include <doctest/doctest.h>
#include <dos/core/float16.hpp>
#include <dos/cpu/isa/avx2.hpp>
#include <dos/cpu/simd.hpp>

#include <cmath>
#include <cstdint>
#include <limits>

using dos::bf16;
using dos::fp16;
using dos::detail::bits_float;
using dos::detail::float_bits;

namespace {

bool is_nan_bits_bf16(std::uint16_t b) { return (b & 0x7F80) == 0x7F80 && (b & 0x7F) != 0; }
bool is_nan_bits_fp16(std::uint16_t b) { return (b & 0x7C00) == 0x7C00 && (b & 0x3FF) != 0; }

// Reference rounding in double: the nearest representable neighbour, ties to the
// one with an even last bit. Neighbours come from the exhaustive 16-bit table.
template <class H>
std::uint16_t round_reference(float x) {
  const double d = x;
  std::uint16_t best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const float f = static_cast<float>(H::from_bits(static_cast<std::uint16_t>(b)));
    if (std::isnan(f)) continue;
    if (std::signbit(f) != std::signbit(x)) continue;
    const double err = std::abs(double(f) - d);
    if (err < best_err || (err == best_err && (b & 1) == 0)) {
      best_err = err;
      best = static_cast<std::uint16_t>(b);
    }
  }
  return best;
}

#if DOS_X86_DISPATCH
__attribute__((target("avx2,fma,f16c"))) void hardware_fp16(const float* in, fp16* out) {
  dos::cpu::isa::avx2::store(out, dos::cpu::isa::avx2::load(in));
}
#endif

}  // namespace

TEST_CASE("every 16-bit pattern survives a round trip through float") {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto h = static_cast<std::uint16_t>(b);
    const bf16 x = bf16::from_bits(h);
    const fp16 y = fp16::from_bits(h);
    if (is_nan_bits_bf16(h)) {
      CHECK(std::isnan(static_cast<float>(x)));
      CHECK(is_nan_bits_bf16(bf16(static_cast<float>(x)).bits));
    } else {
      CHECK(bf16(static_cast<float>(x)).bits == h);
    }
    if (is_nan_bits_fp16(h)) {
      CHECK(std::isnan(static_cast<float>(y)));
      CHECK(is_nan_bits_fp16(fp16(static_cast<float>(y)).bits));
    } else {
      CHECK(fp16(static_cast<float>(y)).bits == h);
    }
  }
}

TEST_CASE("conversions round to nearest, ties to even") {
  // Exact ties: halfway between neighbours goes to the even one.
  CHECK(bf16(bits_float(0x3F808000u)).bits == 0x3F80);  // 1 + 2^-8: tie, 0x3F80 is even
  CHECK(bf16(bits_float(0x3F818000u)).bits == 0x3F82);  // tie, rounds up to even
  CHECK(fp16(1.0f + 0x1p-11f).bits == 0x3C00);
  CHECK(fp16(1.0f + 3 * 0x1p-11f).bits == 0x3C02);
  // Overflow and the subnormal range of fp16.
  CHECK(fp16(65504.0f).bits == 0x7BFF);
  CHECK(fp16(65519.0f).bits == 0x7BFF);
  CHECK(fp16(65520.0f).bits == 0x7C00);
  CHECK(fp16(-1e6f).bits == 0xFC00);
  CHECK(fp16(0x1p-24f).bits == 0x0001);
  CHECK(fp16(0x1p-25f).bits == 0x0000);
  CHECK(fp16(0x1.8p-25f).bits == 0x0001);
  CHECK(bf16(std::numeric_limits<float>::max()).bits == 0x7F80);  // rounds to inf
  // Random floats against a brute-force reference.
  dos::test::Rng rng(7);
  for (int i = 0; i < 200; ++i) {
    const float x = bits_float(static_cast<std::uint32_t>(rng.next()) & 0xBFFFFFFFu);  // no NaN
    if (std::isnan(x) || std::isinf(x)) continue;
    CAPTURE(x);
    CHECK(bf16(x).bits == round_reference<bf16>(x));
    if (std::abs(x) < 65520.0f) CHECK(fp16(x).bits == round_reference<fp16>(x));
  }
}

TEST_CASE("NaN stays NaN and keeps its sign") {
  for (std::uint32_t payload : {0x7FC00000u, 0x7F800001u, 0x7F80FFFFu, 0xFFC00001u, 0xFF800001u}) {
    const float nan = bits_float(payload);
    CHECK(is_nan_bits_bf16(bf16(nan).bits));
    CHECK(is_nan_bits_fp16(fp16(nan).bits));
    CHECK((bf16(nan).bits >> 15) == (payload >> 31));
    CHECK((fp16(nan).bits >> 15) == (payload >> 31));
  }
  CHECK(bf16(std::numeric_limits<float>::infinity()).bits == 0x7F80);
  CHECK(fp16(-std::numeric_limits<float>::infinity()).bits == 0xFC00);
}

TEST_CASE("the fp16 conversion matches the F16C instruction bit for bit") {
#if DOS_X86_DISPATCH
  if (!dos::simd_supported(dos::SimdLevel::avx2)) return;
  dos::test::Rng rng(11);
  int mismatches = 0;
  for (int round = 0; round < 20000; ++round) {
    float in[8];
    for (float& f : in) {
      // Mostly values near the fp16 range, plus arbitrary bit patterns (NaN, inf, tiny).
      std::uint32_t b = static_cast<std::uint32_t>(rng.next());
      if (round % 2 == 0) b = (b & 0x87FFFFFFu) | 0x30000000u;
      f = bits_float(b);
    }
    fp16 hw[8];
    hardware_fp16(in, hw);
    for (int i = 0; i < 8; ++i) mismatches += fp16(in[i]).bits != hw[i].bits;
  }
  CHECK(mismatches == 0);
#endif
}
