#pragma once
/// @file
/// @brief The `Communicator` concept: what dos needs to know about the other ranks of a
///        job (who it is, how many there are, which share its node) and the few
///        collectives it runs on them. `SingleProcess` is the default (one rank);
///        `MpiCommunicator` (`dos/comm/mpi.hpp`) runs over an `MPI_Comm`.

#include "dos/error.hpp"

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

namespace dos {

/// @brief The reduction of `all_reduce`.
enum class ReduceOp : std::uint8_t { sum, max };

/// @brief The ranks of a job and the collectives dos runs on them. Every rank must call
///        the same collectives in the same order (as with MPI); a collective returns on a
///        rank once that rank's part of the result is there.
///
/// - `rank()`, `size()`: this rank in [0, size); `local_rank()`, `local_size()`: the
///   same among the ranks sharing this host (its cores and memory).
/// - `all_reduce(buf, op)`: in place, element by element over every rank's @p buf (a
///   small buffer of doubles: statistics, flags).
/// - `all_gather(mine, all, counts)`: rank r's @p mine (`counts[r]` floats) lands at
///   offset `counts[0] + ... + counts[r-1]` of every rank's @p all.
/// - `reduce_scatter(all, mine, counts)`: the sum over ranks of @p all, of which rank r
///   receives its part (`counts[r]` floats at the same offsets) in @p mine.
/// - `barrier()`.
/// @code
/// struct MyRanks {  // for example over a framework's process group
///   int rank() const; int size() const; int local_rank() const; int local_size() const;
///   void all_reduce(std::span<double> buf, dos::ReduceOp op);
///   void all_gather(std::span<const float> mine, std::span<float> all, std::span<const std::size_t> counts);
///   void reduce_scatter(std::span<const float> all, std::span<float> mine, std::span<const std::size_t> counts);
///   void barrier();
/// };
/// static_assert(dos::Communicator<MyRanks>);
/// dos::Options o;
/// o.communicator = dos::AnyCommunicator(MyRanks{...});  // dos/comm/any_communicator.hpp
/// @endcode
template <class C>
concept Communicator = requires(C& c, const C& cc, std::span<double> small, ReduceOp op, std::span<const float> in,
                                std::span<float> out, std::span<const std::size_t> counts) {
  { cc.rank() } -> std::convertible_to<int>;
  { cc.size() } -> std::convertible_to<int>;
  { cc.local_rank() } -> std::convertible_to<int>;
  { cc.local_size() } -> std::convertible_to<int>;
  c.all_reduce(small, op);
  c.all_gather(in, out, counts);
  c.reduce_scatter(in, out, counts);
  c.barrier();
};

/// @brief Checks the shapes of an `all_gather` or `reduce_scatter` call: one count per
///        rank, this rank's part of @p count elements, the whole of @p total.
/// @throws std::invalid_argument naming the mismatch.
inline void check_collective_shape(const char* what, int rank, int size, std::size_t part, std::size_t total,
                                   std::span<const std::size_t> counts) {
  if (counts.size() != static_cast<std::size_t>(size))
    throw_invalid_argument("{}: {} counts for {} ranks", what, counts.size(), size);
  std::size_t sum = 0;
  for (const std::size_t n : counts) sum += n;
  if (part != counts[static_cast<std::size_t>(rank)] || total != sum)
    throw_invalid_argument("{} on rank {}: a part of {} and a whole of {} elements, where the counts say {} and {}",
                           what, rank, part, total, counts[static_cast<std::size_t>(rank)], sum);
}

}  // namespace dos
