// NcclCommunicator on a real GPU, as one rank (a device check machine has one GPU, and
// NCCL puts one rank on each): the Communicator contract on host buffers (staged
// through the device) and on device buffers (given to NCCL as they are), uneven
// counts included, and an optimizer agreeing over it. Without a GPU the process exits
// with 77, which CTest reports as skipped. The collectives' logic across several ranks
// is the same group of broadcasts and reduces; tests/support/collectives.hpp holds the
// contract every communicator is checked against.

#include "../support/collectives.hpp"

#include <dos/cuda/nccl.hpp>
#include <dos/optimizer.hpp>

#include <cuda_runtime_api.h>

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

namespace {

int failures = 0;
void expect(bool ok, const std::string& what) {
  if (ok) return;
  ++failures;
  std::fprintf(stderr, "FAILED: %s\n", what.c_str());
}

// all_gather and reduce_scatter on spans that live on the device.
void device_buffers(dos::cuda::NcclCommunicator& c) {
  const std::vector<float> host{1.5f, -2.0f, 3.25f, 0.0f, 7.0f};
  float* d = nullptr;
  DOS_CUDA_CHECK(cudaMalloc(&d, 2 * host.size() * sizeof(float)));
  DOS_CUDA_CHECK(cudaMemcpy(d, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  const std::vector<std::size_t> counts{host.size()};
  c.all_gather(std::span<const float>(d, host.size()), std::span<float>(d + host.size(), host.size()), counts);
  std::vector<float> back(host.size());
  DOS_CUDA_CHECK(cudaMemcpy(back.data(), d + host.size(), back.size() * sizeof(float), cudaMemcpyDeviceToHost));
  expect(back == host, "all_gather on device buffers");
  c.reduce_scatter(std::span<const float>(d, host.size()), std::span<float>(d + host.size(), host.size()), counts);
  DOS_CUDA_CHECK(cudaMemcpy(back.data(), d + host.size(), back.size() * sizeof(float), cudaMemcpyDeviceToHost));
  expect(back == host, "reduce_scatter on device buffers");
  // A device source with a host destination, and the other way round.
  std::vector<float> out(host.size());
  c.all_gather(std::span<const float>(d, host.size()), out, counts);
  expect(out == host, "all_gather from the device into host memory");
  DOS_CUDA_CHECK(cudaFree(d));
}

// A framework-sharded optimizer agreeing over NCCL: with one rank, the same bits as
// one that knows no ranks, clipping included.
void optimizer_over_nccl(dos::cuda::NcclCommunicator&& c) {
  std::vector<float> v1(3000), g1(3000), v2(3000), g2(3000);
  for (std::size_t i = 0; i < v1.size(); ++i) {
    v1[i] = v2[i] = 0.001f * static_cast<float>(i % 97);
    g1[i] = g2[i] = 0.01f * static_cast<float>(i % 13) - 0.05f;
  }
  std::vector<dos::HostParam<float>> p1{{v1, g1}}, p2{{v2, g2}};
  dos::Options o{.threads = 1, .max_grad_norm = 0.5};
  dos::CpuOptimizer alone(p1, dos::AdamW{}, o);
  o.communicator = std::move(c);
  dos::CpuOptimizer agreed(p2, dos::AdamW{}, o);
  for (int s = 0; s < 3; ++s) {
    const auto a = alone.step(), b = agreed.step();
    expect(a.grad_norm == b.grad_norm, "the norm over NCCL differs from the local one");
  }
  expect(v1 == v2, "the optimizer over NCCL diverged from the one without ranks");
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no usable GPU (%s)\n", cudaGetErrorString(cudaGetLastError()));
    return 77;
  }
  try {
    ncclUniqueId id;
    dos::cuda::check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    dos::cuda::NcclCommunicator c(id, 0, 1, 0, 1);
    for (const auto& f : dos::test::check_collectives(dos::AnyCommunicator(std::move(c)))) expect(false, f);
    dos::cuda::check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");  // an id serves one communicator
    dos::cuda::NcclCommunicator d(id, 0, 1, 0, 1);
    device_buffers(d);
    // Bootstrap over a host communicator (here the single process).
    dos::SingleProcess host;
    optimizer_over_nccl(dos::cuda::NcclCommunicator::bootstrap(host));
    try {
      dos::cuda::NcclCommunicator bad(id, 1, 1, 0, 1);
      expect(false, "rank 1 of 1 was accepted");
    } catch (const std::invalid_argument& e) {
      expect(std::string(e.what()).find("rank 1 of 1") != std::string::npos, std::string("message: ") + e.what());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAILED: unexpected exception: %s\n", e.what());
    return 1;
  }
  std::printf("nccl: %d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}
