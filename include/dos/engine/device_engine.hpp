#pragma once
/// @file
/// @brief `DeviceEngine`: the update engine of a `DeviceBackend`. It owns everything
///        the device adds to the optimizer: per-subgroup slot layouts and copy lists,
///        the pinned mirrors of device tensors, resident homes, the staging pool (in
///        the plan executor), the cost model, the policy and the last timeline.
///
/// One update: refresh the copy lists from the step's views, let the policy choose a
/// plan (unless `begin_backward` already did), predict it, validate it, run it (device
/// operations issued first, CPU subgroups on the executor meanwhile), refine the model
/// and show the policy what was measured. Everything it touches in a step was sized at
/// construction.

#include "dos/backend/device_backend.hpp"
#include "dos/cpu/executor.hpp"
#include "dos/engine/calibrate.hpp"
#include "dos/error.hpp"
#include "dos/engine/host_registration.hpp"
#include "dos/engine/interleave_options.hpp"
#include "dos/engine/plan_executor.hpp"
#include "dos/engine/subgroup_io.hpp"
#include "dos/engine/value_io.hpp"
#include "dos/schedule/any_policy.hpp"
#include "dos/schedule/cost_model.hpp"
#include "dos/schedule/timeline.hpp"
#include "dos/schedule/validator.hpp"
#include "dos/state/param_table.hpp"
#include "dos/state/state_store.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace dos::engine {

/// @brief The update engine of device backend @p B, CPU executor @p E, cost model @p Model.
template <DeviceBackend B, cpu::CpuExecutor E, CostModel Model>
class DeviceEngine {
 public:
  using Executor = PlanExecutor<B>;
  using PinnedMemory = typename Executor::PinnedMemory;
  using Store = StateStore<PinnedMemory>;

  /// @throws std::invalid_argument for an invalid policy.
  DeviceEngine(B& backend, E& cpu, Store& store, ParamTable& params, ValueIo<B>& values, const InterleaveOptions& o)
      : b_(backend), cpu_(cpu), store_(store), params_(params), values_(values), options_(o),
        host_views_(backend, params.size()), policy_(o.policy) {
    policy_.validate();
    if (!backend.available()) return;
    // Measure first: calibration borrows device memory the pool may take next.
    model_.emplace(o.profile ? *o.profile : calibrate(b_, cpu_));
    const std::size_t n = store.subgroups().size();
    io_.resize(n);
    shapes_.resize(n);
    std::size_t slot_bytes = 0;
    for (std::size_t s = 0; s < n; ++s) {
      lay_out(io_[s], shapes_[s], s, store, params);
      slot_bytes = std::max(slot_bytes, shapes_[s].slot_bytes);
      mirror_device_tensors(s);
    }
    const std::size_t available = b_.staging_bytes_available();
    const std::size_t budget = o.staging_budget != 0 ? o.staging_budget : available;
    const auto slots_for = [&](std::size_t streamable, std::size_t slot) {
      const std::size_t wanted = o.staging_slots == 0 ? streamable : std::min(o.staging_slots, streamable);
      return slot == 0 ? 0 : std::min(wanted, budget / slot);
    };
    reserve_plans(n);
    fetched_.assign(store.segments().size(), 0);
    host_views_.update(params);
    if (host_views_.refused()) stage_host_tensors();
    refresh_all(false);
    // Residents take the device memory the staging slots leave.
    const std::size_t staging = slots_for(n, slot_bytes) * slot_bytes;
    residency_request_ = {available > staging ? available - staging : 0, {staging, slots_for(n, slot_bytes)}};
    step_budget_ = budget;
    // Staging for every subgroup, the memory the residency request set aside for it: a
    // later policy may keep fewer subgroups resident and stream the others.
    executor_.emplace(b_, 3 * n + 1, slots_for(n, slot_bytes), slot_bytes);
    std::vector<Place> wanted;
    policy_.residency(residency_request(), wanted);
    check_residency(policy_, wanted);
    move_residents(wanted);  // from none: the same path as a later change of policy
    if constexpr (requires { model_->reserve(n); }) model_->reserve(n);
    policy_.reserve(n);
  }

