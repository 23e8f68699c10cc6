#pragma once
/// @file
/// @brief `InterleavedOptimizer<Backend>`: the optimizer a training engine holds.
///
/// Data flow of one `step()`:
///  1. ask the framework (through `tensor_traits`) for every value and gradient view,
///     and validate all of them: a bad view throws before any byte of state changes;
///  2. with `NonFinitePolicy::skip_step`, scan the gradients; stop if one is non-finite;
///  3. compute each group's coefficients for step t + 1 (in double, as torch does);
///  4. the backend updates every subgroup exactly once: fp32 master (for 16-bit values),
///     m, v and vmax live in one zero-initialised host block per subgroup, and the
///     framework's values are rewritten in place;
///  5. only then does the step count advance.
/// Everything that step() touches is allocated at construction.

#include "dos/backend/cpu.hpp"
#include "dos/core/tensor.hpp"
#include "dos/error.hpp"
#include "dos/memory/host_resource.hpp"
#include "dos/optim/adam.hpp"
#include "dos/optim/param_group.hpp"
#include "dos/options.hpp"
#include "dos/partition/greedy_partitioner.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <ranges>
#include <span>
#include <string>
#include <vector>

namespace dos {

/// @brief The per-element state `read_state` and `write_state` address.
enum class StateKind : std::uint8_t {
  master,          ///< the fp32 parameter (the value itself for fp32 parameters)
  exp_avg,         ///< m
  exp_avg_sq,      ///< v
  max_exp_avg_sq,  ///< vmax (amsgrad only)
};

namespace detail {

/// Type-erased access to the framework's parameters, re-read at every step.
class ParamSource {
 public:
  virtual ~ParamSource() = default;
  virtual std::size_t size() const = 0;
  virtual TensorView value(std::size_t i) const = 0;
  virtual ConstTensorView grad(std::size_t i) const = 0;
};

template <Tensor P>
class ParamList final : public ParamSource {
 public:
  explicit ParamList(std::vector<P> params) : params_(std::move(params)) {}
  std::size_t size() const override { return params_.size(); }
  TensorView value(std::size_t i) const override { return tensor_traits<P>::value(params_[i]); }
  ConstTensorView grad(std::size_t i) const override { return tensor_traits<P>::grad(params_[i]); }

 private:
  std::vector<P> params_;
};

inline bool misaligned(const void* p, DType t) {
  return reinterpret_cast<std::uintptr_t>(p) % dtype_size(t) != 0;
}

}  // namespace detail

/// @brief Adam/AdamW over parameters whose fp32 state lives in host memory, with
///        the update split between the CPU and (with a device backend) a GPU.
/// @tparam Backend where subgroups are updated: `CpuBackend` updates all on the CPU.
/// @tparam Part the subgroup partitioner, constructed from `Options::subgroup_elements`.
/// @code
/// std::vector<dos::HostParam<float>> params = ...;
/// dos::InterleavedOptimizer<dos::CpuBackend> opt(params, dos::AdamW{.lr = 3e-4}, {.threads = 8});
/// for (...) { /* forward, backward */ opt.step(); }
/// @endcode
template <class Backend = CpuBackend, Partitioner Part = GreedyPartitioner>
class InterleavedOptimizer {
 public:
  /// @brief One group: every parameter of @p params shares @p hyper.
  /// @throws std::invalid_argument for an empty list, invalid hyperparameters or a
  ///         bad parameter view.
  template <std::ranges::input_range R>
    requires Tensor<std::ranges::range_value_t<R>>
  InterleavedOptimizer(R&& params, AdamConfig hyper, Options options = {})
      : InterleavedOptimizer(one_group(std::forward<R>(params), hyper), options) {}

