#pragma once
/// @file
/// @brief `AdamCoefficients`: the scalars of one Adam step, all any executor (CPU or
///        device) consumes. Dependency-free, so nvcc-compiled kernels can include it.

namespace dos {

/// @brief The scalars of one step, in the lane type `V` (float, or a SIMD vector
///        after broadcasting). Every executor consumes exactly these values.
template <class V>
struct AdamCoefficients {
  V grad_sign;        ///< -1 with maximize, else +1 (an exact negation)
  V l2;               ///< Adam's weight decay; 0 for AdamW
  V decay;            ///< AdamW's 1 - lr * wd; 1 for Adam
  V beta1, one_minus_beta1;
  V beta2, one_minus_beta2;
  V inv_sqrt_bias_correction2;
  V eps;
  V neg_step_size;    ///< -lr / (1 - beta1^t)
};

}  // namespace dos
