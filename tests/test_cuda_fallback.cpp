// The CUDA backend where there may be no GPU: construction either works (a GPU is
// there) or fails with a clear dos::cuda_error; with MissingDevice::use_cpu the
// optimizer runs everything on the CPU, bit for bit as CpuOptimizer, and says why.

#include "support/backend_compare.hpp"

#include <doctest/doctest.h>
#include <dos/backend/cuda.hpp>
#include <dos/optimizer.hpp>

#include <string>
#include <vector>

using namespace dos;

TEST_CASE("constructing a CudaBackend without a GPU throws cuda_error naming the cause") {
  const std::string reason = cuda::unavailable_reason();
  if (reason.empty()) {
    CudaBackend b;  // a GPU is here: construction works
    CHECK(b.available());
    CHECK(b.staging_bytes_available() > 0);
    return;
  }
  MESSAGE(reason);
  CHECK(reason.find("no usable CUDA device") == 0);
  try {
    CudaBackend b;
    FAIL("constructed a CudaBackend without a GPU");
  } catch (const cuda_error& e) {
    CHECK(std::string(e.what()).find("dos: no usable CUDA device") == 0);
  }
}

TEST_CASE("MissingDevice::use_cpu: every step on the CPU, identical to CpuOptimizer, with the reason reported") {
  if (cuda::unavailable_reason().empty()) {
    MESSAGE("a GPU is present; the fallback path is exercised on machines without one");
    return;
  }
  std::vector<test::TensorSpec> specs = test::one_per_subgroup(6, 256, 3);
  for (auto& s : specs) s.device = Device::host;
  test::MixedModel host(specs, test::two_groups, true), other(specs, test::two_groups, true);
  CpuOptimizer reference(host.groups(), Options{.subgroup_elements = 256, .threads = 1});
  InterleavedOptimizer<CudaBackend> opt(other.groups(), Options{.subgroup_elements = 256, .threads = 1},
                                        CudaConfig{.on_missing = MissingDevice::use_cpu});
  CHECK_FALSE(opt.device_available());
  for (int t = 1; t <= 10; ++t) {
    host.set_gradients(t);
    other.set_gradients(t);
    reference.step();
    const StepReport r = opt.step();
    CHECK(r.applied);
    CHECK(std::string(r.fallback).find("no usable CUDA device") == 0);
  }
  CHECK(host.value_bytes() == other.value_bytes());
  CHECK(test::same_bits(test::all_state(reference), test::all_state(opt)));
}

TEST_CASE("without a GPU, tensors that claim to live on the device are rejected clearly") {
  if (cuda::unavailable_reason().empty()) return;
  std::vector<float> v(16, 1.0f), g(16, 0.0f);
  std::vector<test::MixedParam> params{{v.data(), g.data(), 16, DType::f32, Device::device}};
  CHECK_THROWS_WITH_AS(InterleavedOptimizer<CudaBackend>(params, Adam{}, {}, CudaConfig{.on_missing = MissingDevice::use_cpu}),
                       "dos: parameter 0: its value lives on a device, but this backend, which has no usable device, "
                       "updates host memory only",
                       std::invalid_argument);
}
