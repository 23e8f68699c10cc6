#pragma once
/// @file
/// @brief `InterleavedOptimizer<Backend>`: the optimizer a training engine holds.
///
/// Data flow of one `step()`:
///  1. ask the framework (through `tensor_traits`) for every value and gradient view,
///     and validate all of them: a bad view throws before any byte of state changes;
///  2. with `NonFinitePolicy::skip_step`, scan the gradients; stop if one is non-finite;
///  3. compute each group's coefficients for step t + 1 (in double, as torch does);
///  4. update every subgroup exactly once. fp32 master (for 16-bit or device-resident
///     values), m, v and vmax live in one zero-initialised host block per subgroup.
///     - `CpuBackend`: the CPU executor updates all of them in place;
///     - a `DeviceBackend`: the policy and the cost model choose a plan (which
///       subgroups stream through the device), the validator checks it, the plan
///       executor runs it on the lanes, and the measured timeline refines the model;
///  5. only then does the step count advance.
/// Everything that step() touches is allocated at construction.

#include "dos/backend/cpu.hpp"
#include "dos/backend/device_backend.hpp"
#include "dos/engine/plan_executor.hpp"
#include "dos/engine/subgroup_io.hpp"
#include "dos/schedule/calibrate.hpp"
#include "dos/schedule/cost_model.hpp"
#include "dos/schedule/planner.hpp"
#include "dos/schedule/policy.hpp"
#include "dos/schedule/timeline.hpp"
#include "dos/schedule/validator.hpp"
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
#include <optional>
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

struct NoDeviceState {};

/// What a device backend adds to the optimizer: the executor with its staging pool,
/// per-subgroup I/O, the cost model and the last timeline.
template <class B, class Model>
struct DeviceState {
  using Executor = engine::PlanExecutor<B>;
  std::optional<Executor> executor;
  std::vector<typename Executor::Io> io;
  std::vector<SubgroupShape> shapes;
  std::vector<Place> residency;   // Place::resident for TwinFlow's share, else Place::cpu
  std::vector<Place> assignment;  // scratch for the policy
  Plan candidate;                 // scratch for the policy
  StepTimeline timeline;
  Model model;
  Policy policy;
  std::size_t step_budget = 0;
  std::optional<typename B::Stream> sync;  // for construction and checkpoint copies
};

template <class B, bool = DeviceBackend<B>>
struct PinnedOf {
  using type = HostResource;
};
template <class B>
struct PinnedOf<B, true> {
  using type = typename engine::PlanExecutor<B>::PinnedMemory;
};

}  // namespace detail

/// @brief Adam/AdamW over parameters whose fp32 state lives in host memory, with
///        the update split between the CPU and (with a device backend) a GPU.
/// @tparam Backend where subgroups are updated: `CpuBackend` updates all on the CPU; a
///         `DeviceBackend` (`EmulatedDeviceBackend`, `CudaBackend`) splits them.
/// @tparam Part the subgroup partitioner, constructed from `Options::subgroup_elements`.
/// @tparam Model the cost model a device backend plans with.
/// @code
/// std::vector<dos::HostParam<float>> params = ...;
/// dos::InterleavedOptimizer<dos::CpuBackend> opt(params, dos::AdamW{.lr = 3e-4}, {.threads = 8});
/// for (...) { /* forward, backward */ opt.step(); }
///
/// // The same on a device, with a cap on staging memory:
/// dos::InterleavedOptimizer<dos::EmulatedDeviceBackend> dev(params, dos::AdamW{}, {.interleave = {
///     .policy = {.kind = dos::PolicyKind::automatic_stride}, .staging_budget = 1 << 30}});
/// @endcode
template <class Backend = CpuBackend, Partitioner Part = GreedyPartitioner, CostModel Model = FirstOrderCostModel>
class InterleavedOptimizer {
 public:
  /// @brief Whether the backend has a device to interleave with.
  static constexpr bool interleaved = DeviceBackend<Backend>;
  using BackendConfig = typename Backend::Config;

