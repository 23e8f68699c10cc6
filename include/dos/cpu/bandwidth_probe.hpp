#pragma once
/// @file
/// @brief The memory-bandwidth limit of an Adam-shaped update: loops that move what the
///        step moves (28 B per element) with next to no arithmetic. A CPU Adam can at
///        best match their rate.
///
/// Two shapes, one per kind of step: `fp32` reads four float arrays and writes three
/// back in place (the fp32 step: p, g, m, v); `mixed16` reads an fp32 master, a 16-bit
/// gradient, m and v, writes the three fp32 arrays back and a 16-bit copy (the bf16 or
/// fp16 step). Both are 28 B per element, but not the same streams: a 16-bit step is
/// measured against the `mixed16` probe.
///
/// For the probe to be a ceiling it must be at least as good a streamer as the step:
/// it runs in the same split over threads as the step (one contiguous range each),
/// and in variants: the plain loop as the compiler builds it for the consumer's flags
/// (baseline x86-64 unless told otherwise), and the loop compiled for the widest
/// instruction set of the machine at run time (like the kernels), with ordinary or
/// with non-temporal stores, with or without software prefetching. The limit is the
/// fastest variant; a step faster than it means the probe, not the step, is wrong.

#include "dos/config.hpp"
#include "dos/core/float16.hpp"
#include "dos/core/tensor.hpp"
#include "dos/cpu/executor.hpp"
#include "dos/cpu/kernel.hpp"
#include "dos/cpu/simd.hpp"
#include "dos/cpu/thread_pool.hpp"
#include "dos/error.hpp"
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

/// @brief Which step's traffic the probe moves (both 28 B per element).
enum class ProbeShape : std::uint8_t {
  fp32,     ///< read p, g, m, v; write p, m, v (fp32 values)
  mixed16,  ///< read master, 16-bit g, m, v; write master, m, v and a 16-bit copy
};

/// @brief Human-readable name, for reports.
constexpr std::string_view probe_shape_name(ProbeShape s) noexcept { return s == ProbeShape::fp32 ? "fp32" : "mixed16"; }

/// @brief The probe shape of a step whose values are of type @p value.
constexpr ProbeShape probe_shape_of(DType value) noexcept {
  return value == DType::f32 ? ProbeShape::fp32 : ProbeShape::mixed16;
}

/// @brief How the probe's loop is built.
///
/// "Non-temporal": in the `fp32` shape every store streams (a trick the fp32 step does
/// not use, tried in case it is faster); in the `mixed16` shape the 16-bit copy
/// streams, as the 16-bit step's does (its other stores go back to lines it has just
/// read, where streaming would only evict them).
enum class ProbeVariant : std::uint8_t {
  plain,                       ///< the portable loop, compiled with the consumer's flags
  native,                      ///< vector loop of the widest instruction set here, ordinary stores
  native_streaming,            ///< the same with non-temporal stores (when the arrays allow them)
  native_prefetch,             ///< the vector loop asking for its arrays ahead, as the kernels do
  native_streaming_prefetch,   ///< both: the way the 16-bit step runs
};

/// @brief Every variant, in report order.
inline constexpr std::array<ProbeVariant, 5> probe_variants{
    ProbeVariant::plain, ProbeVariant::native, ProbeVariant::native_streaming, ProbeVariant::native_prefetch,
    ProbeVariant::native_streaming_prefetch};

