#pragma once
/// @file
/// @brief `StateStore`: where the optimizer state lives and how it is cut for the CPU.
///
/// One zero-initialised, 64-byte-aligned block per subgroup, laid out
/// [m | v | vmax? | master?], each array indexed by the segment's `state_offset`; the
/// master exists when a segment's values are 16-bit or live on a device (the block is
/// then the only fp32 copy). Built once: the partition (subgroups never mix groups,
/// so each has one set of hyperparameters), the segment table the executors read, the
/// chunks the CPU runs, and each parameter's chunks. `bind` points the table at the
/// step's views; nothing here allocates after construction.

#include "dos/core/function_ref.hpp"
#include "dos/core/tensor.hpp"
#include "dos/cpu/executor.hpp"
#include "dos/error.hpp"
#include "dos/memory/host_resource.hpp"
#include "dos/optim/adam.hpp"
#include "dos/partition/subgroup.hpp"
#include "dos/state/param_table.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace dos {

/// @brief The per-element state `read_state` and `write_state` address.
enum class StateKind : std::uint8_t {
  master,          ///< the fp32 parameter (the value itself for fp32 host parameters)
  exp_avg,         ///< m
  exp_avg_sq,      ///< v
  max_exp_avg_sq,  ///< vmax (amsgrad only)
};

/// @brief Reads elements [offset, offset + out.size()) of a value view as floats,
///        wherever the view lives.
using ValueReader = FunctionRef<void(const TensorView&, std::size_t, std::span<float>)>;

/// @brief The state blocks, the segment table and the chunks of one optimizer.
template <MemoryResource Pinned>
class StateStore {
 public:
  /// @brief Elements of padding at the end of each state array of a subgroup of at
  ///        least `stagger_from` elements (`cpu::stream_stagger`). Without it, a
  ///        subgroup of 2^k elements puts m[i], v[i] and the master a power of two
  ///        apart, and the update, which touches all three at once, ran 3-4x slower at
  ///        64M elements on a 2-vCPU EPYC VM. The pad travels with the block to the
  ///        device: at most 0.6% more bytes, and none for small subgroups.
  static constexpr std::size_t state_stagger = cpu::stream_stagger;
  /// @brief Smallest subgroup (state elements) whose arrays are staggered: 1 MiB each.
  static constexpr std::size_t stagger_from = (std::size_t{1} << 20) / sizeof(float);
  static_assert(state_stagger % state_alignment == 0);

  struct SegmentRef {
    std::uint32_t subgroup = 0;
    const Segment* segment = nullptr;
  };
  struct Block {
    HostBuffer<float, Pinned> memory;
    float* exp_avg = nullptr;
    float* exp_avg_sq = nullptr;
    float* max_exp_avg_sq = nullptr;
    float* master = nullptr;
    std::uint32_t first_segment = 0, end_segment = 0;  ///< its entries in `segments()` and `work()`
    std::uint32_t first_chunk = 0, end_chunk = 0;      ///< its CPU chunks
  };

  /// @param partition called as `partition(sizes)` for each group's tensor sizes.
  /// @param params the parameter table (kept by reference).
  /// @param amsgrad whether each group uses amsgrad (it owns a vmax array).
  /// @param resource where the blocks come from (pinned with a device backend).
  /// @param read fills the masters from the values as they are now.
  /// @param cpu the executor whose threads will update the blocks: they zero them first
  ///        (`first_touch`).
  template <class Partition, cpu::CpuExecutor E>
  StateStore(Partition&& partition, const ParamTable& params, const std::vector<bool>& amsgrad, Pinned resource,
             ValueReader read, E& cpu)
      : params_(&params), amsgrad_(amsgrad), coefficients_(amsgrad.size()) {
    const std::size_t n = params.size();
    for (std::uint32_t g = 0; g < amsgrad.size(); ++g) {
      std::vector<std::size_t> members, sizes;
      for (std::size_t i = 0; i < n; ++i)
        if (params.record(i).group == g) {
          members.push_back(i);
          sizes.push_back(params.record(i).numel);
        }
      if (members.empty()) continue;
      for (Subgroup& s : partition(std::span<const std::size_t>(sizes))) {
        for (Segment& seg : s.segments) {
          if (seg.tensor >= members.size())
            throw_invalid_argument("the partitioner named tensor {} of group {}, which has {}", seg.tensor, g,
                                   members.size());
          seg.tensor = static_cast<std::uint32_t>(members[seg.tensor]);
        }
        if (s.state_elements >= stagger_from) s.state_elements += state_stagger;
        subgroups_.push_back(std::move(s));
        subgroup_group_.push_back(g);
      }
    }
    for (std::size_t s = 0; s < subgroups_.size(); ++s) build_block(s, amsgrad[subgroup_group_[s]], resource);
    first_touch(cpu);
    for (std::size_t k = 0; k < work_.size(); ++k)  // masters from the values, on pages already placed
      if (work_[k].args.master != nullptr) {
        const Segment& seg = *refs_[k].segment;
        read(params_->value(seg.tensor), seg.tensor_offset, {work_[k].args.master, seg.count});
      }
    for (std::size_t k = 0; k < work_.size(); ++k)
      work_[k].coefficients = &coefficients_[subgroup_group_[refs_[k].subgroup]];
    // Each parameter's chunks, in chunk order.
    param_chunks_begin_.assign(n + 1, 0);
    for (const cpu::Chunk& c : chunks_) ++param_chunks_begin_[refs_[c.segment].segment->tensor + 1];
    for (std::size_t p = 0; p < n; ++p) param_chunks_begin_[p + 1] += param_chunks_begin_[p];
    param_chunks_.resize(chunks_.size());
    std::vector<std::uint32_t> next(param_chunks_begin_.begin(), param_chunks_begin_.end() - 1);
    for (std::uint32_t c = 0; c < chunks_.size(); ++c) param_chunks_[next[refs_[chunks_[c].segment].segment->tensor]++] = c;
  }