  /// @brief One group: every parameter of @p params shares @p hyper.
  /// @throws std::invalid_argument for an empty list, invalid hyperparameters or a
  ///         bad parameter view.
  template <std::ranges::input_range R>
    requires Tensor<std::ranges::range_value_t<R>>
  InterleavedOptimizer(R&& params, AdamConfig hyper, Options options = {}, BackendConfig backend = {})
      : InterleavedOptimizer(one_group(std::forward<R>(params), hyper), options, backend) {}

  /// @brief Several groups, each with its own hyperparameters.
  /// @throws std::invalid_argument for an empty list, invalid hyperparameters or a
  ///         bad parameter view.
  template <Tensor P>
  explicit InterleavedOptimizer(std::vector<ParamGroup<P>> groups, Options options = {}, BackendConfig backend = {})
      : options_(options), partitioner_(options.subgroup_elements), backend_(options, backend) {
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
    if constexpr (interleaved) {
      check_policy(options.interleave.policy);
      device_ = backend_.available();
    }
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
    if (device_) {
      if constexpr (interleaved) run_plan(report);
    } else {
      backend_.cpu().run(chunks_, work_);
      if constexpr (requires { backend_.unavailable_reason(); }) report.fallback = backend_.unavailable_reason();
    }
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

  /// @brief Caps the device staging memory of later steps (device backends). The pool
  ///        was allocated at construction; a budget above it is capped there. A budget
  ///        below one staging slot makes steps fall back to the CPU, with a reason.
  void set_staging_budget(std::size_t bytes)
    requires interleaved
  {
    dev_.step_budget = bytes;
  }
  /// @brief Changes the assignment policy (device backends). The resident share of
  ///        `static_fraction` is fixed at construction, so that kind cannot be switched
  ///        to or from, nor its fraction changed.
  /// @throws std::invalid_argument for an invalid policy or a change of residency.
  void set_policy(const Policy& p)
    requires interleaved
  {
    check_policy(p);
    const bool was = dev_.policy.kind == PolicyKind::static_fraction, is = p.kind == PolicyKind::static_fraction;
    if (was != is || (is && p.fraction != dev_.policy.fraction))
      throw_invalid_argument("the static_fraction policy fixes residency at construction; it cannot be switched to, "
                             "from or resized (was {}, asked for {})", policy_name(dev_.policy.kind), policy_name(p.kind));
    dev_.policy = p;
  }
  /// @brief The policy in use (device backends).
  const Policy& policy() const noexcept
    requires interleaved
  {
    return dev_.policy;
  }
  /// @brief The last step's plan with its predicted and measured timelines (device
  ///        backends); see `chrome_trace` and `summary`.
  const StepTimeline& timeline() const noexcept
    requires interleaved
  {
    return dev_.timeline;
  }
  /// @brief The cost model, refined by every step so far (device backends).
  const Model& cost_model() const noexcept
    requires interleaved
  {
    return dev_.model;
  }
  /// @brief Staging slots allocated at construction, and their size (device backends).
  PoolStats staging_pool() const
    requires interleaved
  {
    return dev_.executor ? dev_.executor->pool_stats() : PoolStats{};
  }
  std::size_t staging_slot_bytes() const
    requires interleaved
  {
    return dev_.executor ? dev_.executor->slot_bytes() : 0;
  }
  /// @brief Whether the device takes part. False for `CpuBackend`, and for a device
  ///        backend built without a device (`CudaConfig::on_missing = use_cpu`): every
  ///        step then runs on the CPU and `StepReport::fallback` says why.
  bool device_available() const noexcept { return device_; }
  /// @brief Per subgroup: what the planner knows about its transfers (device backends).
  const std::vector<SubgroupShape>& subgroup_shapes() const noexcept
    requires interleaved
  {
    return dev_.shapes;
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
                                                      std::size_t n, std::uint32_t subgroup) {
      if constexpr (interleaved) pull_resident(subgroup);
      for (std::size_t i = 0; i < n; ++i) out[off + i] = state != nullptr ? state[i] : load_value(v, off + i);
    });
  }
  /// @brief Overwrites one state tensor of parameter @p param, for checkpoint loading.
  ///        Writing the master of a 16-bit parameter also rewrites its value, rounded.
  /// @throws std::invalid_argument for a bad index, a size mismatch, or vmax without amsgrad.
  void write_state(std::size_t param, StateKind kind, std::span<const float> in) {
    if constexpr (interleaved)
      if (device_) refresh_value_views();  // a resident push copies fp32 values from where they are now
    for_each_state_piece(param, kind, in.size(), [&](float* state, const TensorView& v, std::size_t off,
                                                     std::size_t n, std::uint32_t subgroup) {
      if constexpr (interleaved) pull_resident(subgroup);  // the shadow must be current before a partial write
      if (state != nullptr)
        for (std::size_t i = 0; i < n; ++i) state[i] = in[off + i];
      if (kind == StateKind::master) write_values(v, off, in.subspan(off, n));
      if constexpr (interleaved) push_resident(subgroup);
    });
  }

 private:
  using PinnedMemory = typename detail::PinnedOf<Backend>::type;
  using DeviceState = std::conditional_t<interleaved, detail::DeviceState<Backend, Model>, detail::NoDeviceState>;

  struct ParamRecord {
    std::size_t numel = 0;
    DType dtype = DType::f32;
    Device device = Device::host;
  };
  struct SegmentRef {  // where a segment's state lives
    std::uint32_t subgroup = 0;
    const Segment* segment = nullptr;
  };
  struct StateBlock {
    HostBuffer<float, PinnedMemory> memory;
    float* exp_avg = nullptr;
    float* exp_avg_sq = nullptr;
    float* max_exp_avg_sq = nullptr;
    float* master = nullptr;
    std::uint32_t first_segment = 0, end_segment = 0;  // its entries in segment_refs_ and work_
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

  static void check_policy(const Policy& p) {
    if (p.kind == PolicyKind::fixed_stride && p.stride < 1)
      throw_invalid_argument("policy stride must be >= 1, got {}", p.stride);
    if (p.kind == PolicyKind::automatic_stride && p.max_stride < 1)
      throw_invalid_argument("policy max_stride must be >= 1, got {}", p.max_stride);
    if (p.kind == PolicyKind::static_fraction && !(p.fraction >= 0 && p.fraction <= 1))
      throw_invalid_argument("policy fraction must be in [0, 1], got {}", p.fraction);
  }

  std::size_t checked_group(std::size_t g) const {
    if (g >= groups_.size()) throw_invalid_argument("parameter group {} does not exist (there are {})", g, groups_.size());
    return g;
  }

  static double seconds_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }

  void check_value(std::size_t i, const TensorView& v) const {
    if (!device_ && v.device != Device::host)
      throw_invalid_argument("parameter {}: its value lives on a device, but {} updates host memory only", i,
                             interleaved ? "this backend, which has no usable device," : "this backend");
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
    if (v.device != params_[i].device)
      throw_invalid_argument("parameter {}: value moved to the {}, but was on the {} when the optimizer was built", i,
                             device_name(v.device), device_name(params_[i].device));
  }
  static std::string_view device_name(Device d) { return d == Device::host ? "host" : "device"; }

  void check_grad(std::size_t i, const TensorView& v, const ConstTensorView& g) const {
    if (g.numel != v.numel)
      throw_invalid_argument("parameter {}: gradient has {} elements, but the value has {}", i, g.numel, v.numel);
    if (!device_ && g.device != Device::host)
      throw_invalid_argument("parameter {}: its gradient lives on a device, but this backend reads host memory", i);
    if (g.device != v.device)
      throw_invalid_argument("parameter {}: its gradient is on the {} but its value on the {}; dos needs both in "
                             "one place", i, device_name(g.device), device_name(v.device));
    if (g.numel > 0 && g.data == nullptr) throw_invalid_argument("parameter {}: gradient pointer is null", i);
    if (detail::misaligned(g.data, g.dtype))
      throw_invalid_argument("parameter {}: gradient pointer {} is not aligned to {} bytes for {}", i, g.data,
                             dtype_size(g.dtype), dtype_name(g.dtype));
  }

  bool on_device(std::size_t tensor) const noexcept { return params_[tensor].device == Device::device; }

  void build() {
    const std::size_t n = source_->size();
    params_.resize(n);
    values_.resize(n);
    grads_.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      const TensorView v = source_->value(i);
      check_value(i, v);
      params_[i] = {v.numel, v.dtype, v.device};
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
    if constexpr (interleaved)
      if (device_) dev_.sync.emplace(backend_.make_stream());
    PinnedMemory resource = pinned_resource();
    for (std::size_t s = 0; s < subgroups_.size(); ++s) {
      const Subgroup& sub = subgroups_[s];
      const bool amsgrad = groups_[subgroup_group_[s]].amsgrad;
      bool needs_master = false;
      for (const Segment& seg : sub.segments) needs_master |= has_master(seg.tensor);
      const std::size_t arrays = 2 + (amsgrad ? 1 : 0) + (needs_master ? 1 : 0);
      StateBlock block;
      block.memory = HostBuffer<float, PinnedMemory>(arrays * sub.state_elements, resource);
      float* next = block.memory.data();
      const auto take = [&] { return std::exchange(next, next + sub.state_elements); };
      block.exp_avg = take();
      block.exp_avg_sq = take();
      if (amsgrad) block.max_exp_avg_sq = take();
      if (needs_master) block.master = take();
      block.first_segment = static_cast<std::uint32_t>(segment_refs_.size());
      for (const Segment& seg : sub.segments) {
        const auto segment = static_cast<std::uint32_t>(segment_refs_.size());
        segment_refs_.push_back({static_cast<std::uint32_t>(s), &seg});
        cpu::SegmentWork w;
        w.args.exp_avg = block.exp_avg + seg.state_offset;
        w.args.exp_avg_sq = block.exp_avg_sq + seg.state_offset;
        if (amsgrad) w.args.max_exp_avg_sq = block.max_exp_avg_sq + seg.state_offset;
        if (has_master(seg.tensor)) {
          w.args.master = block.master + seg.state_offset;
          read_values(values_[seg.tensor], seg.tensor_offset, {w.args.master, seg.count});
        }
        work_.push_back(w);
        cpu::append_chunks(chunks_, segment, seg.count);
      }
      block.end_segment = static_cast<std::uint32_t>(segment_refs_.size());
      state_.push_back(std::move(block));
      subgroup_chunks_.push_back(static_cast<std::uint32_t>(chunks_.size()));
    }
    coefficients_.resize(groups_.size());
    for (std::size_t k = 0; k < work_.size(); ++k)
      work_[k].coefficients = &coefficients_[subgroup_group_[segment_refs_[k].subgroup]];
    chunk_flags_.resize(chunks_.size());
    param_flags_.resize(n);
    if constexpr (interleaved)
      if (device_) build_device();
  }

  PinnedMemory pinned_resource() {
    if constexpr (interleaved) return backend_.pinned_memory();
    else return HostResource{options_.huge_pages};
  }

  // A master copy exists for 16-bit values, and for values the framework keeps on a
  // device (the host block is then the only host copy of the parameter).
  bool has_master(std::size_t tensor) const noexcept {
    return params_[tensor].dtype != DType::f32 || on_device(tensor);
  }

  static float load_value(const TensorView& v, std::size_t e) {
    switch (v.dtype) {
      case DType::f32: return static_cast<const float*>(v.data)[e];
      case DType::bf16: return static_cast<float>(static_cast<const bf16*>(v.data)[e]);
      case DType::f16: return static_cast<float>(static_cast<const fp16*>(v.data)[e]);
    }
    return 0;
  }
  static void store_value(void* data, DType dtype, std::size_t e, float x) {
    switch (dtype) {
      case DType::f32: static_cast<float*>(data)[e] = x; break;
      case DType::bf16: static_cast<bf16*>(data)[e] = bf16(x); break;
      case DType::f16: static_cast<fp16*>(data)[e] = fp16(x); break;
    }
  }

  // Values [offset, offset + out.size()) of a view, as floats, wherever they live.
  void read_values(const TensorView& v, std::size_t offset, std::span<float> out) {
    if (!interleaved || v.device == Device::host) {
      for (std::size_t e = 0; e < out.size(); ++e) out[e] = load_value(v, offset + e);
      return;
    }
    if constexpr (interleaved) {
      const std::size_t size = dtype_size(v.dtype);
      std::vector<std::byte> staged(out.size() * size);
      backend_.copy_d2h(staged.data(), static_cast<const std::byte*>(v.data) + offset * size, staged.size(), *dev_.sync);
      backend_.synchronize(*dev_.sync);
      const TensorView host{staged.data(), out.size(), v.dtype, Device::host};
      for (std::size_t e = 0; e < out.size(); ++e) out[e] = load_value(host, e);
    }
  }
  // Writes floats, rounded to the view's type, wherever the view lives.
  void write_values(const TensorView& v, std::size_t offset, std::span<const float> in) {
    if (!interleaved || v.device == Device::host) {
      for (std::size_t e = 0; e < in.size(); ++e) store_value(v.data, v.dtype, offset + e, in[e]);
      return;
    }
    if constexpr (interleaved) {
      const std::size_t size = dtype_size(v.dtype);
      std::vector<std::byte> staged(in.size() * size);
      for (std::size_t e = 0; e < in.size(); ++e) store_value(staged.data(), v.dtype, e, in[e]);
      backend_.copy_h2d(static_cast<std::byte*>(v.data) + offset * size, staged.data(), staged.size(), *dev_.sync);
      backend_.synchronize(*dev_.sync);
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
      check_grad(i, v, g);
      // Scratch only: the segment table below is not touched until every view passed.
      values_[i] = v;
      grads_[i] = g;
    }
    for (std::size_t k = 0; k < work_.size(); ++k) {
      const Segment& seg = *segment_refs_[k].segment;
      const TensorView& v = values_[seg.tensor];
      const ConstTensorView& g = grads_[seg.tensor];
      cpu::SegmentWork& w = work_[k];
      if (on_device(seg.tensor)) {
        // The CPU works on the pinned mirror: gradients fetched in, values pushed out.
        if constexpr (interleaved) {
          std::byte* mirror = dev_.io[segment_refs_[k].subgroup].mirror.data();
          const std::size_t elements = subgroups_[segment_refs_[k].subgroup].state_elements;
          w.args.grad = mirror + seg.state_offset * 4;
          w.args.param = mirror + (elements + seg.state_offset) * 4;
        }
      } else {
        w.args.param = static_cast<std::byte*>(v.data) + seg.tensor_offset * dtype_size(v.dtype);
        w.args.grad = static_cast<const std::byte*>(g.data) + seg.tensor_offset * dtype_size(g.dtype);
      }
      w.kernel = backend_.cpu().kernel(v.dtype, g.dtype, groups_[subgroup_group_[segment_refs_[k].subgroup]].amsgrad);
      w.grad_dtype = g.dtype;
    }
  }

  std::size_t count_nonfinite(StepReport& report) {
    backend_.cpu().scan_nonfinite(chunks_, work_, chunk_flags_);
    std::fill(param_flags_.begin(), param_flags_.end(), std::uint8_t{0});
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      const std::uint32_t p = segment_refs_[chunks_[c].segment].segment->tensor;
      if (chunk_flags_[c] != 0 && !on_device(p)) param_flags_[p] = 1;
    }
    if constexpr (interleaved) {
      // Device gradients are scanned where they are; the mirror is not fetched yet.
      for (std::size_t p = 0; p < params_.size(); ++p)
        if (on_device(p) && backend_.any_nonfinite(grads_[p].data, grads_[p].dtype, grads_[p].numel)) param_flags_[p] = 1;
    }
    for (std::size_t p = 0; p < param_flags_.size(); ++p)
      if (param_flags_[p] != 0) {
        ++report.nonfinite_params;
        report.first_nonfinite_param = std::min(report.first_nonfinite_param, p);
      }
    return report.nonfinite_params;
  }

  // Calls f(state, value, offset within the parameter, count, subgroup) for each
  // segment of the parameter; state is null for the master of an fp32 host parameter
  // (the value is it).
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
      const bool value_is_master = kind == StateKind::master && !has_master(param);
      f(value_is_master ? nullptr : base + seg.state_offset, v, seg.tensor_offset, seg.count, segment_refs_[k].subgroup);
    }
  }

  // ---- Device backends only ------------------------------------------------------

  // Lays out every subgroup's slot, allocates mirrors, resident homes and the staging
  // pool, and measures the machine unless a profile was given.
  void build_device()
    requires interleaved
  {
    const InterleaveOptions& opt = options_.interleave;
    // Measure first: calibration borrows device memory the pool may take next.
    dev_.model = Model(opt.profile ? *opt.profile : calibrate(backend_));
    dev_.policy = opt.policy;
    const std::size_t n = subgroups_.size();
    dev_.io.resize(n);
    dev_.shapes.resize(n);
    if (opt.policy.kind == PolicyKind::static_fraction) resident_assignment(dev_.residency, n, opt.policy.fraction);
    else dev_.residency.assign(n, Place::cpu);

    std::size_t slot_bytes = 0;
    std::size_t streamable = 0;
    for (std::size_t s = 0; s < n; ++s) {
      auto& io = dev_.io[s];
      const Subgroup& sub = subgroups_[s];
      const StateBlock& block = state_[s];
      const std::size_t e4 = sub.state_elements * 4;
      const bool amsgrad = block.max_exp_avg_sq != nullptr;
      bool host_tensor = false, host_16bit = false, device_tensor = false;
      for (const Segment& seg : sub.segments) {
        const bool dev = on_device(seg.tensor);
        device_tensor |= dev;
        host_tensor |= !dev;
        host_16bit |= !dev && params_[seg.tensor].dtype != DType::f32;
      }
      engine::SlotLayout& l = io.layout;
      l.m = 0;
      l.v = e4;
      std::size_t off = 2 * e4;
      if (amsgrad) l.vmax = std::exchange(off, off + e4);
      l.master = std::exchange(off, off + e4);
      l.state_bytes = block.memory.size() * sizeof(float);
      if (host_tensor) l.grad = std::exchange(off, off + e4);
      if (host_16bit) l.value = std::exchange(off, off + sub.state_elements * 2);
      l.bytes = (off + 255) / 256 * 256;
      dev_.shapes[s].elements = sub.numel;
      dev_.shapes[s].slot_bytes = l.bytes;
      dev_.shapes[s].cpu_bytes = static_cast<std::size_t>(adam_bytes_per_element) * sub.numel;

      const std::size_t segments = sub.segments.size();
      for (auto* list : {&io.up_state, &io.up_value, &io.up_grad, &io.down_state, &io.down_value}) list->reserve(segments + 1);
      io.fetch.reserve(segments);
      io.push.reserve(segments);
      io.launch.reserve(segments);
      io.offsets.reserve(segments);
      io.first_chunk = s == 0 ? 0 : subgroup_chunks_[s - 1];
      io.end_chunk = subgroup_chunks_[s];
      if (device_tensor) io.mirror = HostBuffer<std::byte, PinnedMemory>(2 * e4, backend_.pinned_memory());
      if (dev_.residency[s] == Place::resident) {
        io.home = decltype(io.home)(l.bytes, backend_.device_memory());
      } else {
        slot_bytes = std::max(slot_bytes, l.bytes);
        ++streamable;
      }
    }
    refresh_io(false);
    for (std::size_t s = 0; s < n; ++s) push_resident(static_cast<std::uint32_t>(s));

    const std::size_t budget = opt.staging_budget != 0 ? opt.staging_budget : backend_.staging_bytes_available();
    std::size_t slots = opt.staging_slots == 0 ? streamable : std::min(opt.staging_slots, streamable);
    if (slot_bytes > 0) slots = std::min(slots, budget / slot_bytes);
    else slots = 0;
    dev_.step_budget = budget;
    dev_.executor.emplace(backend_, 3 * n + 1, slots, slot_bytes);

    dev_.assignment.reserve(n);
    for (Plan* plan : {&dev_.timeline.plan, &dev_.candidate}) {
      plan->ops.reserve(3 * n + 1);
      plan->placement.reserve(n);
      plan->shapes.reserve(n);
      for (auto& w : plan->workspace) w.reserve(n);
    }
    dev_.timeline.predicted.reserve(3 * n + 1);
    dev_.timeline.measured.reserve(3 * n + 1);
  }

  // Rebuilds every subgroup's copy lists and launch segments from the current views.
  // With `with_grads` false (construction, checkpoints) gradient copies are skipped.
  void refresh_io(bool with_grads)
    requires interleaved
  {
    for (std::uint32_t s = 0; s < subgroups_.size(); ++s) {
      auto& io = dev_.io[s];
      const engine::SlotLayout& l = io.layout;
      StateBlock& block = state_[s];
      const std::size_t elements = subgroups_[s].state_elements;
      const AdamCoefficients<float>& k = coefficients_[subgroup_group_[s]];
      io.up_state.clear();
      io.up_value.clear();
      io.down_state.clear();
      io.up_grad.clear();
      io.down_value.clear();
      io.fetch.clear();
      io.push.clear();
      io.launch.clear();
      io.offsets.clear();
      io.up_state.push_back({0, block.memory.data(), l.state_bytes});
      io.down_state.push_back({0, block.memory.data(), l.state_bytes});
      // What each transfer moves, from this step's types (a bf16 value may come with
      // an fp32 gradient), for the planner and the cost model.
      SubgroupShape& sh = dev_.shapes[s];
      std::size_t host_grads = 0, host_fp32_values = 0, host_values = 0, device_grads = 0, device_values = 0;
      for (std::uint32_t w = block.first_segment; w < block.end_segment; ++w) {
        const Segment& seg = *segment_refs_[w].segment;
        const TensorView& v = values_[seg.tensor];
        const ConstTensorView& g = grads_[seg.tensor];
        const std::size_t vs = dtype_size(v.dtype), gs = dtype_size(g.dtype), so = seg.state_offset;
        auto* value = static_cast<std::byte*>(v.data) + seg.tensor_offset * vs;
        const auto* grad = with_grads ? static_cast<const std::byte*>(g.data) + seg.tensor_offset * gs : nullptr;
        DeviceSegment d;
        d.count = seg.count;
        d.value = v.dtype;
        d.grad = g.dtype;
        d.amsgrad = block.max_exp_avg_sq != nullptr;
        d.coefficients = k;
        engine::LaunchOffsets o;
        o.m = l.m + so * 4;
        o.v = l.v + so * 4;
        if (d.amsgrad) o.vmax = l.vmax + so * 4;
        if (on_device(seg.tensor)) {
          // Updated on the device: straight from and into the framework's tensors.
          d.args.param = value;
          d.args.grad = grad;
          o.master = l.master + so * 4;
          std::byte* mirror = io.mirror.data();
          if (with_grads) io.fetch.push_back({mirror + so * 4, grad, seg.count * gs});
          io.push.push_back({value, mirror + (elements + so) * 4, seg.count * vs});
          device_grads += seg.count * gs;
          device_values += seg.count * vs;
        } else {
          o.grad = l.grad + so * 4;
          if (with_grads) io.up_grad.push_back({o.grad, const_cast<std::byte*>(grad), seg.count * gs});
          host_grads += seg.count * gs;
          host_values += seg.count * vs;
          if (v.dtype == DType::f32) {
            // The host value is the master: it crosses the link both ways, also for
            // a resident subgroup, so edits the framework makes to it are kept.
            o.param = l.master + so * 4;
            io.up_value.push_back({o.param, value, seg.count * 4});
            io.down_value.push_back({o.param, value, seg.count * 4});
            host_fp32_values += seg.count * 4;
          } else {
            o.param = l.value + so * 2;
            o.master = l.master + so * 4;
            io.down_value.push_back({o.param, value, seg.count * 2});
          }
        }
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
  }

  // Re-reads every value view (validated; gradients untouched) and rebuilds the copy
  // lists from them. Throws before changing anything if a view is bad.
  void refresh_value_views()
    requires interleaved
  {
    std::vector<TensorView> fresh(params_.size());
    for (std::size_t i = 0; i < params_.size(); ++i) {
      fresh[i] = source_->value(i);
      check_unchanged(i, fresh[i]);
    }
    values_ = std::move(fresh);
    refresh_io(false);
  }

  // Resident subgroups: the device home is the truth and the host block its shadow.
  void pull_resident(std::uint32_t s) const
    requires interleaved
  {
    if (!device_ || dev_.residency[s] != Place::resident) return;
    auto& io = dev_.io[s];
    for (const engine::SlotCopy& c : io.down_state) backend_.copy_d2h(c.host, io.home.data() + c.offset, c.bytes, *dev_.sync);
    backend_.synchronize(*dev_.sync);
  }
  void push_resident(std::uint32_t s) const
    requires interleaved
  {
    if (!device_ || dev_.residency[s] != Place::resident) return;
    auto& io = dev_.io[s];
    for (const auto* list : {&io.up_state, &io.up_value})
      for (const engine::SlotCopy& c : *list) backend_.copy_h2d(io.home.data() + c.offset, c.host, c.bytes, *dev_.sync);
    backend_.synchronize(*dev_.sync);
  }

  void run_plan(StepReport& report)
    requires interleaved
  {
    refresh_io(true);
    const auto limits = PlanLimits{std::min(dev_.step_budget, dev_.executor->slots() * dev_.executor->slot_bytes()),
                                   dev_.executor->slots()};
    StepTimeline& t = dev_.timeline;
    choose_plan(t.plan, dev_.candidate, dev_.assignment, dev_.shapes, dev_.residency, dev_.policy, limits, dev_.model);
    t.predicted_seconds = dev_.model.predict(t.plan, &t.predicted);
    if (options_.interleave.validate_plans) validate_plan(t.plan);
    const auto start = std::chrono::steady_clock::now();
    dev_.executor->run(
        t.plan, std::span(dev_.io),
        [&](std::uint32_t s) {
          const auto& io = dev_.io[s];
          backend_.cpu().run(std::span(chunks_).subspan(io.first_chunk, io.end_chunk - io.first_chunk), work_);
        },
        t.measured);
    t.measured_seconds = seconds_since(start);
    t.step = step_ + 1;
    t.policy = policy_name(dev_.policy.kind);
    if (options_.interleave.refine) dev_.model.refine(t);
    report.policy = t.policy;
    report.stride = t.plan.stride;
    report.device_subgroups = t.plan.device_subgroups();
    report.bytes_moved = bytes_moved(t.plan);
    report.predicted_seconds = t.predicted_seconds;
    report.update_seconds = t.measured_seconds;
    report.fallback = t.plan.fallback;
  }

  Options options_;
  Part partitioner_;
  mutable Backend backend_;
  std::unique_ptr<detail::ParamSource> source_;
  std::vector<AdamConfig> groups_;
  std::vector<std::uint32_t> param_group_;
  std::vector<ParamRecord> params_;
  std::vector<TensorView> values_;
  std::vector<ConstTensorView> grads_;
  std::vector<Subgroup> subgroups_;
  std::vector<std::uint32_t> subgroup_group_;
  std::vector<std::uint32_t> subgroup_chunks_;  // end of each subgroup's chunks in chunks_
  std::vector<StateBlock> state_;
  std::vector<SegmentRef> segment_refs_;
  std::vector<cpu::SegmentWork> work_;
  std::vector<cpu::Chunk> chunks_;
  std::vector<AdamCoefficients<float>> coefficients_;
  std::vector<std::uint8_t> chunk_flags_;
  std::vector<std::uint8_t> param_flags_;
  std::size_t total_elements_ = 0;
  std::int64_t step_ = 0;
  bool device_ = false;  // a device backend with a usable device
  [[no_unique_address]] mutable DeviceState dev_;
};

/// @brief The all-CPU optimizer (ZeRO-Offload's update).
using CpuOptimizer = InterleavedOptimizer<CpuBackend>;

}  // namespace dos
