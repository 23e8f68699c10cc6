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
#include "dos/optim/schedule.hpp"
#include "dos/options.hpp"
#include "dos/partition/greedy_partitioner.hpp"

#include <chrono>
#include <cmath>
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
  std::vector<std::uint8_t> fetched;       // per segment: its gradient was fetched during backward
  std::size_t early_fetch_bytes = 0;
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
    check_training_options(options);
    if constexpr (interleaved) {
      check_policy(options.interleave.policy);
      device_ = backend_.available();
    }
    schedules_.resize(groups_.size());
    if (options.loss_scaling) scale_ = options.loss_scaling->init_scale;
    source_ = std::make_unique<detail::ParamList<P>>(std::move(flat));
    build();
  }

  InterleavedOptimizer(const InterleavedOptimizer&) = delete;
  InterleavedOptimizer& operator=(const InterleavedOptimizer&) = delete;

  /// @brief Updates every parameter once, from its current gradient.
  /// @throws std::invalid_argument when a parameter's views no longer match what the
  ///         optimizer was built with; nothing has changed then.
  StepReport step() {
    try {
      return step_impl();
    } catch (...) {
      // Nothing of the optimizer changed, but what grad_ready() and begin_backward()
      // gathered may not describe the gradients of a retried step: drop it.
      forget_backward();
      throw;
    }
  }

 private:
  StepReport step_impl() {
    backend_wait_for_framework();
    const auto start = std::chrono::steady_clock::now();
    refresh_views();
    // Scheduled learning rates, all checked before any is applied.
    for (std::size_t g = 0; g < groups_.size(); ++g)
      if (schedules_[g]) {
        AdamConfig c = groups_[g];
        c.lr = schedules_[g](calls_);
        validate(c, g);
        scheduled_[g] = c.lr;
      }
    for (std::size_t g = 0; g < groups_.size(); ++g)
      if (schedules_[g]) groups_[g].lr = scheduled_[g];
    ++calls_;

    StepReport report;
    report.step = step_;
    const bool scaling = options_.loss_scaling.has_value();
    report.loss_scale = scaling ? scale_ : 1.0;
    const bool skip_nonfinite = scaling || options_.nonfinite == NonFinitePolicy::skip_step;
    // The factor every gradient is multiplied by: 1 / scale (a power of two, so exact),
    // times the clipping coefficient, as torch's unscale_ then clip_grad_norm_ do.
    float multiplier = 1;
    if (skip_nonfinite || options_.max_grad_norm > 0) {
      const double sum_squares = gather_grad_stats(report);
      if (report.nonfinite_params > 0 && skip_nonfinite) {
        report.overflow = true;
        if (scaling) {
          scale_ *= options_.loss_scaling->backoff_factor;
          growth_tracker_ = 0;
        }
        end_phase();
        report.seconds = seconds_since(start);
        return report;
      }
      const float inverse_scale = scaling ? static_cast<float>(1.0 / scale_) : 1.0f;
      const float norm = static_cast<float>(std::sqrt(sum_squares) * static_cast<double>(inverse_scale));
      report.grad_norm = norm;
      multiplier = inverse_scale;
      if (options_.max_grad_norm > 0) {
        const float coef = static_cast<float>(options_.max_grad_norm) / (norm + 1e-6f);
        const float clamped = coef >= 1.0f ? 1.0f : coef;  // a NaN norm stays NaN, as torch.clamp keeps it
        report.clip_coef = clamped;
        multiplier = inverse_scale * clamped;  // exact: inverse_scale is a power of two
      }
    }
    const std::int64_t t = step_ + 1;
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      coefficients_[g] = coefficients(groups_[g], t);
      coefficients_[g].grad_sign *= multiplier;  // +-1 times it: exact
    }
    if (device_) {
      if constexpr (interleaved) run_plan(report);
    } else {
      backend_.cpu().run(chunks_, work_);
      if constexpr (requires { backend_.unavailable_reason(); }) report.fallback = backend_.unavailable_reason();
    }
    if (scaling && ++growth_tracker_ == options_.loss_scaling->growth_interval) {
      // torch keeps the scale in float32, where growth stops short of infinity.
      const double grown = scale_ * options_.loss_scaling->growth_factor;
      if (detail::finite_bits(static_cast<float>(grown))) scale_ = grown;
      growth_tracker_ = 0;
    }
    end_phase();
    step_ = t;
    report.applied = true;
    report.step = step_;
    report.elements = total_elements_;
    report.seconds = seconds_since(start);
    return report;
  }

 public:
  // ---- The training loop around step() ------------------------------------------

  /// @brief The factor to multiply the loss by before backward (1 without loss scaling).
  double loss_scale() const noexcept { return options_.loss_scaling ? scale_ : 1.0; }

  /// @brief Sets group @p group's learning rate from @p schedule at every `step()`
  ///        call (see `LrSchedule`); an empty schedule turns it off.
  /// @throws std::invalid_argument for an unknown group.
  void set_schedule(std::size_t group, LrSchedule schedule) {
    schedules_.at(checked_group(group)) = std::move(schedule);
  }
  /// @brief `step()` calls so far, skipped ones included: the index schedules see next.
  std::int64_t schedule_index() const noexcept { return calls_; }
  /// @brief Sets the index the schedules see at the next `step()`, for resuming from
  ///        a checkpoint (the schedules themselves are code and are set again).
  /// @throws std::invalid_argument for a negative index.
  void set_schedule_index(std::int64_t calls) {
    if (calls < 0) throw_invalid_argument("schedule index must be >= 0, got {}", calls);
    calls_ = calls;
  }

  /// @brief Clean steps since the loss scale last changed (GradScaler's growth
  ///        tracker); 0 without loss scaling.
  std::int64_t loss_scale_growth_tracker() const noexcept { return options_.loss_scaling ? growth_tracker_ : 0; }
  /// @brief Restores the loss scaler's scale and growth tracker, for resuming.
  /// @throws std::invalid_argument without `Options::loss_scaling`, for a scale that is
  ///         not a finite positive power of two, or a tracker outside
  ///         [0, growth_interval); nothing changes then.
  void set_loss_scaler_state(double scale, std::int64_t growth_tracker) {
    if (!options_.loss_scaling) throw_invalid_argument("set_loss_scaler_state: this optimizer has no loss scaling");
    int e = 0;
    if (!detail::finite_bits(scale) || scale <= 0 || std::frexp(scale, &e) != 0.5)
      throw_invalid_argument("loss scale must be a finite positive power of two, got {}", scale);
    if (growth_tracker < 0 || growth_tracker >= options_.loss_scaling->growth_interval)
      throw_invalid_argument("loss scale growth tracker must be in [0, {}), got {}", options_.loss_scaling->growth_interval,
                             growth_tracker);
    scale_ = scale;
    growth_tracker_ = growth_tracker;
  }

  /// @brief Backward is about to start. With a device backend the coming update's
  ///        plan is chosen now, so `grad_ready` can start gradient transfers while
  ///        backward goes on. Optional: `step()` works without it.
  void begin_backward() {
    forget_backward();
    if constexpr (interleaved)
      if (device_) plan_ahead();
  }

  /// @brief Parameter @p param's gradient is final for this backward pass. Its norm
  ///        contribution and overflow check are taken now (one read, overlapping the
  ///        rest of backward); with a device backend, if its subgroup is planned for
  ///        the CPU, its device gradient starts its copy to pinned host memory now.
  ///        The gradient must stay where it is, unchanged, until `step()` returns.
  /// @throws std::invalid_argument for a bad index or view; nothing changes then.
  void grad_ready(std::size_t param) {
    if (param >= params_.size()) throw_invalid_argument("parameter {} does not exist (there are {})", param, params_.size());
    const TensorView v = source_->value(param);
    const ConstTensorView g = source_->grad(param);
    check_unchanged(param, v);
    check_grad(param, v, g);
    backend_wait_for_framework();
    if (micro_batches_ == 0) {
      param_stats_[param] = param_grad_stats(param, g);
      if (ready_[param] == 0) ++ready_count_;
      ready_[param] = 1;
    }
    if constexpr (interleaved)
      if (device_ && planned_ && on_device(param) && micro_batches_ == 0) fetch_early(param, g);
  }

  /// @brief Adds every parameter's current gradient into an fp32 host accumulator (one
  ///        micro-batch done); the next `step()` updates from the sum, then clears it.
  ///        Scale each micro-batch's loss as torch users do (by 1 / micro-batches).
  /// @throws std::invalid_argument for a bad view, or a gradient on a device; nothing
  ///         is accumulated then.
  void accumulate() {
    std::vector<ConstTensorView>& g = grads_;  // scratch: step() reads every view again
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const TensorView v = source_->value(i);
      g[i] = source_->grad(i);
      check_unchanged(i, v);
      check_grad(i, v, g[i]);
      if (g[i].device != Device::host)
        throw_invalid_argument("parameter {}: accumulate() sums gradients on the host, but this one is on the device; "
                               "accumulate device gradients in the framework", i);
    }
    if (accum_.empty())
      for (const ParamRecord& r : params_) accum_.emplace_back(r.numel);
    auto body = [&](std::size_t c) {
      const cpu::Chunk& chunk = chunks_[c];
      const Segment& seg = *segment_refs_[chunk.segment].segment;
      float* out = accum_[seg.tensor].data() + seg.tensor_offset;
      const ConstTensorView& gv = g[seg.tensor];
      const TensorView as_value{const_cast<void*>(gv.data), gv.numel, gv.dtype, Device::host};
      for (std::size_t e = chunk.begin; e < chunk.end; ++e) out[e] += load_value(as_value, seg.tensor_offset + e);
    };
    backend_.cpu().pool().parallel_for(chunks_.size(), body);
    ++micro_batches_;
  }
  /// @brief Micro-batches accumulated since the last step.
  std::int64_t micro_batches() const noexcept { return micro_batches_; }

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
  /// @brief Element type of parameter @p param's value, as recorded at construction.
  DType param_dtype(std::size_t param) const { return params_.at(param).dtype; }
  /// @brief The group parameter @p param belongs to.
  std::size_t param_group(std::size_t param) const { return param_group_.at(param); }
  /// @brief Whether dos keeps an fp32 master of parameter @p param apart from its
  ///        value: for 16-bit values, and for values the framework keeps on a device.
  /// @throws std::out_of_range for a bad index.
  bool param_has_master(std::size_t param) const {
    static_cast<void>(params_.at(param));  // the bounds check
    return has_master(param);
  }
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
      if (device_) {
        dev_.sync.emplace(backend_.make_stream());
        backend_.wait_for_framework();  // the framework may still be initialising the values
      }
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
    chunk_stats_.resize(chunks_.size());
    param_stats_.resize(n);
    ready_.assign(n, 0);
    scheduled_.resize(groups_.size());
    // Each parameter's chunks, in chunk order.
    param_chunks_begin_.assign(n + 1, 0);
    for (const cpu::Chunk& c : chunks_) ++param_chunks_begin_[segment_refs_[c.segment].segment->tensor + 1];
    for (std::size_t p = 0; p < n; ++p) param_chunks_begin_[p + 1] += param_chunks_begin_[p];
    param_chunks_.resize(chunks_.size());
    std::vector<std::uint32_t> next(param_chunks_begin_.begin(), param_chunks_begin_.end() - 1);
    for (std::uint32_t c = 0; c < chunks_.size(); ++c) param_chunks_[next[segment_refs_[chunks_[c].segment].segment->tensor]++] = c;
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
      // After accumulate(), the update reads the fp32 sums, not the framework's gradients.
      const ConstTensorView g = micro_batches_ > 0
                                    ? ConstTensorView{accum_[i].data(), params_[i].numel, DType::f32, Device::host}
                                    : source_->grad(i);
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
      if (!on_device(seg.tensor)) {  // device tensors: the pinned mirror, fixed by build_device()
        w.args.param = static_cast<std::byte*>(v.data) + seg.tensor_offset * dtype_size(v.dtype);
        w.args.grad = static_cast<const std::byte*>(g.data) + seg.tensor_offset * dtype_size(g.dtype);
      }
      w.kernel = backend_.cpu().kernel(v.dtype, g.dtype, groups_[subgroup_group_[segment_refs_[k].subgroup]].amsgrad);
      w.grad_dtype = g.dtype;
    }
  }

  // The fused gradient pass of one parameter, grouped by its chunks so the sum is the
  // same whether it is taken in grad_ready() or in step().
  GradStats param_grad_stats(std::size_t p, const ConstTensorView& g) {
    if (on_device(p)) {
      if constexpr (interleaved) return backend_.grad_stats(g.data, g.dtype, g.numel);
    }
    GradStats total;
    for (std::uint32_t k = param_chunks_begin_[p]; k < param_chunks_begin_[p + 1]; ++k) {
      const cpu::Chunk& c = chunks_[param_chunks_[k]];
      const Segment& seg = *segment_refs_[c.segment].segment;
      const GradStats s = cpu::grad_stats(g.data, g.dtype, seg.tensor_offset + c.begin, seg.tensor_offset + c.end);
      total.sum_squares += s.sum_squares;
      total.nonfinite |= s.nonfinite;
    }
    return total;
  }

  // Norm and overflow over every gradient: those reported by grad_ready() are reused,
  // the others are read now in one parallel pass. Returns the sum of squares.
  double gather_grad_stats(StepReport& report) {
    const bool reuse = micro_batches_ == 0;
    if (!reuse || ready_count_ < params_.size()) {
      backend_.cpu().grad_stats(chunks_, work_, chunk_stats_);
      for (std::size_t p = 0; p < params_.size(); ++p) {
        if (reuse && ready_[p] != 0) continue;
        if (on_device(p)) {
          param_stats_[p] = param_grad_stats(p, grads_[p]);
          continue;
        }
        GradStats total;
        for (std::uint32_t k = param_chunks_begin_[p]; k < param_chunks_begin_[p + 1]; ++k) {
          total.sum_squares += chunk_stats_[param_chunks_[k]].sum_squares;
          total.nonfinite |= chunk_stats_[param_chunks_[k]].nonfinite;
        }
        param_stats_[p] = total;
      }
    }
    double sum = 0;
    for (std::size_t p = 0; p < params_.size(); ++p) {
      sum += param_stats_[p].sum_squares;
      if (param_stats_[p].nonfinite) {
        ++report.nonfinite_params;
        report.first_nonfinite_param = std::min(report.first_nonfinite_param, p);
      }
    }
    return sum;
  }

  // After a step, applied or skipped: the backward phase and the accumulation are over.
  void end_phase() {
    forget_backward();
    if (micro_batches_ > 0) {
      for (auto& a : accum_) std::fill_n(a.data(), a.size(), 0.0f);
      micro_batches_ = 0;
    }
  }
  // Drops what begin_backward() and grad_ready() gathered: cached gradient statistics,
  // the plan chosen ahead, and which segments were fetched early.
  void forget_backward() {
    std::fill(ready_.begin(), ready_.end(), std::uint8_t{0});
    ready_count_ = 0;
    planned_ = false;
    if constexpr (interleaved) {
      // Early copies may still be reading the framework's gradients, which it will
      // overwrite once step() returns: let them finish first.
      if (dev_.early_fetch_bytes > 0 && dev_.executor) backend_.synchronize(dev_.executor->stream(Lane::d2h));
      std::fill(dev_.fetched.begin(), dev_.fetched.end(), std::uint8_t{0});
      dev_.early_fetch_bytes = 0;
    }
  }
  // The framework's device work so far (backward kernels writing gradients) must be
  // complete before dos reads what it wrote.
  void backend_wait_for_framework() {
    if constexpr (interleaved)
      if (device_) backend_.wait_for_framework();
  }

  static void check_training_options(const Options& o) {
    if (!detail::finite_bits(o.max_grad_norm) || o.max_grad_norm < 0)
      throw_invalid_argument("max_grad_norm must be finite and >= 0, got {}", o.max_grad_norm);
    if (const auto& ls = o.loss_scaling) {
      if (!detail::finite_bits(ls->init_scale) || ls->init_scale <= 0)
        throw_invalid_argument("loss_scaling.init_scale must be finite and > 0, got {}", ls->init_scale);
      if (!detail::finite_bits(ls->growth_factor) || ls->growth_factor < 1)
        throw_invalid_argument("loss_scaling.growth_factor must be finite and >= 1, got {}", ls->growth_factor);
      if (!detail::finite_bits(ls->backoff_factor) || ls->backoff_factor <= 0 || ls->backoff_factor >= 1)
        throw_invalid_argument("loss_scaling.backoff_factor must be in (0, 1), got {}", ls->backoff_factor);
      if (ls->growth_interval < 1)
        throw_invalid_argument("loss_scaling.growth_interval must be >= 1, got {}", ls->growth_interval);
      // Powers of two keep unscaling exact, so folding 1/scale and the clipping
      // coefficient into one multiplication gives torch's two.
      const auto power_of_two = [](double x) {
        int e = 0;
        return std::frexp(x, &e) == 0.5;
      };
      for (const auto& [name, value] : {std::pair{"init_scale", ls->init_scale}, std::pair{"growth_factor", ls->growth_factor},
                                        std::pair{"backoff_factor", ls->backoff_factor}})
        if (!power_of_two(value))
          throw_invalid_argument("loss_scaling.{} must be a power of two, got {}", name, value);
    }
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
      if (device_tensor) {
        // The CPU works on the pinned mirror: gradients fetched in, values pushed out.
        io.mirror = HostBuffer<std::byte, PinnedMemory>(2 * e4, backend_.pinned_memory());
        for (std::uint32_t w = block.first_segment; w < block.end_segment; ++w) {
          const Segment& seg = *segment_refs_[w].segment;
          if (!on_device(seg.tensor)) continue;
          work_[w].args.grad = io.mirror.data() + seg.state_offset * 4;
          work_[w].args.param = io.mirror.data() + e4 + seg.state_offset * 4;
        }
      }
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
    dev_.fetched.assign(segment_refs_.size(), 0);
    if constexpr (requires { dev_.model.reserve(n); }) dev_.model.reserve(n);
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
          if (with_grads && dev_.fetched[w] == 0) io.fetch.push_back({mirror + so * 4, grad, seg.count * gs});
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

  PlanLimits plan_limits() const
    requires interleaved
  {
    return {std::min(dev_.step_budget, dev_.executor->slots() * dev_.executor->slot_bytes()), dev_.executor->slots()};
  }

  // begin_backward(): choose the coming step's plan now, from the last known shapes.
  void plan_ahead()
    requires interleaved
  {
    choose_plan(dev_.timeline.plan, dev_.candidate, dev_.assignment, dev_.shapes, dev_.residency, dev_.policy,
                plan_limits(), dev_.model);
    planned_ = true;
  }

  // grad_ready() of a device tensor: the segments whose subgroups the plan puts on the
  // CPU copy their gradients to the pinned mirror now, on the d2h stream, ahead of the
  // plan's fetch op (which then only records its event after them).
  void fetch_early(std::size_t param, const ConstTensorView& g)
    requires interleaved
  {
    const std::size_t gs = dtype_size(g.dtype);
    for (std::size_t k = 0; k < segment_refs_.size(); ++k) {
      const Segment& seg = *segment_refs_[k].segment;
      const std::uint32_t s = segment_refs_[k].subgroup;
      if (seg.tensor != param || dev_.timeline.plan.placement[s] != Place::cpu || dev_.fetched[k] != 0) continue;
      std::byte* mirror = dev_.io[s].mirror.data();
      backend_.copy_d2h(mirror + seg.state_offset * 4, static_cast<const std::byte*>(g.data) + seg.tensor_offset * gs,
                        seg.count * gs, dev_.executor->stream(Lane::d2h));
      dev_.fetched[k] = 1;
      dev_.early_fetch_bytes += seg.count * gs;
    }
  }

  void run_plan(StepReport& report)
    requires interleaved
  {
    refresh_io(true);
    const PlanLimits limits = plan_limits();
    StepTimeline& t = dev_.timeline;
    if (!planned_)
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
    report.early_fetch_bytes = dev_.early_fetch_bytes;  // end_phase() resets it
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
  std::vector<GradStats> chunk_stats_;
  std::vector<GradStats> param_stats_;
  std::vector<std::uint32_t> param_chunks_begin_, param_chunks_;  // chunks of each parameter
  std::vector<std::uint8_t> ready_;   // grad_ready() seen this backward
  std::size_t ready_count_ = 0;
  std::vector<LrSchedule> schedules_;
  std::vector<double> scheduled_;
  std::int64_t calls_ = 0;            // step() calls, skipped included
  double scale_ = 1;                  // the loss scale
  std::int64_t growth_tracker_ = 0;   // clean steps since the scale last changed
  std::vector<HostBuffer<float>> accum_;
  std::int64_t micro_batches_ = 0;
  bool planned_ = false;              // begin_backward() chose this step's plan
  std::size_t total_elements_ = 0;
  std::int64_t step_ = 0;
  bool device_ = false;  // a device backend with a usable device
  [[no_unique_address]] mutable DeviceState dev_;
};

/// @brief The all-CPU optimizer (ZeRO-Offload's update).
using CpuOptimizer = InterleavedOptimizer<CpuBackend>;

}  // namespace dos
