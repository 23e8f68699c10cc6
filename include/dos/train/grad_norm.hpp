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
#include "dos/optim/adam.hpp"
#include "dos/optim/loss_scaler.hpp"
#include "dos/options.hpp"
#include "dos/partition/subgroup.hpp"
#include "dos/state/param_table.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <cmath>
#include <mutex>
#include <optional>
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

/// @brief The factor every gradient of a step is multiplied by: 1/scale (a power of
///        two: exact) times the clipping coefficient, as torch's unscale_ then
///        clip_grad_norm_ do. Fills @p report's norm, clipping and non-finite fields.
/// @return the factor, or nullopt when the step must be skipped: a non-finite gradient
///         with @p skip_nonfinite, or an infinite unscaled norm with loss scaling.
inline std::optional<float> step_multiplier(const GradSummary& sum, const LossScaler& scaler, bool skip_nonfinite,
                                            double max_grad_norm, StepReport& report) {
  report.nonfinite_params = sum.nonfinite_params;
  report.first_nonfinite_param = sum.first_nonfinite_param;
  float multiplier = scaler.inverse();
  report.grad_norm = static_cast<float>(std::sqrt(sum.sum_squares) * static_cast<double>(multiplier));
  // Unscaling by a scale below 1 can itself overflow: an element beyond the float
  // range makes the norm infinite, where torch's unscale_ finds an inf and skips.
  if ((sum.nonfinite_params > 0 && skip_nonfinite) || (scaler.enabled() && !detail::finite_bits(report.grad_norm))) {
    report.overflow = true;
    return std::nullopt;
  }
  if (max_grad_norm > 0) {
    report.clip_coef = clip_coefficient(static_cast<float>(report.grad_norm), max_grad_norm);
    multiplier *= static_cast<float>(report.clip_coef);  // exact: the inverse scale is a power of two
  }
  return multiplier;
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
  ///        chunks and device ones by @p device_stats(p); a parameter without a
  ///        gradient contributes nothing.
  template <cpu::CpuExecutor E, class Store, class DeviceStats>
  GradSummary gather(bool reuse, E& cpu, const Store& store, const ParamTable& params, DeviceStats&& device_stats) {
    if (!reuse || ready_count_ < params.size()) {
      // Host parameters' chunks only: a device parameter's segments read the pinned
      // mirror, which early gradient fetches may be writing right now.
      const auto chunks = store.chunks();
      const auto work = store.work();
      // Parameters without a gradient count as zero and finite, as clip_grad_norm_
      // leaves out a None grad (adding +0 changes no sum's bits).
      cpu.parallel_for(chunks.size(), [&](std::size_t i) {
        const cpu::Chunk& c = chunks[i];
        const std::size_t p = store.segments()[c.segment].segment->tensor;
        chunk_[i] = params.on_device(p) || !params.present(p) || (reuse && ready_[p] != 0)
                        ? GradStats{}
                        : cpu::grad_stats(work[c.segment].args.grad, work[c.segment].grad, c.begin, c.end);
      });
      for (std::size_t p = 0; p < params.size(); ++p) {
        if (reuse && ready_[p] != 0) continue;
        if (!params.present(p)) {
          param_[p] = GradStats{};
        } else if (params.on_device(p)) {
          param_[p] = device_stats(p);
        } else {
          GradStats total;
          for (const std::uint32_t c : store.param_chunks(p)) total += chunk_[c];
          param_[p] = total;
        }
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
