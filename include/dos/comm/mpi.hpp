#pragma once
/// @file
/// @brief `MpiCommunicator`: the `Communicator` over an `MPI_Comm`. Needs MPI (CMake
///        target `dos::mpi`, built where `find_package(MPI)` finds it).

#include "dos/comm/communicator.hpp"
#include "dos/error.hpp"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdio>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace dos {

/// @brief The ranks of an `MPI_Comm`. It duplicates the communicator, so dos's
///        collectives never match the caller's messages, and splits it by host
///        (`MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`) for the node-local rank. MPI must
///        be initialised before and finalised after its lifetime. Move-only.
///
/// MPI has no timeout of its own: a blocking collective whose peer died unnoticed, or
/// stopped calling `step()`, waits forever. So every collective here is the
/// nonblocking one, polled until it completes or `timeout` passes. Then:
/// - `all_reduce` and `barrier` (the collective that opens every step) throw
///   `std::runtime_error` naming the call, the rank and the timeout, and the
///   communicator refuses every later call. The abandoned operation cannot be
///   cancelled, so it runs on the communicator's own buffer, which it keeps.
/// - `all_gather` and `reduce_scatter` run on the caller's large buffers, which a late
///   rank could still write after the caller freed them; they print the same message
///   and end the job with `MPI_Abort`.
/// A rank that exits makes Open MPI's launcher end the whole job; the timeout covers
/// what the launcher cannot see.
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
  /// @brief How long a collective may wait for the other ranks by default: as long as
  ///        torch.distributed's default for its CPU process groups.
  static constexpr std::chrono::milliseconds default_timeout = std::chrono::minutes(30);

  /// @param comm the ranks (duplicated: dos's collectives never match the caller's).
  /// @param timeout how long one collective may wait for every rank; zero waits forever.
  /// @throws std::invalid_argument when MPI is not initialised or @p timeout is negative;
  ///         std::runtime_error when an MPI call fails.
  explicit MpiCommunicator(MPI_Comm comm = MPI_COMM_WORLD, std::chrono::milliseconds timeout = default_timeout)
      : timeout_(timeout) {
    if (timeout.count() < 0) throw_invalid_argument("MpiCommunicator: the timeout is {} ms; it must be >= 0", timeout.count());
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
        size_(o.size_), local_rank_(o.local_rank_), local_size_(o.local_size_), timeout_(o.timeout_),
        abandoned_(std::move(o.abandoned_)), small_(std::move(o.small_)) {}
  MpiCommunicator& operator=(MpiCommunicator&&) = delete;
  ~MpiCommunicator() {
    if (!abandoned_.empty()) {
      // A timed-out all_reduce is still posted on small_ and the communicators: a
      // late rank may yet complete it, so neither may go. The job is ending anyway.
      new std::vector<double>(std::move(small_));  // NOLINT: deliberately never freed
      return;
    }
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
  /// @brief `MPI_Iallreduce` in place, waited for.
  void all_reduce(std::span<double> buf, ReduceOp op) {
    usable("all_reduce");
    small_.assign(buf.begin(), buf.end());  // see the class comment: a timed-out operation keeps it
    MPI_Request r = MPI_REQUEST_NULL;
    check(MPI_Iallreduce(MPI_IN_PLACE, small_.data(), as_int(small_.size(), "all_reduce"), MPI_DOUBLE,
                         op == ReduceOp::sum ? MPI_SUM : MPI_MAX, comm_, &r),
          "MPI_Iallreduce");
    finish(r, "all_reduce", false);
    std::copy(small_.begin(), small_.end(), buf.begin());
  }
  /// @brief `MPI_Iallgatherv`, waited for.
  void all_gather(std::span<const float> mine, std::span<float> all, std::span<const std::size_t> counts) {
    usable("all_gather");
    check_collective_shape("all_gather", rank_, size_, mine.size(), all.size(), counts);
    const auto [n, at] = layout(counts, "all_gather");
    MPI_Request r = MPI_REQUEST_NULL;
    check(MPI_Iallgatherv(mine.data(), n[static_cast<std::size_t>(rank_)], MPI_FLOAT, all.data(), n.data(), at.data(),
                          MPI_FLOAT, comm_, &r),
          "MPI_Iallgatherv");
    finish(r, "all_gather", true);
  }
  /// @brief `MPI_Ireduce_scatter` with a sum, waited for.
  void reduce_scatter(std::span<const float> all, std::span<float> mine, std::span<const std::size_t> counts) {
    usable("reduce_scatter");
    check_collective_shape("reduce_scatter", rank_, size_, mine.size(), all.size(), counts);
    const auto [n, at] = layout(counts, "reduce_scatter");
    MPI_Request r = MPI_REQUEST_NULL;
    check(MPI_Ireduce_scatter(all.data(), mine.data(), n.data(), MPI_FLOAT, MPI_SUM, comm_, &r), "MPI_Ireduce_scatter");
    finish(r, "reduce_scatter", true);
  }
  void barrier() {
    usable("barrier");
    MPI_Request r = MPI_REQUEST_NULL;
    check(MPI_Ibarrier(comm_, &r), "MPI_Ibarrier");
    finish(r, "barrier", false);
  }
  /// @brief How long one collective may wait (zero: forever).
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }
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
  // After a timeout the abandoned operation is still posted: nothing may follow it.
  void usable(const char* call) const {
    if (!abandoned_.empty())
      throw std::runtime_error("dos: " + std::string(call) + " on rank " + std::to_string(rank_) +
                               ": this communicator timed out in " + abandoned_ + " before and cannot be used again");
  }
  // Polls @p r to completion: yields for the first millisecond (a step's small
  // all-reduce usually completes in it), then sleeps 100 us between polls, so a rank
  // waiting for a slow one leaves the cores of its node to it. MPI progresses the
  // operation inside MPI_Test.
  void finish(MPI_Request& r, const char* call, bool caller_buffers) {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    for (;;) {
      int done = 0;
      check(MPI_Test(&r, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done != 0) return;
      const auto waited = clock::now() - start;
      if (timeout_.count() > 0 && waited >= timeout_) {
        abandoned_ = call;
        const std::string what = "dos: " + std::string(call) + " on rank " + std::to_string(rank_) + " of " +
                                 std::to_string(size_) + ": not every rank joined within " +
                                 std::to_string(timeout_.count()) +
                                 " ms (the MpiCommunicator timeout); a rank may have died, hung, or stopped calling "
                                 "the same collectives";
        if (caller_buffers) {
          std::fprintf(stderr, "%s; ending the job, as the operation may still write the caller's buffers\n",
                       what.c_str());
          MPI_Abort(comm_, 3);
        }
        throw std::runtime_error(what);
      }
      if (waited < std::chrono::milliseconds(1)) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
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
  std::chrono::milliseconds timeout_ = default_timeout;
  std::string abandoned_;      // the call that timed out, if one did
  std::vector<double> small_;  // all_reduce's buffer, owned so a timed-out operation cannot outlive it
};
static_assert(Communicator<MpiCommunicator>);

}  // namespace dos
