#pragma once
/// @file
/// @brief The `UpdateEngine` concept: what the optimizer façade asks of the part that
///        updates the subgroups. `HostEngine` (no device) and `DeviceEngine` (a
///        `DeviceBackend`) model it; `engine_for` picks one for a backend.

#include "dos/backend/device_backend.hpp"
#include "dos/core/grad_stats.hpp"
#include "dos/core/tensor.hpp"
#include "dos/engine/device_engine.hpp"
#include "dos/engine/host_engine.hpp"
#include "dos/engine/interleave_options.hpp"
#include "dos/cpu/cpu_adam.hpp"
#include "dos/memory/host_resource.hpp"

#include <concepts>
#include <cstddef>
#include <cstdint>

namespace dos::engine {

/// @brief Updates every subgroup once per step, and takes part in the backward phase.
///
/// `update(report, step)` runs after every view was validated and the step's
/// coefficients were set, and updates each subgroup exactly once; `begin_backward`,
/// `grad_ready(param, grad)` and `end_backward` bracket backward (may start transfers
/// early; `grad_ready` may be called from several threads at once); `device_grad_stats`
/// reads a device-resident gradient; `pull_resident`/`push_resident(subgroup)` make the
/// host copy of a resident subgroup's state current / write it back (checkpoints);
/// `refresh_values` re-reads the value views before state is written.
template <class G>
concept UpdateEngine = requires(G& g, const G& cg, UpdateReport& report, std::int64_t step, std::size_t i,
                                const ConstTensorView& grad) {
  { cg.device_available() } -> std::convertible_to<bool>;
  g.wait_for_framework();
  g.begin_backward();
  g.grad_ready(i, grad);
  g.end_backward();
  { g.device_grad_stats(grad) } -> std::same_as<GradStats>;
  g.update(report, step);
  g.pull_resident(i);
  g.push_resident(i);
  g.refresh_values();
};

namespace detail {
template <class B, class E, class Model, bool = DeviceBackend<B>>
struct EngineFor {
  using pinned_memory = HostResource;
  using store = StateStore<HostResource>;
  using type = HostEngine<E, store>;
};
template <class B, class E, class Model>
struct EngineFor<B, E, Model, true> {
  using type = DeviceEngine<B, E, Model>;
  using pinned_memory = typename type::PinnedMemory;
  using store = typename type::Store;
};
}  // namespace detail

/// @brief The engine for backend @p B: `DeviceEngine` for a device backend, else `HostEngine`.
template <class B, cpu::CpuExecutor E, CostModel Model>
using engine_for = typename detail::EngineFor<B, E, Model>::type;
/// @brief The host memory resource state blocks come from: pinned with a device backend.
template <class B, cpu::CpuExecutor E, CostModel Model>
using pinned_memory_for = typename detail::EngineFor<B, E, Model>::pinned_memory;

/// @brief Whether @p b has a device the engine may use.
template <class B>
bool device_usable(const B& b) {
  if constexpr (DeviceBackend<B>) return b.available();
  else return false;
}

/// @brief The host memory state blocks come from: the backend's pinned memory, or
///        plain (huge-page) host memory without a device backend.
template <class B>
auto pinned_resource(B& b, bool huge_pages) {
  if constexpr (DeviceBackend<B>) return b.pinned_memory();
  else return HostResource{huge_pages};
}

/// @brief Builds engine @p G for backend @p b.
template <class G, class B, class E, class Store, class Values>
G make_engine(B& b, E& cpu, Store& store, ParamTable& params, Values& values, const InterleaveOptions& o) {
  if constexpr (DeviceBackend<B>) return G(b, cpu, store, params, values, o);
  else return G(cpu, store);
}

static_assert(UpdateEngine<HostEngine<cpu::CpuAdamExecutor, StateStore<HostResource>>>);

}  // namespace dos::engine
