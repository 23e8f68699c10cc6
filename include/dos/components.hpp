#pragma once
/// @file
/// @brief `Components`: the partitioner, cost model and CPU executor an optimizer is
///        built from, chosen together as one bundle (`DefaultComponents`). The
///        assignment policy is a value (`AnyPolicy`) and the backend a template
///        argument of `InterleavedOptimizer` of their own.

#include "dos/cpu/cpu_adam.hpp"
#include "dos/cpu/executor.hpp"
#include "dos/partition/greedy_partitioner.hpp"
#include "dos/partition/subgroup.hpp"
#include "dos/schedule/cost_model.hpp"

namespace dos {

/// @brief The policy-based parts of an optimizer. Derive and override one to swap it:
///        `struct Mine : dos::DefaultComponents { using partitioner = OnePerTensor; };`
struct DefaultComponents {
  using partitioner = GreedyPartitioner;     ///< a `Partitioner`
  using cost_model = FirstOrderCostModel;    ///< a `CostModel`
  using cpu_executor = cpu::CpuAdamExecutor; ///< a `cpu::CpuExecutor`
};

/// @brief A components bundle: each member type models its concept.
template <class C>
concept Components = Partitioner<typename C::partitioner> && CostModel<typename C::cost_model> &&
                     cpu::CpuExecutor<typename C::cpu_executor>;

}  // namespace dos
