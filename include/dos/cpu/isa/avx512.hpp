#pragma once
/// @file
/// @brief The AVX-512 kernel: 16 floats per lane. Compiled through a target region,
///        so it exists whatever `-march` the consumer builds with, and runs only after
///        run-time detection says the CPU has AVX-512F.

#include "dos/config.hpp"

#if DOS_X86_DISPATCH

#include "dos/core/float16.hpp"
#include "dos/cpu/isa/scalar.hpp"
#include "dos/cpu/kernel.hpp"

#include <immintrin.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma,f16c")
// GCC 12 flags the deliberately undefined pass-through operand of its own AVX-512
// intrinsics as "maybe uninitialized" once they are inlined here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace dos::cpu::isa::avx512 {

#define DOS_STEP_FN DOS_ALWAYS_INLINE
#define DOS_LOOP_FN inline

struct Lane {
  __m512 r;
};
inline constexpr std::size_t kWidth = 16;

DOS_ALWAYS_INLINE Lane broadcast(float x) { return {_mm512_set1_ps(x)}; }
DOS_ALWAYS_INLINE Lane mul(Lane a, Lane b) { return {_mm512_mul_ps(a.r, b.r)}; }
DOS_ALWAYS_INLINE Lane fma(Lane a, Lane b, Lane c) { return {_mm512_fmadd_ps(a.r, b.r, c.r)}; }
// Division and square root are pinned to the exact instructions with inline asm:
// under -ffast-math GCC otherwise replaces vector divisions and square roots with
// RCP14/RSQRT14 plus a Newton step, which changes the last bits.
DOS_ALWAYS_INLINE Lane div(Lane a, Lane b) {
  __m512 r;
  __asm__("vdivps %2, %1, %0" : "=v"(r) : "v"(a.r), "v"(b.r));
  return {r};
}
DOS_ALWAYS_INLINE Lane sqrt(Lane a) {
  __m512 r;
  __asm__("vsqrtps %1, %0" : "=v"(r) : "v"(a.r));
  return {r};
}
DOS_ALWAYS_INLINE Lane max_nonneg(Lane a, Lane b) {
  return {_mm512_castsi512_ps(_mm512_max_epu32(_mm512_castps_si512(a.r), _mm512_castps_si512(b.r)))};
}

// The float versions serve the scalar tail of each range.
#include "dos/cpu/isa/float_ops.inl"

DOS_ALWAYS_INLINE Lane load(const float* p) { return {_mm512_loadu_ps(p)}; }
DOS_ALWAYS_INLINE Lane load(const bf16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))};
}
DOS_ALWAYS_INLINE Lane load(const fp16* p) {
  return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
}
DOS_ALWAYS_INLINE void store(float* p, Lane x) { _mm512_storeu_ps(p, x.r); }
DOS_ALWAYS_INLINE __m256i to_bf16(Lane x) {
  // Same integer rounding as detail::float_to_bf16_bits, sixteen at a time.
  const __m512i u = _mm512_castps_si512(x.r);
  const __m512i hi = _mm512_srli_epi32(u, 16);
  const __m512i bias = _mm512_add_epi32(_mm512_and_si512(hi, _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7FFF));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  const __m512i quiet = _mm512_or_si512(hi, _mm512_set1_epi32(0x40));
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}
DOS_ALWAYS_INLINE __m256i to_fp16(Lane x) { return _mm512_cvtps_ph(x.r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
DOS_ALWAYS_INLINE void store(bf16* p, Lane x) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_bf16(x)); }
DOS_ALWAYS_INLINE void store(fp16* p, Lane x) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_fp16(x)); }
// Two 16-byte streaming stores: framework buffers are often only 16-byte aligned
// (glibc's large allocations), which rules out the 32-byte form.
inline constexpr std::size_t kStreamAlignment = 16;
DOS_ALWAYS_INLINE void stream_32_bytes(void* p, __m256i x) {
  auto* q = static_cast<__m128i*>(p);
  _mm_stream_si128(q, _mm256_castsi256_si128(x));
  _mm_stream_si128(q + 1, _mm256_extracti128_si256(x, 1));
}
DOS_ALWAYS_INLINE void store_stream(bf16* p, Lane x) { stream_32_bytes(p, to_bf16(x)); }
DOS_ALWAYS_INLINE void store_stream(fp16* p, Lane x) { stream_32_bytes(p, to_fp16(x)); }
DOS_ALWAYS_INLINE void stream_fence() { _mm_sfence(); }

#include "dos/optim/detail/adam_step.inl"
#include "dos/cpu/isa/segment_loop.inl"

// Sixteen double partial sums of squares, element j of each block of 16 into
// partial[j]; see cpu/grad_stats.hpp for why every family gets the same bits.
template <class T>
inline void sum_squares_blocks(const T* p, std::size_t blocks, double* partial) {
  __m512d lo = _mm512_loadu_pd(partial), hi = _mm512_loadu_pd(partial + 8);
  for (std::size_t b = 0; b < blocks; ++b, p += 16) {
    const __m512 x = load(p).r;
    const __m512d dlo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    const __m512d dhi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    lo = _mm512_fmadd_pd(dlo, dlo, lo);
    hi = _mm512_fmadd_pd(dhi, dhi, hi);
  }
  _mm512_storeu_pd(partial, lo);
  _mm512_storeu_pd(partial + 8, hi);
}
#undef DOS_STEP_FN
#undef DOS_LOOP_FN

}  // namespace dos::cpu::isa::avx512

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif

#endif  // DOS_X86_DISPATCH
