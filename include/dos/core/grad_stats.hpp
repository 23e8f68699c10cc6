#pragma once
/// @file
/// @brief `GradStats`: what one fused read of a gradient yields. A plain value type
///        shared by the CPU executor, the device backends and the training loop, so it
///        lives below all of them. Dependency-free (nvcc compiles it too).

namespace dos {

/// @brief A fused pass over a gradient: its sum of squares, in double, and whether it
///        holds an inf or a NaN. Global-norm clipping and the overflow check need both.
struct GradStats {
  double sum_squares = 0;
  bool nonfinite = false;

  /// @brief Adds another piece's statistics (sums in the caller's order).
  constexpr GradStats& operator+=(const GradStats& o) noexcept {
    sum_squares += o.sum_squares;
    nonfinite |= o.nonfinite;
    return *this;
  }
};

}  // namespace dos
