#pragma once
/// @file
/// @brief `dos::cuda_error` and the checks around CUDA runtime calls. Host code; needs
///        the CUDA runtime headers (link `CUDA::cudart`), not nvcc. No {fmt}, so the
///        nvcc-compiled kernels can use it.

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>
#include <string_view>

namespace dos {

/// @brief A CUDA runtime call failed, or there is no usable device.
class cuda_error : public std::runtime_error {
 public:
  cuda_error(std::string_view what, cudaError_t code)
      : std::runtime_error("dos: " + std::string(what) + ": " + cudaGetErrorString(code) + " (" +
                           cudaGetErrorName(code) + ", error " + std::to_string(static_cast<int>(code)) + ")"),
        code_(code) {}
  explicit cuda_error(const std::string& what) : std::runtime_error(what), code_(cudaErrorUnknown) {}
  cudaError_t code() const noexcept { return code_; }

 private:
  cudaError_t code_;
};

namespace cuda {
/// @brief Throws `cuda_error` naming @p call when @p code is not success.
inline void check(cudaError_t code, std::string_view call) {
  if (code != cudaSuccess) throw cuda_error(call, code);
}
}  // namespace cuda

}  // namespace dos
