#pragma once
/// @file
/// @brief `DeviceSegment`: what one device Adam launch updates. Dependency-free (no
///        {fmt}, no CUDA), shared by the backends and the nvcc-compiled kernels.

#include "dos/core/grad_stats.hpp"
#include "dos/core/tensor.hpp"
#include "dos/cpu/kernel.hpp"
#include "dos/optim/coefficients.hpp"

namespace dos {

/// @brief One contiguous piece of a device Adam launch: the segment descriptor every
///        executor shares, with device pointers (`args.master` null when fp32 values
///        are their own master), and the coefficients by value, since they travel into
///        the kernel's parameters.
struct DeviceSegment : cpu::SegmentDesc {
  AdamCoefficients<float> coefficients{};
};

}  // namespace dos
