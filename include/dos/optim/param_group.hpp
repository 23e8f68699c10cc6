#pragma once
/// @file
/// @brief Parameter groups: parameters that share hyperparameters, such as the
///        "no weight decay on biases and norms" group of every LLM recipe.

#include "dos/core/tensor.hpp"
#include "dos/optim/adam.hpp"

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

}  // namespace dos
