#pragma once
/// @file
/// @brief What a user chooses when building an optimizer, and what a step reports.

#include "dos/comm/any_communicator.hpp"
#include "dos/cpu/executor.hpp"
#include "dos/cpu/placement.hpp"
#include "dos/cpu/simd.hpp"
#include "dos/cpu/thread_pool.hpp"
#include "dos/engine/interleave_options.hpp"
#include "dos/error.hpp"
#include "dos/optim/adam.hpp"
#include "dos/optim/loss_scaler.hpp"

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

namespace dos {

/// @brief What `step()` does when a gradient holds an inf or a NaN.
enum class NonFinitePolicy : std::uint8_t {
  /// Update as torch does: the non-finite values flow into the state. No extra pass.
  propagate,
  /// Check every gradient first (one extra read of the gradients); if any element is
  /// non-finite, change nothing and report the step as skipped.
  skip_step,
};

/// @brief Who shards the optimizer over the ranks of `Options::communicator`.
enum class Sharding : std::uint8_t {
  /// The framework does (FSDP, ZeRO-3): each rank passes only its own parameters to an
  /// `InterleavedOptimizer`.
  framework,
  /// dos does (`ShardedOptimizer`): every rank passes every parameter, with gradients
  /// the framework already averaged; each rank updates a balanced share, then all ranks
  /// all-gather the values.
  zero1,
  /// As `zero1`, but the gradients are each rank's own: dos averages them with a
  /// reduce-scatter, so each rank receives only its share's.
  zero2,
};

/// @brief The name of @p s, for messages.
constexpr const char* sharding_name(Sharding s) noexcept {
  return s == Sharding::zero1 ? "zero1" : s == Sharding::zero2 ? "zero2" : "framework";
}

/// @brief Construction options shared by every backend.
struct Options {
  /// Target elements per subgroup (the unit of scheduling). The paper used 100M.
  std::size_t subgroup_elements = 100'000'000;
  /// CPU threads for the update, the caller included; 0 means every hardware thread
  /// this process may use, shared evenly with the other ranks of its node
  /// (`communicator.local_size()`) unless the launcher already bound each rank to its
  /// own cores (`threads_for_rank`). Set it explicitly under torchrun, which sets
  /// OMP_NUM_THREADS=1 (dos does not read OpenMP variables).
  unsigned threads = 0;
  NonFinitePolicy nonfinite = NonFinitePolicy::propagate;
  /// Force a CPU kernel family (tests, benchmarks); `automatic` picks the widest.
  SimdLevel simd = SimdLevel::automatic;
  /// Back large state blocks with transparent huge pages.
  bool huge_pages = true;
  /// Move the framework's host values and gradients (as passed at construction) onto
  /// huge pages too, in place (`collapse_to_huge_pages`): a one-time copy at about
  /// 0.5-2 GB/s that made a 1-thread step 7-10% faster on a 2-vCPU EPYC VM.
  bool caller_huge_pages = true;
  /// Global-norm gradient clipping (L2), as torch.nn.utils.clip_grad_norm_; 0 turns it off.
  double max_grad_norm = 0;
  /// Dynamic loss scaling; implies skipping steps whose gradients overflow.
  std::optional<LossScaling> loss_scaling{};
  /// Where the CPU threads run: by default, several ranks on a host with several NUMA
  /// nodes, unbound by the launcher, each get their own node or run of a node's CPUs
  /// (`rank_cpus`), so the state stays on its socket; elsewhere nothing changes.
  ThreadPlacement placement = ThreadPlacement::automatic;
  /// The CPU/device split, for device backends.
  InterleaveOptions interleave{};
  /// The ranks this optimizer's parameters are sharded over, when the framework shards
  /// them (FSDP, ZeRO-3: each rank's optimizer holds only its own shard). With more than
  /// one rank, every step agrees across ranks (`agree_across_ranks`): clipping uses the
  /// global norm, all ranks skip the same steps, bad input on one fails all. Default:
  /// `SingleProcess`, which changes nothing.
  AnyCommunicator communicator{};
  /// Who shards: `framework` for `InterleavedOptimizer`; `zero1` or `zero2` for
  /// `ShardedOptimizer` (`dos/shard/sharded_optimizer.hpp`), which refuses `framework`.
  Sharding sharding = Sharding::framework;

  /// @brief The part of these options the host side (executor, backend) is built from.
  cpu::CpuConfig cpu() const {
    std::vector<int> cpus = placed_cpus(placement, communicator.local_rank(), communicator.local_size());
    const unsigned n = threads != 0      ? threads
                       : !cpus.empty() ? static_cast<unsigned>(cpus.size())
                                        : threads_for_rank(communicator.local_size());
    return {n, simd, huge_pages, std::move(cpus)};
  }
};

/// @brief @p o, for an `InterleavedOptimizer`: ZeRO-1/2 need every rank's every parameter
///        and a gather after the step, which is `ShardedOptimizer`'s work.
/// @throws std::invalid_argument when `o.sharding` is not `Sharding::framework`.
inline Options framework_sharded(Options o) {
  if (o.sharding != Sharding::framework)
    throw_invalid_argument("Options::sharding is {}: InterleavedOptimizer takes only Sharding::framework (each rank passes "
                           "its own shard); use dos::ShardedOptimizer (dos/shard/sharded_optimizer.hpp) for ZeRO-1 and ZeRO-2",
                           sharding_name(o.sharding));
  return o;
}

/// @brief Checks the options that do not depend on the parameters.
/// @throws std::invalid_argument naming the field and its value.
inline Options validated(Options o) {
  if (!detail::finite_bits(o.max_grad_norm) || o.max_grad_norm < 0)
    throw_invalid_argument("max_grad_norm must be finite and >= 0, got {}", o.max_grad_norm);
  if (o.loss_scaling) LossScaler::validate(*o.loss_scaling);
  o.interleave.policy.validate();
  return o;
}

/// @brief What one call to `step()` did. The update engine's part (`UpdateReport`:
///        policy, stride, bytes moved, predicted and measured times, fallback) is
///        filled in by device backends.
struct StepReport : UpdateReport {
  static constexpr std::size_t none = std::numeric_limits<std::size_t>::max();

  bool applied = false;              ///< false when the step was skipped
  std::int64_t step = 0;             ///< the optimizer's step count after the call
  std::size_t elements = 0;          ///< elements updated
  std::size_t nonfinite_params = 0;  ///< parameters with a non-finite gradient (skip_step only)
  std::size_t first_nonfinite_param = none;
  double seconds = 0;                ///< wall time of the call
  bool overflow = false;             ///< skipped because a gradient held an inf or a NaN
  double grad_norm = -1;             ///< global L2 norm of the (unscaled) gradients; -1 if not computed
  double clip_coef = 1;              ///< the factor the gradients were multiplied by (clipping)
  double loss_scale = 1;             ///< the loss scale this step's gradients carried
};

}  // namespace dos
