#pragma once
/// @file
/// @brief `dos::cuda::NcclCommunicator`: the `Communicator` over NCCL, for jobs whose
///        ranks each drive one GPU. Host code; needs the CUDA runtime and NCCL headers
///        (CMake target `dos::nccl`, built where NCCL is found).
///
/// The concept's collectives take float (and, for `all_reduce`, double) spans that may
/// live in host or device memory. Device spans go to NCCL as they are; host spans are
/// staged through device buffers the communicator owns (grown once, kept). Uneven
/// counts, which `ncclAllGather` and `ncclReduceScatter` do not take, run as one NCCL
/// group of a broadcast (all-gather) or a reduce (reduce-scatter) rooted at each rank:
/// NCCL fuses the group, and no rank pads its part.
///
/// NCCL, like MPI, has no timeout: a peer that died leaves a kernel waiting forever.
/// Every collective is waited for by polling its stream; past `timeout` the
/// communicator aborts NCCL (`ncclCommAbort`, which ends the pending kernels), throws
/// `dos::cuda_error` naming the call, the rank and the timeout, and refuses later calls.

#include "dos/comm/communicator.hpp"
#include "dos/cuda/error.hpp"
#include "dos/error.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace dos::cuda {

/// @brief Throws `cuda_error` naming @p call when @p r is not `ncclSuccess`.
inline void check_nccl(ncclResult_t r, const char* call) {
  if (r == ncclSuccess) return;
  throw cuda_error(std::string("dos: ") + call + " failed: " + ncclGetErrorString(r) + " (NCCL error " +
                   std::to_string(static_cast<int>(r)) + ")");
}

/// @brief The ranks of an NCCL communicator, one GPU each.
/// @code
/// // Every rank: the id from rank 0, by any means (here over the host communicator).
/// dos::MpiCommunicator host(MPI_COMM_WORLD);
/// cudaSetDevice(host.local_rank());
/// auto nccl = dos::cuda::NcclCommunicator::bootstrap(host);
/// dos::Options o;
/// o.communicator = std::move(nccl);
/// @endcode
class NcclCommunicator {
 public:
  /// @brief How long one collective may wait for every rank by default.
  static constexpr std::chrono::milliseconds default_timeout = std::chrono::minutes(30);

  /// @brief Joins the NCCL communicator of @p size ranks named by @p id, as @p rank, on
  ///        the current CUDA device (`ncclCommInitRank`). Collective: every rank calls it.
  /// @param id the communicator's id, made by one rank (`ncclGetUniqueId`) and given to all.
  /// @param rank this rank, in [0, @p size).
  /// @param size the number of ranks.
  /// @param local_rank this rank among those sharing its host.
  /// @param local_size the number of ranks sharing its host.
  /// @param timeout how long one collective may wait for every rank; zero waits forever.
  /// @throws std::invalid_argument for ranks out of range or a negative timeout;
  ///         `cuda_error` when CUDA or NCCL fails.
  NcclCommunicator(const ncclUniqueId& id, int rank, int size, int local_rank, int local_size,
                   std::chrono::milliseconds timeout = default_timeout)
      : rank_(rank), size_(size), local_rank_(local_rank), local_size_(local_size), timeout_(timeout) {
    if (size < 1 || rank < 0 || rank >= size || local_size < 1 || local_rank < 0 || local_rank >= local_size ||
        local_size > size)
      throw_invalid_argument("NcclCommunicator: rank {} of {}, local rank {} of {} is not a valid place", rank, size,
                             local_rank, local_size);
    if (timeout.count() < 0) throw_invalid_argument("NcclCommunicator: the timeout is {} ms; it must be >= 0", timeout.count());
    DOS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    try {
      check_nccl(ncclCommInitRank(&comm_, size, id, rank), "ncclCommInitRank");
    } catch (...) {
      cudaStreamDestroy(stream_);
      throw;
    }
  }

