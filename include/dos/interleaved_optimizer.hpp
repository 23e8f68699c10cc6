#pragma once
/// @file
/// @brief `InterleavedOptimizer<Backend, Components>`: the optimizer a training engine
///        holds. A façade: it states the order of one step and forwards everything
///        else to the components that own it (docs/design.md draws the whole picture):
///  - `ParamTable` (the framework's tensors, their records and validation);
///  - `StateStore` (state blocks, segment table, chunks);
///  - an `UpdateEngine`: `HostEngine`, or `DeviceEngine` for a `DeviceBackend`
///    (plans, copies, the cost model, the policy);
///  - the training loop: `GradNorm`, `LossScaler`, `LrSchedules`, `GradAccumulator`;
///  - checkpoint access (`engine::StateAccessors`, `engine/state_access.hpp`).

#include "dos/backend/cpu.hpp"
#include "dos/backend/device_backend.hpp"
#include "dos/components.hpp"
#include "dos/core/call_guard.hpp"
#include "dos/core/function_ref.hpp"
#include "dos/core/state_hold.hpp"
#include "dos/core/tensor.hpp"
#include "dos/engine/state_access.hpp"
#include "dos/engine/update_engine.hpp"
#include "dos/engine/value_io.hpp"
#include "dos/error.hpp"
#include "dos/optim/adam.hpp"
#include "dos/optim/loss_scaler.hpp"
#include "dos/optim/param_group.hpp"
#include "dos/options.hpp"
#include "dos/state/param_table.hpp"
#include "dos/state/state_store.hpp"
#include "dos/state/step_counts.hpp"
#include "dos/train/accumulator.hpp"
#include "dos/train/grad_norm.hpp"
#include "dos/train/lr_schedules.hpp"
#include "dos/train/rank_agreement.hpp"

#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <vector>

namespace dos {

/// @brief Adam/AdamW over parameters whose fp32 state lives in host memory, with the
///        update split between the CPU and (with a device backend) a device.
/// @tparam Backend `CpuBackend` updates everything on the CPU; a `DeviceBackend`
///         (`EmulatedDeviceBackend`, `CudaBackend`) splits the subgroups.
/// @tparam C the partitioner, cost model and CPU executor (`DefaultComponents`).
/// @code
/// std::vector<dos::HostParam<float>> params = ...;
/// dos::InterleavedOptimizer<dos::CpuBackend> opt(params, dos::AdamW{.lr = 3e-4}, {.threads = 8});
/// for (...) { /* forward, backward */ opt.step(); }
///
/// dos::Options o;
/// o.interleave.policy = dos::ResidentThenStride{};
/// dos::InterleavedOptimizer<dos::EmulatedDeviceBackend> dev(params, dos::AdamW{}, o);
/// @endcode
template <class Backend = CpuBackend, Components C = DefaultComponents>
class InterleavedOptimizer : public engine::StateAccessors<InterleavedOptimizer<Backend, C>, DeviceBackend<Backend>> {
  static_assert(check_backend<Backend>());

  using Executor = typename C::cpu_executor;
  using Model = typename C::cost_model;
  using Engine = engine::engine_for<Backend, Executor, Model>;
  using Pinned = engine::pinned_memory_for<Backend, Executor, Model>;
 public:
  /// @brief Whether the backend is a device backend (the update may be interleaved).
  static constexpr bool interleaved = DeviceBackend<Backend>;
  using BackendConfig = typename Backend::Config;

  /// @brief One group: every parameter of @p params shares @p hyper.
  /// @throws std::invalid_argument for an empty list, invalid hyperparameters or options,
  ///         or a bad parameter view.
  template <std::ranges::input_range R>
    requires Tensor<std::ranges::range_value_t<R>>
  InterleavedOptimizer(R&& params, AdamConfig hyper, Options options = {}, BackendConfig backend = {})
      : InterleavedOptimizer(one_group(std::forward<R>(params), hyper), std::move(options), backend) {}

  /// @brief Several groups, each with its own hyperparameters.
  /// @throws std::invalid_argument as above.
  template <Tensor P>
  explicit InterleavedOptimizer(std::vector<ParamGroup<P>> groups, Options options = {}, BackendConfig backend = {})
      : options_(framework_sharded(validated(std::move(options)))), groups_(hyperparameters_of(groups)), cpu_(options_.cpu()),
        backend_(options_.cpu(), backend), values_(backend_, [this](std::size_t n, FunctionRef<void(std::size_t)> f) { cpu_.parallel_for(n, f); }),
        params_(flatten(groups), group_of_each(groups), engine::device_usable(backend_), interleaved, options_.caller_huge_pages),
        store_([&](std::span<const std::size_t> sizes) { return partitioner_.partition(sizes); }, params_, amsgrad_of(groups_),
               engine::pinned_resource(backend_, options_.huge_pages), [&](const TensorView& v, std::size_t off, std::span<float> out) { values_.read(v, off, out); }, cpu_),
        engine_(engine::make_engine<Engine>(backend_, cpu_, store_, params_, values_, options_.interleave)), norm_(params_.size(), store_.chunks().size()), scaler_(options_.loss_scaling),
        schedules_(groups_.size()), steps_(params_.size(), groups_.size()) {}

