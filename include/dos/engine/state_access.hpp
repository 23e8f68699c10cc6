#pragma once
/// @file
/// @brief Checkpoint access: free functions that copy one state tensor of a parameter
///        out of, or into, the optimizer's state blocks, wherever its pieces live (a
///        resident subgroup's truth is on the device; a device parameter's values are
///        read and written through staged copies), and `StateAccessors`, the
///        optimizer's public surface over them, each call under its call guard.

#include "dos/core/call_guard.hpp"
#include "dos/core/state_hold.hpp"
#include "dos/engine/update_engine.hpp"
#include "dos/error.hpp"
#include "dos/engine/value_io.hpp"
#include "dos/state/param_table.hpp"
#include "dos/state/state_store.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

namespace dos::engine {

/// @brief Copies state @p kind of parameter @p param into @p out.
/// @throws std::invalid_argument for a bad index, kind or size, vmax without amsgrad,
///         or a value view that no longer matches.
template <class Store, UpdateEngine G, class Values>
void read_state(const Store& store, G& engine, Values& values, const ParamTable& params, std::size_t param,
                StateKind kind, std::span<float> out) {
  store.for_each_piece(param, kind, out.size(), [&](const float*, std::size_t, std::size_t, std::uint32_t) {});
  const TensorView v = params.read_value(param);
  store.for_each_piece(param, kind, out.size(), [&](const float* state, std::size_t off, std::size_t n, std::uint32_t s) {
    engine.pull_resident(s);
    if (state != nullptr) std::copy_n(state, n, out.begin() + static_cast<std::ptrdiff_t>(off));
    else values.read(v, off, out.subspan(off, n));
  });
}

/// @brief Copies state @p kind of parameter @p param out of the host state blocks
///        alone: never a value, never the device, never the parameter table's views, so
///        it may run on another thread while the owner makes calls that leave the state
///        as it is (the caller keeps mutating calls out, e.g. with a `StateHold`).
/// @throws std::invalid_argument for a bad index, kind or size, vmax without amsgrad,
///         or the master of an fp32 host parameter (its value is its master: read it).
template <class Store>
void read_stored_state(const Store& store, std::size_t param, StateKind kind, std::span<float> out) {
  store.for_each_piece(param, kind, out.size(), [&](const float* state, std::size_t, std::size_t, std::uint32_t) {
    if (state == nullptr)
      throw_invalid_argument("parameter {}: an fp32 host parameter's master is its value, which only the framework "
                             "holds; read the value instead", param);
  });
  store.for_each_piece(param, kind, out.size(), [&](const float* state, std::size_t off, std::size_t n, std::uint32_t) {
    std::copy_n(state, n, out.begin() + static_cast<std::ptrdiff_t>(off));
  });
}

/// @brief Overwrites state @p kind of parameter @p param from @p in. Writing the master
///        of a 16-bit parameter also rewrites its value, rounded.
/// @throws std::invalid_argument as `read_state`; nothing changes then.
template <class Store, UpdateEngine G, class Values>
void write_state(Store& store, G& engine, Values& values, ParamTable& params, std::size_t param, StateKind kind,
                 std::span<const float> in) {
  store.for_each_piece(param, kind, in.size(), [&](const float*, std::size_t, std::size_t, std::uint32_t) {});
  const TensorView v = params.read_value(param);
  engine.refresh_values();  // a resident push copies fp32 values from where they are now
  store.for_each_piece(param, kind, in.size(), [&](float* state, std::size_t off, std::size_t n, std::uint32_t s) {
    engine.pull_resident(s);  // the shadow must be current before a partial write
    if (state != nullptr) std::copy_n(in.begin() + static_cast<std::ptrdiff_t>(off), n, state);
    if (kind == StateKind::master) values.write(v, off, in.subspan(off, n));
    engine.push_resident(s);
  });
}

/// @brief Re-reads every fp32 master from the parameter's current value (16-bit and
///        device-resident parameters): after the framework edited those values in
///        place (loaded weights, tied them, swapped in an EMA), which the master would
///        otherwise overwrite at the next step. m, v and vmax are kept.
/// @throws std::invalid_argument for a value view that no longer matches; nothing changes then.
template <class Store, UpdateEngine G, class Values>
void reload_masters(Store& store, G& engine, Values& values, ParamTable& params) {
  for (std::size_t p = 0; p < params.size(); ++p) (void)params.read_value(p);  // all checked first
  engine.refresh_values();
  for (std::size_t p = 0; p < params.size(); ++p) {
    if (!store.has_master(p)) continue;
    const TensorView v = params.read_value(p);
    store.for_each_piece(p, StateKind::master, params.record(p).numel,
                         [&](float* master, std::size_t off, std::size_t n, std::uint32_t s) {
                           engine.pull_resident(s);
                           values.read(v, off, {master, n});
                           engine.push_resident(s);
                         });
  }
}

/// @brief The checkpoint calls of an optimizer, which derives from it (CRTP): each runs
///        the function above of its name under the optimizer's call guard.
/// @tparam Derived the optimizer; it befriends this class and has `store_`, `engine_`,
///         `values_`, `params_`, `guard_`, `holds_` and `changing_state(call)` (the
///         exclusive guard of a call that changes the state, after the holds are released).
/// @tparam Interleaved whether a device may hold state: reads then pull it through a
///         stream, so they exclude each other, and a `StateHold` is not offered.
template <class Derived, bool Interleaved>
class StateAccessors {
 public:
  /// @brief Copies one state tensor of parameter @p param into @p out. Without a device
  ///        it only reads, so several threads may call it at once (checkpoint writers);
  ///        with one it may pull resident state through one stream, hence not const.
  /// @throws std::invalid_argument for a bad index, kind or size, or vmax without amsgrad.
  void read_state(std::size_t param, StateKind kind, std::span<float> out) {
    Derived& d = self();
    const std::conditional_t<Interleaved, CallGuard::Exclusive, CallGuard::Shared> busy(d.guard_, "read_state()");
    engine::read_state(d.store_, d.engine_, d.values_, d.params_, param, kind, out);
  }
  /// @brief Overwrites one state tensor of parameter @p param. Writing the master of a
  ///        16-bit parameter also rewrites its value, rounded.
  void write_state(std::size_t param, StateKind kind, std::span<const float> in) {
    Derived& d = self();
    const CallGuard::Exclusive busy = d.changing_state("write_state()");
    engine::write_state(d.store_, d.engine_, d.values_, d.params_, param, kind, in);
  }
  /// @brief Keeps the host state as it is until released (`core/state_hold.hpp`): calls
  ///        that change it wait. Not for device optimizers (residents move by stream).
  StateHold hold_state() requires(!Interleaved) { return self().holds_.hold(); }
  /// @brief `read_state` for the holder of @p h, from any thread (`read_stored_state`).
  /// @throws std::invalid_argument for a hold on another optimizer, or as that function.
  void read_state(const StateHold& h, std::size_t param, StateKind kind, std::span<float> out) const
    requires(!Interleaved)
  {
    const Derived& d = self();
    if (!h.holds(d.holds_)) throw_invalid_argument("read_state: the hold given is not a live hold on this optimizer");
    engine::read_stored_state(d.store_, param, kind, out);
  }
  /// @brief The fp32 master of 16-bit and device-resident parameters is the truth the
  ///        next step updates; after editing such values in place, call this to make
  ///        the masters follow them (`reload_masters` above).
  void reload_masters() {
    Derived& d = self();
    const CallGuard::Exclusive busy = d.changing_state("reload_masters()");
    engine::reload_masters(d.store_, d.engine_, d.values_, d.params_);
  }

 protected:
  StateAccessors() = default;

 private:
  Derived& self() noexcept { return static_cast<Derived&>(*this); }
  const Derived& self() const noexcept { return static_cast<const Derived&>(*this); }
};

}  // namespace dos::engine
