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
///    the push copies them back to the framework's device tensors. Each segment's
///    pieces take its value's type (2 B per element for bf16/fp16, not 4), so a 16-bit
///    model's mirror is half an fp32 one; a device gradient is never wider than its
///    value (`ParamTable` refuses one), so the gradient piece always fits.
/// Device side: a staging slot (or a resident home) laid out as
///    [m | v | vmax? | master | gradients of host tensors? | 16-bit values of host tensors?]
/// so the state block crosses the link in one copy each way. Per segment, element e
/// of the subgroup's state sits at `state_offset + e` in every array. Gradients of
/// host tensors and both mirror arrays take 4 bytes per element whatever their type,
/// the 16-bit value area 2, so every segment's arrays stay 64-byte aligned. Mirror
/// pieces start 64-byte aligned too (`lay_out_mirror`).

#include "dos/backend/device_backend.hpp"
#include "dos/cpu/bandwidth_probe.hpp"
#include "dos/memory/device_buffer.hpp"
#include "dos/memory/host_resource.hpp"
#include "dos/schedule/plan.hpp"
#include "dos/state/param_table.hpp"
#include "dos/state/state_store.hpp"

#include <span>
#include <utility>

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
  /// Where the device copies from or to instead of `host`, when the subgroup stages
  /// its framework tensors (`SubgroupIo::staging`); the CPU copies between the two.
  std::byte* staged = nullptr;
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

/// @brief Byte offsets of one device-tensor segment's pieces in its subgroup's mirror;
///        `absent` for a segment of a host tensor.
struct MirrorPiece {
  std::size_t grad = SlotLayout::absent, value = SlotLayout::absent;
};