  InterleavedOptimizer(const InterleavedOptimizer&) = delete;
  InterleavedOptimizer& operator=(const InterleavedOptimizer&) = delete;
  ~InterleavedOptimizer() { holds_.wait_released(); }  // a background reader may still copy the state

  /// @brief Updates every parameter once, from its current gradient.
  /// @throws std::invalid_argument when a parameter's views no longer match what the
  ///         optimizer was built with; nothing has changed then.
  /// @throws std::logic_error when another call is running on this optimizer.
  StepReport step() { return guarded_step(std::nullopt); }

  // ---- The training loop around step() ------------------------------------------

  /// @brief The factor to multiply the loss by before backward (1 without loss scaling).
  double loss_scale() const noexcept { return scaler_.scale(); }
  /// @brief Sets group @p group's learning rate from @p schedule at every `step()`
  ///        call (see `LrSchedule`); an empty schedule turns it off.
  void set_schedule(std::size_t group, LrSchedule schedule) {
    const CallGuard::Exclusive busy(guard_, "set_schedule()");
    schedules_.set(checked_group(group), std::move(schedule));
  }
  /// @brief `step()` calls so far, skipped ones included: the index schedules see next.
  std::int64_t schedule_index() const noexcept { return schedules_.calls(); }
  /// @brief Sets the index the schedules see next, for resuming (schedules are code: set them again).
  void set_schedule_index(std::int64_t calls) {
    const CallGuard::Exclusive busy(guard_, "set_schedule_index()");
    schedules_.set_calls(calls);
  }
  /// @brief GradScaler's growth tracker: clean steps since the scale last changed (0 without scaling).
  std::int64_t loss_scale_growth_tracker() const noexcept { return scaler_.growth_tracker(); }
  /// @brief Restores the loss scale and its growth tracker, for resuming (`LossScaler::restore`).
  void set_loss_scaler_state(double scale, std::int64_t growth_tracker) {
    const CallGuard::Exclusive busy(guard_, "set_loss_scaler_state()");
    scaler_.restore(scale, growth_tracker);
  }

  /// @brief Backward is about to start. With a device backend the coming update's plan
  ///        is chosen now, so `grad_ready` can start transfers while backward goes on.
  void begin_backward() {
    const CallGuard::Exclusive busy(guard_, "begin_backward()");
    end_backward();
    engine_.begin_backward();
  }
  /// @brief Parameter @p param's gradient is final for this backward pass: its norm
  ///        contribution and overflow check are taken now; a device gradient bound for
  ///        the CPU starts its copy. The gradient must stay unchanged until `step()`
  ///        returns. May be called from several threads at once. An absent gradient
  ///        (`ConstTensorView::absent()`) is ignored: `step()` reads the view again.
  /// @throws std::invalid_argument for a bad index or view; nothing changes then.
  void grad_ready(std::size_t param) {
    const CallGuard::Shared busy(guard_, "grad_ready()");
    const TensorView v = params_.read_value(params_.checked(param));
    const ConstTensorView g = params_.read_grad(param, v);
    if (g.is_absent()) return;
    engine_.wait_for_framework();
    if (accumulator_.active()) return;  // the step reads the sums, not this gradient
    norm_.record(param, params_.on_device(param) ? engine_.device_grad_stats(g)
                                                 : GradNorm::of_host_param(store_, param, g));
    engine_.grad_ready(param, g);
  }
  /// @brief Adds every parameter's current gradient into an fp32 host accumulator (one
  ///        micro-batch done); the next `step()` updates from the sum, then clears it.
  ///        An absent gradient adds nothing; a parameter absent in every micro-batch is skipped.
  /// @throws std::invalid_argument for a bad view, or a gradient on a device.
  void accumulate() {
    const CallGuard::Exclusive busy(guard_, "accumulate()");
    accumulator_.add(cpu_, store_, params_, grads_scratch_);
  }
  /// @brief Micro-batches accumulated since the last step.
  std::int64_t micro_batches() const noexcept { return accumulator_.micro_batches(); }

