#pragma once
/// @file
/// @brief `GradAccumulator`: gradient accumulation over micro-batches, into fp32 host
///        sums laid out like the parameters; the next step updates from the sums.

#include "dos/core/tensor.hpp"
#include "dos/cpu/executor.hpp"
#include "dos/error.hpp"
#include "dos/memory/host_resource.hpp"
#include "dos/partition/subgroup.hpp"
#include "dos/state/param_table.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace dos {

/// @brief fp32 sums of the gradients of the micro-batches since the last step.
class GradAccumulator {
 public:
  /// @brief Micro-batches accumulated since the last `clear()`.
  std::int64_t micro_batches() const noexcept { return micro_batches_; }
  bool active() const noexcept { return micro_batches_ > 0; }

  /// @brief Adds every parameter's current gradient (validated first: nothing is
  ///        added when one is bad) to the sums, chunk by chunk on @p cpu; an absent
  ///        gradient adds nothing.
  /// @throws std::invalid_argument for a bad view, or a gradient on a device.
  template <cpu::CpuExecutor E, class Store>
  void add(E& cpu, const Store& store, const ParamTable& params, std::vector<ConstTensorView>& grads) {
    grads.resize(params.size());
    for (std::size_t i = 0; i < params.size(); ++i) {
      grads[i] = params.read_grad(i, params.read_value(i));
      if (grads[i].device != Device::host)
        throw_invalid_argument("parameter {}: accumulate() sums gradients on the host, but this one is on the device; "
                               "accumulate device gradients in the framework", i);
    }
    if (sums_.empty()) {
      for (std::size_t i = 0; i < params.size(); ++i) sums_.emplace_back(params.record(i).numel);
      seen_.assign(params.size(), 0);
    }
    const auto chunks = store.chunks();
    cpu.parallel_for(chunks.size(), [&](std::size_t c) {
      const cpu::Chunk& chunk = chunks[c];
      const Segment& seg = *store.segments()[chunk.segment].segment;
      float* out = sums_[seg.tensor].data() + seg.tensor_offset;
      const ConstTensorView& g = grads[seg.tensor];
      if (g.is_absent()) return;  // adds nothing
      for (std::size_t e = chunk.begin; e < chunk.end; ++e) out[e] += load_element(g.data, g.dtype, seg.tensor_offset + e);
    });
    for (std::size_t i = 0; i < params.size(); ++i)
      if (!grads[i].is_absent()) seen_[i] = 1;
    ++micro_batches_;
  }

  /// @brief The sum for parameter @p i, as a gradient view; absent when no micro-batch
  ///        since the last step had a gradient for it (the step skips it).
  ConstTensorView view(std::size_t i) const noexcept {
    if (seen_[i] == 0) return ConstTensorView::absent();
    return {sums_[i].data(), sums_[i].size(), DType::f32, Device::host};
  }

  /// @brief Zeroes the sums: the step that used them is over.
  void clear() noexcept {
    if (micro_batches_ == 0) return;
    for (auto& s : sums_) std::fill_n(s.data(), s.size(), 0.0f);
    std::fill(seen_.begin(), seen_.end(), std::uint8_t{0});
    micro_batches_ = 0;
  }

 private:
  std::vector<HostBuffer<float>> sums_;
  std::vector<std::uint8_t> seen_;  // per parameter: some micro-batch had a gradient
  std::int64_t micro_batches_ = 0;
};

}  // namespace dos
