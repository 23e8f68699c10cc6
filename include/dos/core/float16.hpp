#pragma once
/// @file
/// @brief The two 16-bit floating-point parameter formats, `dos::bf16` and `dos::fp16`.
///
/// They are distinct types on purpose: the reference code for this method once
/// memcpy'd fp16 bytes into a bf16 buffer and training diverged (docs/design.md, "Traps").
/// Here one format can only become the other through `float`, with a rounding.
///
/// Conversions from `float` round to nearest, ties to even, and keep NaN a (quiet)
/// NaN with its sign. The fp16 conversion reproduces the x86 F16C instructions bit
/// for bit, so the scalar and SIMD executors agree exactly.

#include "dos/config.hpp"

#include <cstdint>
#include <cstring>

namespace dos {

namespace detail {

DOS_HOST_DEVICE std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

DOS_HOST_DEVICE float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

/// Round-to-nearest-even float -> bfloat16 bits. NaN keeps its sign and top payload
/// bits and gains the quiet bit, so it can never round into an infinity.
DOS_HOST_DEVICE std::uint16_t float_to_bf16_bits(float f) {
  std::uint32_t u = float_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

DOS_HOST_DEVICE float bf16_bits_to_float(std::uint16_t h) { return bits_float(std::uint32_t{h} << 16); }

/// Round-to-nearest-even float -> IEEE binary16 bits, identical to VCVTPS2PH with
/// rounding mode 0: overflow goes to infinity, tiny values to subnormals or zero,
/// NaN becomes a quiet NaN with the top ten payload bits.
DOS_HOST_DEVICE std::uint16_t float_to_fp16_bits(float f) {
  const std::uint32_t u = float_bits(f);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  if (a >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // >= 65520 rounds to inf
  if (a < 0x38800000u) {                                                   // below 2^-14: subnormal
    if (a <= 0x33000000u) return sign;                                     // <= 2^-25 rounds to zero
    const std::uint32_t e = a >> 23;
    const std::uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
    const std::uint32_t shift = 126u - e;  // 14..24
    std::uint32_t q = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<std::uint16_t>(sign | q);
  }
  std::uint32_t r = a - 0x38000000u;  // rebias the exponent from 127 to 15
  r += 0xFFFu + ((r >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | (r >> 13));
}

/// Exact binary16 -> float. A signalling NaN comes back quiet, as with VCVTPH2PS.
DOS_HOST_DEVICE float fp16_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16;
  const std::uint32_t e = (h >> 10) & 0x1Fu;
  std::uint32_t m = h & 0x3FFu;
  if (e == 0x1Fu) return bits_float(sign | 0x7F800000u | (m << 13) | (m != 0 ? 0x400000u : 0u));
  if (e == 0) {
    if (m == 0) return bits_float(sign);
    // m * 2^-24 = 1.f * 2^(-14 - s) after s shifts bring the leading one to bit 10.
    std::uint32_t exponent = 127 - 14;
    while ((m & 0x400u) == 0) {
      m <<= 1;
      --exponent;
    }
    return bits_float(sign | (exponent << 23) | ((m & 0x3FFu) << 13));
  }
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

}  // namespace detail

/// @brief bfloat16: 8 exponent bits, 7 stored mantissa bits. Storage only; arithmetic
///        happens in `float`.
struct bf16 {
  std::uint16_t bits = 0;

  bf16() = default;
  /// @brief Rounds to nearest even; NaN stays NaN.
  DOS_HOST_DEVICE explicit bf16(float f) : bits(detail::float_to_bf16_bits(f)) {}
  DOS_HOST_DEVICE explicit operator float() const { return detail::bf16_bits_to_float(bits); }
  DOS_HOST_DEVICE static bf16 from_bits(std::uint16_t b) {
    bf16 r;
    r.bits = b;
    return r;
  }
  friend DOS_HOST_DEVICE bool operator==(bf16 a, bf16 b) { return a.bits == b.bits; }
};

/// @brief IEEE 754 binary16: 5 exponent bits, 10 stored mantissa bits, range +-65504.
struct fp16 {
  std::uint16_t bits = 0;

  fp16() = default;
  /// @brief Rounds to nearest even; overflow becomes infinity; NaN stays NaN.
  DOS_HOST_DEVICE explicit fp16(float f) : bits(detail::float_to_fp16_bits(f)) {}
  DOS_HOST_DEVICE explicit operator float() const { return detail::fp16_bits_to_float(bits); }
  DOS_HOST_DEVICE static fp16 from_bits(std::uint16_t b) {
    fp16 r;
    r.bits = b;
    return r;
  }
  friend DOS_HOST_DEVICE bool operator==(fp16 a, fp16 b) { return a.bits == b.bits; }
};

static_assert(sizeof(bf16) == 2 && sizeof(fp16) == 2);

}  // namespace dos
