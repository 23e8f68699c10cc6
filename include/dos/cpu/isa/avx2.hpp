#pragma once
/// @file
/// @brief The AVX2 kernel: 8 floats per lane, with FMA and F16C. Compiled through a
///        target region and selected at run time, like the AVX-512 one.

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
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

namespace dos::cpu::isa::avx2 {

#define DOS_STEP_FN DOS_ALWAYS_INLINE
#define DOS_LOOP_FN inline

struct Lane {
  __m256 r;
};
inline constexpr std::size_t kWidth = 8;

DOS_ALWAYS_INLINE Lane broadcast(float x) { return {_mm256_set1_ps(x)}; }
DOS_ALWAYS_INLINE Lane mul(Lane a, Lane b) { return {_mm256_mul_ps(a.r, b.r)}; }
DOS_ALWAYS_INLINE Lane fma(Lane a, Lane b, Lane c) { return {_mm256_fmadd_ps(a.r, b.r, c.r)}; }
// Pinned to the exact instructions; see avx512.hpp.
DOS_ALWAYS_INLINE Lane div(Lane a, Lane b) {
  __m256 r;
  __asm__("vdivps %2, %1, %0" : "=x"(r) : "x"(a.r), "x"(b.r));
  return {r};
}
DOS_ALWAYS_INLINE Lane sqrt(Lane a) {
  __m256 r;
  __asm__("vsqrtps %1, %0" : "=x"(r) : "x"(a.r));
  return {r};
}
DOS_ALWAYS_INLINE Lane max_nonneg(Lane a, Lane b) {
  return {_mm256_castsi256_ps(_mm256_max_epu32(_mm256_castps_si256(a.r), _mm256_castps_si256(b.r)))};
}

#include "dos/cpu/isa/float_ops.inl"

DOS_ALWAYS_INLINE Lane load(const float* p) { return {_mm256_loadu_ps(p)}; }
DOS_ALWAYS_INLINE Lane load(const bf16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))};
}
DOS_ALWAYS_INLINE Lane load(const fp16* p) {
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))};
}
DOS_ALWAYS_INLINE void store(float* p, Lane x) { _mm256_storeu_ps(p, x.r); }
DOS_ALWAYS_INLINE __m128i to_bf16(Lane x) {
  const __m256i u = _mm256_castps_si256(x.r);
  const __m256i hi = _mm256_srli_epi32(u, 16);
  const __m256i bias = _mm256_add_epi32(_mm256_and_si256(hi, _mm256_set1_epi32(1)), _mm256_set1_epi32(0x7FFF));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
  const __m256i quiet = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
  // |x| fits in 31 bits, so the signed comparison orders it correctly.
  const __m256i nan =
      _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)), _mm256_set1_epi32(0x7F800000));
  const __m256i bits = _mm256_blendv_epi8(rounded, quiet, nan);
  // packus works per 128-bit half; the permute gathers the two packed quarters.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(bits, bits), 0b1000);
  return _mm256_castsi256_si128(packed);
}
DOS_ALWAYS_INLINE __m128i to_fp16(Lane x) { return _mm256_cvtps_ph(x.r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
DOS_ALWAYS_INLINE void store(bf16* p, Lane x) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), to_bf16(x)); }
DOS_ALWAYS_INLINE void store(fp16* p, Lane x) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), to_fp16(x)); }
inline constexpr std::size_t kStreamAlignment = 16;
DOS_ALWAYS_INLINE void store_stream(bf16* p, Lane x) { _mm_stream_si128(reinterpret_cast<__m128i*>(p), to_bf16(x)); }
DOS_ALWAYS_INLINE void store_stream(fp16* p, Lane x) { _mm_stream_si128(reinterpret_cast<__m128i*>(p), to_fp16(x)); }
DOS_ALWAYS_INLINE void stream_fence() { _mm_sfence(); }

#include "dos/optim/detail/adam_step.inl"
#include "dos/cpu/isa/segment_loop.inl"

// Sixteen double partial sums of squares, element j of each block of 16 into
// partial[j]; see cpu/grad_stats.hpp for why every family gets the same bits.
template <class T>
inline void sum_squares_blocks(const T* p, std::size_t blocks, double* partial) {
  __m256d a0 = _mm256_loadu_pd(partial), a1 = _mm256_loadu_pd(partial + 4);
  __m256d a2 = _mm256_loadu_pd(partial + 8), a3 = _mm256_loadu_pd(partial + 12);
  for (std::size_t b = 0; b < blocks; ++b, p += 16) {
    const __m256 x = load(p).r, y = load(p + 8).r;
    const __m256d d0 = _mm256_cvtps_pd(_mm256_castps256_ps128(x)), d1 = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    const __m256d d2 = _mm256_cvtps_pd(_mm256_castps256_ps128(y)), d3 = _mm256_cvtps_pd(_mm256_extractf128_ps(y, 1));
    a0 = _mm256_fmadd_pd(d0, d0, a0);
    a1 = _mm256_fmadd_pd(d1, d1, a1);
    a2 = _mm256_fmadd_pd(d2, d2, a2);
    a3 = _mm256_fmadd_pd(d3, d3, a3);
  }
  _mm256_storeu_pd(partial, a0);
  _mm256_storeu_pd(partial + 4, a1);
  _mm256_storeu_pd(partial + 8, a2);
  _mm256_storeu_pd(partial + 12, a3);
}
#undef DOS_STEP_FN
#undef DOS_LOOP_FN

}  // namespace dos::cpu::isa::avx2

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif  // DOS_X86_DISPATCH
