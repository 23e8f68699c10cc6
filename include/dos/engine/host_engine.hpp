#pragma once
/// @file
/// @brief `HostEngine`: the update engine of a backend without a device. Every
///        subgroup's chunks run on the CPU executor, in place on the framework's host
///        tensors; there is nothing to plan, move or wait for.

#include "dos/core/grad_stats.hpp"
#include "dos/core/tensor.hpp"
#include "dos/cpu/executor.hpp"
#include "dos/engine/interleave_options.hpp"

#include <cstddef>
#include <cstdint>

namespace dos::engine {

/// @brief All-CPU updates of the subgroups of @p Store on executor @p E.
template <cpu::CpuExecutor E, class Store>
class HostEngine {
 public:
  HostEngine(E& cpu, Store& store) noexcept : cpu_(cpu), store_(store) {}

  bool device_available() const noexcept { return false; }
  void wait_for_framework() noexcept {}
  void begin_backward() noexcept {}
  void grad_ready(std::size_t, const ConstTensorView&) noexcept {}
  void end_backward() noexcept {}
  /// @brief Never called: a host backend has no device tensors.
  GradStats device_grad_stats(const ConstTensorView&) noexcept { return {}; }
  void update(UpdateReport&, std::int64_t) { cpu_.run(store_.chunks(), store_.work()); }
  void pull_resident(std::size_t) noexcept {}
  void push_resident(std::size_t) noexcept {}
  void refresh_values() noexcept {}

 private:
  E& cpu_;
  Store& store_;
};

}  // namespace dos::engine