  /// @brief Whether the device takes part (false: every step runs on the CPU).
  bool device_available() const noexcept { return model_.has_value(); }
  void wait_for_framework() {
    if (device_available()) b_.wait_for_framework();
  }

  /// @brief Chooses the coming step's plan now, from the last known shapes, so that
  ///        `grad_ready` can start gradient transfers during backward.
  void begin_backward() {
    if (!device_available()) return;
    choose(timeline_.plan);
    planned_ = true;
  }

  /// @brief A device gradient is final: the segments the plan puts on the CPU copy it
  ///        to the pinned mirror now, on the d2h stream, ahead of the plan's fetch.
  void grad_ready(std::size_t param, const ConstTensorView& g) {
    if (!device_available() || !planned_ || !params_.on_device(param) || g.is_absent()) return;
    const std::lock_guard lock(fetch_mutex_);
    const std::size_t gs = dtype_size(g.dtype);
    const auto refs = store_.segments();
    for (std::size_t k = 0; k < refs.size(); ++k) {
      const Segment& seg = *refs[k].segment;
      const std::uint32_t s = refs[k].subgroup;
      if (seg.tensor != param || timeline_.plan.placement[s] != Place::cpu || fetched_[k] != 0) continue;
      const std::size_t piece = io_[s].mirror_pieces[k - store_.blocks()[s].first_segment].grad;
      b_.copy_d2h(io_[s].mirror.data() + piece,
                  static_cast<const std::byte*>(g.data) + seg.tensor_offset * gs, seg.count * gs,
                  executor_->stream(Lane::d2h));
      fetched_[k] = 1;
      early_fetch_bytes_ += seg.count * gs;
    }
  }

  /// @brief Statistics of a device-resident gradient (blocks).
  GradStats device_grad_stats(const ConstTensorView& g) { return b_.grad_stats(g.data, g.dtype, g.numel); }

  /// @brief The backward phase is over (the step ran, was skipped, or threw): early
  ///        copies may still read the framework's gradients, which it overwrites once
  ///        `step()` returns, so they finish first; the plan chosen ahead is dropped.
  void end_backward() {
    planned_ = false;
    if (!device_available()) return;
    if (early_fetch_bytes_ > 0) b_.synchronize(executor_->stream(Lane::d2h));
    std::fill(fetched_.begin(), fetched_.end(), std::uint8_t{0});
    early_fetch_bytes_ = 0;
  }

  /// @brief Updates every subgroup once.
  /// @param report receives the plan's policy, stride, bytes, times and fallback.
  /// @param step the step this update makes (for the timeline).
  void update(UpdateReport& report, std::int64_t step) {
    report.policy = policy_.name();
    if (!device_available()) {
      cpu_.run(store_.chunks(), store_.work());
      if constexpr (requires { b_.unavailable_reason(); }) report.fallback = b_.unavailable_reason();
      return;
    }
    refresh_all(true);
    if (!staging_) register_host_views();  // before any copy of them is issued
    StepTimeline& t = timeline_;
    if (!planned_) choose(t.plan);
    t.predicted_seconds = model_->predict(t.plan, &t.predicted);
    if (options_.validate_plans) validate_plan(t.plan, check_);
    const auto start = std::chrono::steady_clock::now();
    executor_->run(
        t.plan, std::span(io_), [&](std::uint32_t s) { cpu_.run(store_.chunks_of(s), store_.work()); }, t.measured);
    t.measured_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    t.policy = policy_.name();
    t.step = step;
    if (options_.refine) model_->refine(t);
    policy_.observe(t);
    if (policy_.next_residency(wanted_)) follow_policy();
    report.stride = t.plan.stride;
    report.device_subgroups = t.plan.device_subgroups();
    report.resident_subgroups = static_cast<std::size_t>(std::count(t.plan.placement.begin(), t.plan.placement.end(), Place::resident));
    report.bytes_moved = bytes_moved(t.plan);
    report.predicted_seconds = t.predicted_seconds;
    report.update_seconds = t.measured_seconds;
    report.fallback = t.plan.fallback;
    report.explored = t.plan.explored;
    report.early_fetch_bytes = early_fetch_bytes_;
  }

