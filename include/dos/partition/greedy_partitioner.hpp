#pragma once
/// @file
/// @brief The default partitioner: DeepSpeed's greedy packing, without its overshoot.

#include "dos/error.hpp"
#include "dos/partition/subgroup.hpp"

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

namespace dos {

/// @brief Packs whole tensors, in order, into subgroups of at most `target_elements`;
///        a tensor larger than the target is split into target-sized pieces (cut at
///        multiples of `state_alignment`), and its remainder opens the next subgroup.
///        Empty tensors own no segment. Targets below `state_alignment` behave as
///        `state_alignment` for split tensors.
class GreedyPartitioner {
 public:
  /// @throws std::invalid_argument when @p target_elements is 0.
  explicit GreedyPartitioner(std::size_t target_elements) : target_(target_elements) {
    if (target_ == 0) throw_invalid_argument("subgroup_elements must be > 0, got 0");
  }

  std::size_t target_elements() const noexcept { return target_; }

  std::vector<Subgroup> partition(std::span<const std::size_t> sizes) const {
    // Pieces of split tensors keep their state aligned, so they are whole multiples
    // of the alignment (and at least one alignment unit, for tiny targets).
    const std::size_t piece = std::max(target_ / state_alignment * state_alignment, state_alignment);
    std::vector<Subgroup> out;
    Subgroup current;
    const auto close = [&] {
      if (!current.segments.empty()) out.push_back(std::move(current));
      current = Subgroup{};
    };
    const auto add = [&](std::uint32_t tensor, std::size_t offset, std::size_t count) {
      current.segments.push_back({tensor, offset, count, current.state_elements});
      current.numel += count;
      current.state_elements += round_up(count);
    };
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      const auto tensor = static_cast<std::uint32_t>(t);
      std::size_t offset = 0, left = sizes[t];
      if (left == 0) continue;
      if (current.numel + left > target_) close();
      while (left > target_) {  // only reached with an empty current subgroup
        const std::size_t n = std::min(piece, left);
        add(tensor, offset, n);
        close();
        offset += n;
        left -= n;
      }
      if (left == 0) continue;
      add(tensor, offset, left);
      if (current.numel >= target_) close();
    }
    close();
    return out;
  }

 private:
  static std::size_t round_up(std::size_t n) { return (n + state_alignment - 1) / state_alignment * state_alignment; }
  std::size_t target_;
};
static_assert(Partitioner<GreedyPartitioner>);

}  // namespace dos
