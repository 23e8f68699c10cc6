#pragma once
/// @file
/// @brief `gather_rows`: any local work that may fail, and a row of numbers from every
///        rank, in one all-reduce. Every collective dos runs at construction or at a
///        step's start goes through it, so a rank whose own work threw makes every rank
///        throw, naming it, and no rank is left waiting in a collective the failing one
///        never reaches.

#include "dos/comm/any_communicator.hpp"
#include "dos/error.hpp"

#include <cstddef>
#include <exception>
#include <span>
#include <string>
#include <vector>

namespace dos {

/// @brief Runs @p local(row) on this rank, then gives every rank every rank's row: rank
///        r's at `fields * r` of the result. One all-reduce, run whether or not @p local
///        threw, so no rank hangs. With one rank, @p local's exception passes as it is.
/// @param comm the ranks.
/// @param fields numbers in a row.
/// @param what how the message starts when a rank failed ("step() changed nothing").
/// @param local fills this rank's row (a `std::span<double>` of @p fields zeros); may throw.
/// @throws std::invalid_argument on every rank when @p local threw on any, naming the
///         failing ranks (and, on a failing rank, its own message).
template <class F>
std::vector<double> gather_rows(AnyCommunicator& comm, std::size_t fields, const char* what, F&& local) {
  const int size = comm.size();
  if (size == 1) {  // no collective, and no allocation for a row of no fields
    std::vector<double> row(fields, 0.0);
    local(std::span<double>(row));
    return row;
  }
  // One row per rank, zero but for this rank's own: a sum is then a gather, exact in any
  // reduction order (x + 0 == x, inf and NaN included). Column 0 says whether it failed.
  const std::size_t width = fields + 1;
  std::vector<double> rows(width * static_cast<std::size_t>(size), 0.0);
  const std::span<double> row(rows.data() + width * static_cast<std::size_t>(comm.rank()), width);
  std::string error;
  try {
    local(row.subspan(1));
  } catch (const std::exception& e) {
    error = e.what();
    if (error.starts_with("dos: ")) error.erase(0, 5);  // ours gets the prefix once
  } catch (...) {
    error = "an exception that is not a std::exception";
  }
  row[0] = error.empty() ? 0.0 : 1.0;
  comm.all_reduce(rows, ReduceOp::sum);
  std::string failed;
  for (int r = 0; r < size; ++r)
    if (rows[width * static_cast<std::size_t>(r)] != 0.0) failed += (failed.empty() ? "" : ", ") + std::to_string(r);
  if (!error.empty()) throw_invalid_argument("{} on any of the {} ranks: rank {} failed: {}", what, size, comm.rank(), error);
  if (!failed.empty())
    throw_invalid_argument("{} on any of the {} ranks: rank(s) {} failed (their errors say why)", what, size, failed);
  std::vector<double> out(fields * static_cast<std::size_t>(size));
  for (std::size_t r = 0; r < static_cast<std::size_t>(size); ++r)
    for (std::size_t f = 0; f < fields; ++f) out[r * fields + f] = rows[r * width + 1 + f];
  return out;
}

}  // namespace dos
