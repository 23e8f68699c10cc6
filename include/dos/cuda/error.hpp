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
/// @brief Throws `cuda_error` naming @p call (and @p file:@p line when given) when
///        @p code is not success. The runtime's last-error state is cleared first, so
///        the next unrelated call does not report this failure as its own.
inline void check(cudaError_t code, std::string_view call, const char* file = nullptr, int line = 0) {
  if (code == cudaSuccess) return;
  (void)cudaGetLastError();
  if (file == nullptr) throw cuda_error(call, code);
  throw cuda_error(std::string(call) + " at " + file + ":" + std::to_string(line), code);
}
}  // namespace cuda

}  // namespace dos

/// @brief Checks a CUDA runtime call, naming its text, file and line in the `cuda_error`.
#define DOS_CUDA_CHECK(call) ::dos::cuda::check((call), #call, __FILE__, __LINE__)
