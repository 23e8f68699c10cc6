#pragma once
/// @file
/// @brief Checkpoint access as free functions: copy one state tensor of a parameter
///        out of, or into, the optimizer's state blocks, wherever its pieces live (a
///        resident subgroup's truth is on the device; a device parameter's values are
///        read and written through staged copies).

#include "dos/engine/update_engine.hpp"
#include "dos/error.hpp"
#include "dos/engine/value_io.hpp"
#include "dos/state/param_table.hpp"
#include "dos/state/state_store.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

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

}  // namespace dos::engine
