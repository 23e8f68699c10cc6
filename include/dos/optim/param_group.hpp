#pragma once
/// @file
/// @brief Parameter groups: parameters that share hyperparameters, such as the
///        "no weight decay on biases and norms" group of every LLM recipe.

#include "dos/core/tensor.hpp"
#include "dos/optim/adam.hpp"

#include <cstddef>
#include <cstdint>
#include <ranges>
#include <utility>
#include <vector>

namespace dos {

/// @brief Parameters with their hyperparameters.
/// @tparam P any type satisfying `Tensor`.
/// @code
/// std::vector<dos::ParamGroup<dos::HostParam<float>>> groups{
///     {matrices, dos::AdamW{.weight_decay = 0.1}},
///     {biases_and_norms, dos::AdamW{.weight_decay = 0.0}},
/// };
/// @endcode
template <Tensor P>
struct ParamGroup {
  std::vector<P> params;
  AdamConfig hyper = Adam{};
};

/// @brief Each group's hyperparameters, validated.
/// @throws std::invalid_argument naming the first invalid group and field.
template <Tensor P>
std::vector<AdamConfig> hyperparameters_of(const std::vector<ParamGroup<P>>& groups) {
  std::vector<AdamConfig> out;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    validate(groups[g].hyper, g);
    out.push_back(groups[g].hyper);
  }
  return out;
}

/// @brief Whether each group uses amsgrad.
inline std::vector<bool> amsgrad_of(const std::vector<AdamConfig>& groups) {
  std::vector<bool> out;
  for (const AdamConfig& g : groups) out.push_back(g.amsgrad);
  return out;
}

/// @brief Every parameter of every group, in order, moved out of @p groups.
template <Tensor P>
std::vector<P> flatten(std::vector<ParamGroup<P>>& groups) {
  std::vector<P> flat;
  for (auto& g : groups)
    for (auto& p : g.params) flat.push_back(std::move(p));
  return flat;
}

/// @brief The group of each parameter, in the order of `flatten`.
template <Tensor P>
std::vector<std::uint32_t> group_of_each(const std::vector<ParamGroup<P>>& groups) {
  std::vector<std::uint32_t> out;
  for (std::size_t g = 0; g < groups.size(); ++g)
    out.insert(out.end(), groups[g].params.size(), static_cast<std::uint32_t>(g));
  return out;
}

/// @brief One group of every element of @p params, with @p hyper.
template <std::ranges::input_range R>
std::vector<ParamGroup<std::ranges::range_value_t<R>>> one_group(R&& params, const AdamConfig& hyper) {
  ParamGroup<std::ranges::range_value_t<R>> g;
  for (auto&& p : params) g.params.push_back(p);
  g.hyper = hyper;
  std::vector<ParamGroup<std::ranges::range_value_t<R>>> out;
  out.push_back(std::move(g));
  return out;
}

}  // namespace dos