/// @brief Everything the executor needs to move and update one subgroup.
template <MemoryResource DeviceMemory, MemoryResource PinnedMemory>
struct SubgroupIo {
  SlotLayout layout;
  SubgroupShape shape;
  std::uint32_t first_chunk = 0, end_chunk = 0;  ///< its CPU chunks
  HostBuffer<std::byte, PinnedMemory> mirror;    ///< gradients and values of device tensors
  std::vector<MirrorPiece> mirror_pieces;        ///< per segment of the subgroup, in order
  DeviceBuffer<DeviceMemory> home;               ///< resident subgroups only
  /// Where the backend cannot register the framework's host tensors: pinned room for
  /// [gradients | values] of them, 4 + 4 B per state element, so their copies to and
  /// from the device stay asynchronous (a CPU memcpy before the upload, after the download).
  HostBuffer<std::byte, PinnedMemory> staging;

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

/// @brief Lays out subgroup @p s's staging slot (see the file comment), fills in the
///        byte counts the planner needs that do not depend on the step's types, and
///        reserves every copy list so that refreshing them never allocates.
template <class Io, class Store>
void lay_out(Io& io, SubgroupShape& shape, std::size_t s, const Store& store, const ParamTable& params) {
  const Subgroup& sub = store.subgroups()[s];
  const auto& block = store.blocks()[s];
  const std::size_t e4 = sub.state_elements * 4;
  bool host_tensor = false, host_16bit = false;
  for (const Segment& seg : sub.segments) {
    const bool dev = params.on_device(seg.tensor);
    host_tensor |= !dev;
    host_16bit |= !dev && params.record(seg.tensor).dtype != DType::f32;
  }
  SlotLayout& l = io.layout;
  l.m = 0;
  l.v = e4;
  std::size_t off = 2 * e4;
  if (block.max_exp_avg_sq != nullptr) l.vmax = std::exchange(off, off + e4);
  l.master = std::exchange(off, off + e4);
  l.state_bytes = block.memory.size() * sizeof(float);
  if (host_tensor) l.grad = std::exchange(off, off + e4);
  if (host_16bit) l.value = std::exchange(off, off + sub.state_elements * 2);
  l.bytes = (off + 255) / 256 * 256;
  shape.elements = sub.numel;
  shape.slot_bytes = l.bytes;
  shape.cpu_bytes = static_cast<std::size_t>(adam_bytes_per_element) * sub.numel;
  const std::size_t segments = sub.segments.size();
  for (auto* list : {&io.up_state, &io.up_value, &io.up_grad, &io.down_state, &io.down_value}) list->reserve(segments + 1);
  io.fetch.reserve(segments);
  io.push.reserve(segments);
  io.launch.reserve(segments);
  io.offsets.reserve(segments);
}

/// @brief Lays out subgroup @p s's mirror (see the file comment): every segment of a
///        device tensor gets a gradient piece and a value piece of `count` elements of
///        its value's type, each starting 64-byte aligned, gradients first. Fills
///        `io.mirror_pieces`; returns the mirror's bytes (0: no device tensor).
template <class Io, class Store>
std::size_t lay_out_mirror(Io& io, std::size_t s, const Store& store, const ParamTable& params) {
  const auto& block = store.blocks()[s];
  io.mirror_pieces.assign(block.end_segment - block.first_segment, MirrorPiece{});
  std::size_t off = 0;
  for (const bool grads : {true, false})
    for (std::uint32_t w = block.first_segment; w < block.end_segment; ++w) {
      const Segment& seg = *store.segments()[w].segment;
      if (!params.on_device(seg.tensor)) continue;
      const std::size_t bytes = (seg.count * dtype_size(params.record(seg.tensor).dtype) + 63) / 64 * 64;
      MirrorPiece& p = io.mirror_pieces[w - block.first_segment];
      (grads ? p.grad : p.value) = std::exchange(off, off + bytes);
    }
  return off;
}

/// @brief Rebuilds subgroup @p s's copy lists and launch segments from the current
///        views, and the transfer sizes of @p shape from this step's types (a bf16
///        value may come with an fp32 gradient). With @p with_grads false
///        (construction, checkpoints) gradient copies are left out; @p fetched marks
///        segments whose gradients `grad_ready` already fetched. With @p with_grads, a
///        parameter without a gradient this step gets no copy and no launch at all.
template <class Io, class Store>
void refresh_io(Io& io, SubgroupShape& sh, std::size_t s, Store& store, const ParamTable& params, bool with_grads,
                std::span<const std::uint8_t> fetched) {
  const SlotLayout& l = io.layout;
  auto& block = store.blocks()[s];
  for (auto* list : {&io.up_state, &io.up_value, &io.down_state, &io.up_grad, &io.down_value}) list->clear();
  io.fetch.clear();
  io.push.clear();
  io.launch.clear();
  io.offsets.clear();
  io.up_state.push_back({0, block.memory.data(), l.state_bytes});
  io.down_state.push_back({0, block.memory.data(), l.state_bytes});
  std::size_t host_grads = 0, host_fp32_values = 0, host_values = 0, device_grads = 0, device_values = 0;
  std::byte* const staging = io.staging.data();  // null: the host tensors are registered
  const std::size_t e4 = store.subgroups()[s].state_elements * 4;
  const auto staged = [&](std::size_t offset) { return staging != nullptr ? staging + offset : nullptr; };
  for (std::uint32_t w = block.first_segment; w < block.end_segment; ++w) {
    const Segment& seg = *store.segments()[w].segment;
    const TensorView& v = params.value(seg.tensor);
    const ConstTensorView& g = params.grad(seg.tensor);
    // No gradient this step: no launch, no gradient copy, and no value copy either way
    // (the kernel writes no value slot; the state block's round trip keeps its bits).
    // The shape still counts its bytes, as if it had a gradient of its value's type:
    // a plan chosen during backward from the last shapes then has the same operations
    // whichever parameters skip, and an operation with nothing to copy does nothing.
    const bool skip = with_grads && g.is_absent();
    const std::size_t vs = dtype_size(v.dtype), gs = dtype_size(skip ? v.dtype : g.dtype), so = seg.state_offset;
    auto* value = static_cast<std::byte*>(v.data) + seg.tensor_offset * vs;
    const auto* grad = with_grads && !skip ? static_cast<const std::byte*>(g.data) + seg.tensor_offset * gs : nullptr;
    DeviceSegment d;
    static_cast<cpu::SegmentDesc&>(d) = store.work()[w];
    d.grad = g.dtype;
    d.coefficients = *store.work()[w].coefficients;  // its group's, or its own (`StepCounts`)
    LaunchOffsets o;
    o.m = l.m + so * 4;
    o.v = l.v + so * 4;
    if (d.amsgrad) o.vmax = l.vmax + so * 4;
    if (params.on_device(seg.tensor)) {
      // Updated on the device: straight from and into the framework's tensors.
      d.args.param = value;
      d.args.grad = grad;
      o.master = l.master + so * 4;
      std::byte* mirror = io.mirror.data();
      const MirrorPiece& piece = io.mirror_pieces[w - block.first_segment];
      if (with_grads && !skip && fetched[w] == 0) io.fetch.push_back({mirror + piece.grad, grad, seg.count * gs});
      if (!skip) io.push.push_back({value, mirror + piece.value, seg.count * vs});
      device_grads += seg.count * gs;
      device_values += seg.count * vs;
    } else {
      o.grad = l.grad + so * 4;
      if (with_grads && !skip)
        io.up_grad.push_back({o.grad, const_cast<std::byte*>(grad), seg.count * gs, staged(so * 4)});
      host_grads += seg.count * gs;
      host_values += seg.count * vs;
      if (v.dtype == DType::f32) {
        // The host value is the master: it crosses the link both ways, also for a
        // resident subgroup, so edits the framework makes to it are kept.
        o.param = l.master + so * 4;
        if (!skip) io.up_value.push_back({o.param, value, seg.count * 4, staged(e4 + so * 4)});
        if (!skip) io.down_value.push_back({o.param, value, seg.count * 4, staged(e4 + so * 4)});
        host_fp32_values += seg.count * 4;
      } else {
        o.param = l.value + so * 2;
        o.master = l.master + so * 4;
        if (!skip) io.down_value.push_back({o.param, value, seg.count * 2, staged(e4 + so * 2)});
      }
    }
    if (skip) continue;
    io.launch.push_back(d);
    io.offsets.push_back(o);
  }
  sh.upload_bytes = l.state_bytes + host_fp32_values + host_grads;
  sh.download_bytes = l.state_bytes + host_values;
  sh.resident_upload_bytes = host_fp32_values + host_grads;
  sh.resident_download_bytes = host_values;
  sh.fetch_bytes = device_grads;
  sh.push_bytes = device_values;
}

}  // namespace dos::engine
