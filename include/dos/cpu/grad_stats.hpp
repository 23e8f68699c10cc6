#pragma once
/// @file
/// @brief The fused gradient read on the host: sum of squares in double and the
///        non-finite flag of a range of a gradient, vectorised with run-time dispatch.
///
/// The sum has a fixed order, whatever the kernel family, the thread count or the
/// flags: element j of each block of 16 (counted from `begin`) goes into partial sum
/// j, the tail the same way, and the sixteen partials are added as a tree (j with
/// j + 8, then + 4, + 2, + 1). Each square of a float is exact in double, so a fused
/// multiply-add and a multiply then add round alike, and every family computes the
/// same bits. A range's result depends only on its elements and its length.

#include "dos/core/grad_stats.hpp"
#include "dos/core/tensor.hpp"
#include "dos/cpu/simd.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace dos::cpu {

namespace detail {

template <class T>
GradStats stats_of(SimdLevel level, const T* p, std::size_t begin, std::size_t end) noexcept {
  double partial[16] = {};
  const std::size_t blocks = (end - begin) / 16;
  switch (level) {
#if DOS_X86_DISPATCH
    case SimdLevel::avx512: isa::avx512::sum_squares_blocks(p + begin, blocks, partial); break;
    case SimdLevel::avx2: isa::avx2::sum_squares_blocks(p + begin, blocks, partial); break;
#endif
    default: isa::scalar::sum_squares_blocks(p + begin, blocks, partial); break;
  }
  for (std::size_t i = begin + blocks * 16; i < end; ++i) {
    const double x = static_cast<float>(p[i]);
    partial[(i - begin) % 16] += x * x;
  }
  for (std::size_t w = 8; w > 0; w /= 2)
    for (std::size_t j = 0; j < w; ++j) partial[j] += partial[j + w];
  // A finite float's square is below 2^256, so the sum of finite elements is finite:
  // an inf or NaN element, and only one, leaves an inf or NaN sum. Tested on the bits,
  // which -ffinite-math-only cannot fold away.
  std::uint64_t bits;
  std::memcpy(&bits, &partial[0], sizeof bits);
  return {partial[0], ((bits >> 52) & 0x7FFu) == 0x7FFu};
}

}  // namespace detail

/// @brief Sum of squares (in double, in the fixed order above) and the non-finite
///        flag of elements [begin, end) of a gradient, with kernel family @p level
///        (resolved, not `automatic`; every family gives the same bits).
inline GradStats grad_stats(SimdLevel level, const void* data, DType dtype, std::size_t begin,
                            std::size_t end) noexcept {
  return visit_dtype(dtype, [&](auto type) {
    using T = typename decltype(type)::type;
    return detail::stats_of(level, static_cast<const T*>(data), begin, end);
  });
}

/// @brief `grad_stats` with the widest kernel family this CPU runs.
inline GradStats grad_stats(const void* data, DType dtype, std::size_t begin, std::size_t end) noexcept {
  return grad_stats(detect_simd(), data, dtype, begin, end);
}

}  // namespace dos::cpu
