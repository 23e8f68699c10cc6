#pragma once
/// @file
/// @brief Where each byte of a subgroup lives when the device takes part, and the
///        copies and launches that move it.
///
/// Host side (pinned, allocated at construction):
///  - the state block [m | v | vmax? | master?], the only durable copy of the state
///    (for a resident subgroup, the device home is durable and this is its shadow);
///  - for tensors the framework keeps on the device, a mirror [gradients | values]:
///    the CPU update reads fetched gradients from it and writes values into it, and
///    the push copies them back to the framework's device tensors.
/// Device side: a staging slot (or a resident home) laid out as
///    [m | v | vmax? | master | gradients of host tensors? | 16-bit values of host tensors?]
/// so the state block crosses the link in one copy each way. Per segment, element e
/// of the subgroup's state sits at `state_offset + e` in every array. Gradients of
/// host tensors and both mirror arrays take 4 bytes per element whatever their type,
/// the 16-bit value area 2, so every segment's arrays stay 64-byte aligned.

#include "dos/backend/device_backend.hpp"
#include "dos/memory/device_buffer.hpp"
#include "dos/memory/host_resource.hpp"
#include "dos/schedule/plan.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dos::engine {

/// @brief Byte offsets of the arrays of a staging slot; `absent` when unused.
struct SlotLayout {
  static constexpr std::size_t absent = ~std::size_t{0};
  std::size_t m = 0, v = 0, vmax = absent, master = 0, grad = absent, value = absent;
  std::size_t state_bytes = 0;  ///< [m | v | vmax?] plus the master when the host block has one
  std::size_t bytes = 0;        ///< the whole slot
};

/// @brief A copy between a slot (by offset) and host memory.
struct SlotCopy {
  std::size_t offset = 0;
  void* host = nullptr;
  std::size_t bytes = 0;
};

/// @brief A copy between two absolute addresses (host mirror and framework tensor).
struct DirectCopy {
  void* dst = nullptr;
  const void* src = nullptr;
  std::size_t bytes = 0;
};

/// @brief Slot offsets a launch segment's pointers resolve to; `absent` keeps the
///        absolute (framework device) pointer already in the segment.
struct LaunchOffsets {
  std::size_t param = SlotLayout::absent, grad = SlotLayout::absent, master = SlotLayout::absent;
  std::size_t m = 0, v = 0, vmax = SlotLayout::absent;
};

/// @brief Everything the executor needs to move and update one subgroup.
template <MemoryResource DeviceMemory, MemoryResource PinnedMemory>
struct SubgroupIo {
  SlotLayout layout;
  SubgroupShape shape;
  std::uint32_t first_chunk = 0, end_chunk = 0;  ///< its CPU chunks
  HostBuffer<std::byte, PinnedMemory> mirror;    ///< gradients and values of device tensors
  DeviceBuffer<DeviceMemory> home;               ///< resident subgroups only

  // Refreshed before every step from the framework's views; capacity reserved at
  // construction, so refreshing allocates nothing.
  // up_state/down_state: the host block; up_value: fp32 host values into the master
  // area (they are the master, so they go up whenever the device updates them);
  // up_grad: host gradients; down_value: updated host values (fp32, or 16-bit).
  std::vector<SlotCopy> up_state, up_value, up_grad, down_state, down_value;
  std::vector<DirectCopy> fetch, push;
  std::vector<DeviceSegment> launch;
  std::vector<LaunchOffsets> offsets;

  /// @brief Points the launch segments at a slot (or the home) at @p base.
  void bind(std::byte* base) noexcept {
    const auto at = [base](std::size_t off) { return reinterpret_cast<float*>(base + off); };
    for (std::size_t i = 0; i < launch.size(); ++i) {
      const LaunchOffsets& o = offsets[i];
      cpu::SegmentArgs& a = launch[i].args;
      if (o.param != SlotLayout::absent) a.param = base + o.param;
      if (o.grad != SlotLayout::absent) a.grad = base + o.grad;
      a.master = o.master != SlotLayout::absent ? at(o.master) : nullptr;
      a.exp_avg = at(o.m);
      a.exp_avg_sq = at(o.v);
      a.max_exp_avg_sq = o.vmax != SlotLayout::absent ? at(o.vmax) : nullptr;
    }
  }
};

}  // namespace dos::engine