  /// @brief Several groups, each with its own hyperparameters.
  /// @throws std::invalid_argument for an empty list, invalid hyperparameters or a
  ///         bad parameter view.
  template <Tensor P>
  explicit InterleavedOptimizer(std::vector<ParamGroup<P>> groups, Options options = {})
      : options_(options), partitioner_(options.subgroup_elements), backend_(options) {
    std::vector<P> flat;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      validate(groups[g].hyper, g);
      for (auto& p : groups[g].params) {
        flat.push_back(std::move(p));
        param_group_.push_back(static_cast<std::uint32_t>(g));
      }
      groups_.push_back(groups[g].hyper);
    }
    if (flat.empty()) throw_invalid_argument("the parameter list is empty");
    source_ = std::make_unique<detail::ParamList<P>>(std::move(flat));
    build();
  }

  InterleavedOptimizer(const InterleavedOptimizer&) = delete;
  InterleavedOptimizer& operator=(const InterleavedOptimizer&) = delete;

  /// @brief Updates every parameter once, from its current gradient.
  /// @throws std::invalid_argument when a parameter's views no longer match what the
  ///         optimizer was built with; nothing has changed then.
  StepReport step() {
    const auto start = std::chrono::steady_clock::now();
    refresh_views();
    StepReport report;
    report.step = step_;
    if (options_.nonfinite == NonFinitePolicy::skip_step && count_nonfinite(report) > 0) {
      report.seconds = seconds_since(start);
      return report;
    }
    const std::int64_t t = step_ + 1;
    for (std::size_t g = 0; g < groups_.size(); ++g) coefficients_[g] = coefficients(groups_[g], t);
    backend_.cpu().run(chunks_, work_);
    step_ = t;
    report.applied = true;
    report.step = step_;
    report.elements = total_elements_;
    report.seconds = seconds_since(start);
    return report;
  }

  /// @brief Steps taken so far (skipped steps excluded).
  std::int64_t step_count() const noexcept { return step_; }
  /// @brief Sets the step count, for resuming from a checkpoint.
  void set_step_count(std::int64_t t) {
    if (t < 0 || t == std::numeric_limits<std::int64_t>::max())
      throw_invalid_argument("step count must be in [0, {}), got {}", std::numeric_limits<std::int64_t>::max(), t);
    step_ = t;
  }

  std::size_t num_params() const noexcept { return params_.size(); }
  /// @brief Elements of parameter @p param, as recorded at construction.
  std::size_t param_numel(std::size_t param) const { return params_.at(param).numel; }
  std::size_t num_groups() const noexcept { return groups_.size(); }
  const AdamConfig& hyperparameters(std::size_t group) const { return groups_.at(checked_group(group)); }

  /// @brief Changes a group's learning rate, for schedulers; effective at the next step.
  /// @throws std::invalid_argument for an unknown group or an invalid lr.
  void set_lr(std::size_t group, double lr) {
    AdamConfig c = groups_.at(checked_group(group));
    c.lr = lr;
    set_hyperparameters(group, c);
  }
  /// @brief Replaces a group's hyperparameters; amsgrad cannot change (it owns state).
  /// @throws std::invalid_argument for an unknown group, invalid values, or a change
  ///         of amsgrad.
  void set_hyperparameters(std::size_t group, const AdamConfig& c) {
    checked_group(group);
    validate(c, group);
    if (c.amsgrad != groups_[group].amsgrad)
      throw_invalid_argument("parameter group {}: amsgrad cannot change after construction", group);
    groups_[group] = c;
  }

  /// @brief Threads the CPU update runs on, the caller included.
  unsigned threads() const noexcept { return backend_.cpu().threads(); }
  /// @brief The CPU kernel family in use.
  SimdLevel simd_level() const noexcept { return backend_.cpu().simd_level(); }
  const std::vector<Subgroup>& subgroups() const noexcept { return subgroups_; }
  const Options& options() const noexcept { return options_; }
  Backend& backend() noexcept { return backend_; }

