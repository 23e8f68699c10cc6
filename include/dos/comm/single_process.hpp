#pragma once
/// @file
/// @brief `SingleProcess`: the default `Communicator`, one rank alone. Its collectives
///        copy or do nothing, so an optimizer built with it behaves exactly as one that
///        knows no ranks.

#include "dos/comm/communicator.hpp"

#include <algorithm>
#include <cstddef>
#include <span>

namespace dos {

/// @brief One rank, alone on its node.
struct SingleProcess {
  int rank() const noexcept { return 0; }
  int size() const noexcept { return 1; }
  int local_rank() const noexcept { return 0; }
  int local_size() const noexcept { return 1; }
  /// @brief The reduction over one rank is the buffer itself.
  void all_reduce(std::span<double>, ReduceOp) noexcept {}
  /// @brief Copies @p mine into @p all.
  void all_gather(std::span<const float> mine, std::span<float> all, std::span<const std::size_t> counts) {
    check_collective_shape("all_gather", 0, 1, mine.size(), all.size(), counts);
    std::copy(mine.begin(), mine.end(), all.begin());
  }
  /// @brief Copies @p all into @p mine.
  void reduce_scatter(std::span<const float> all, std::span<float> mine, std::span<const std::size_t> counts) {
    check_collective_shape("reduce_scatter", 0, 1, mine.size(), all.size(), counts);
    std::copy(all.begin(), all.end(), mine.begin());
  }
  void barrier() noexcept {}
};
static_assert(Communicator<SingleProcess>);

}  // namespace dos