  const std::vector<Subgroup>& subgroups() const noexcept { return subgroups_; }
  std::uint32_t group_of_subgroup(std::size_t s) const noexcept { return subgroup_group_[s]; }
  std::span<Block> blocks() noexcept { return blocks_; }
  std::span<const Block> blocks() const noexcept { return blocks_; }
  std::span<const SegmentRef> segments() const noexcept { return refs_; }
  std::span<cpu::SegmentWork> work() noexcept { return work_; }
  std::span<const cpu::SegmentWork> work() const noexcept { return work_; }
  std::span<const cpu::Chunk> chunks() const noexcept { return chunks_; }
  /// @brief The chunks of subgroup @p s.
  std::span<const cpu::Chunk> chunks_of(std::size_t s) const noexcept {
    return std::span(chunks_).subspan(blocks_[s].first_chunk, blocks_[s].end_chunk - blocks_[s].first_chunk);
  }
  /// @brief Indices into `chunks()` of parameter @p p's chunks.
  std::span<const std::uint32_t> param_chunks(std::size_t p) const noexcept {
    return std::span(param_chunks_).subspan(param_chunks_begin_[p], param_chunks_begin_[p + 1] - param_chunks_begin_[p]);
  }
  /// @brief The coefficients every segment of group @p g reads this step.
  AdamCoefficients<float>& coefficients(std::size_t g) noexcept { return coefficients_[g]; }

  /// @brief A master copy exists for 16-bit values, and for values the framework keeps
  ///        on a device (the host block is then the only host copy of the parameter).
  bool has_master(std::size_t tensor) const noexcept {
    return params_->record(tensor).dtype != DType::f32 || params_->on_device(tensor);
  }

  /// @brief Points the segment table at the parameter table's current views (host
  ///        tensors; device tensors keep the pinned mirror their engine set) and picks
  ///        each segment's kernel from @p cpu (`cpu::skip_range` for a parameter
  ///        without a gradient, whose gradient pointer is then null).
  template <cpu::CpuExecutor E>
  void bind(const E& cpu) {
    for (std::size_t k = 0; k < work_.size(); ++k) {
      const Segment& seg = *refs_[k].segment;
      const TensorView& v = params_->value(seg.tensor);
      const ConstTensorView& g = params_->grad(seg.tensor);
      cpu::SegmentWork& w = work_[k];
      const bool present = !g.is_absent();
      if (!params_->on_device(seg.tensor)) {
        w.args.param = static_cast<std::byte*>(v.data) + seg.tensor_offset * dtype_size(v.dtype);
        w.args.grad = present ? static_cast<const std::byte*>(g.data) + seg.tensor_offset * dtype_size(g.dtype) : nullptr;
      }
      w.kernel = present ? cpu.kernel(v.dtype, g.dtype, w.amsgrad) : &cpu::skip_range;
      w.grad = g.dtype;
    }
  }

  /// @brief Calls f(state, offset within the parameter, count, subgroup) for each
  ///        segment of parameter @p param; `state` is null for the master of an fp32
  ///        host parameter (the value is the master).
  /// @throws std::invalid_argument for a bad parameter, kind or size.
  template <class F>
  void for_each_piece(std::size_t param, StateKind kind, std::size_t size, F&& f) const {
    params_->checked(param);
    if (size != params_->record(param).numel)
      throw_invalid_argument("parameter {}: state buffer has {} elements, the parameter has {}", param, size,
                             params_->record(param).numel);
    if (kind != StateKind::master && kind != StateKind::exp_avg && kind != StateKind::exp_avg_sq &&
        kind != StateKind::max_exp_avg_sq)
      throw_invalid_argument("parameter {}: state kind {} does not exist", param, static_cast<int>(kind));
    if (kind == StateKind::max_exp_avg_sq && !amsgrad_[params_->record(param).group])
      throw_invalid_argument("parameter {}: its group does not use amsgrad, so it has no max_exp_avg_sq", param);
    const bool value_is_master = kind == StateKind::master && !has_master(param);
    for (std::size_t k = 0; k < refs_.size(); ++k) {
      const Segment& seg = *refs_[k].segment;
      if (seg.tensor != param) continue;
      const Block& b = blocks_[refs_[k].subgroup];
      float* base = kind == StateKind::master       ? b.master
                    : kind == StateKind::exp_avg    ? b.exp_avg
                    : kind == StateKind::exp_avg_sq ? b.exp_avg_sq
                                                    : b.max_exp_avg_sq;
      f(value_is_master ? nullptr : base + seg.state_offset, seg.tensor_offset, seg.count, refs_[k].subgroup);
    }
  }

