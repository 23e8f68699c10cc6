// Conan's test of a dos package built with cuda=True: dos::cuda links (with the CUDA
// runtime from the consumer's toolkit); without a GPU, a CudaBackend with
// MissingDevice::use_cpu steps on the CPU and says why.
#include <dos/backend/cuda.hpp>
#include <dos/optimizer.hpp>

#include <cstdio>
#include <string>
#include <vector>

int main() {
  std::vector<float> value(64, 1.0f), grad(64, 0.25f);
  std::vector<dos::HostParam<float>> params{{value, grad}};
  dos::InterleavedOptimizer<dos::CudaBackend> opt(params, dos::AdamW{.lr = 1e-3}, {.threads = 1},
                                                  dos::CudaConfig{.on_missing = dos::MissingDevice::use_cpu});
  const dos::StepReport r = opt.step();
  const bool ok = r.applied && value[0] < 1.0f && value[0] > 0.998f &&
                  (opt.device_available() || !std::string(r.fallback).empty());
  std::printf("dos::cuda from Conan: device %s, p[0] = %.6f, %s\n",
              opt.device_available() ? "used" : std::string(r.fallback).c_str(), value[0], ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
