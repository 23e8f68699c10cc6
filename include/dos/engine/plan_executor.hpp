#pragma once
/// @file
/// @brief Runs a validated plan on a `DeviceBackend`.
///
/// The host walks the plan once, in issue order. A stream operation is enqueued on its
/// lane's stream after `wait`s on the completion events of its cross-lane
/// dependencies, between two timing events. A CPU operation first blocks the host on
/// the events it depends on, then runs on the CPU executor; operations issued after it
/// are enqueued only once it returned, which is what orders a push after its CPU
/// update. Staging slots are leased from a fixed pool for the step; after its download
/// a slot is `discard`ed, so an emulated device poisons it.

#include "dos/backend/device_backend.hpp"
#include "dos/engine/subgroup_io.hpp"
#include "dos/error.hpp"
#include "dos/memory/buffer_pool.hpp"
#include "dos/schedule/plan.hpp"
#include "dos/schedule/timeline.hpp"

#include <array>
#include <cstdio>
#include <exception>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

namespace dos::engine {

template <DeviceBackend B>
class PlanExecutor {
 public:
  using DeviceMemory = std::remove_cvref_t<decltype(std::declval<B&>().device_memory())>;
  using PinnedMemory = std::remove_cvref_t<decltype(std::declval<B&>().pinned_memory())>;
  using Io = SubgroupIo<DeviceMemory, PinnedMemory>;

  /// @param backend the device it runs on (kept by reference).
  /// @param max_ops the longest plan it will run (events are made for that many).
  /// @param slots, slot_bytes the staging pool, allocated now.
  PlanExecutor(B& backend, std::size_t max_ops, std::size_t slots, std::size_t slot_bytes)
      : b_(backend), pool_(slots, slot_bytes, backend.device_memory()), origin_(backend.make_event()) {
    for (std::size_t l = 1; l < lane_count; ++l) streams_[l] = b_.make_stream();  // the CPU lane has none
    begin_.reserve(max_ops);
    end_.reserve(max_ops);
    for (std::size_t i = 0; i < max_ops; ++i) {
      begin_.push_back(b_.make_event());
      end_.push_back(b_.make_event());
    }
    leases_.reserve(slots);
  }

  PlanExecutor(const PlanExecutor&) = delete;
  PlanExecutor& operator=(const PlanExecutor&) = delete;
  /// @brief Waits for everything issued (early gradient fetches included) before the
  ///        streams, events and staging slots go away.
  ~PlanExecutor() { synchronize_noexcept(); }

  /// @brief Waits until every stream is idle.
  void synchronize() {
    for (std::size_t l = 1; l < lane_count; ++l) b_.synchronize(streams_[l]);
  }

  std::size_t slots() const noexcept { return pool_.capacity(); }
  std::size_t slot_bytes() const noexcept { return pool_.block_bytes(); }
  PoolStats pool_stats() const { return pool_.stats(); }
  typename B::Stream& stream(Lane l) noexcept { return streams_[static_cast<std::size_t>(l)]; }

