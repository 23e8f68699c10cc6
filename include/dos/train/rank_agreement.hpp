#pragma once
/// @file
/// @brief `agree_across_ranks`: the one collective of a step when the framework shards
///        the parameters (FSDP, ZeRO-3: each rank's optimizer holds only its shard).
///        Every rank validates its input and sums up its gradients, then one all-reduce
///        tells every rank whether all succeeded and gives each the global gradient
///        statistics, so all clip by the global norm, all skip the same overflowing
///        steps, and a rank's bad input fails every rank before any changes state.
///        `gather_rows` (`comm/gather_rows.hpp`) is the collective underneath.

#include "dos/comm/any_communicator.hpp"
#include "dos/comm/gather_rows.hpp"
#include "dos/train/grad_norm.hpp"

#include <cstddef>
#include <exception>
#include <span>
#include <string>
#include <vector>

namespace dos {

/// @brief Runs @p local (validation, then this rank's `GradSummary`) and agrees on the
///        outcome with every rank of @p comm. With one rank it is just `local()`.
/// @return the global summary: the sum of squares and non-finite count over every
///         rank, added in rank order so every rank gets the same bits; the first
///         non-finite parameter is this rank's own (an index of its shard).
/// @throws std::invalid_argument on every rank when @p local threw on any (`gather_rows`).
template <class F>
GradSummary agree_across_ranks(AnyCommunicator& comm, F&& local) {
  if (comm.size() == 1) return local();
  GradSummary mine;
  const std::vector<double> rows = gather_rows(comm, 2, "step() changed nothing", [&](std::span<double> row) {
    mine = local();
    row[0] = mine.sum_squares;
    row[1] = static_cast<double>(mine.nonfinite_params);
  });
  GradSummary global;
  global.first_nonfinite_param = mine.first_nonfinite_param;
  for (std::size_t r = 0; r < rows.size(); r += 2) {
    global.sum_squares += rows[r];
    global.nonfinite_params += static_cast<std::size_t>(rows[r + 1]);
  }
  return global;
}

}  // namespace dos
