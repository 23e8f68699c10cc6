#pragma once
/// @file
/// @brief Run-time choice of the CPU kernel: detect the instruction sets the CPU and
///        the OS support, and pick the kernel for a (value, gradient, amsgrad) triple.
///
/// Detection reads CPUID and XCR0 directly, so a binary built without any `-march`
/// flag still runs AVX-512 where the CPU has it, and never runs it where the OS does
/// not save the wider registers.

#include "dos/config.hpp"
#include "dos/core/tensor.hpp"
#include "dos/cpu/isa/avx2.hpp"
#include "dos/cpu/isa/avx512.hpp"
#include "dos/cpu/isa/scalar.hpp"
#include "dos/cpu/kernel.hpp"
#include "dos/error.hpp"

#include <cstdint>
#include <string_view>

#if DOS_X86_DISPATCH
#include <cpuid.h>
#endif

namespace dos {

/// @brief The CPU kernel families. `automatic` picks the widest one available.
enum class SimdLevel : std::uint8_t { automatic, scalar, avx2, avx512 };

/// @brief Human-readable name, for reports.
constexpr std::string_view simd_name(SimdLevel l) noexcept {
  switch (l) {
    case SimdLevel::automatic: return "automatic";
    case SimdLevel::scalar: return "scalar";
    case SimdLevel::avx2: return "avx2";
    case SimdLevel::avx512: return "avx512";
  }
  return "?";
}

/// @brief The widest kernel family this CPU and OS can run.
inline SimdLevel detect_simd() noexcept {
#if DOS_X86_DISPATCH
  static const SimdLevel level = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return SimdLevel::scalar;
    const bool osxsave = (c >> 27) & 1u, fma = (c >> 12) & 1u, f16c = (c >> 29) & 1u;
    if (!osxsave) return SimdLevel::scalar;
    std::uint32_t xcr0_lo = 0, xcr0_hi = 0;
    __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    const bool os_avx = (xcr0_lo & 0x6u) == 0x6u;          // XMM and YMM state
    const bool os_avx512 = (xcr0_lo & 0xE6u) == 0xE6u;     // plus opmask and ZMM state
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return SimdLevel::scalar;
    const bool avx2 = (b >> 5) & 1u, avx512f = (b >> 16) & 1u;
    if (!(os_avx && avx2 && fma && f16c)) return SimdLevel::scalar;
    return (os_avx512 && avx512f) ? SimdLevel::avx512 : SimdLevel::avx2;
  }();
  return level;
#else
  return SimdLevel::scalar;
#endif
}

/// @brief Whether kernels of family @p l can run here.
inline bool simd_supported(SimdLevel l) noexcept {
  return l == SimdLevel::automatic || static_cast<int>(l) <= static_cast<int>(detect_simd());
}

/// @brief Resolves `automatic` and checks a forced level.
/// @throws std::invalid_argument when @p requested cannot run on this CPU.
inline SimdLevel resolve_simd(SimdLevel requested) {
  if (requested == SimdLevel::automatic) return detect_simd();
  if (!simd_supported(requested))
    throw_invalid_argument("simd level {} was requested but this CPU supports at most {}", simd_name(requested),
                           simd_name(detect_simd()));
  return requested;
}

namespace cpu::detail {

template <class ISA, class P, class G, bool Amsgrad>
struct KernelOf;

template <template <class, class, bool> class Pick, class P, class G>
RangeKernel pick_amsgrad(bool amsgrad) {
  return amsgrad ? Pick<P, G, true>::get() : Pick<P, G, false>::get();
}

template <template <class, class, bool> class Pick>
RangeKernel pick(DType value, DType grad, bool amsgrad) {
  if (!dtype_valid(value) || !dtype_valid(grad)) return nullptr;
  return visit_dtype(value, [&](auto p) {
    return visit_dtype(grad, [&](auto g) {
      using P = typename decltype(p)::type;
      using G = typename decltype(g)::type;
      return pick_amsgrad<Pick, P, G>(amsgrad);
    });
  });
}

template <class P, class G, bool A>
struct PickScalar {
  static RangeKernel get() { return &isa::scalar::adam_range<P, G, A>; }
};
#if DOS_X86_DISPATCH
template <class P, class G, bool A>
struct PickAvx2 {
  static RangeKernel get() { return &isa::avx2::adam_range<P, G, A>; }
};
template <class P, class G, bool A>
struct PickAvx512 {
  static RangeKernel get() { return &isa::avx512::adam_range<P, G, A>; }
};
#endif

}  // namespace cpu::detail

/// @brief The range kernel of family @p level (already resolved, not `automatic`)
///        for values of type @p value, gradients of type @p grad, with or without
///        amsgrad.
inline cpu::RangeKernel select_kernel(SimdLevel level, DType value, DType grad, bool amsgrad) {
  switch (level) {
#if DOS_X86_DISPATCH
    case SimdLevel::avx512: return cpu::detail::pick<cpu::detail::PickAvx512>(value, grad, amsgrad);
    case SimdLevel::avx2: return cpu::detail::pick<cpu::detail::PickAvx2>(value, grad, amsgrad);
#endif
    default: return cpu::detail::pick<cpu::detail::PickScalar>(value, grad, amsgrad);
  }
}

}  // namespace dos
