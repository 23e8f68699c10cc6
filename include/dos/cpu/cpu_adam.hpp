#pragma once
/// @file
/// @brief The CPU Adam executor: runs range kernels over a persistent thread pool.
///
/// The optimizer hands it a list of segments (pointers refreshed every step) and a
/// fixed list of chunks, cut once at construction, so a step allocates nothing.
/// Each chunk runs with the default floating-point environment (round to nearest,
/// no flush-to-zero, no denormals-are-zero): a consumer linked with -ffast-math sets
/// FTZ/DAZ for the whole process, and the results must not change with it.

#include "dos/backend/device_segment.hpp"
#include "dos/core/tensor.hpp"
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

/// @brief One segment as the executor sees it at one step.
struct SegmentWork {
  SegmentArgs args;
  DType grad_dtype = DType::f32;
  RangeKernel kernel = nullptr;
  const AdamCoefficients<float>* coefficients = nullptr;
};

/// @brief Elements [begin, end) of segment `segment`; the unit one thread runs.
struct Chunk {
  std::uint32_t segment = 0;
  std::size_t begin = 0;
  std::size_t end = 0;
};

/// @brief Elements per chunk: about 1 MB of state traffic, enough to amortise the
///        scheduling, small enough to balance two to a hundred threads.
inline constexpr std::size_t chunk_elements = std::size_t{1} << 15;

/// @brief Appends the chunks of a segment of @p count elements to @p out.
inline void append_chunks(std::vector<Chunk>& out, std::uint32_t segment, std::size_t count) {
  for (std::size_t b = 0; b < count; b += chunk_elements) out.push_back({segment, b, std::min(count, b + chunk_elements)});
}

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

template <class Bits>
bool any_nonfinite(const void* data, std::size_t begin, std::size_t end, Bits exponent) noexcept {
  const auto* p = static_cast<const Bits*>(data);
  bool found = false;
  for (std::size_t i = begin; i < end; ++i) found |= (p[i] & exponent) == exponent;
  return found;
}

}  // namespace detail

namespace detail {
template <class T>
GradStats stats_of(const T* p, std::size_t begin, std::size_t end) noexcept {
  double sum = 0;
  for (std::size_t i = begin; i < end; ++i) {
    const double x = static_cast<float>(p[i]);
    sum += x * x;
  }
  return {sum, false};
}
}  // namespace detail

/// @brief Sum of squares (in double, in element order) and the non-finite flag of
///        elements [begin, end) of a gradient. The flag tests the exponent bits, so it
///        still works when the consumer compiles with -ffinite-math-only.
inline GradStats grad_stats(const void* data, DType dtype, std::size_t begin, std::size_t end) noexcept {
  GradStats s;
  switch (dtype) {
    case DType::f32:
      s = detail::stats_of(static_cast<const float*>(data), begin, end);
      s.nonfinite = detail::any_nonfinite<std::uint32_t>(data, begin, end, 0x7F800000u);
      break;
    case DType::bf16:
      s = detail::stats_of(static_cast<const bf16*>(data), begin, end);
      s.nonfinite = detail::any_nonfinite<std::uint16_t>(data, begin, end, std::uint16_t{0x7F80});
      break;
    case DType::f16:
      s = detail::stats_of(static_cast<const fp16*>(data), begin, end);
      s.nonfinite = detail::any_nonfinite<std::uint16_t>(data, begin, end, std::uint16_t{0x7C00});
      break;
  }
  return s;
}

/// @brief Runs Adam on the CPU, multi-threaded and vectorised.
class CpuAdamExecutor {
 public:
  /// @param threads 0 for every available hardware thread.
  /// @param simd a forced kernel family, or `automatic`.
  /// @throws std::invalid_argument when @p simd cannot run on this CPU.
  CpuAdamExecutor(unsigned threads, SimdLevel simd) : level_(resolve_simd(simd)), pool_(threads) {}

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
      out[i] = cpu::grad_stats(s.args.grad, s.grad_dtype, c.begin, c.end);
    };
    pool_.parallel_for(chunks.size(), body);
  }

 private:
  SimdLevel level_;
  ThreadPool pool_;
};

}  // namespace dos::cpu
