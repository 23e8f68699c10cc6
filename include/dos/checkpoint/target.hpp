#pragma once
/// @file
/// @brief `CheckpointTarget`: exactly the optimizer members checkpoints use, so they
///        work with any class offering this public API (`InterleavedOptimizer` with
///        every backend), and the tensor list both directions agree on.

#include "dos/interleaved_optimizer.hpp"

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dos {

/// @brief What `save`, `load` and `AsyncCheckpointer` call on an optimizer.
template <class O>
concept CheckpointTarget = requires(O& o, const O& c, std::size_t i, std::span<float> out, std::span<const float> in,
                                    const AdamConfig& hyper, std::int64_t n, double scale) {
  { c.num_params() } -> std::convertible_to<std::size_t>;
  { c.param_numel(i) } -> std::convertible_to<std::size_t>;
  { c.param_record(i) } -> std::convertible_to<ParamRecord>;
  { c.param_has_master(i) } -> std::convertible_to<bool>;
  { c.num_groups() } -> std::convertible_to<std::size_t>;
  { c.hyperparameters(i) } -> std::convertible_to<AdamConfig>;
  { c.step_count() } -> std::convertible_to<std::int64_t>;
  { c.step_count(i) } -> std::convertible_to<std::int64_t>;
  { c.schedule_index() } -> std::convertible_to<std::int64_t>;
  { c.loss_scale() } -> std::convertible_to<double>;
  { c.loss_scale_growth_tracker() } -> std::convertible_to<std::int64_t>;
  { c.options() } -> std::convertible_to<const Options&>;
  o.read_state(i, StateKind::exp_avg, out);
  o.write_state(i, StateKind::exp_avg, in);
  o.set_hyperparameters(i, hyper);
  o.set_step_count(n);
  o.set_step_count(i, n);
  o.set_schedule_index(n);
  o.set_loss_scaler_state(scale, n);
};

namespace checkpoint {

/// @brief One saved tensor: torch's optimizer `state_dict` name and where it comes from.
struct SavedTensor {
  std::string name;        ///< "state.<param>.exp_avg", ... , "state.<param>.master"
  std::size_t param = 0;
  StateKind kind = StateKind::exp_avg;
  std::size_t numel = 0;
  std::size_t offset = 0;  ///< in floats, within the snapshot and the file's data
};

/// @brief The name torch's `state_dict` (and the file) uses for a state kind.
inline const char* state_name(StateKind k) noexcept {
  switch (k) {
    case StateKind::master: return "master";
    case StateKind::exp_avg: return "exp_avg";
    case StateKind::exp_avg_sq: return "exp_avg_sq";
    case StateKind::max_exp_avg_sq: return "max_exp_avg_sq";
  }
  return "?";
}

/// @brief The tensors a checkpoint of @p opt holds, in file order: per parameter m, v,
///        vmax with amsgrad, and the fp32 master where dos keeps one apart from the
///        value (16-bit values; values on a device). The value of an fp32 host
///        parameter is its master, and the framework saves its weights itself.
template <CheckpointTarget O>
std::vector<SavedTensor> saved_tensors(const O& opt) {
  std::vector<SavedTensor> out;
  std::size_t offset = 0;
  for (std::size_t p = 0; p < opt.num_params(); ++p) {
    const std::size_t n = opt.param_numel(p);
    const auto add = [&](StateKind k) {
      out.push_back({fmt::format("state.{}.{}", p, state_name(k)), p, k, n, offset});
      offset += n;
    };
    add(StateKind::exp_avg);
    add(StateKind::exp_avg_sq);
    if (opt.hyperparameters(opt.param_record(p).group).amsgrad) add(StateKind::max_exp_avg_sq);
    if (opt.param_has_master(p)) add(StateKind::master);
  }
  return out;
}

}  // namespace checkpoint
}  // namespace dos
