#pragma once
/// @file
/// @brief `MpiCommunicator`: the `Communicator` over an `MPI_Comm`. Needs MPI (CMake
///        target `dos::mpi`, built where `find_package(MPI)` finds it).

#include "dos/comm/communicator.hpp"
#include "dos/error.hpp"

#include <mpi.h>

#include <climits>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace dos {

/// @brief The ranks of an `MPI_Comm`. It duplicates the communicator, so dos's
///        collectives never match the caller's messages, and splits it by host
///        (`MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`) for the node-local rank. MPI must
///        be initialised before and finalised after its lifetime. Move-only.
/// @code
/// MPI_Init(&argc, &argv);
/// {
///   dos::Options o;
///   o.communicator = dos::MpiCommunicator(MPI_COMM_WORLD);
///   dos::CpuOptimizer opt(my_shard, dos::AdamW{}, o);
///   ...
/// }
/// MPI_Finalize();
/// @endcode
class MpiCommunicator {
 public:
  /// @throws std::invalid_argument when MPI is not initialised; std::runtime_error when
  ///         an MPI call fails.
  explicit MpiCommunicator(MPI_Comm comm = MPI_COMM_WORLD) {
    int initialised = 0;
    MPI_Initialized(&initialised);
    if (initialised == 0) throw_invalid_argument("MpiCommunicator: MPI_Init has not been called");
    check(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node_), "MPI_Comm_split_type");
    check(MPI_Comm_rank(node_, &local_rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(node_, &local_size_), "MPI_Comm_size");
  }
  MpiCommunicator(MpiCommunicator&& o) noexcept
      : comm_(std::exchange(o.comm_, MPI_COMM_NULL)), node_(std::exchange(o.node_, MPI_COMM_NULL)), rank_(o.rank_),
        size_(o.size_), local_rank_(o.local_rank_), local_size_(o.local_size_) {}
  MpiCommunicator& operator=(MpiCommunicator&&) = delete;
  ~MpiCommunicator() {
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (finalised != 0) return;  // MPI freed them already
    if (node_ != MPI_COMM_NULL) MPI_Comm_free(&node_);
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  int local_rank() const noexcept { return local_rank_; }
  int local_size() const noexcept { return local_size_; }
  /// @brief `MPI_Allreduce` in place.
  void all_reduce(std::span<double> buf, ReduceOp op) {
    check(MPI_Allreduce(MPI_IN_PLACE, buf.data(), as_int(buf.size(), "all_reduce"), MPI_DOUBLE,
                        op == ReduceOp::sum ? MPI_SUM : MPI_MAX, comm_),
          "MPI_Allreduce");
  }
  /// @brief `MPI_Allgatherv`.
  void all_gather(std::span<const float> mine, std::span<float> all, std::span<const std::size_t> counts) {
    check_collective_shape("all_gather", rank_, size_, mine.size(), all.size(), counts);
    const auto [n, at] = layout(counts, "all_gather");
    check(MPI_Allgatherv(mine.data(), n[static_cast<std::size_t>(rank_)], MPI_FLOAT, all.data(), n.data(), at.data(),
                         MPI_FLOAT, comm_),
          "MPI_Allgatherv");
  }
  /// @brief `MPI_Reduce_scatter` with a sum.
  void reduce_scatter(std::span<const float> all, std::span<float> mine, std::span<const std::size_t> counts) {
    check_collective_shape("reduce_scatter", rank_, size_, mine.size(), all.size(), counts);
    const auto [n, at] = layout(counts, "reduce_scatter");
    check(MPI_Reduce_scatter(all.data(), mine.data(), n.data(), MPI_FLOAT, MPI_SUM, comm_), "MPI_Reduce_scatter");
  }
  void barrier() { check(MPI_Barrier(comm_), "MPI_Barrier"); }
  /// @brief The duplicated communicator dos runs its collectives on.
  MPI_Comm comm() const noexcept { return comm_; }

 private:
  static void check(int code, const char* call) {
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(code, text, &length);
    throw std::runtime_error(std::string("dos: ") + call + " failed: " + std::string(text, static_cast<std::size_t>(length)));
  }
  static int as_int(std::size_t n, const char* what) {
    // MPI counts are int; larger buffers would need derived datatypes.
    if (n > static_cast<std::size_t>(INT_MAX)) throw_invalid_argument("{}: {} elements exceed MPI's int counts", what, n);
    return static_cast<int>(n);
  }
  // MPI's int counts and displacements from dos's counts.
  static std::pair<std::vector<int>, std::vector<int>> layout(std::span<const std::size_t> counts, const char* what) {
    std::vector<int> n, at;
    std::size_t offset = 0;
    for (const std::size_t c : counts) {
      n.push_back(as_int(c, what));
      at.push_back(as_int(offset, what));
      offset += c;
    }
    as_int(offset, what);
    return {std::move(n), std::move(at)};
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm node_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
};
static_assert(Communicator<MpiCommunicator>);

}  // namespace dos