  /// @brief Copies one state tensor of parameter @p param into @p out.
  /// @throws std::invalid_argument for a bad index, a size mismatch, or vmax without amsgrad.
  void read_state(std::size_t param, StateKind kind, std::span<float> out) const {
    for_each_state_piece(param, kind, out.size(), [&](const float* state, const TensorView& v, std::size_t off,
                                                      std::size_t n) {
      for (std::size_t i = 0; i < n; ++i) out[off + i] = state != nullptr ? state[i] : load_value(v, off + i);
    });
  }
  /// @brief Overwrites one state tensor of parameter @p param, for checkpoint loading.
  ///        Writing the master of a 16-bit parameter also rewrites its value, rounded.
  /// @throws std::invalid_argument for a bad index, a size mismatch, or vmax without amsgrad.
  void write_state(std::size_t param, StateKind kind, std::span<const float> in) {
    for_each_state_piece(param, kind, in.size(), [&](float* state, const TensorView& v, std::size_t off,
                                                     std::size_t n) {
      for (std::size_t i = 0; i < n; ++i) {
        if (state != nullptr) state[i] = in[off + i];
        if (kind == StateKind::master) store_value(v, off + i, in[off + i]);
      }
    });
  }

 private:
  struct ParamRecord {
    std::size_t numel = 0;
    DType dtype = DType::f32;
  };
  struct SegmentRef {  // where a segment's state lives
    std::uint32_t subgroup = 0;
    const Segment* segment = nullptr;
  };
  struct StateBlock {
    HostBuffer<float> memory;
    float* exp_avg = nullptr;
    float* exp_avg_sq = nullptr;
    float* max_exp_avg_sq = nullptr;
    float* master = nullptr;
  };

  template <class R>
  static std::vector<ParamGroup<std::ranges::range_value_t<R>>> one_group(R&& params, const AdamConfig& hyper) {
    ParamGroup<std::ranges::range_value_t<R>> g;
    for (auto&& p : params) g.params.push_back(p);
    g.hyper = hyper;
    std::vector<ParamGroup<std::ranges::range_value_t<R>>> out;
    out.push_back(std::move(g));
    return out;
  }

  std::size_t checked_group(std::size_t g) const {
    if (g >= groups_.size()) throw_invalid_argument("parameter group {} does not exist (there are {})", g, groups_.size());
    return g;
  }