  /// @brief Resident subgroups: the device home is the truth and the host block its
  ///        shadow. `pull` makes the shadow current; `push` writes it back.
  void pull_resident(std::size_t s) {
    if (!resident(s)) return;
    for (const SlotCopy& c : io_[s].down_state) values_.copy_d2h(c.host, io_[s].home.data() + c.offset, c.bytes);
  }
  void push_resident(std::size_t s) {
    if (resident(s)) push_home(s);
  }
  /// @brief Re-reads every value view (validated) and the copy lists built from them,
  ///        so a resident push copies fp32 values from where they are now.
  void refresh_values() {
    if (!device_available()) return;
    params_.refresh_values();
    refresh_all(false);
  }

  /// @brief Replaces the policy. Where it keeps other subgroups resident than the
  ///        policy before it (its `residency` sees the device memory as it was at
  ///        construction), their state moves now: a subgroup that stops being resident
  ///        is pulled into its host block, which is its truth from then on, and its
  ///        device home freed; one that becomes resident gets a home and its host
  ///        state pushed into it. The bits of later steps do not depend on where a
  ///        subgroup was updated, so a change of residency changes no result.
  /// @throws std::invalid_argument for an invalid policy, a residency that is not one
  ///         `Place` per subgroup, `resident` or `cpu`, within the device memory, or a
  ///         change of residency between `begin_backward()` and `step()` (the coming
  ///         step's plan is already chosen); nothing has changed then. The backend's
  ///         error when a new home cannot be allocated or filled: the policy stays, the
  ///         subgroups not yet moved in stay on the CPU with their state (`residency()`
  ///         says which are resident), and nothing is lost.
  void set_policy(const AnyPolicy& p) {
    p.validate();
    AnyPolicy next = p;  // copied and sized first: nothing after the move may throw
    next.reserve(shapes_.size());
    if (device_available()) {
      std::vector<Place> theirs;
      p.residency(residency_request(), theirs);
      check_residency(p, theirs);
      if (theirs != residency_) {
        if (planned_)
          throw_invalid_argument("policy {} would keep other subgroups resident than policy {}, and the coming "
                                 "step's plan is already chosen: change the residency before begin_backward() or "
                                 "after step()", p.name(), policy_.name());
        move_residents(theirs);
      } else {
        drop_kept_homes(theirs);
      }
    }
    policy_ = std::move(next);
  }
  const AnyPolicy& policy() const noexcept { return policy_; }
  void set_staging_budget(std::size_t bytes) noexcept { step_budget_ = bytes; }
  const StepTimeline& timeline() const noexcept { return timeline_; }
  const Model& cost_model() const { return *model_; }
  PoolStats staging_pool() const { return executor_ ? executor_->pool_stats() : PoolStats{}; }
  std::size_t staging_slot_bytes() const noexcept { return executor_ ? executor_->slot_bytes() : 0; }
  const std::vector<SubgroupShape>& subgroup_shapes() const noexcept { return shapes_; }
  const std::vector<Place>& residency() const noexcept { return residency_; }

 private:
  bool resident(std::size_t s) const noexcept { return device_available() && residency_[s] == Place::resident; }

  // Writes subgroup s's host state and fp32 host values into its device home.
  void push_home(std::size_t s) {
    for (const auto* list : {&io_[s].up_state, &io_[s].up_value})
      for (const SlotCopy& c : *list) {
        if (c.staged != nullptr) std::memcpy(c.staged, c.host, c.bytes);  // never from unregistered memory
        values_.copy_h2d(io_[s].home.data() + c.offset, c.staged != nullptr ? c.staged : c.host, c.bytes);
      }
  }

