#pragma once
/// @file
/// @brief The `CpuExecutor` concept: what the optimizer needs from whatever runs Adam
///        on the host, and the work it hands over (segments cut into chunks once, at
///        construction, so a step allocates nothing). `CpuAdamExecutor` is the default.

#include "dos/core/function_ref.hpp"
#include "dos/core/tensor.hpp"
#include "dos/cpu/kernel.hpp"
#include "dos/cpu/simd.hpp"

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace dos::cpu {

/// @brief How the host side runs: threads, kernel family, huge pages. What backends
///        and executors are built from, instead of the optimizer's whole `Options`.
struct CpuConfig {
  /// Threads, the caller included; 0 means every hardware thread this process may use.
  unsigned threads = 0;
  /// Force a kernel family (tests, benchmarks); `automatic` picks the widest.
  SimdLevel simd = SimdLevel::automatic;
  /// Back large host blocks with transparent huge pages.
  bool huge_pages = true;
  /// Pin the threads to these CPUs (`ThreadPool`, `placed_cpus`); empty: not pinned.
  std::vector<int> cpus{};
};

/// @brief One segment as the CPU executor sees it at one step: the descriptor, the
///        range kernel for its types, and its group's coefficients.
struct SegmentWork : SegmentDesc {
  RangeKernel kernel = nullptr;
  const AdamCoefficients<float>* coefficients = nullptr;
};

/// @brief Elements [begin, end) of segment `segment`; the unit one thread runs.
struct Chunk {
  std::uint32_t segment = 0;
  std::size_t begin = 0;
  std::size_t end = 0;
};

/// @brief Elements per chunk: about 1 MB of state traffic, enough to amortise the
///        scheduling, small enough to balance two to a hundred threads.
inline constexpr std::size_t chunk_elements = std::size_t{1} << 15;

/// @brief Padding, in floats, between large arrays that one loop streams together
///        (a page and a half). Arrays a power of two apart ran 3-4x slower at 64M
///        elements on a 2-vCPU EPYC VM (cache-set and DRAM-bank conflicts); staggered,
///        at full speed. Half a page rather than a cache line past the page: with a
///        one-line offset, non-temporal stores to the arrays ran 10x slower.
///        `StateStore` pads large subgroups' state arrays by it, and the bandwidth
///        probe lays its arrays out the same way.
inline constexpr std::size_t stream_stagger = (4096 + 2048) / sizeof(float);

/// @brief Bytes of memory traffic per element of a segment's update: read the
///        gradient; read and write m, v (and vmax); read and write the value, or read
///        and write the master and write (streamed) the value. 28 for fp32 and for
///        bf16 with a master, which is why threads split work by bytes, not elements.
inline std::size_t traffic_per_element(const SegmentDesc& s) noexcept {
  const std::size_t value = dtype_size(s.value), state = s.amsgrad ? 24 : 16;
  return dtype_size(s.grad) + state + (s.args.master != nullptr ? 8 + value : 2 * value);
}

/// @brief Appends the chunks of a segment of @p count elements to @p out.
inline void append_chunks(std::vector<Chunk>& out, std::uint32_t segment, std::size_t count) {
  for (std::size_t b = 0; b < count; b += chunk_elements) out.push_back({segment, b, std::min(count, b + chunk_elements)});
}

/// @brief Runs Adam and the gradient passes on the host.
///
/// Required: construction from a `CpuConfig`; `threads()`; `kernel(value, grad,
/// amsgrad)`, the range kernel for those types (or null for types it cannot run);
/// `run(chunks, work)`, every chunk once, each with its segment's kernel and
/// coefficients, blocking until done; `parallel_for(n, body)`, body(i) for every i in
/// [0, n) (the gradient-statistics pass and accumulation use it, over chunks).
/// Results must not depend on how chunks are spread over threads: each element's
/// arithmetic is the kernel's alone.
/// @code
/// struct Serial {  // one thread, the default kernels
///   explicit Serial(const dos::cpu::CpuConfig&) {}
///   unsigned threads() const { return 1; }
///   dos::cpu::RangeKernel kernel(dos::DType v, dos::DType g, bool a) const {
///     return dos::select_kernel(dos::SimdLevel::scalar, v, g, a);
///   }
///   void run(std::span<const dos::cpu::Chunk> chunks, std::span<const dos::cpu::SegmentWork> work) {
///     for (const auto& c : chunks) {
///       const auto& s = work[c.segment];
///       s.kernel(s.args, c.begin, c.end, *s.coefficients);
///     }
///   }
///   void parallel_for(std::size_t n, dos::FunctionRef<void(std::size_t)> body) {
///     for (std::size_t i = 0; i < n; ++i) body(i);
///   }
/// };
/// static_assert(dos::cpu::CpuExecutor<Serial>);
/// @endcode
template <class E>
concept CpuExecutor =
    std::constructible_from<E, const CpuConfig&> &&
    requires(E& e, const E& ce, std::span<const Chunk> chunks, std::span<const SegmentWork> work,
             std::size_t n, FunctionRef<void(std::size_t)> body, DType t, bool amsgrad) {
      { ce.threads() } -> std::convertible_to<unsigned>;
      { ce.kernel(t, t, amsgrad) } -> std::same_as<RangeKernel>;
      e.run(chunks, work);
      e.parallel_for(n, body);
    };

}  // namespace dos::cpu
