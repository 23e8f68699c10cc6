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
/// Required: `partition(sizes)`, in which every element of every tensor lands in
/// exactly one segment of one subgroup and every `state_offset` is a multiple of
/// `state_alignment`; and construction, either from the target subgroup size in
/// elements (`Options::subgroup_elements`) or, when it takes no size, by default.
/// The optimizer partitions each parameter group separately.
/// @code
/// struct OnePerTensor {  // each tensor its own subgroup
///   std::vector<dos::Subgroup> partition(std::span<const std::size_t> sizes) const {
///     std::vector<dos::Subgroup> out;
///     for (std::uint32_t t = 0; t < sizes.size(); ++t)
///       out.push_back({{{t, 0, sizes[t], 0}}, sizes[t], sizes[t]});
///     return out;
///   }
/// };
/// static_assert(dos::Partitioner<OnePerTensor>);
/// @endcode
template <class P>
concept Partitioner = (std::constructible_from<P, std::size_t> || std::default_initializable<P>) &&
                      requires(const P& p, std::span<const std::size_t> sizes) {
                        { p.partition(sizes) } -> std::same_as<std::vector<Subgroup>>;
                      };

/// @brief A partitioner for subgroups of @p subgroup_elements (ignored by one that
///        takes no size).
template <Partitioner P>
P make_partitioner(std::size_t subgroup_elements) {
  if constexpr (std::constructible_from<P, std::size_t>) return P(subgroup_elements);
  else return P{};
}

}  // namespace dos