  /// @brief Runs @p plan; @p cpu_update(subgroup) updates one subgroup on the CPU.
  ///        Fills @p measured (seconds from the start, per op). Returns when every
  ///        stream is idle.
  template <class CpuUpdate>
  void run(const Plan& plan, std::span<Io> io, CpuUpdate&& cpu_update, std::vector<OpTiming>& measured) {
    if (plan.ops.size() > end_.size())
      throw_invalid_argument("plan has {} operations, the executor was sized for {}", plan.ops.size(), end_.size());
    if (plan.slots > pool_.capacity() || plan.slot_bytes > pool_.block_bytes())
      throw_invalid_argument("plan needs {} slots of {} B, the pool has {} of {} B", plan.slots, plan.slot_bytes,
                             pool_.capacity(), pool_.block_bytes());
    for (std::size_t j = 0; j < plan.slots; ++j) leases_.push_back(pool_.acquire());
    // Whatever happens below, nothing may still run on the device, and the leases go
    // back to the pool, when run() returns or throws: a throw with copies in flight
    // would otherwise let them write into memory the caller reuses, and the next step
    // would wait forever for slots nobody returns.
    struct Drain {
      PlanExecutor& self;
      ~Drain() {
        self.synchronize_noexcept();
        self.leases_.clear();
      }
    } drain{*this};
    measured.assign(plan.ops.size(), OpTiming{});

    using Clock = std::chrono::steady_clock;
    const auto host_origin = Clock::now();
    const auto since = [&](Clock::time_point t) { return std::chrono::duration<double>(t - host_origin).count(); };
    b_.record(origin_, stream(Lane::h2d));  // the h2d stream is idle: it completes at once

    for (std::size_t i = 0; i < plan.ops.size(); ++i) {
      const Op& op = plan.ops[i];
      Io& s = io[op.subgroup];
      if (op.lane == Lane::cpu) {
        for (const Dependency& d : op.dependencies())
          if (d.event) b_.synchronize(end_[d.op]);
        const auto t0 = Clock::now();
        cpu_update(op.subgroup);
        measured[i] = {since(t0), since(Clock::now())};
        continue;
      }
      auto& st = stream(op.lane);
      for (const Dependency& d : op.dependencies())
        if (d.event) b_.wait(st, end_[d.op]);
      b_.record(begin_[i], st);
      std::byte* const base = op.slot >= 0 ? leases_[static_cast<std::size_t>(op.slot)].data() : s.home.data();
      const bool streamed = op.slot >= 0;
      switch (op.kind) {
        case OpKind::upload:
          if (streamed)
            for (const SlotCopy& c : s.up_state) b_.copy_h2d(base + c.offset, c.host, c.bytes, st);
          for (const SlotCopy& c : s.up_value) b_.copy_h2d(base + c.offset, stage_in(c), c.bytes, st);
          for (const SlotCopy& c : s.up_grad) b_.copy_h2d(base + c.offset, stage_in(c), c.bytes, st);
          break;
        case OpKind::device_update:
          s.bind(base);
          b_.launch_adam(s.launch, st);
          break;
        case OpKind::download:
          if (streamed)
            for (const SlotCopy& c : s.down_state) b_.copy_d2h(c.host, base + c.offset, c.bytes, st);
          for (const SlotCopy& c : s.down_value)
            b_.copy_d2h(c.staged != nullptr ? c.staged : c.host, base + c.offset, c.bytes, st);
          if (streamed) b_.discard(base, s.layout.bytes, st);
          break;
        case OpKind::fetch_grad:
          for (const DirectCopy& c : s.fetch) b_.copy_d2h(c.dst, c.src, c.bytes, st);
          break;
        case OpKind::push_params:
          for (const DirectCopy& c : s.push) b_.copy_h2d(c.dst, c.src, c.bytes, st);
          break;
        case OpKind::cpu_update: break;
      }
      b_.record(end_[i], st);
    }
    synchronize();
    // Staged values reach the framework's tensors once every download is done; the
    // framework reads them only after the step returns.
    for (const Op& op : plan.ops)
      if (op.kind == OpKind::download)
        for (const SlotCopy& c : io[op.subgroup].down_value)
          if (c.staged != nullptr) std::memcpy(c.host, c.staged, c.bytes);
    for (std::size_t i = 0; i < plan.ops.size(); ++i)
      if (plan.ops[i].lane != Lane::cpu)
        measured[i] = {b_.elapsed(origin_, begin_[i]), b_.elapsed(origin_, end_[i])};
  }

 private:
  // A staged upload reads pinned memory the host fills now: the subgroup's one upload
  // per step, after the last step's copies (run() waited for them) are done.
  static const void* stage_in(const SlotCopy& c) noexcept {
    if (c.staged == nullptr) return c.host;
    std::memcpy(c.staged, c.host, c.bytes);
    return c.staged;
  }

  void synchronize_noexcept() noexcept {
    try {
      synchronize();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dos: waiting for the device streams failed: %s\n", e.what());
    }
  }

  B& b_;
  std::array<typename B::Stream, lane_count> streams_{};  // [cpu] is unused
  BufferPool<DeviceMemory> pool_;
  std::vector<typename BufferPool<DeviceMemory>::Lease> leases_;
  typename B::Event origin_;
  std::vector<typename B::Event> begin_, end_;
};

}  // namespace dos::engine