  /// @brief Steps applied so far (skipped steps excluded).
  std::int64_t step_count() const noexcept { return step_; }
  /// @brief Sets the step count and every parameter's, for resuming from a checkpoint.
  void set_step_count(std::int64_t t) {
    const CallGuard::Exclusive busy(guard_, "set_step_count()");
    steps_.set_all(t);
    step_ = t;
  }
  /// @brief Steps parameter @p param took: torch's `state[p]["step"]`. Steps at which it
  ///        had no gradient are not counted; its bias corrections use this count.
  std::int64_t step_count(std::size_t param) const { return steps_.count(params_.checked(param)); }
  /// @brief Sets parameter @p param's step count, for resuming (after `set_step_count(t)`);
  ///        throws std::invalid_argument for a bad index or @p t outside [0, INT64_MAX).
  void set_step_count(std::size_t param, std::int64_t t) {
    const CallGuard::Exclusive busy(guard_, "set_step_count()");
    steps_.set(params_.checked(param), t);
  }

  std::size_t num_params() const noexcept { return params_.size(); }
  /// @brief Elements of parameter @p param, as recorded at construction.
  std::size_t param_numel(std::size_t param) const { return params_.record(params_.checked(param)).numel; }
  /// @brief Parameter @p param as recorded at construction: size, dtype, place, group.
  const ParamRecord& param_record(std::size_t param) const { return params_.record(params_.checked(param)); }
  /// @brief Whether dos keeps an fp32 master of @p param apart from its value (16-bit or device values).
  bool param_has_master(std::size_t param) const { return store_.has_master(params_.checked(param)); }
  std::size_t num_groups() const noexcept { return groups_.size(); }
  const AdamConfig& hyperparameters(std::size_t group) const { return groups_[checked_group(group)]; }
  /// @brief Changes a group's learning rate, for schedulers; effective at the next step.
  void set_lr(std::size_t group, double lr) {
    AdamConfig c = groups_[checked_group(group)];
    c.lr = lr;
    set_hyperparameters(group, c);
  }
  /// @brief Replaces a group's hyperparameters; amsgrad cannot change (it owns state).
  /// @throws std::invalid_argument for an unknown group, invalid values, or a change of amsgrad.
  void set_hyperparameters(std::size_t group, const AdamConfig& c) {
    const CallGuard::Exclusive busy(guard_, "set_hyperparameters()");
    validate(c, checked_group(group));
    if (c.amsgrad != groups_[group].amsgrad)
      throw_invalid_argument("parameter group {}: amsgrad cannot change after construction", group);
    groups_[group] = c;
  }

  // Checkpoint access (read_state, write_state, hold_state, reload_masters) comes from
  // `engine::StateAccessors` (engine/state_access.hpp).

  // ---- The device side (device backends) ----------------------------------------

  /// @brief Whether the device takes part: false for `CpuBackend`, and for a device
  ///        backend without a usable device (every step then says why in `fallback`).
  bool device_available() const noexcept { return engine_.device_available(); }
  /// @brief Caps the device staging memory of later steps; below one slot, steps fall
  ///        back to the CPU with a reason.
  void set_staging_budget(std::size_t bytes) requires interleaved {
    const CallGuard::Exclusive busy(guard_, "set_staging_budget()");
    engine_.set_staging_budget(bytes);
  }
  /// @brief Changes the policy from the next step on; residents move now (`engine::DeviceEngine::set_policy`).
  void set_policy(const AnyPolicy& p) requires interleaved {
    const CallGuard::Exclusive busy(guard_, "set_policy()");
    engine_.set_policy(p);
  }
  const AnyPolicy& policy() const noexcept requires interleaved { return engine_.policy(); }
  /// @brief The last step's plan with its predicted and measured timelines.
  const StepTimeline& timeline() const noexcept requires interleaved { return engine_.timeline(); }
  /// @brief The cost model, refined by every step so far.
  const Model& cost_model() const requires interleaved { return engine_.cost_model(); }
  PoolStats staging_pool() const requires interleaved { return engine_.staging_pool(); }
  std::size_t staging_slot_bytes() const requires interleaved { return engine_.staging_slot_bytes(); }
  const std::vector<SubgroupShape>& subgroup_shapes() const noexcept requires interleaved { return engine_.subgroup_shapes(); }
  /// @brief Per subgroup, `Place::resident` or `Place::cpu`: the residents in force.
  const std::vector<Place>& residency() const noexcept requires interleaved { return engine_.residency(); }

  /// @brief Threads the CPU update runs on, the caller included.
  unsigned threads() const noexcept { return cpu_.threads(); }
  /// @brief The CPU kernel family in use.
  SimdLevel simd_level() const noexcept { return cpu_.simd_level(); }
  const std::vector<Subgroup>& subgroups() const noexcept { return store_.subgroups(); }
  const Options& options() const noexcept { return options_; }
  Backend& backend() noexcept { return backend_; }
  Executor& cpu_executor() noexcept { return cpu_; }

