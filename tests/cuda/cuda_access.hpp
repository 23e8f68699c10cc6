#pragma once
// How the GPU tests reach device memory: cudaMemcpy.

#include <dos/backend/cuda.hpp>

#include <cstddef>

namespace dos::test {

struct CudaAccess {
  using Memory = cuda::DeviceMemory;
  static Memory memory() { return Memory{}; }
  static void write(void* device, const void* host, std::size_t bytes) {
    cuda::check(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to the device");
    // A pageable cudaMemcpy may return before the DMA lands; dos's streams are
    // non-blocking, so make the data visible to them.
    cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  static void read(void* host, const void* device, std::size_t bytes) {
    cuda::check(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy from the device");
  }
};

}  // namespace dos::test
