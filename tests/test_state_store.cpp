// The state store: every byte of every block is written at construction, whatever the
// memory held before (the blocks are zeroed by the threads that will update them, the
// pad between arrays by the constructing thread), and the masters hold the values.

#include <doctest/doctest.h>
#include <dos/cpu/cpu_adam.hpp>
#include <dos/partition/greedy_partitioner.hpp>
#include <dos/state/state_store.hpp>

#include <cmath>
#include <cstring>
#include <vector>

namespace {

// Memory that arrives full of NaN bytes, as a pinned pool reused from earlier work might.
struct PoisonedResource {
  void* allocate(std::size_t bytes, std::size_t alignment) const {
    void* p = dos::HostResource{}.allocate(bytes, alignment);
    std::memset(p, 0xFF, bytes);
    return p;
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) const noexcept {
    dos::HostResource{}.deallocate(p, bytes, alignment);
  }
};

}  // namespace

TEST_CASE("every block is zero but the masters, which hold the values, whatever the memory held") {
  // A large bf16 tensor: its subgroup is staggered (the pad is written too) and has a
  // master; with and without amsgrad (a vmax array).
  const std::size_t big = dos::StateStore<PoisonedResource>::stagger_from + 4097;
  std::vector<dos::bf16> v16(big), g16(big);
  for (std::size_t i = 0; i < big; ++i) v16[i] = dos::bf16(0.001f * static_cast<float>(i % 1000));
  const std::vector<dos::HostParam<dos::bf16>> p16{{v16, g16}};
  for (const unsigned threads : {1u, 2u, 3u}) {
    for (const bool amsgrad : {false, true}) {
      dos::cpu::CpuAdamExecutor cpu(dos::cpu::CpuConfig{.threads = threads});
      dos::ParamTable table(p16, {0}, false, false);
      dos::GreedyPartitioner partitioner(1 << 20);
      dos::StateStore<PoisonedResource> store(
          [&](std::span<const std::size_t> sizes) { return partitioner.partition(sizes); }, table, {amsgrad},
          PoisonedResource{},
          [&](const dos::TensorView& v, std::size_t off, std::span<float> out) {
            for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(static_cast<const dos::bf16*>(v.data)[off + i]);
          },
          cpu);
      std::size_t nonzero = 0, masters = 0;
      for (std::size_t s = 0; s < store.blocks().size(); ++s) {
        const auto& b = store.blocks()[s];
        const std::size_t n = store.subgroups()[s].state_elements;
        for (const float* array : {b.exp_avg, b.exp_avg_sq, b.max_exp_avg_sq})
          if (array != nullptr)
            for (std::size_t i = 0; i < n; ++i) nonzero += array[i] != 0.0f || std::signbit(array[i]);
        REQUIRE(b.master != nullptr);
        for (std::uint32_t k = b.first_segment; k < b.end_segment; ++k) {
          const auto& seg = *store.segments()[k].segment;
          for (std::size_t i = 0; i < seg.count; ++i)
            masters += b.master[seg.state_offset + i] != static_cast<float>(v16[seg.tensor_offset + i]);
        }
        // The pad after the last segment: zero.
        for (std::size_t i = n - dos::StateStore<PoisonedResource>::state_stagger; i < n; ++i)
          nonzero += b.master[i] != 0.0f;
      }
      CHECK_MESSAGE(nonzero == 0, threads, " threads, amsgrad ", amsgrad);
      CHECK_MESSAGE(masters == 0, threads, " threads, amsgrad ", amsgrad);
    }
  }
}
