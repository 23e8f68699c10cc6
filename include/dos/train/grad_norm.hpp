#pragma once
/// @file
/// @brief `GradNorm`: the global gradient norm and the overflow check, from one fused
///        read of every gradient (sum of squares and non-finite flag), either per
///        parameter as `grad_ready` reports it during backward, or in one parallel pass
///        at `step()`. Both group a parameter's sum by its chunks, in chunk order, so the
///        norm is the same whichever way it was taken. And the clipping coefficient.

#include "dos/core/grad_stats.hpp"
#include "dos/core/tensor.hpp"
#include "dos/cpu/grad_stats.hpp"
#include "dos/cpu/executor.hpp"
#include "dos/partition/subgroup.hpp"
#include "dos/state/param_table.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <vector>

namespace dos {

/// @brief The gradients of one step, summed up.
struct GradSummary {
  static constexpr std::size_t none = std::numeric_limits<std::size_t>::max();
  double sum_squares = 0;
  std::size_t nonfinite_params = 0;
  std::size_t first_nonfinite_param = none;
};

/// @brief torch.nn.utils.clip_grad_norm_'s coefficient in float: max / (norm + 1e-6),
///        at most 1. A NaN norm gives NaN, as torch.clamp keeps it.
inline float clip_coefficient(float norm, double max_norm) noexcept {
  const float coef = static_cast<float>(max_norm) / (norm + 1e-6f);
  return coef >= 1.0f ? 1.0f : coef;
}

/// @brief Per-parameter gradient statistics of the current backward pass.
class GradNorm {
 public:
  GradNorm(std::size_t params, std::size_t chunks) : param_(params), ready_(params, 0), chunk_(chunks) {}

  /// @brief The statistics of host parameter @p p's gradient @p g, chunk by chunk.
  template <class Store>
  static GradStats of_host_param(const Store& store, std::size_t p, const ConstTensorView& g) {
    GradStats total;
    for (const std::uint32_t c : store.param_chunks(p)) {
      const cpu::Chunk& chunk = store.chunks()[c];
      const Segment& seg = *store.segments()[chunk.segment].segment;
      total += cpu::grad_stats(g.data, g.dtype, seg.tensor_offset + chunk.begin, seg.tensor_offset + chunk.end);
    }
    return total;
  }

  /// @brief Records parameter @p p's statistics, taken during backward. Safe to call
  ///        from several threads at once (backward hooks).
  void record(std::size_t p, const GradStats& s) {
    const std::lock_guard lock(mutex_);
    param_[p] = s;
    if (ready_[p] == 0) ++ready_count_;
    ready_[p] = 1;
  }
  /// @brief Forgets what backward recorded.
  void forget() {
    std::fill(ready_.begin(), ready_.end(), std::uint8_t{0});
    ready_count_ = 0;
  }

  /// @brief Every parameter's statistics: those recorded during backward are reused
  ///        when @p reuse, the others read now, host ones in one parallel pass over the
  ///        chunks and device ones by @p device_stats(p).
  template <cpu::CpuExecutor E, class Store, class DeviceStats>
  GradSummary gather(bool reuse, E& cpu, const Store& store, const ParamTable& params, DeviceStats&& device_stats) {
    if (!reuse || ready_count_ < params.size()) {
      // Host parameters' chunks only: a device parameter's segments read the pinned
      // mirror, which early gradient fetches may be writing right now.
      const auto chunks = store.chunks();
      const auto work = store.work();
      cpu.parallel_for(chunks.size(), [&](std::size_t i) {
        const cpu::Chunk& c = chunks[i];
        chunk_[i] = params.on_device(store.segments()[c.segment].segment->tensor)
                        ? GradStats{}
                        : cpu::grad_stats(work[c.segment].args.grad, work[c.segment].grad, c.begin, c.end);
      });
      for (std::size_t p = 0; p < params.size(); ++p) {
        if (reuse && ready_[p] != 0) continue;
        if (params.on_device(p)) {
          param_[p] = device_stats(p);
          continue;
        }
        GradStats total;
        for (const std::uint32_t c : store.param_chunks(p)) total += chunk_[c];
        param_[p] = total;
      }
    }
    GradSummary out;
    for (std::size_t p = 0; p < params.size(); ++p) {
      out.sum_squares += param_[p].sum_squares;
      if (param_[p].nonfinite) {
        ++out.nonfinite_params;
        out.first_nonfinite_param = std::min(out.first_nonfinite_param, p);
      }
    }
    return out;
  }

 private:
  std::vector<GradStats> param_;
  std::vector<std::uint8_t> ready_;
  std::size_t ready_count_ = 0;
  std::vector<GradStats> chunk_;
  std::mutex mutex_;
};

}  // namespace dos
