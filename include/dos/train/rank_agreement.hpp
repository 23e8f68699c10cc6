#pragma once
/// @file
/// @brief `agree_across_ranks`: the one collective of a step when the framework shards
///        the parameters (FSDP, ZeRO-3: each rank's optimizer holds only its shard).
///        Every rank validates its input and sums up its gradients, then one all-reduce
///        tells every rank whether all succeeded and gives each the global gradient
///        statistics, so all clip by the global norm, all skip the same overflowing
///        steps, and a rank's bad input fails every rank before any changes state.

#include "dos/comm/any_communicator.hpp"
#include "dos/error.hpp"
#include "dos/train/grad_norm.hpp"

#include <cstddef>
#include <exception>
#include <string>
#include <vector>

namespace dos {

/// @brief Runs @p local (validation, then this rank's `GradSummary`) and agrees on the
///        outcome with every rank of @p comm. With one rank it is just `local()`.
/// @return the global summary: the sum of squares and non-finite count over every
///         rank, added in rank order so every rank gets the same bits; the first
///         non-finite parameter is this rank's own (an index of its shard).
/// @throws std::invalid_argument on every rank when @p local threw on any, naming the
///         failing ranks (and, on a failing rank, its own message). No rank hangs: the
///         collective runs whether or not @p local threw.
template <class F>
GradSummary agree_across_ranks(AnyCommunicator& comm, F&& local) {
  const int size = comm.size();
  if (size == 1) return local();
  GradSummary mine;
  std::string error;
  try {
    mine = local();
  } catch (const std::exception& e) {
    error = e.what();
    if (error.starts_with("dos: ")) error.erase(0, 5);  // ours gets the prefix once
  } catch (...) {
    error = "an exception that is not a std::exception";
  }
  // One row per rank, zero but for this rank's own: a sum is then a gather, exact in any
  // reduction order (x + 0 == x, inf and NaN included).
  constexpr std::size_t fields = 3;
  std::vector<double> rows(fields * static_cast<std::size_t>(size), 0.0);
  double* row = rows.data() + fields * static_cast<std::size_t>(comm.rank());
  row[0] = error.empty() ? 0.0 : 1.0;
  row[1] = mine.sum_squares;
  row[2] = static_cast<double>(mine.nonfinite_params);
  comm.all_reduce(rows, ReduceOp::sum);
  GradSummary global;
  global.first_nonfinite_param = mine.first_nonfinite_param;
  std::string failed;
  for (int r = 0; r < size; ++r) {
    const double* other = rows.data() + fields * static_cast<std::size_t>(r);
    if (other[0] != 0.0) failed += (failed.empty() ? "" : ", ") + std::to_string(r);
    global.sum_squares += other[1];
    global.nonfinite_params += static_cast<std::size_t>(other[2]);
  }
  if (failed.empty()) return global;
  if (!error.empty())
    throw_invalid_argument("step() changed nothing on any of the {} ranks: rank {} failed: {}", size, comm.rank(), error);
  throw_invalid_argument("step() changed nothing on any of the {} ranks: rank(s) {} failed (their errors say why)", size,
                         failed);
}

}  // namespace dos