/// @brief Human-readable name, for reports.
constexpr std::string_view probe_name(ProbeVariant v) noexcept {
  switch (v) {
    case ProbeVariant::plain: return "plain";
    case ProbeVariant::native: return "native";
    case ProbeVariant::native_streaming: return "native-nt";
    case ProbeVariant::native_prefetch: return "native-pf";
    case ProbeVariant::native_streaming_prefetch: return "native-nt-pf";
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

/// @brief One pass of the plain `mixed16` probe over elements [begin, end): the 16-bit
///        arrays hold the upper halves of floats (bf16 bits); the copy is truncated,
///        which is as cheap as a conversion gets.
inline void mixed16_shaped_pass(float* master, const std::uint16_t* g, float* m, float* v, std::uint16_t* copy,
                                std::size_t begin, std::size_t end) noexcept {
  for (std::size_t i = begin; i < end; ++i) {
    const float gi = detail::bits_float(std::uint32_t{g[i]} << 16);
    const float mi = m[i] + gi;
    const float vi = v[i] + gi;
    m[i] = mi;
    v[i] = vi;
    const float pi = master[i] - mi - vi;
    master[i] = pi;
    copy[i] = static_cast<std::uint16_t>(detail::float_bits(pi) >> 16);
  }
}

namespace detail {

#if DOS_X86_DISPATCH
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12 flags the deliberately undefined pass-through operand of its own AVX-512
// intrinsics as "maybe uninitialized" once they are inlined (as in cpu/isa/avx512.hpp).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
// The vector probes, one family per instruction set, each in its own target region.
// Streaming needs the streamed arrays equally aligned to the vector width: a scalar
// head runs up to that alignment, and arrays it leaves misaligned fall back to
// ordinary stores. Prefetching asks for every array it reads as far ahead as the
// kernels do (cpu/kernel.hpp), once per 64-byte line of fp32 state. Each iteration
// takes U vectors: their loads, their sums, then their stores in the kernels' order
// (value or master first); the rest of a range runs the scalar loop. The fp32 shape
// takes the kernels' `cpu::unroll_vectors` (two); the mixed16 shape one. On the 2-vCPU
// Zen 5 VM at one thread, each against the same step in one process (medians of 41
// rounds), two vectors ran the fp32 probe 0.998-1.022x as fast as one in six runs (four
// faster, level in two), and the mixed16 probe 0.973-1.000x as fast in five.
//
// The 16-bit helpers: LOAD16 widens WIDTH bf16 bits to floats, PACK16 truncates WIDTH
// floats to their upper halves, STORE16/STREAM16 write the packed halves.
#define DOS_PROBE_LOOPS(NAME, TARGET, VEC, WIDTH, LOADU, STORE, STREAM, ADD, SUB, LOAD16, PACK16, STORE16, STREAM16)  \
  __attribute__((target(TARGET))) DOS_ALWAYS_INLINE VEC NAME##_grad(const float* g) { return LOADU(g); }              \
  __attribute__((target(TARGET))) DOS_ALWAYS_INLINE VEC NAME##_grad(const std::uint16_t* g) { return LOAD16(g); }     \
  /* Asks for, loads and sums U vectors from element i: both shapes' reads. */                                        \
  template <bool Prefetch, std::size_t U, class G>                                                                    \
  __attribute__((target(TARGET))) DOS_ALWAYS_INLINE void NAME##_sums(const float* p, const G* g, const float* m,      \
                                                                     const float* v, std::size_t i, VEC(&pi)[U],      \
                                                                     VEC(&mi)[U], VEC(&vi)[U]) {                      \
    VEC gi[U];                                                                                                        \
    for (std::size_t u = 0; u < (U); ++u) {                                                                           \
      const std::size_t j = i + u * (WIDTH);                                                                          \
      if (Prefetch && j % (64 / sizeof(float)) < (WIDTH)) {                                                           \
        constexpr std::size_t ahead = cpu::prefetch_elements;                                                         \
        cpu::prefetch_ahead(p + j, ahead * sizeof(float));                                                            \
        cpu::prefetch_ahead(g + j, ahead * sizeof(G));                                                                \
        cpu::prefetch_ahead(m + j, ahead * sizeof(float));                                                            \
        cpu::prefetch_ahead(v + j, ahead * sizeof(float));                                                            \
      }                                                                                                               \
      pi[u] = LOADU(p + j);                                                                                           \
      gi[u] = NAME##_grad(g + j);                                                                                     \
      mi[u] = LOADU(m + j);                                                                                           \
      vi[u] = LOADU(v + j);                                                                                           \
    }                                                                                                                 \
    for (std::size_t u = 0; u < (U); ++u) {                                                                           \
      mi[u] = ADD(mi[u], gi[u]);                                                                                      \
      vi[u] = ADD(vi[u], gi[u]);                                                                                      \
      pi[u] = SUB(SUB(pi[u], mi[u]), vi[u]);                                                                          \
    }                                                                                                                 \
  }                                                                                                                   \
  template <bool Stream, bool Prefetch, std::size_t U = cpu::unroll_vectors>                                          \
  __attribute__((target(TARGET))) inline void NAME(float* p, const float* g, float* m, float* v, std::size_t begin,   \
                                                   std::size_t end) noexcept {                                        \
    constexpr std::uintptr_t bytes = (WIDTH) * sizeof(float);                                                         \
    const auto misaligned = [&](const float* x) { return reinterpret_cast<std::uintptr_t>(x) % bytes; };              \
    std::size_t i = begin;                                                                                            \
    if (Stream) {                                                                                                     \
      for (; i < end && misaligned(p + i) != 0; ++i) adam_shaped_pass(p, g, m, v, i, i + 1);                          \
      if (misaligned(m + i) != 0 || misaligned(v + i) != 0) return NAME<false, Prefetch, U>(p, g, m, v, i, end);      \
    }                                                                                                                 \
    for (; i + (U) * (WIDTH) <= end; i += (U) * (WIDTH)) {                                                            \
      VEC pi[U], mi[U], vi[U];                                                                                        \
      NAME##_sums<Prefetch>(p, g, m, v, i, pi, mi, vi);                                                               \
      for (std::size_t u = 0; u < (U); ++u) {                                                                         \
        const std::size_t j = i + u * (WIDTH);                                                                        \
        if (Stream) {                                                                                                 \
          STREAM(p + j, pi[u]);                                                                                       \
          STREAM(m + j, mi[u]);                                                                                       \
          STREAM(v + j, vi[u]);                                                                                       \
        } else {                                                                                                      \
          STORE(p + j, pi[u]);                                                                                        \
          STORE(m + j, mi[u]);                                                                                        \
          STORE(v + j, vi[u]);                                                                                        \
        }                                                                                                             \
      }                                                                                                               \
    }                                                                                                                 \
    adam_shaped_pass(p, g, m, v, i, end);                                                                             \
    if (Stream) _mm_sfence();                                                                                         \
  }                                                                                                                   \
  template <bool Stream, bool Prefetch, std::size_t U = 1>                                                            \
  __attribute__((target(TARGET))) inline void NAME##_mixed16(float* p, const std::uint16_t* g, float* m, float* v,    \
                                                             std::uint16_t* h, std::size_t begin,                     \
                                                             std::size_t end) noexcept {                              \
    constexpr std::uintptr_t bytes = (WIDTH) * sizeof(std::uint16_t);                                                 \
    std::size_t i = begin;                                                                                            \
    if (Stream) {                                                                                                     \
      for (; i < end && reinterpret_cast<std::uintptr_t>(h + i) % bytes != 0; ++i)                                    \
        mixed16_shaped_pass(p, g, m, v, h, i, i + 1);                                                                 \
    }                                                                                                                 \
    for (; i + (U) * (WIDTH) <= end; i += (U) * (WIDTH)) {                                                            \
      VEC pi[U], mi[U], vi[U];                                                                                        \
      NAME##_sums<Prefetch>(p, g, m, v, i, pi, mi, vi);                                                               \
      for (std::size_t u = 0; u < (U); ++u) {                                                                         \
        const std::size_t j = i + u * (WIDTH);                                                                        \
        STORE(p + j, pi[u]);                                                                                          \
        if (Stream) {                                                                                                 \
          STREAM16(h + j, PACK16(pi[u]));                                                                             \
        } else {                                                                                                      \
          STORE16(h + j, PACK16(pi[u]));                                                                              \
        }                                                                                                             \
        STORE(m + j, mi[u]);                                                                                          \
        STORE(v + j, vi[u]);                                                                                          \
      }                                                                                                               \
    }                                                                                                                 \
    mixed16_shaped_pass(p, g, m, v, h, i, end);                                                                       \
    if (Stream) _mm_sfence();                                                                                         \
  }

__attribute__((target("avx2"))) DOS_ALWAYS_INLINE __m256 load16_avx2(const std::uint16_t* g) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(g));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
__attribute__((target("avx2"))) DOS_ALWAYS_INLINE __m128i pack16_avx2(__m256 x) {
  const __m256i hi = _mm256_srli_epi32(_mm256_castps_si256(x), 16);
  // packus works per 128-bit half; the permute gathers the two packed quarters.
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(hi, hi), 0b1000));
}
__attribute__((target("avx2"))) DOS_ALWAYS_INLINE void store16_avx2(std::uint16_t* h, __m128i x) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(h), x);
}
__attribute__((target("avx2"))) DOS_ALWAYS_INLINE void stream16_avx2(std::uint16_t* h, __m128i x) {
  _mm_stream_si128(reinterpret_cast<__m128i*>(h), x);
}
__attribute__((target("avx512f"))) DOS_ALWAYS_INLINE __m512 load16_avx512(const std::uint16_t* g) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
__attribute__((target("avx512f"))) DOS_ALWAYS_INLINE __m256i pack16_avx512(__m512 x) {
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(x), 16));
}
__attribute__((target("avx512f"))) DOS_ALWAYS_INLINE void store16_avx512(std::uint16_t* h, __m256i x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(h), x);
}
__attribute__((target("avx512f"))) DOS_ALWAYS_INLINE void stream16_avx512(std::uint16_t* h, __m256i x) {
  _mm256_stream_si256(reinterpret_cast<__m256i*>(h), x);
}

