// Prints a digest of the optimizer state after a short run, for every CPU kernel
// family and parameter type. Built with different compiler flags (-ffast-math,
// -fno-math-errno, -march=native) by tests/CMakeLists.txt; every build must print
// the same digests. Gradients are tiny so that v goes subnormal: a process linked
// with -ffast-math runs with flush-to-zero, which the executor must undo.

#include "support/inputs.hpp"

#include <dos/optimizer.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

std::uint64_t digest(std::uint64_t h, const void* data, std::size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001B3ull;  // FNV-1a
  return h;
}

template <class T>
std::uint64_t run(dos::SimdLevel level, bool amsgrad) {
  const std::size_t sizes[] = {1, 37, 1000, 4099};
  std::vector<std::vector<T>> values, grads;
  std::vector<dos::HostParam<T>> params;
  for (std::size_t t = 0; t < 4; ++t) {
    values.emplace_back(sizes[t]);
    grads.emplace_back(sizes[t]);
    for (std::size_t i = 0; i < sizes[t]; ++i) values[t][i] = T(dos::test::initial_param(t, i));
  }
  for (std::size_t t = 0; t < 4; ++t) params.push_back({values[t], grads[t]});
  dos::AdamW hyper{.lr = 1e-2, .weight_decay = 0.1, .amsgrad = amsgrad};
  dos::InterleavedOptimizer<> opt(params, hyper, {.subgroup_elements = 2000, .threads = 2, .simd = level});
  for (int step = 1; step <= 6; ++step) {
    // Steps 1-3 have tiny gradients (subnormal squares), 4-6 ordinary ones.
    const float scale = step <= 3 ? 1e-20f : 1.0f;
    for (std::size_t t = 0; t < 4; ++t)
      for (std::size_t i = 0; i < sizes[t]; ++i) grads[t][i] = T(dos::test::gradient(t, step, i) * scale);
    opt.step();
  }
  std::uint64_t h = 0xCBF29CE484222325ull;
  for (std::size_t t = 0; t < 4; ++t) {
    std::vector<float> buf(sizes[t]);
    for (auto kind : {dos::StateKind::master, dos::StateKind::exp_avg, dos::StateKind::exp_avg_sq}) {
      opt.read_state(t, kind, buf);
      h = digest(h, buf.data(), buf.size() * sizeof(float));
    }
    h = digest(h, values[t].data(), values[t].size() * sizeof(T));
  }
  return h;
}

}  // namespace

int main() {
  for (auto level : {dos::SimdLevel::scalar, dos::SimdLevel::avx2, dos::SimdLevel::avx512}) {
    if (!dos::simd_supported(level)) {
      std::printf("%s unsupported\n", dos::simd_name(level).data());
      continue;
    }
    for (bool amsgrad : {false, true})
      std::printf("%s amsgrad=%d f32=%016llx bf16=%016llx f16=%016llx\n", dos::simd_name(level).data(), amsgrad,
                  static_cast<unsigned long long>(run<float>(level, amsgrad)),
                  static_cast<unsigned long long>(run<dos::bf16>(level, amsgrad)),
                  static_cast<unsigned long long>(run<dos::fp16>(level, amsgrad)));
  }
}
