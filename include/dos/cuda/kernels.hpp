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

/// @brief The gradient statistics of device memory: one fused CUB reduction. Its device
///        scratch and its pinned result are allocated once, at construction, on the
///        current device: a reduction allocates and frees nothing (a `cudaFree` would
///        synchronise the whole device, inside backward). Failures throw `cuda_error`.
///        One reduction at a time: the scratch is shared.
class GradReduction {
 public:
  /// @throws cuda_error when the allocations fail.
  GradReduction();
  ~GradReduction();
  GradReduction(const GradReduction&) = delete;
  GradReduction& operator=(const GradReduction&) = delete;

  /// @brief Sum of squares and non-finite check of @p count elements at @p data, on
  ///        @p stream; blocks until the result is on the host.
  GradStats operator()(const void* data, DType dtype, std::size_t count, cudaStream_t stream);

 private:
  void* scratch_ = nullptr;
  std::size_t scratch_bytes_ = 0;
  void* result_ = nullptr;  // device
  void* host_ = nullptr;    // pinned
};

}  // namespace dos::cuda
