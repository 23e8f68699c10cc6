#pragma once
/// @file
/// @brief `CpuAdamExecutor`, the default `CpuExecutor`: range kernels over a persistent
///        thread pool.
///
/// Each chunk runs with the default floating-point environment (round to nearest,
/// no flush-to-zero, no denormals-are-zero): a consumer linked with -ffast-math sets
/// FTZ/DAZ for the whole process, and the results must not change with it.

#include "dos/core/tensor.hpp"
#include "dos/cpu/executor.hpp"
#include "dos/cpu/numa.hpp"
#include "dos/cpu/grad_stats.hpp"
#include "dos/cpu/kernel.hpp"
#include "dos/cpu/simd.hpp"
#include "dos/cpu/thread_pool.hpp"

#include <cstddef>
#include <cstdint>
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

// Updates chunk i with its segment's kernel and coefficients.
struct UpdateChunk {
  std::span<const Chunk> chunks;
  std::span<const SegmentWork> segments;
  void operator()(std::size_t i) const {
    [[maybe_unused]] const DefaultFloatEnvironment fenv;
    const Chunk& c = chunks[i];
    const SegmentWork& s = segments[c.segment];
    s.kernel(s.args, c.begin, c.end, *s.coefficients);
  }
};

}  // namespace detail

/// @brief Runs Adam on the CPU, multi-threaded and vectorised.
class CpuAdamExecutor {
 public:
  /// @throws std::invalid_argument when `config.simd` cannot run on this CPU.
  explicit CpuAdamExecutor(const CpuConfig& config = {})
      : level_(resolve_simd(config.simd)), pool_(config.threads, config.cpus), numa_(numa_layout()) {}

  unsigned threads() const noexcept { return pool_.size(); }
  /// @brief The NUMA nodes this process's threads may run on, as seen at construction.
  ///        The state is first touched by the threads that update it (`StateStore`),
  ///        so its pages follow them; threads that span nodes still cross sockets.
  const NumaLayout& numa() const noexcept { return numa_; }
  /// @brief The CPUs the threads are pinned to (`Options::placement`); empty: not pinned.
  const std::vector<int>& cpus() const noexcept { return pool_.cpus(); }
  SimdLevel simd_level() const noexcept { return level_; }
  ThreadPool& pool() noexcept { return pool_; }

  /// @brief The kernel this executor uses for the given types.
  RangeKernel kernel(DType value, DType grad, bool amsgrad) const {
    return select_kernel(level_, value, grad, amsgrad);
  }

  /// @brief Updates every chunk. Blocks until done. Each thread runs one contiguous
  ///        run of chunks carrying an equal share of the bytes of traffic (chunks are
  ///        laid out in state order, so that is one stretch of every array it touches).
  void run(std::span<const Chunk> chunks, std::span<const SegmentWork> segments) {
    detail::UpdateChunk body{chunks, segments};
    pool_.parallel_for_weighted(
        chunks.size(),
        [&](std::size_t i) { return (chunks[i].end - chunks[i].begin) * traffic_per_element(segments[chunks[i].segment]); },
        body);
  }

  /// @brief `run` with the scheduling it replaced: every thread takes the next chunk
  ///        from one shared counter, so threads interleave across the same arrays.
  ///        The same bits; kept so that benchmarks can compare the two.
  void run_interleaved(std::span<const Chunk> chunks, std::span<const SegmentWork> segments) {
    detail::UpdateChunk body{chunks, segments};
    pool_.parallel_for_interleaved(chunks.size(), body);
  }

  /// @brief Runs @p body(i) for every i in [0, n) on the pool, one contiguous range of
  ///        indices per thread (the gradient passes run over chunks in state order).
  void parallel_for(std::size_t n, FunctionRef<void(std::size_t)> body) { pool_.parallel_for(n, body); }

 private:
  SimdLevel level_;
  ThreadPool pool_;
  NumaLayout numa_;
};
static_assert(CpuExecutor<CpuAdamExecutor>);

}  // namespace dos::cpu
