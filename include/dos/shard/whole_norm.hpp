#pragma once
/// @file
/// @brief `WholeGradNorm`: ZeRO-1's gradient summary, taken on every rank from the whole
///        model exactly as one process would take it. In ZeRO-1 every rank holds every
///        (already averaged) gradient, so no rank needs another's partial sums: summing
///        the ranks' shares would add the same squares in another order and change the
///        norm's last bits, and with them every clipped value. One process sums each
///        parameter's chunks in chunk order, the chunks being the 32K-element pieces of
///        the segments its partitioner cut (`GradNorm`, `StateStore`); this class cuts
///        the same segments with the same partitioner and adds in the same order.

#include "dos/core/grad_stats.hpp"
#include "dos/core/tensor.hpp"
#include "dos/cpu/executor.hpp"
#include "dos/cpu/grad_stats.hpp"
#include "dos/partition/subgroup.hpp"
#include "dos/train/grad_norm.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace dos {

/// @brief The one-process `GradSummary` of a whole model (one parameter group), from
///        host gradients.
class WholeGradNorm {
 public:
  /// @brief The pieces one process with @p subgroups (its partition of tensors of
  ///        @p sizes) sums, in its order.
  WholeGradNorm(std::span<const std::size_t> sizes, const std::vector<Subgroup>& subgroups)
      : first_(sizes.size() + 1, 0) {
    std::vector<cpu::Chunk> chunks;  // StateStore's chunks, in its order
    std::vector<const Segment*> segments;
    for (const Subgroup& s : subgroups)
      for (const Segment& seg : s.segments) {
        cpu::append_chunks(chunks, static_cast<std::uint32_t>(segments.size()), seg.count);
        segments.push_back(&seg);
      }
    // Grouped by tensor, each tensor's in chunk order (a stable counting sort).
    for (const cpu::Chunk& c : chunks) ++first_[segments[c.segment]->tensor + 1];
    for (std::size_t t = 0; t < sizes.size(); ++t) first_[t + 1] += first_[t];
    pieces_.resize(chunks.size());
    std::vector<std::size_t> next(first_.begin(), first_.end() - 1);
    for (const cpu::Chunk& c : chunks) {
      const Segment& seg = *segments[c.segment];
      pieces_[next[seg.tensor]++] = {seg.tensor, seg.tensor_offset + c.begin, seg.tensor_offset + c.end};
    }
    stats_.resize(pieces_.size());
    grads_.reserve(sizes.size());
    tensor_.resize(sizes.size());
    ready_.assign(sizes.size(), 0);
  }

  /// @brief Takes tensor @p t's statistics now, from its host gradient @p g, during
  ///        backward; `gather` then reuses them. An absent gradient is not recorded:
  ///        `gather` reads the view again, as `InterleavedOptimizer::grad_ready` does.
  ///        Distinct tensors may be recorded from several threads at once.
  void record(std::size_t t, const ConstTensorView& g) {
    if (g.is_absent()) return;
    GradStats total;
    for (std::size_t i = first_[t]; i < first_[t + 1]; ++i)
      total += cpu::grad_stats(g.data, g.dtype, pieces_[i].begin, pieces_[i].end);
    tensor_[t] = total;
    ready_[t] = 1;
  }
  /// @brief Forgets what `record` took (a step is over, or a backward begins).
  void forget() { std::fill(ready_.begin(), ready_.end(), std::uint8_t{0}); }

  /// @brief The summary: per tensor the sum of its pieces (those `record`ed reused),
  ///        then over the tensors in order, as `GradNorm::gather`; an absent gradient
  ///        adds nothing.
  /// @param cpu the executor whose threads read the pieces not recorded.
  /// @param grad gives tensor t's gradient (host, or absent), checked by the caller.
  template <cpu::CpuExecutor E, class Grad>
  GradSummary gather(E& cpu, Grad&& grad) {
    grads_.clear();
    for (std::size_t t = 0; t + 1 < first_.size(); ++t) grads_.push_back(grad(t));
    cpu.parallel_for(pieces_.size(), [&](std::size_t i) {
      const Piece& p = pieces_[i];
      const ConstTensorView& g = grads_[p.tensor];
      if (ready_[p.tensor] == 0) stats_[i] = g.is_absent() ? GradStats{} : cpu::grad_stats(g.data, g.dtype, p.begin, p.end);
    });
    GradSummary out;
    for (std::size_t t = 0; t + 1 < first_.size(); ++t) {
      GradStats total = tensor_[t];
      if (ready_[t] == 0) {
        total = GradStats{};
        for (std::size_t i = first_[t]; i < first_[t + 1]; ++i) total += stats_[i];
      }
      out.sum_squares += total.sum_squares;
      if (total.nonfinite) {
        ++out.nonfinite_params;
        out.first_nonfinite_param = std::min(out.first_nonfinite_param, t);
      }
    }
    return out;
  }

  /// @brief The pieces summed (for tests): at most 32K elements each.
  std::size_t pieces() const noexcept { return pieces_.size(); }

 private:
  struct Piece {
    std::size_t tensor = 0, begin = 0, end = 0;  // elements [begin, end) of the tensor
  };
  std::vector<std::size_t> first_;  // tensor t's pieces: [first_[t], first_[t + 1])
  std::vector<Piece> pieces_;
  std::vector<GradStats> stats_;
  std::vector<ConstTensorView> grads_;  // reserved at construction: step() allocates nothing
  std::vector<GradStats> tensor_;       // per tensor: what `record` took
  std::vector<std::uint8_t> ready_;     // per tensor: whether `record` took it this backward
};

}  // namespace dos