 private:
  // Zeroes every state array. Each chunk's elements are zeroed by the thread
  // `parallel_for` gives that chunk, which for an all-CPU step of one value type is the
  // thread that will update it (the update splits the same chunks by bytes), so with
  // several NUMA nodes each page lands on the node of the core that streams it. What
  // no chunk covers (the stagger pad) is zeroed here.
  template <cpu::CpuExecutor E>
  void first_touch(E& cpu) {
    const auto zero = [](float* array, std::size_t from, std::size_t to) {
      if (array != nullptr && to > from) std::memset(array + from, 0, (to - from) * sizeof(float));
    };
    cpu.parallel_for(chunks_.size(), [&](std::size_t i) {
      const cpu::Chunk& c = chunks_[i];
      const cpu::SegmentArgs& a = work_[c.segment].args;
      for (float* array : {a.exp_avg, a.exp_avg_sq, a.max_exp_avg_sq, a.master}) zero(array, c.begin, c.end);
    });
    for (std::size_t s = 0; s < blocks_.size(); ++s) {
      const Block& b = blocks_[s];
      std::vector<std::pair<std::size_t, std::size_t>> covered;
      for (std::uint32_t k = b.first_segment; k < b.end_segment; ++k)
        covered.emplace_back(refs_[k].segment->state_offset, refs_[k].segment->state_offset + refs_[k].segment->count);
      std::sort(covered.begin(), covered.end());
      covered.emplace_back(subgroups_[s].state_elements, subgroups_[s].state_elements);
      std::size_t at = 0;
      for (const auto& [from, to] : covered) {
        for (float* array : {b.exp_avg, b.exp_avg_sq, b.max_exp_avg_sq, b.master}) zero(array, at, from);
        at = std::max(at, to);
      }
    }
  }

  void build_block(std::size_t s, bool amsgrad, const Pinned& resource) {
    const Subgroup& sub = subgroups_[s];
    bool needs_master = false;
    for (const Segment& seg : sub.segments) needs_master |= has_master(seg.tensor);
    const std::size_t arrays = 2 + (amsgrad ? 1 : 0) + (needs_master ? 1 : 0);
    Block block;
    block.memory = HostBuffer<float, Pinned>(arrays * sub.state_elements, resource, uninitialized);  // first_touch zeroes it
    float* next = block.memory.data();
    const auto take = [&] { return std::exchange(next, next + sub.state_elements); };
    block.exp_avg = take();
    block.exp_avg_sq = take();
    if (amsgrad) block.max_exp_avg_sq = take();
    if (needs_master) block.master = take();
    block.first_segment = static_cast<std::uint32_t>(refs_.size());
    block.first_chunk = static_cast<std::uint32_t>(chunks_.size());
    for (const Segment& seg : sub.segments) {
      const auto segment = static_cast<std::uint32_t>(refs_.size());
      refs_.push_back({static_cast<std::uint32_t>(s), &seg});
      cpu::SegmentWork w;
      w.count = seg.count;
      w.value = params_->record(seg.tensor).dtype;
      w.amsgrad = amsgrad;
      w.args.exp_avg = block.exp_avg + seg.state_offset;
      w.args.exp_avg_sq = block.exp_avg_sq + seg.state_offset;
      if (amsgrad) w.args.max_exp_avg_sq = block.max_exp_avg_sq + seg.state_offset;
      if (has_master(seg.tensor)) w.args.master = block.master + seg.state_offset;
      work_.push_back(w);
      cpu::append_chunks(chunks_, segment, seg.count);
    }
    block.end_segment = static_cast<std::uint32_t>(refs_.size());
    block.end_chunk = static_cast<std::uint32_t>(chunks_.size());
    blocks_.push_back(std::move(block));
  }

  const ParamTable* params_;
  std::vector<bool> amsgrad_;  // per group
  std::vector<Subgroup> subgroups_;
  std::vector<std::uint32_t> subgroup_group_;
  std::vector<Block> blocks_;
  std::vector<SegmentRef> refs_;
  std::vector<cpu::SegmentWork> work_;
  std::vector<cpu::Chunk> chunks_;
  std::vector<AdamCoefficients<float>> coefficients_;
  std::vector<std::uint32_t> param_chunks_begin_, param_chunks_;
};

}  // namespace dos
