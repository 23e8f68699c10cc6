#pragma once
/// @file
/// @brief The memory-bandwidth limit of an Adam-shaped update: a loop that reads four
///        float arrays and writes three back in place (28 B per element), with next to
///        no arithmetic. A CPU Adam can at best match its rate.
///
/// For the probe to be a ceiling it must be at least as good a streamer as the step:
/// it runs in the same split over threads as the step (one contiguous range each),
/// and in variants: the plain loop as the compiler builds it for the consumer's flags
/// (baseline x86-64 unless told otherwise), and the loop compiled for the widest
/// instruction set of the machine at run time (like the kernels), with ordinary or
/// with non-temporal stores. The limit is the fastest variant; a step faster than it
/// means the probe, not the step, is wrong.

#include "dos/config.hpp"
#include "dos/cpu/executor.hpp"
#include "dos/cpu/kernel.hpp"
#include "dos/cpu/simd.hpp"
#include "dos/cpu/thread_pool.hpp"
#include "dos/memory/host_resource.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#if DOS_X86_DISPATCH
#include <immintrin.h>
#endif

namespace dos {

/// @brief Bytes of memory traffic per element of an Adam-shaped update
///        (read p, g, m, v; write p, m, v; fp32).
inline constexpr double adam_bytes_per_element = 28.0;

/// @brief How the probe's loop is built.
enum class ProbeVariant : std::uint8_t {
  plain,             ///< the portable loop, compiled with the consumer's flags
  native,            ///< vector loop of the widest instruction set here, ordinary stores
  native_streaming,  ///< the same with non-temporal stores (when the arrays allow them)
  native_prefetch,   ///< the vector loop asking for its arrays ahead, as the kernels do
};

/// @brief Every variant, in report order.
inline constexpr std::array<ProbeVariant, 4> probe_variants{ProbeVariant::plain, ProbeVariant::native,
                                                            ProbeVariant::native_streaming, ProbeVariant::native_prefetch};

/// @brief Human-readable name, for reports.
constexpr std::string_view probe_name(ProbeVariant v) noexcept {
  switch (v) {
    case ProbeVariant::plain: return "plain";
    case ProbeVariant::native: return "native";
    case ProbeVariant::native_streaming: return "native-nt";
    case ProbeVariant::native_prefetch: return "native-pf";
  }
  return "?";
}

/// @brief One pass of the plain probe over elements [begin, end).
inline void adam_shaped_pass(float* p, const float* g, float* m, float* v, std::size_t begin, std::size_t end) noexcept {
  for (std::size_t i = begin; i < end; ++i) {
    const float gi = g[i];
    const float mi = m[i] + gi;
    const float vi = v[i] + gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] - mi - vi;
  }
}

namespace detail {

#if DOS_X86_DISPATCH
// The vector probes, one per instruction set, each in its own target region. The
// streaming form needs p, m and v equally aligned to the vector width; it runs a
// scalar head up to that alignment and otherwise falls back to ordinary stores. The
// prefetching form asks for every array as far ahead as the kernels do (cpu/kernel.hpp).
#define DOS_PROBE_LOOP(NAME, TARGET, VEC, WIDTH, LOADU, STORE, STREAM, ADD, SUB)                                     \
  template <bool Stream, bool Prefetch = false>                                                                       \
  __attribute__((target(TARGET))) inline void NAME(float* p, const float* g, float* m, float* v, std::size_t begin,   \
                                                   std::size_t end) noexcept {                                        \
    constexpr std::uintptr_t bytes = (WIDTH) * sizeof(float);                                                         \
    const auto misaligned = [&](const float* x) { return reinterpret_cast<std::uintptr_t>(x) % bytes; };            \
    std::size_t i = begin;                                                                                            \
    if (Stream) {                                                                                                     \
      for (; i < end && misaligned(p + i) != 0; ++i) adam_shaped_pass(p, g, m, v, i, i + 1);                          \
      if (misaligned(m + i) != 0 || misaligned(v + i) != 0) return NAME<false, Prefetch>(p, g, m, v, i, end);         \
    }                                                                                                                 \
    for (; i + (WIDTH) <= end; i += (WIDTH)) {                                                                        \
      if (Prefetch && i % (64 / sizeof(float)) < (WIDTH)) { /* once per 64-byte line */                              \
        constexpr std::size_t ahead = cpu::prefetch_elements * sizeof(float);                                         \
        cpu::prefetch_ahead(p + i, ahead);                                                                            \
        cpu::prefetch_ahead(g + i, ahead);                                                                            \
        cpu::prefetch_ahead(m + i, ahead);                                                                            \
        cpu::prefetch_ahead(v + i, ahead);                                                                            \
      }                                                                                                               \
      const VEC gi = LOADU(g + i);                                                                                    \
      const VEC mi = ADD(LOADU(m + i), gi);                                                                           \
      const VEC vi = ADD(LOADU(v + i), gi);                                                                           \
      const VEC pi = SUB(SUB(LOADU(p + i), mi), vi);                                                                  \
      if (Stream) {                                                                                                   \
        STREAM(m + i, mi);                                                                                            \
        STREAM(v + i, vi);                                                                                            \
        STREAM(p + i, pi);                                                                                            \
      } else {                                                                                                        \
        STORE(m + i, mi);                                                                                             \
        STORE(v + i, vi);                                                                                             \
        STORE(p + i, pi);                                                                                             \
      }                                                                                                               \
    }                                                                                                                 \
    adam_shaped_pass(p, g, m, v, i, end);                                                                             \
    if (Stream) _mm_sfence();                                                                                         \
  }

DOS_PROBE_LOOP(probe_avx2, "avx2", __m256, 8, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_stream_ps, _mm256_add_ps,
               _mm256_sub_ps)
DOS_PROBE_LOOP(probe_avx512, "avx512f", __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_stream_ps,
               _mm512_add_ps, _mm512_sub_ps)
#undef DOS_PROBE_LOOP
#endif

using ProbeLoop = void (*)(float*, const float*, float*, float*, std::size_t, std::size_t) noexcept;

inline ProbeLoop probe_loop(ProbeVariant variant) noexcept {
#if DOS_X86_DISPATCH
  switch (variant == ProbeVariant::plain ? SimdLevel::scalar : detect_simd()) {
    case SimdLevel::avx512:
      return variant == ProbeVariant::native_streaming  ? &probe_avx512<true>
             : variant == ProbeVariant::native_prefetch ? &probe_avx512<false, true>
                                                        : &probe_avx512<false>;
    case SimdLevel::avx2:
      return variant == ProbeVariant::native_streaming  ? &probe_avx2<true>
             : variant == ProbeVariant::native_prefetch ? &probe_avx2<false, true>
                                                        : &probe_avx2<false>;
    default: break;
  }
#else
  (void)variant;
#endif
  return &adam_shaped_pass;
}

}  // namespace detail