DOS_PROBE_LOOPS(probe_avx2, "avx2", __m256, 8, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_stream_ps, _mm256_add_ps,
                _mm256_sub_ps, load16_avx2, pack16_avx2, store16_avx2, stream16_avx2)
DOS_PROBE_LOOPS(probe_avx512, "avx512f", __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_stream_ps,
                _mm512_add_ps, _mm512_sub_ps, load16_avx512, pack16_avx512, store16_avx512, stream16_avx512)
#undef DOS_PROBE_LOOPS
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

using ProbeLoop = void (*)(float*, const float*, float*, float*, std::size_t, std::size_t) noexcept;
using Mixed16Loop = void (*)(float*, const std::uint16_t*, float*, float*, std::uint16_t*, std::size_t,
                             std::size_t) noexcept;

// Picks Family<Stream, Prefetch> for a native variant; the caller handles `plain`.
#define DOS_PROBE_PICK(FAMILY, VARIANT)                                                    \
  ((VARIANT) == ProbeVariant::native_streaming            ? &FAMILY<true, false>          \
   : (VARIANT) == ProbeVariant::native_prefetch           ? &FAMILY<false, true>          \
   : (VARIANT) == ProbeVariant::native_streaming_prefetch ? &FAMILY<true, true>           \
                                                          : &FAMILY<false, false>)

