#pragma once
/// @file
/// @brief The device kernels, as host-callable functions. Declared here for any host
///        compiler; defined in `dos/cuda/kernels.cu` (built by nvcc into `dos::cuda`,
///        for sm_80 and sm_90), from `dos/cuda/adam_kernel.cuh`.

#include "dos/backend/device_segment.hpp"
#include "dos/core/tensor.hpp"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <span>

namespace dos::cuda {

/// @brief Segments per kernel launch: their descriptors travel as the kernel's
///        parameter, so a multi-tensor update needs no descriptor copy.
inline constexpr std::size_t segments_per_launch = 16;

/// @brief Updates every segment (device pointers) with Adam: one launch per
///        `segments_per_launch` segments, on @p stream. Returns at once.
void launch_adam(std::span<const DeviceSegment> segments, cudaStream_t stream);

/// @brief One fused reduction (Thrust on @p stream) over @p count elements; blocks.
GradStats grad_stats(const void* data, DType dtype, std::size_t count, cudaStream_t stream);

}  // namespace dos::cuda
