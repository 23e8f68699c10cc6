#pragma once
/// @file
/// @brief `DeviceSegment`: what one device Adam launch updates. Dependency-free (no
///        {fmt}, no CUDA), shared by the backends and the nvcc-compiled kernels.

#include "dos/core/tensor.hpp"
#include "dos/cpu/kernel.hpp"
#include "dos/optim/coefficients.hpp"

#include <cstddef>

namespace dos {

/// @brief One contiguous piece of a device Adam launch. Pointers are device
///        addresses; `args.master` is null when fp32 values are their own master.
struct DeviceSegment {
  cpu::SegmentArgs args;
  std::size_t count = 0;
  DType value = DType::f32;
  DType grad = DType::f32;
  bool amsgrad = false;
  AdamCoefficients<float> coefficients{};
};

/// @brief A fused pass over a gradient: its sum of squares, in double, and whether it
///        holds an inf or a NaN. Global-norm clipping and the overflow check need both.
struct GradStats {
  double sum_squares = 0;
  bool nonfinite = false;
};

}  // namespace dos