  // A policy's residency, checked before anything uses it: one place per subgroup,
  // resident or cpu, and the residents' homes within the memory set aside for them.
  void check_residency(const AnyPolicy& p, const std::vector<Place>& r) const {
    if (r.size() != shapes_.size())
      throw_invalid_argument("policy {} chose a residency of {} places for {} subgroups", p.name(), r.size(),
                             shapes_.size());
    std::size_t bytes = 0;
    for (std::size_t s = 0; s < r.size(); ++s) {
      if (r[s] != Place::cpu && r[s] != Place::resident)
        throw_invalid_argument("policy {} chose place {} for subgroup {}; a residency is resident or cpu", p.name(),
                               static_cast<int>(r[s]), s);
      if (r[s] == Place::resident) bytes += io_[s].layout.bytes;
    }
    if (bytes > residency_request_.first)
      throw_invalid_argument("policy {} keeps {} B resident; the device memory left after staging is {} B", p.name(),
                             bytes, residency_request_.first);
  }

  // Moves subgroups in and out of residency between steps, with the streams idle.
  // Those that leave go first: their host blocks become current and their homes are
  // freed (kept, if @p keep_homes), so the homes of those that join never need room
  // for both sets. A joining subgroup becomes resident only once its home holds its
  // state; if a home cannot be allocated or filled, that subgroup and the ones after it
  // stay on the CPU with their host state current, nothing is lost, and the error
  // propagates.
  void move_residents(const std::vector<Place>& to, bool keep_homes = false) {
    using Home = decltype(io_[0].home);
    refresh_values();  // a push copies fp32 values from where the framework has them now
    executor_->synchronize();
    for (std::size_t s = 0; s < to.size(); ++s)
      if (residency_[s] == Place::resident && to[s] != Place::resident) {
        pull_resident(s);
        residency_[s] = Place::cpu;
      }
    // Homes kept for a return stay only if this move keeps them and they fit, with the
    // new residents, in the memory set aside for residents (a policy's moves need not
    // be nested).
    std::size_t held = 0;
    for (std::size_t s = 0; s < to.size(); ++s)
      if (io_[s].home.data() != nullptr || to[s] == Place::resident) held += io_[s].layout.bytes;
    if (!keep_homes || held > residency_request_.first) drop_kept_homes(to);
    for (std::size_t s = 0; s < to.size(); ++s)
      if (to[s] == Place::resident && residency_[s] != Place::resident) {
        if (io_[s].home.data() == nullptr) io_[s].home = Home(io_[s].layout.bytes, b_.device_memory());
        try {
          push_home(s);
        } catch (...) {
          io_[s].home = Home();
          throw;
        }
        residency_[s] = Place::resident;
      }
  }

  // Frees the homes kept for a return, but those of subgroups @p to makes resident.
  void drop_kept_homes(const std::vector<Place>& to) {
    for (std::size_t s = 0; s < to.size(); ++s)
      if (residency_[s] != Place::resident && to[s] != Place::resident) io_[s].home = decltype(io_[s].home)();
  }