  /// @brief Rank 0 makes the id and every rank receives it over @p host (any
  ///        `Communicator`, e.g. `MpiCommunicator`), which also gives the ranks and the
  ///        node-local ranks. Collective over @p host.
  template <Communicator Host>
  static NcclCommunicator bootstrap(Host& host, std::chrono::milliseconds timeout = default_timeout) {
    ncclUniqueId id{};
    static_assert(sizeof id % sizeof(float) == 0);
    constexpr std::size_t words = sizeof id / sizeof(float);
    if (host.rank() == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    // An all-gather in which only rank 0 sends: the bytes travel as floats, unchanged
    // (a gather moves them; no arithmetic touches them).
    std::vector<float> mine(host.rank() == 0 ? words : 0), all(words);
    if (host.rank() == 0) std::memcpy(mine.data(), &id, sizeof id);
    std::vector<std::size_t> counts(static_cast<std::size_t>(host.size()), 0);
    counts[0] = words;
    host.all_gather(mine, all, counts);
    std::memcpy(&id, all.data(), sizeof id);
    return NcclCommunicator(id, host.rank(), host.size(), host.local_rank(), host.local_size(), timeout);
  }

  NcclCommunicator(NcclCommunicator&& o) noexcept
      : comm_(std::exchange(o.comm_, nullptr)), stream_(std::exchange(o.stream_, nullptr)), rank_(o.rank_),
        size_(o.size_), local_rank_(o.local_rank_), local_size_(o.local_size_), timeout_(o.timeout_),
        broken_(std::move(o.broken_)), staging_(std::exchange(o.staging_, nullptr)),
        staging_bytes_(std::exchange(o.staging_bytes_, 0)) {}
  NcclCommunicator& operator=(NcclCommunicator&&) = delete;
  ~NcclCommunicator() {
    if (comm_ != nullptr) {
      if (broken_.empty()) {
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
    }
    if (staging_ != nullptr) cudaFree(staging_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  int local_rank() const noexcept { return local_rank_; }
  int local_size() const noexcept { return local_size_; }
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  /// @brief The stream the collectives run on (waited for before each returns).
  cudaStream_t stream() const noexcept { return stream_; }

  /// @brief `ncclAllReduce` in place, sum or max, in double.
  void all_reduce(std::span<double> buf, ReduceOp op) {
    usable("all_reduce");
    if (buf.empty()) return;
    Staged<double> b(*this, buf, 0);
    check_nccl(ncclAllReduce(b.device, b.device, buf.size(), ncclDouble, op == ReduceOp::sum ? ncclSum : ncclMax, comm_,
                             stream_),
               "ncclAllReduce");
    finish("all_reduce");
    b.back(*this, buf);
  }

  /// @brief Rank r's @p mine lands at offset counts[0..r) of every rank's @p all.
  void all_gather(std::span<const float> mine, std::span<float> all, std::span<const std::size_t> counts) {
    usable("all_gather");
    check_collective_shape("all_gather", rank_, size_, mine.size(), all.size(), counts);
    Staged<float> out(*this, std::span<const float>(all.data(), all.size()), 0, /*copy_in=*/false);
    const std::size_t at = offset(counts, rank_);
    // This rank's part goes to its place first, so its own broadcast sends from there.
    copy_to_device(out.device + at, mine);
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < size_; ++r) {
      const std::size_t n = counts[static_cast<std::size_t>(r)];
      if (n == 0) continue;
      float* place = out.device + offset(counts, r);
      check_nccl(ncclBroadcast(place, place, n, ncclFloat, r, comm_, stream_), "ncclBroadcast");
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    finish("all_gather");
    out.back(*this, all);
  }

  /// @brief The sum over ranks of @p all, of which rank r receives its part in @p mine.
  void reduce_scatter(std::span<const float> all, std::span<float> mine, std::span<const std::size_t> counts) {
    usable("reduce_scatter");
    check_collective_shape("reduce_scatter", rank_, size_, mine.size(), all.size(), counts);
    // Both operands may need staging: the buffer grows to both before either is
    // placed in it, so the first one's address stays valid.
    staging((all.size() + mine.size()) * sizeof(float));
    Staged<float> in(*this, all, 0);
    Staged<float> out(*this, std::span<const float>(mine.data(), mine.size()), all.size(), /*copy_in=*/false);
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < size_; ++r) {
      const std::size_t n = counts[static_cast<std::size_t>(r)];
      if (n == 0) continue;
      // recvbuff is read on the root only; the others pass their send place.
      const float* send = in.device + offset(counts, r);
      check_nccl(ncclReduce(send, r == rank_ ? out.device : const_cast<float*>(send), n, ncclFloat, ncclSum, r, comm_,
                            stream_),
                 "ncclReduce");
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    finish("reduce_scatter");
    out.back(*this, mine);
  }

  /// @brief A one-element all-reduce: NCCL has no barrier of its own.
  void barrier() {
    double x = 0;
    all_reduce(std::span<double>(&x, 1), ReduceOp::sum);
  }

 private:
  static bool on_device(const void* p) {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  }
  static std::size_t offset(std::span<const std::size_t> counts, int r) {
    std::size_t at = 0;
    for (int q = 0; q < r; ++q) at += counts[static_cast<std::size_t>(q)];
    return at;
  }
  // The staging buffer holds @p bytes at least; it only grows.
  std::byte* staging(std::size_t bytes) {
    if (bytes > staging_bytes_) {
      DOS_CUDA_CHECK(cudaStreamSynchronize(stream_));
      if (staging_ != nullptr) DOS_CUDA_CHECK(cudaFree(staging_));
      staging_ = nullptr;
      staging_bytes_ = 0;
      DOS_CUDA_CHECK(cudaMalloc(&staging_, bytes));
      staging_bytes_ = bytes;
    }
    return static_cast<std::byte*>(staging_);
  }
  template <class T>
  void copy_to_device(T* device, std::span<const T> from) {
    if (from.empty() || from.data() == device) return;
    DOS_CUDA_CHECK(cudaMemcpyAsync(device, from.data(), from.size_bytes(), cudaMemcpyDefault, stream_));
  }
  // A span's device address: itself when it lives on the device, else a place in the
  // staging buffer (after @p skip elements of T used by another operand), filled
  // from the host when @p copy_in.
  template <class T>
  struct Staged {
    T* device = nullptr;
    bool staged = false;
    Staged(NcclCommunicator& c, std::span<const T> s, std::size_t skip, bool copy_in = true) {
      if (s.empty() || on_device(s.data())) {
        device = const_cast<T*>(s.data());
        return;
      }
      staged = true;
      device = reinterpret_cast<T*>(c.staging((skip + s.size()) * sizeof(T))) + skip;
      if (copy_in) c.copy_to_device(device, s);
    }
    Staged(NcclCommunicator& c, std::span<T> s, std::size_t skip) : Staged(c, std::span<const T>(s), skip) {}
    // After `finish`: a copy into pageable memory waits for the stream, which must not
    // happen before the collective is known complete (it would wait past the timeout).
    void back(NcclCommunicator& c, std::span<T> to) const {
      if (!staged || to.empty()) return;
      DOS_CUDA_CHECK(cudaMemcpyAsync(to.data(), device, to.size_bytes(), cudaMemcpyDeviceToHost, c.stream_));
      DOS_CUDA_CHECK(cudaStreamSynchronize(c.stream_));
    }
  };
  void usable(const char* call) const {
    if (!broken_.empty())
      throw cuda_error("dos: " + std::string(call) + " on rank " + std::to_string(rank_) +
                       ": this NcclCommunicator timed out in " + broken_ + " before and cannot be used again");
  }
  // Waits for the stream (the collective and its copies) by polling, up to the timeout.
  void finish(const char* call) {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    for (;;) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) cuda::check(e, call);
      ncclResult_t async = ncclSuccess;
      check_nccl(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
      check_nccl(async, call);
      const auto waited = clock::now() - start;
      if (timeout_.count() > 0 && waited >= timeout_) {
        broken_ = call;
        ncclCommAbort(comm_);
        comm_ = nullptr;
        throw cuda_error("dos: " + std::string(call) + " on rank " + std::to_string(rank_) + " of " +
                         std::to_string(size_) + ": not every rank joined within " + std::to_string(timeout_.count()) +
                         " ms (the NcclCommunicator timeout); NCCL was aborted");
      }
      if (waited < std::chrono::milliseconds(1)) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  std::chrono::milliseconds timeout_ = default_timeout;
  std::string broken_;  // the call that timed out, if one did
  void* staging_ = nullptr;
  std::size_t staging_bytes_ = 0;
};
static_assert(Communicator<NcclCommunicator>);

}  // namespace dos::cuda
