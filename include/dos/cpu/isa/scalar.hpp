#pragma once
/// @file
/// @brief The portable kernel: one float per lane. It is the reference the SIMD
///        kernels must match bit for bit, and the fallback on CPUs without AVX2.

#include "dos/core/float16.hpp"
#include "dos/cpu/kernel.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace dos::cpu::isa {

/// Correctly rounded a / b that no compiler flag can turn into a reciprocal
/// approximation: on x86-64 the SSE instruction is pinned with inline asm.
inline float exact_div(float a, float b) {
#if DOS_X86_DISPATCH
  __asm__("divss %1, %0" : "+x"(a) : "x"(b));
  return a;
#else
  return a / b;
#endif
}

/// Correctly rounded square root, pinned like `exact_div`.
inline float exact_sqrt(float a) {
#if DOS_X86_DISPATCH
  float r;
  __asm__("sqrtss %1, %0" : "=x"(r) : "x"(a));
  return r;
#else
  return std::sqrt(a);
#endif
}

}  // namespace dos::cpu::isa

namespace dos::cpu::isa::scalar {

using Lane = float;
inline constexpr std::size_t kWidth = 1;

#define DOS_STEP_FN inline
#define DOS_LOOP_FN inline
#include "dos/cpu/isa/float_ops.inl"

inline float broadcast(float x) { return x; }

inline float load(const float* p) { return *p; }
inline float load(const bf16* p) { return static_cast<float>(*p); }
inline float load(const fp16* p) { return static_cast<float>(*p); }
inline void store(float* p, float x) { *p = x; }
inline void store(bf16* p, float x) { *p = bf16(x); }
inline void store(fp16* p, float x) { *p = fp16(x); }
inline constexpr std::size_t kStreamAlignment = 1;  // "streaming" is a plain store here
template <class T>
inline void store_stream(T* p, float x) { store(p, x); }
inline void stream_fence() {}

#include "dos/optim/detail/adam_step.inl"
#include "dos/cpu/isa/segment_loop.inl"

// Sixteen double partial sums of squares, element j of each block of 16 into
// partial[j]; see cpu/grad_stats.hpp for why every family gets the same bits.
template <class T>
inline void sum_squares_blocks(const T* p, std::size_t blocks, double* partial) {
  for (std::size_t b = 0; b < blocks; ++b, p += 16)
    for (std::size_t j = 0; j < 16; ++j) {
      const double x = load(p + j);
      partial[j] += x * x;
    }
}
#undef DOS_STEP_FN
#undef DOS_LOOP_FN

}  // namespace dos::cpu::isa::scalar