  static double seconds_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }

  void check_value(std::size_t i, const TensorView& v) const {
    if (v.device != Device::host)
      throw_invalid_argument("parameter {}: its value lives on a device, but this backend updates host memory", i);
    if (v.numel > 0 && v.data == nullptr) throw_invalid_argument("parameter {}: value pointer is null", i);
    if (detail::misaligned(v.data, v.dtype))
      throw_invalid_argument("parameter {}: value pointer {} is not aligned to {} bytes for {}", i, v.data,
                             dtype_size(v.dtype), dtype_name(v.dtype));
  }

  // The value view still matches what the optimizer was built with.
  void check_unchanged(std::size_t i, const TensorView& v) const {
    check_value(i, v);
    if (v.numel != params_[i].numel)
      throw_invalid_argument("parameter {}: value has {} elements, but had {} when the optimizer was built", i,
                             v.numel, params_[i].numel);
    if (v.dtype != params_[i].dtype)
      throw_invalid_argument("parameter {}: value is {}, but was {} when the optimizer was built", i,
                             dtype_name(v.dtype), dtype_name(params_[i].dtype));
  }

  void build() {
    const std::size_t n = source_->size();
    params_.resize(n);
    values_.resize(n);
    grads_.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      const TensorView v = source_->value(i);
      check_value(i, v);
      params_[i] = {v.numel, v.dtype};
      values_[i] = v;
      total_elements_ += v.numel;
    }
    // Subgroups never mix groups, so each one has a single set of hyperparameters.
    for (std::uint32_t g = 0; g < groups_.size(); ++g) {
      std::vector<std::size_t> members, sizes;
      for (std::size_t i = 0; i < n; ++i)
        if (param_group_[i] == g) {
          members.push_back(i);
          sizes.push_back(params_[i].numel);
        }
      for (Subgroup& s : partitioner_.partition(sizes)) {
        for (Segment& seg : s.segments) seg.tensor = static_cast<std::uint32_t>(members[seg.tensor]);
        subgroups_.push_back(std::move(s));
        subgroup_group_.push_back(g);
      }
    }
    const HostResource resource{options_.huge_pages};
    for (std::size_t s = 0; s < subgroups_.size(); ++s) {
      const Subgroup& sub = subgroups_[s];
      const bool amsgrad = groups_[subgroup_group_[s]].amsgrad;
      bool needs_master = false;
      for (const Segment& seg : sub.segments) needs_master |= params_[seg.tensor].dtype != DType::f32;
      const std::size_t arrays = 2 + (amsgrad ? 1 : 0) + (needs_master ? 1 : 0);
      StateBlock block;
      block.memory = HostBuffer<float>(arrays * sub.state_elements, resource);
      float* next = block.memory.data();
      const auto take = [&] { return std::exchange(next, next + sub.state_elements); };
      block.exp_avg = take();
      block.exp_avg_sq = take();
      if (amsgrad) block.max_exp_avg_sq = take();
      if (needs_master) block.master = take();
      for (const Segment& seg : sub.segments) {
        const auto segment = static_cast<std::uint32_t>(segment_refs_.size());
        segment_refs_.push_back({static_cast<std::uint32_t>(s), &seg});
        cpu::SegmentWork w;
        w.args.exp_avg = block.exp_avg + seg.state_offset;
        w.args.exp_avg_sq = block.exp_avg_sq + seg.state_offset;
        if (amsgrad) w.args.max_exp_avg_sq = block.max_exp_avg_sq + seg.state_offset;
        if (params_[seg.tensor].dtype != DType::f32) {
          w.args.master = block.master + seg.state_offset;
          for (std::size_t e = 0; e < seg.count; ++e)
            w.args.master[e] = load_value(values_[seg.tensor], seg.tensor_offset + e);
        }
        work_.push_back(w);
        cpu::append_chunks(chunks_, segment, seg.count);
      }
      state_.push_back(std::move(block));
    }
    coefficients_.resize(groups_.size());
    for (std::size_t k = 0; k < work_.size(); ++k)
      work_[k].coefficients = &coefficients_[subgroup_group_[segment_refs_[k].subgroup]];
    chunk_flags_.resize(chunks_.size());
    param_flags_.resize(n);
  }

  static float load_value(const TensorView& v, std::size_t e) {
    switch (v.dtype) {
      case DType::f32: return static_cast<const float*>(v.data)[e];
      case DType::bf16: return static_cast<float>(static_cast<const bf16*>(v.data)[e]);
      case DType::f16: return static_cast<float>(static_cast<const fp16*>(v.data)[e]);
    }
    return 0;
  }
  static void store_value(const TensorView& v, std::size_t e, float x) {
    switch (v.dtype) {
      case DType::f32: static_cast<float*>(v.data)[e] = x; break;
      case DType::bf16: static_cast<bf16*>(v.data)[e] = bf16(x); break;
      case DType::f16: static_cast<fp16*>(v.data)[e] = fp16(x); break;
    }
  }

  // Reads and validates every view, then points the segment table at them. Throws
  // before writing anything if any parameter is bad.
  void refresh_views() {
    const std::size_t n = params_.size();
    for (std::size_t i = 0; i < n; ++i) {
      const TensorView v = source_->value(i);
      const ConstTensorView g = source_->grad(i);
      check_unchanged(i, v);
      if (g.numel != v.numel)
        throw_invalid_argument("parameter {}: gradient has {} elements, but the value has {}", i, g.numel, v.numel);
      if (g.device != Device::host)
        throw_invalid_argument("parameter {}: its gradient lives on a device, but this backend reads host memory", i);
      if (g.numel > 0 && g.data == nullptr) throw_invalid_argument("parameter {}: gradient pointer is null", i);
      if (detail::misaligned(g.data, g.dtype))
        throw_invalid_argument("parameter {}: gradient pointer {} is not aligned to {} bytes for {}", i, g.data,
                               dtype_size(g.dtype), dtype_name(g.dtype));
      // Scratch only: the segment table below is not touched until every view passed.
      values_[i] = v;
      grads_[i] = g;
    }
    for (std::size_t k = 0; k < work_.size(); ++k) {
      const Segment& seg = *segment_refs_[k].segment;
      const TensorView& v = values_[seg.tensor];
      const ConstTensorView& g = grads_[seg.tensor];
      cpu::SegmentWork& w = work_[k];
      w.args.param = static_cast<std::byte*>(v.data) + seg.tensor_offset * dtype_size(v.dtype);
      w.args.grad = static_cast<const std::byte*>(g.data) + seg.tensor_offset * dtype_size(g.dtype);
      w.kernel = backend_.cpu().kernel(v.dtype, g.dtype, groups_[subgroup_group_[segment_refs_[k].subgroup]].amsgrad);
      w.grad_dtype = g.dtype;
    }
  }

  std::size_t count_nonfinite(StepReport& report) {
    backend_.cpu().scan_nonfinite(chunks_, work_, chunk_flags_);
    std::fill(param_flags_.begin(), param_flags_.end(), std::uint8_t{0});
    for (std::size_t c = 0; c < chunks_.size(); ++c)
      if (chunk_flags_[c] != 0) param_flags_[segment_refs_[chunks_[c].segment].segment->tensor] = 1;
    for (std::size_t p = 0; p < param_flags_.size(); ++p)
      if (param_flags_[p] != 0) {
        ++report.nonfinite_params;
        report.first_nonfinite_param = std::min(report.first_nonfinite_param, p);
      }
    return report.nonfinite_params;
  }

  // Calls f(state, value, offset within the parameter, count) for each segment of
  // the parameter; state is null for the master of an fp32 parameter (the value is it).
  template <class F>
  void for_each_state_piece(std::size_t param, StateKind kind, std::size_t size, F&& f) const {
    if (param >= params_.size()) throw_invalid_argument("parameter {} does not exist (there are {})", param, params_.size());
    if (size != params_[param].numel)
      throw_invalid_argument("parameter {}: state buffer has {} elements, the parameter has {}", param, size,
                             params_[param].numel);
    if (kind == StateKind::max_exp_avg_sq && !groups_[param_group_[param]].amsgrad)
      throw_invalid_argument("parameter {}: its group does not use amsgrad, so it has no max_exp_avg_sq", param);
    const TensorView v = source_->value(param);
    check_unchanged(param, v);
    for (std::size_t k = 0; k < segment_refs_.size(); ++k) {
      const Segment& seg = *segment_refs_[k].segment;
      if (seg.tensor != param) continue;
      const StateBlock& b = state_[segment_refs_[k].subgroup];
      float* base = kind == StateKind::master       ? b.master
                    : kind == StateKind::exp_avg    ? b.exp_avg
                    : kind == StateKind::exp_avg_sq ? b.exp_avg_sq
                                                    : b.max_exp_avg_sq;
      const bool fp32_master = kind == StateKind::master && params_[param].dtype == DType::f32;
      f(fp32_master ? nullptr : base + seg.state_offset, v, seg.tensor_offset, seg.count);
    }
  }

  Options options_;
  Part partitioner_;
  Backend backend_;
  std::unique_ptr<detail::ParamSource> source_;
  std::vector<AdamConfig> groups_;
  std::vector<std::uint32_t> param_group_;
  std::vector<ParamRecord> params_;
  std::vector<TensorView> values_;
  std::vector<ConstTensorView> grads_;
  std::vector<Subgroup> subgroups_;
  std::vector<std::uint32_t> subgroup_group_;
  std::vector<StateBlock> state_;
  std::vector<SegmentRef> segment_refs_;
  std::vector<cpu::SegmentWork> work_;
  std::vector<cpu::Chunk> chunks_;
  std::vector<AdamCoefficients<float>> coefficients_;
  std::vector<std::uint8_t> chunk_flags_;
  std::vector<std::uint8_t> param_flags_;
  std::size_t total_elements_ = 0;
  std::int64_t step_ = 0;
};

/// @brief The all-CPU optimizer (ZeRO-Offload's update).
using CpuOptimizer = InterleavedOptimizer<CpuBackend>;

}  // namespace dos
