#pragma once
/// @file
/// @brief `CpuAdamExecutor`, the default `CpuExecutor`: range kernels over a persistent
///        thread pool, and the fused gradient pass.
///
/// Each chunk runs with the default floating-point environment (round to nearest,
/// no flush-to-zero, no denormals-are-zero): a consumer linked with -ffast-math sets
/// FTZ/DAZ for the whole process, and the results must not change with it.

#include "dos/core/grad_stats.hpp"
#include "dos/core/tensor.hpp"
#include "dos/cpu/executor.hpp"
#include "dos/cpu/kernel.hpp"
#include "dos/cpu/simd.hpp"
#include "dos/cpu/thread_pool.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#if DOS_X86_DISPATCH
#include <xmmintrin.h>
#endif

namespace dos::cpu {

namespace detail {

/// Restores the caller's MXCSR on scope exit, after forcing the IEEE default.
class DefaultFloatEnvironment {
 public:
#if DOS_X86_DISPATCH
  DefaultFloatEnvironment() noexcept : saved_(_mm_getcsr()) { _mm_setcsr(0x1F80u); }
  ~DefaultFloatEnvironment() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
#endif
};

// Exponent bits of each element type: all ones means inf or NaN.
template <class T>
inline constexpr std::uint32_t exponent_mask = 0x7F800000u;
template <>
inline constexpr std::uint32_t exponent_mask<bf16> = 0x7F80u;
template <>
inline constexpr std::uint32_t exponent_mask<fp16> = 0x7C00u;

template <class T>
GradStats stats_of(const T* p, std::size_t begin, std::size_t end) noexcept {
  using Bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint16_t>;
  constexpr auto mask = static_cast<Bits>(exponent_mask<T>);
  double sum = 0;
  bool found = false;
  for (std::size_t i = begin; i < end; ++i) {
    const double x = static_cast<float>(p[i]);
    sum += x * x;
    Bits bits;
    std::memcpy(&bits, p + i, sizeof bits);
    found |= (bits & mask) == mask;
  }
  return {sum, found};
}
}  // namespace detail

/// @brief Sum of squares (in double, in element order) and the non-finite flag of
///        elements [begin, end) of a gradient. The flag tests the exponent bits, so it
///        still works when the consumer compiles with -ffinite-math-only.
inline GradStats grad_stats(const void* data, DType dtype, std::size_t begin, std::size_t end) noexcept {
  return visit_dtype(dtype, [&](auto type) {
    using T = typename decltype(type)::type;
    return detail::stats_of(static_cast<const T*>(data), begin, end);
  });
}

/// @brief Runs Adam on the CPU, multi-threaded and vectorised.
class CpuAdamExecutor {
 public:
  /// @throws std::invalid_argument when `config.simd` cannot run on this CPU.
  explicit CpuAdamExecutor(const CpuConfig& config = {}) : level_(resolve_simd(config.simd)), pool_(config.threads) {}

  unsigned threads() const noexcept { return pool_.size(); }
  SimdLevel simd_level() const noexcept { return level_; }
  ThreadPool& pool() noexcept { return pool_; }

  /// @brief The kernel this executor uses for the given types.
  RangeKernel kernel(DType value, DType grad, bool amsgrad) const {
    return select_kernel(level_, value, grad, amsgrad);
  }

  /// @brief Updates every chunk. Blocks until done.
  void run(std::span<const Chunk> chunks, std::span<const SegmentWork> segments) {
    auto body = [&](std::size_t i) {
      [[maybe_unused]] const detail::DefaultFloatEnvironment fenv;
      const Chunk& c = chunks[i];
      const SegmentWork& s = segments[c.segment];
      s.kernel(s.args, c.begin, c.end, *s.coefficients);
    };
    pool_.parallel_for(chunks.size(), body);
  }

  /// @brief The fused gradient pass: `out[i]` gets chunk i's sum of squares and
  ///        non-finite flag.
  void grad_stats(std::span<const Chunk> chunks, std::span<const SegmentWork> segments, std::span<GradStats> out) {
    auto body = [&](std::size_t i) {
      const Chunk& c = chunks[i];
      const SegmentWork& s = segments[c.segment];
      out[i] = cpu::grad_stats(s.args.grad, s.grad, c.begin, c.end);
    };
    pool_.parallel_for(chunks.size(), body);
  }

  /// @brief Runs @p body(i) for every i in [0, n) on the pool.
  void parallel_for(std::size_t n, FunctionRef<void(std::size_t)> body) { pool_.parallel_for(n, body); }

 private:
  SimdLevel level_;
  ThreadPool pool_;
};
static_assert(CpuExecutor<CpuAdamExecutor>);

}  // namespace dos::cpu
