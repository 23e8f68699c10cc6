#pragma once
/// @file
/// @brief The contract between the CPU executor and its per-instruction-set kernels:
///        the pointers of one segment and the signature of a range update.

#include "dos/core/tensor.hpp"
#include "dos/optim/coefficients.hpp"

#include <cstddef>

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

/// @brief Updates elements [begin, end) of a segment with the given step coefficients.
using RangeKernel = void (*)(const SegmentArgs&, std::size_t begin, std::size_t end,
                             const AdamCoefficients<float>&);

/// @brief The kernel of a segment whose parameter has no gradient this step: it
///        leaves every array as it is (torch skips a parameter whose `.grad` is None).
inline void skip_range(const SegmentArgs&, std::size_t, std::size_t, const AdamCoefficients<float>&) noexcept {}

}  // namespace dos::cpu