/// @brief One pass of the probe over all elements, spread over @p pool in contiguous
///        ranges of the same chunks the CPU executor uses.
inline void adam_shaped_pass(ThreadPool& pool, std::span<float> p, std::span<const float> g, std::span<float> m,
                             std::span<float> v, ProbeVariant variant = ProbeVariant::plain) {
  const std::size_t n = p.size();
  const std::size_t chunks = (n + cpu::chunk_elements - 1) / cpu::chunk_elements;
  const detail::ProbeLoop loop = detail::probe_loop(variant);
  auto body = [&](std::size_t c) {
    const std::size_t b = c * cpu::chunk_elements;
    loop(p.data(), g.data(), m.data(), v.data(), b, std::min(n, b + cpu::chunk_elements));
  };
  pool.parallel_for(chunks, body);
}

/// @brief The probe's limit: the fastest variant, in elements per second.
struct ProbeLimit {
  double elements_per_second = 0;
  ProbeVariant variant = ProbeVariant::plain;
};

/// @brief The probe's four arrays laid out as the optimizer's state is: one block on
///        transparent huge pages, the arrays `cpu::stream_stagger` apart and 64-byte
///        aligned (so the non-temporal variant streams). The probe then pays no TLB
///        miss and no set conflict that the step does not.
struct ProbeArrays {
  /// @param count elements per array.
  explicit ProbeArrays(std::size_t count)
      : n(count), block(4 * (count + cpu::stream_stagger), HostResource{.huge_pages = true}), p(array(0)), g(array(1)),
        m(array(2)), v(array(3)) {
    std::fill(p.begin(), p.end(), 1.0f);
    std::fill(g.begin(), g.end(), 1e-3f);
  }
  /// @brief One pass of @p variant over the arrays.
  void pass(ThreadPool& pool, ProbeVariant variant) { adam_shaped_pass(pool, p, g, m, v, variant); }

  std::size_t n;                 ///< elements per array
  HostBuffer<float> block;       ///< the memory of all four
  std::span<float> p, g, m, v;   ///< the arrays, inside `block`

 private:
  std::span<float> array(std::size_t k) { return block.span().subspan(k * (n + cpu::stream_stagger), n); }
};

/// @brief Runs every variant @p repetitions times over @p a (after one pass to touch
///        it) and returns the fastest. Not for `step()`: the caller owns the arrays.
inline ProbeLimit measure_probe_limit(ThreadPool& pool, ProbeArrays& a, int repetitions = 5) {
  ProbeLimit best;
  for (const ProbeVariant variant : probe_variants) {
    a.pass(pool, variant);
    for (int r = 0; r < repetitions; ++r) {
      const auto t = std::chrono::steady_clock::now();
      a.pass(pool, variant);
      const double rate =
          static_cast<double>(a.n) / std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
      if (rate > best.elements_per_second) best = {rate, variant};
    }
  }
  return best;
}

}  // namespace dos
