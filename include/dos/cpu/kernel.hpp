#pragma once
/// @file
/// @brief The contract between the CPU executor and its per-instruction-set kernels:
///        the pointers of one segment and the signature of a range update.

#include "dos/config.hpp"
#include "dos/core/tensor.hpp"
#include "dos/optim/coefficients.hpp"

#include <cstddef>
#include <cstdint>

namespace dos::cpu {

/// @brief The arrays of one segment (a contiguous piece of one tensor), all indexed
///        from the segment's first element.
struct SegmentArgs {
  void* param = nullptr;        ///< the framework's values, in place (float, bf16 or fp16)
  const void* grad = nullptr;   ///< the framework's gradient (float, bf16 or fp16)
  float* master = nullptr;      ///< fp32 master; null when fp32 values are the master themselves
  float* exp_avg = nullptr;     ///< m
  float* exp_avg_sq = nullptr;  ///< v
  float* max_exp_avg_sq = nullptr;  ///< vmax; null without amsgrad
};

/// @brief One segment as every executor sees it: its arrays, its length and its
///        element types. The CPU's `SegmentWork` and the device's `DeviceSegment` are
///        this plus the way each receives the step's coefficients.
struct SegmentDesc {
  SegmentArgs args;
  std::size_t count = 0;     ///< elements
  DType value = DType::f32;  ///< type of `args.param`
  DType grad = DType::f32;   ///< type of `args.grad`
  bool amsgrad = false;      ///< `args.max_exp_avg_sq` is used
};

/// @brief How far ahead of the element it updates a kernel asks for each array it
///        reads: 512 elements, 2 KiB of an fp32 array.
///
/// One core streams four to six arrays at once (value or master, gradient, m, v, and
/// vmax), more than its hardware prefetchers keep ahead of, so without help a 1-thread
/// step waits on memory between bursts. Measured on the 2-vCPU EPYC VM (AVX2; median
/// of paired rounds, against the same step without it): 1.07-1.09x for fp32 and
/// 1.15-1.26x for bf16 at 1 thread, 1.04x and 1.12x at 2, 16M and 128M elements;
/// 128 to 1024 elements ahead did about as well there. On the 2-vCPU Zen 5 VM (AVX-512,
/// about 50 GB/s from one core) the distance mattered: the 1-thread bf16 step ran
/// 1.04-1.07x faster at 512 than at 256 and 0.88-0.93x at 128 (against the same probe,
/// paired); fp32 and two threads moved within noise. One core must keep its streams'
/// bandwidth times latency in flight, and a faster core needs more. A prefetch changes
/// no arithmetic.
inline constexpr std::size_t prefetch_elements = 512;

/// @brief How many vectors a kernel's loop takes per iteration: two.
///
/// The loop loads both, steps both, then stores both, so the two independent Adam
/// chains (a square root and a division each) overlap, and the loop's own overhead is
/// paid once per two vectors. Each element's arithmetic is unchanged. Against one
/// vector per iteration, median of paired rounds: on the 2-vCPU EPYC VM (AVX2, a
/// scratch build) 1.03-1.13x faster for bf16 at one thread, 1.01x for fp32; on the
/// 2-vCPU Xeon VM (AVX-512) 1.014-1.017x for fp32 at one thread and 1.00-1.03x
/// elsewhere. The remainder of a range below two vectors runs one vector, then
/// scalars.
inline constexpr std::size_t unroll_vectors = 2;

/// @brief Hints that @p bytes past @p p will be read soon. Never faults, so it may
///        point past the end of an array; the address is formed as an integer for that.
DOS_ALWAYS_INLINE void prefetch_ahead(const void* p, std::size_t bytes) noexcept {
#if defined(__GNUC__)
  __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<std::uintptr_t>(p) + bytes), 0, 3);
#else
  (void)p, (void)bytes;
#endif
}

/// @brief Updates elements [begin, end) of a segment with the given step coefficients.
using RangeKernel = void (*)(const SegmentArgs&, std::size_t begin, std::size_t end,
                             const AdamCoefficients<float>&);

/// @brief The kernel of a segment whose parameter has no gradient this step: it
///        leaves every array as it is (torch skips a parameter whose `.grad` is None).
inline void skip_range(const SegmentArgs&, std::size_t, std::size_t, const AdamCoefficients<float>&) noexcept {}

}  // namespace dos::cpu