 private:
  template <class, Components>
  friend class ShardedOptimizer;
  friend class engine::StateAccessors<InterleavedOptimizer, interleaved>;
  // ZeRO-1 (`ShardedOptimizer`): @p whole gives the whole model's summary, computed the
  // same on every rank as one process would, instead of this shard's.
  StepReport guarded_step(std::optional<FunctionRef<GradSummary()>> whole) {
    const CallGuard::Exclusive busy = changing_state("step()");
    try {
      return step_impl(whole);
    } catch (...) {
      end_backward();  // what backward gathered may not describe a retried step's gradients
      throw;
    }
  }
  // One step, in order: validate everything, compute the factors, update, advance.
  StepReport step_impl(std::optional<FunctionRef<GradSummary()>> whole) {
    engine_.wait_for_framework();
    const auto start = std::chrono::steady_clock::now();
    const auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
    // 1. Validate (views, scheduled lrs), sum up the gradients; ranks agree. Nothing changes on error.
    const bool skip_nonfinite = scaler_.enabled() || options_.nonfinite == NonFinitePolicy::skip_step;
    const bool need_norm = skip_nonfinite || options_.max_grad_norm > 0;
    const GradSummary sum = agree_across_ranks(options_.communicator, [&] {
      if (step_ == std::numeric_limits<std::int64_t>::max())
        throw_invalid_argument("the step count is {}, the largest there is: it cannot advance", step_);
      params_.refresh([&](std::size_t i, const ConstTensorView& v) { return accumulator_.active() ? accumulator_.view(i) : v; });
      steps_.check_can_advance(params_);
      store_.bind(cpu_);  // the segment table now points at this step's views
      schedules_.prepare(groups_);
      if (!need_norm) return GradSummary{};
      if (whole) {  // the same on every rank: counted once, by rank 0
        GradSummary w = (*whole)();
        if (options_.communicator.rank() != 0) w.sum_squares = 0, w.nonfinite_params = 0;
        return w;
      }
      return norm_.gather(!accumulator_.active(), cpu_, store_, params_, [&](std::size_t p) { return engine_.device_grad_stats(params_.grad(p)); });
    });
    schedules_.apply(groups_);
    StepReport report;
    report.step = step_;
    report.loss_scale = scaler_.scale();
    // 2. Factors: 1/scale times the clipping coefficient (`step_multiplier`), or skip on overflow.
    float multiplier = 1;
    if (need_norm) {
      const std::optional<float> m = step_multiplier(sum, scaler_, skip_nonfinite, options_.max_grad_norm, report);
      if (!m) {
        scaler_.overflowed();
        end_phase();
        report.seconds = seconds();
        return report;
      }
      multiplier = *m;
    }
    steps_.prepare(store_, params_, groups_, multiplier);  // per group, and per parameter whose count differs
    engine_.update(report, step_ + 1);  // 3. Update every subgroup once (parameters without a gradient skipped).
    scaler_.applied();                  // 4. Advance.
    report.elements = steps_.advance(params_);
    end_phase();
    report.step = ++step_;
    report.applied = true;
    report.seconds = seconds();
    return report;
  }

  // The guard of a call that changes the state: a checkpoint's copy holding it goes first.
  CallGuard::Exclusive changing_state(const char* call) {
    holds_.wait_released();
    return CallGuard::Exclusive(guard_, call);
  }
  // After a step, applied or skipped: the backward phase and the accumulation are over.
  void end_phase() {
    end_backward();
    accumulator_.clear();
  }
  void end_backward() {
    norm_.forget();
    engine_.end_backward();
  }
  std::size_t checked_group(std::size_t g) const {
    if (g >= groups_.size()) throw_invalid_argument("parameter group {} does not exist (there are {})", g, groups_.size());
    return g;
  }
  Options options_;
  std::vector<AdamConfig> groups_;
  typename C::partitioner partitioner_ = make_partitioner<typename C::partitioner>(options_.subgroup_elements);
  Executor cpu_;
  Backend backend_;
  engine::ValueIo<Backend> values_;
  ParamTable params_;
  StateStore<Pinned> store_;
  Engine engine_;
  GradNorm norm_;
  LossScaler scaler_;
  LrSchedules schedules_;
  GradAccumulator accumulator_;
  StepCounts steps_;  // per parameter
  std::vector<ConstTensorView> grads_scratch_;  // accumulate()'s views
  std::int64_t step_ = 0;
  CallGuard guard_;
  StateHolds holds_;
};

/// @brief The all-CPU optimizer (ZeRO-Offload's update).
using CpuOptimizer = InterleavedOptimizer<CpuBackend>;

}  // namespace dos