  // The policy asked, after a step, for other residents from the next one (it measures
  // residencies): they move now, and those that leave keep their homes, so a policy
  // that tries counts back and forth allocates nothing after its first visit to each
  // (the memory was set aside for residents when the policy was set). The step has
  // run: a move that fails changes nothing of its result and loses nothing; it is
  // reported, and the policy sees in its next choice which subgroups are resident.
  void follow_policy() {
    try {
      check_residency(policy_, wanted_);
      move_residents(wanted_, /*keep_homes=*/true);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dos: warning: policy %.*s asked for other resident subgroups and they could not move: %s\n",
                   static_cast<int>(policy_.name().size()), policy_.name().data(), e.what());
    }
  }

  // The CPU updates device tensors on the pinned mirror: gradients fetched in, values
  // pushed out. Its pieces take each value's type (lay_out_mirror).
  void mirror_device_tensors(std::size_t s) {
    const auto& block = store_.blocks()[s];
    const std::size_t bytes = lay_out_mirror(io_[s], s, store_, params_);
    shapes_[s].mirror_bytes = bytes;
    if (bytes == 0) return;
    io_[s].mirror = HostBuffer<std::byte, PinnedMemory>(bytes, b_.pinned_memory());
    for (std::uint32_t w = block.first_segment; w < block.end_segment; ++w) {
      const MirrorPiece& p = io_[s].mirror_pieces[w - block.first_segment];
      if (p.grad == SlotLayout::absent) continue;
      store_.work()[w].args.grad = io_[s].mirror.data() + p.grad;
      store_.work()[w].args.param = io_[s].mirror.data() + p.value;
    }
  }

  // The backend refused to register a host tensor (or cannot register any): every
  // subgroup with host tensors copies them through pinned staging of its own, for
  // good, rather than let one copy be synchronous and hold the CPU lane behind the device.
  void stage_host_tensors() {
    std::size_t bytes = 0;
    for (std::size_t s = 0; s < io_.size(); ++s) {
      if (io_[s].layout.grad == SlotLayout::absent) continue;  // no host tensor
      const std::size_t e4 = store_.subgroups()[s].state_elements * 4;
      io_[s].staging = HostBuffer<std::byte, PinnedMemory>(2 * e4, b_.pinned_memory());
      bytes += 2 * e4;
    }
    staging_ = true;
    std::fprintf(stderr, "dos: warning: the device backend could not register the framework's host tensors; their "
                         "copies to and from the device go through %zu B of pinned staging (a CPU copy each way)\n",
                 bytes);
  }
  void register_host_views() {
    host_views_.update(params_);
    if (!host_views_.refused() || warned_synchronous_) return;
    warned_synchronous_ = true;
    std::fprintf(stderr, "dos: warning: a host tensor that moved could not be registered with the device; its copies "
                         "are synchronous, and the CPU waits for the device's work before them\n");
  }

  void reserve_plans(std::size_t n) {
    assignment_.reserve(n);
    wanted_.reserve(n);
    residency_.assign(n, Place::cpu);
    for (Plan* plan : {&timeline_.plan, &candidate_}) {
      plan->ops.reserve(3 * n + 1);
      plan->placement.reserve(n);
      plan->shapes.reserve(n);
      for (auto& w : plan->workspace) w.reserve(n);
    }
    check_.reserve(n, 3 * n + 1, n);
    timeline_.predicted.reserve(3 * n + 1);
    timeline_.measured.reserve(3 * n + 1);
  }

  void refresh_all(bool with_grads) {
    for (std::size_t s = 0; s < io_.size(); ++s) refresh_io(io_[s], shapes_[s], s, store_, params_, with_grads, fetched_);
  }

  ResidencyRequest residency_request() {
    return {shapes_, residency_request_.first, residency_request_.second, predict_, candidate_, assignment_};
  }
  PlanLimits limits() const {
    return {std::min(step_budget_, executor_->slots() * executor_->slot_bytes()), executor_->slots()};
  }
  void choose(Plan& plan) {
    policy_.choose({shapes_, residency_, limits(), model_->profile(), predict_, candidate_, assignment_}, plan);
  }

  B& b_;
  E& cpu_;
  Store& store_;
  ParamTable& params_;
  ValueIo<B>& values_;
  InterleaveOptions options_;
  HostRegistration<B> host_views_;  // outlives the executor, whose copies use the views
  AnyPolicy policy_;
  std::optional<Model> model_;
  std::vector<typename Executor::Io> io_;
  std::vector<SubgroupShape> shapes_;
  std::vector<Place> residency_;   // Place::resident or Place::cpu; changes only between steps (move_residents)
  std::vector<Place> assignment_;  // scratch for the policy
  std::vector<Place> wanted_;      // the residency the policy asks for after a step
  Plan candidate_;                 // scratch for the policy
  StepTimeline timeline_;
  PlanCheckWorkspace check_;
  std::size_t step_budget_ = 0;
  std::vector<std::uint8_t> fetched_;  // per segment: its gradient was fetched during backward
  std::size_t early_fetch_bytes_ = 0;
  bool planned_ = false;
  bool staging_ = false;             // host tensors go through SubgroupIo::staging
  bool warned_synchronous_ = false;  // a moved host tensor was refused after construction
  std::mutex fetch_mutex_;
  std::pair<std::size_t, PlanLimits> residency_request_{};  // resident bytes and staging at construction
  struct Predict {
    DeviceEngine* self;
    double operator()(const Plan& p) const { return self->model_->predict(p); }
  } predict_{this};
  // Last, so it is destroyed first: its destructor waits for every stream (early
  // gradient fetches may still be writing into the mirrors in io_) before they go.
  std::optional<Executor> executor_;
};

}  // namespace dos::engine
