#pragma once
/// @file
/// @brief Subgroups, the unit of scheduling: each is updated as a whole, by the CPU or
///        (in later backends) by a device, and its optimizer state is one contiguous
///        block so it can cross PCIe in one transfer.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace dos {

/// @brief Elements of state between segment starts: one cache line of floats, and one
///        AVX-512 vector, so every segment's state is aligned for SIMD.
inline constexpr std::size_t state_alignment = 16;

/// @brief A contiguous piece of one tensor inside a subgroup.
struct Segment {
  std::uint32_t tensor = 0;         ///< index of the tensor in the list given to the partitioner
  std::size_t tensor_offset = 0;    ///< first element, within the tensor
  std::size_t count = 0;            ///< elements
  std::size_t state_offset = 0;     ///< first element, within the subgroup's state block
};

/// @brief A set of segments updated together.
struct Subgroup {
  std::vector<Segment> segments;
  std::size_t numel = 0;           ///< elements: the sum of the segment counts
  std::size_t state_elements = 0;  ///< length of the state block, including alignment padding
};

/// @brief A policy that packs tensors (given by their element counts) into subgroups.
///
/// Required: every element of every tensor lands in exactly one segment of one
/// subgroup, and every `state_offset` is a multiple of `state_alignment`.
/// @code
/// struct OnePerTensor {
///   std::vector<dos::Subgroup> partition(std::span<const std::size_t> sizes) const;
/// };
/// static_assert(dos::Partitioner<OnePerTensor>);
/// @endcode
template <class P>
concept Partitioner = requires(const P& p, std::span<const std::size_t> sizes) {
  { p.partition(sizes) } -> std::same_as<std::vector<Subgroup>>;
};

}  // namespace dos
