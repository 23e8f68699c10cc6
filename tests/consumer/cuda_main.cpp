// A consumer of dos::cuda. Where there is no GPU (every machine these tests have run
// on so far) it checks what it can: the nvcc-built library links, constructing a
// CudaBackend throws dos::cuda_error naming the cause, and MissingDevice::use_cpu runs
// the step on the CPU and says why. With a GPU it runs one step on it.
#include <dos/backend/cuda.hpp>
#include <dos/optimizer.hpp>

#include <cstdio>
#include <string>
#include <vector>

namespace {
bool moved_by_one_step(const std::vector<float>& value) { return value[0] < 1.0f && value[0] > 0.998f; }
}  // namespace

int main() {
  const std::string reason = dos::cuda::unavailable_reason();
  std::vector<float> value(1000, 1.0f), grad(1000, 0.5f);
  std::vector<dos::HostParam<float>> params{{value, grad}};
  if (reason.empty()) {
    dos::InterleavedOptimizer<dos::CudaBackend> opt(params, dos::AdamW{}, {.threads = 1});
    const dos::StepReport r = opt.step();
    const bool ok = r.applied && moved_by_one_step(value);
    std::printf("consumer_cuda: GPU step, p[0] = %.6f, %s\n", value[0], ok ? "ok" : "WRONG");
    return ok ? 0 : 1;
  }
  try {
    dos::InterleavedOptimizer<dos::CudaBackend> opt(params, dos::AdamW{}, {.threads = 1});
    std::printf("consumer_cuda: WRONG: constructed a CudaBackend although %s\n", reason.c_str());
    return 1;
  } catch (const dos::cuda_error& e) {
    if (std::string(e.what()).find("dos: no usable CUDA device") != 0) {
      std::printf("consumer_cuda: WRONG: unexpected message: %s\n", e.what());
      return 1;
    }
    std::printf("consumer_cuda: no GPU, as expected: %s\n", e.what());
  }
  dos::InterleavedOptimizer<dos::CudaBackend> opt(params, dos::AdamW{}, {.threads = 1},
                                                  dos::CudaConfig{.on_missing = dos::MissingDevice::use_cpu});
  const dos::StepReport r = opt.step();
  const bool ok = !opt.device_available() && r.applied && moved_by_one_step(value) &&
                  std::string(r.fallback).find("no usable CUDA device") == 0;
  std::printf("consumer_cuda: CPU fallback step, p[0] = %.6f, fallback: %s, %s\n", value[0],
              std::string(r.fallback).c_str(), ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