// Both shapes' loops of one variant, picked in one place.
struct ProbeLoops {
  ProbeLoop fp32;
  Mixed16Loop mixed16;
};

inline ProbeLoops probe_loops(ProbeVariant variant) noexcept {
#if DOS_X86_DISPATCH
  switch (variant == ProbeVariant::plain ? SimdLevel::scalar : detect_simd()) {
    case SimdLevel::avx512:
      return {DOS_PROBE_PICK(probe_avx512, variant), DOS_PROBE_PICK(probe_avx512_mixed16, variant)};
    case SimdLevel::avx2:
      return {DOS_PROBE_PICK(probe_avx2, variant), DOS_PROBE_PICK(probe_avx2_mixed16, variant)};
    default: break;
  }
#else
  (void)variant;
#endif
  return {&adam_shaped_pass, &mixed16_shaped_pass};
}
#undef DOS_PROBE_PICK

// Runs range(begin, end) over [0, n) in the CPU executor's chunks, spread over @p pool.
template <class Range>
void over_chunks(ThreadPool& pool, std::size_t n, Range range) {
  const std::size_t chunks = (n + cpu::chunk_elements - 1) / cpu::chunk_elements;
  auto body = [&](std::size_t c) {
    const std::size_t b = c * cpu::chunk_elements;
    range(b, std::min(n, b + cpu::chunk_elements));
  };
  pool.parallel_for(chunks, body);
}

}  // namespace detail

/// @brief One pass of the probe over all elements, spread over @p pool in contiguous
///        ranges of the same chunks the CPU executor uses.
inline void adam_shaped_pass(ThreadPool& pool, std::span<float> p, std::span<const float> g, std::span<float> m,
                             std::span<float> v, ProbeVariant variant = ProbeVariant::plain) {
  const detail::ProbeLoop loop = detail::probe_loops(variant).fp32;
  detail::over_chunks(pool, p.size(), [&](std::size_t b, std::size_t e) {
    loop(p.data(), g.data(), m.data(), v.data(), b, e);
  });
}

/// @brief One pass of the `mixed16` probe over all elements, split as `adam_shaped_pass`.
inline void mixed16_shaped_pass(ThreadPool& pool, std::span<float> master, std::span<const std::uint16_t> g,
                                std::span<float> m, std::span<float> v, std::span<std::uint16_t> copy,
                                ProbeVariant variant = ProbeVariant::plain) {
  const detail::Mixed16Loop loop = detail::probe_loops(variant).mixed16;
  detail::over_chunks(pool, master.size(), [&](std::size_t b, std::size_t e) {
    loop(master.data(), g.data(), m.data(), v.data(), copy.data(), b, e);
  });
}

/// @brief The probe's limit: the fastest variant, in elements per second.
struct ProbeLimit {
  double elements_per_second = 0;
  ProbeVariant variant = ProbeVariant::plain;
  ProbeShape shape = ProbeShape::fp32;  ///< the shape it was measured in
};

/// @brief The probe's arrays laid out much as the optimizer's state is: the four fp32
///        arrays in one block on transparent huge pages, `cpu::stream_stagger` apart
///        (64-byte aligned when the count is a multiple of 16, so the non-temporal
///        variants stream), and the two 16-bit arrays of the `mixed16` shape in a
///        block of their own, as a framework's values and gradients are. The probe
///        then pays no TLB miss and no set conflict that the step does not. (The
///        `mixed16` shape leaves the fp32 `g` unused between its master and m.)
struct ProbeArrays {
  /// @param count elements per array.
  /// @param with_mixed16 also allocate the 16-bit arrays (a quarter more memory).
  explicit ProbeArrays(std::size_t count, bool with_mixed16 = true)
      : n(count), block(4 * (count + cpu::stream_stagger), HostResource{.huge_pages = true}),
        halves(with_mixed16 ? 2 * (count + 2 * cpu::stream_stagger) : 0, HostResource{.huge_pages = true}),
        p(array(0)), g(array(1)), m(array(2)), v(array(3)), g16(half(0)), copy16(half(1)) {
    std::fill(p.begin(), p.end(), 1.0f);
    std::fill(g.begin(), g.end(), 1e-3f);
    std::fill(g16.begin(), g16.end(), std::uint16_t{0x3B00});  // 2^-9 in bf16, unlike g
  }
  /// @brief One pass of @p variant in @p shape over the arrays.
  /// @throws std::invalid_argument for `mixed16` when built without its arrays.
  void pass(ThreadPool& pool, ProbeVariant variant, ProbeShape shape = ProbeShape::fp32) {
    if (shape == ProbeShape::fp32) {
      adam_shaped_pass(pool, p, g, m, v, variant);
    } else {
      if (g16.size() != n)
        throw_invalid_argument("ProbeArrays: a mixed16 pass over arrays built without their 16-bit arrays "
                               "(with_mixed16 = false)");
      mixed16_shaped_pass(pool, p, g16, m, v, copy16, variant);
    }
  }

  std::size_t n;                       ///< elements per array
  HostBuffer<float> block;             ///< the memory of the fp32 arrays
  HostBuffer<std::uint16_t> halves;    ///< the memory of the 16-bit arrays
  std::span<float> p, g, m, v;         ///< the fp32 arrays (p is the master of `mixed16`)
  std::span<std::uint16_t> g16, copy16;  ///< the 16-bit gradient and copy of `mixed16`

 private:
  std::span<float> array(std::size_t k) { return block.span().subspan(k * (n + cpu::stream_stagger), n); }
  std::span<std::uint16_t> half(std::size_t k) {
    if (halves.size() == 0) return {};
    return halves.span().subspan(k * (n + 2 * cpu::stream_stagger), n);
  }
};

/// @brief Runs every variant of @p shape @p repetitions times over @p a (after one pass
///        to touch it) and returns the fastest. Not for `step()`: the caller owns the
///        arrays.
inline ProbeLimit measure_probe_limit(ThreadPool& pool, ProbeArrays& a, int repetitions = 5,
                                      ProbeShape shape = ProbeShape::fp32) {
  ProbeLimit best{.shape = shape};
  for (const ProbeVariant variant : probe_variants) {
    a.pass(pool, variant, shape);
    for (int r = 0; r < repetitions; ++r) {
      const auto t = std::chrono::steady_clock::now();
      a.pass(pool, variant, shape);
      const double rate =
          static_cast<double>(a.n) / std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
      if (rate > best.elements_per_second) best = {rate, variant, shape};
    }
  }
  return best;
}

}  // namespace dos
