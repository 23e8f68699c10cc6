#pragma once
/// @file
/// @brief A persistent pool of worker threads for data-parallel loops.
///
/// Threads are created once, at construction, because a training step must not pay
/// thread start-up. `parallel_for` neither allocates nor type-erases through the heap,
/// so it is safe inside `step()`. The calling thread takes part in the work.
///
/// Each loop is split into one contiguous range of indices per thread, cut by weight,
/// so every thread streams its own stretch of the arrays: two threads interleaving
/// 1 MB chunks across the same arrays measured 10-20% slower on a 2-vCPU machine than
/// two threads on the two halves. A thread that finishes early steals from the front of
/// the others' remaining ranges, so a thread slowed by its neighbours delays the loop
/// by one chunk at most. `parallel_for_interleaved` keeps the old dealing (one shared
/// counter) for comparison.

#include "dos/error.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#include <unistd.h>
#endif

namespace dos {

/// @brief Hardware threads this process may run on: the affinity mask where the OS
///        has one (containers, taskset, MPI bindings), else hardware_concurrency.
inline unsigned available_threads() noexcept {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return static_cast<unsigned>(n);
  }
#endif
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1u : n;
}

/// @brief The threads one of @p local_ranks ranks sharing a node takes by default: its
///        affinity mask as it is where the launcher already gave each rank its own
///        cores (the mask is narrower than the node's online CPUs), else an even share
///        of the node's CPUs, at least one. With one rank, `available_threads()`.
inline unsigned threads_for_rank(int local_ranks) noexcept {
  const unsigned mine = available_threads();
  if (local_ranks <= 1) return mine;
#if defined(__linux__)
  const long online = ::sysconf(_SC_NPROCESSORS_ONLN);
  if (online > 0 && mine < static_cast<unsigned long>(online)) return mine;
#endif
  return std::max(1u, mine / static_cast<unsigned>(local_ranks));
}

#if defined(__linux__)
/// @brief Keeps @p thread on @p cpus (all of them, as one set); the error number of
///        `pthread_setaffinity_np`, EINVAL for a CPU outside [0, CPU_SETSIZE), or 0.
///        What `ThreadPool` and the emulated device's streams pin with.
inline int pin_thread(pthread_t thread, const std::vector<int>& cpus) noexcept {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (const int c : cpus) {
    if (c < 0 || c >= CPU_SETSIZE) return EINVAL;
    CPU_SET(c, &set);
  }
  return pthread_setaffinity_np(thread, sizeof set, &set);
}
#endif

/// @brief A fixed set of threads that run `parallel_for` loops together.
class ThreadPool {
 public:
  /// @param threads participants, including the caller of `parallel_for`; 0 means
  ///        `available_threads()`.
  /// @param cpus where to pin them (`placed_cpus`); empty: nowhere. Worker i runs on
  ///        `cpus[i % cpus.size()]` alone; the constructing thread (which runs range 0
  ///        of the loops it calls, the optimizer's steps normally among them) is kept on
  ///        the set as a whole until the pool is destroyed, on that thread, which gives
  ///        it back its mask.
  /// @throws std::invalid_argument when a thread cannot be pinned (a CPU outside the
  ///         affinity mask); std::system_error when a thread cannot start.
  explicit ThreadPool(unsigned threads = 0, std::vector<int> cpus = {})
      : size_(threads == 0 ? available_threads() : threads), cpus_(std::move(cpus)), ranges_(size_) {
    workers_.reserve(size_ - 1);
    try {
      for (unsigned i = 1; i < size_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
#if defined(__linux__)
      if (!cpus_.empty()) {
        for (unsigned i = 1; i < size_; ++i) pin(workers_[i - 1].native_handle(), {cpus_[i % cpus_.size()]});
        caller_ = pthread_self();
        CPU_ZERO(&caller_mask_);
        if (pthread_getaffinity_np(caller_, sizeof caller_mask_, &caller_mask_) == 0) {
          pin(caller_, cpus_);
          restore_caller_ = true;
        }
      }
#endif
    } catch (...) {  // e.g. a container's thread limit: stop what started, then report
      shutdown();
      throw;
    }
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  ~ThreadPool() { shutdown(); }

  /// @brief Number of threads that run a loop, the caller included.
  unsigned size() const noexcept { return size_; }
  /// @brief The CPUs the threads are pinned to (empty: not pinned).
  const std::vector<int>& cpus() const noexcept { return cpus_; }

  /// @brief Calls `body(i)` once for every i in [0, n), spread over the pool in equal
  ///        contiguous ranges; returns when all calls have returned. `body` must not
  ///        throw. Not reentrant: one loop at a time per pool.
  template <class Body>
  void parallel_for(std::size_t n, Body& body) {
    parallel_for_weighted(n, [](std::size_t) { return std::size_t{1}; }, body);
  }

  /// @brief Like `parallel_for`, with thread t owning the contiguous range of indices
  ///        whose cumulative @p weight (e.g. bytes of traffic) lies in
  ///        [t W / size(), (t + 1) W / size()), W the total.
  template <class Weight, class Body>
  void parallel_for_weighted(std::size_t n, Weight&& weight, Body& body) {
    if (n == 0) return;
    if (workers_.empty() || n == 1) {
      for (std::size_t i = 0; i < n; ++i) body(i);
      return;
    }
    std::size_t total = 0;
    for (std::size_t i = 0; i < n; ++i) total += weight(i);
    std::unique_lock lock(mutex_);
    // Thread t starts at the first index whose preceding weight reaches t W / size:
    // cut points depend only on the weights and the thread count.
    std::size_t i = 0, before = 0;
    for (unsigned t = 0; t < size_; ++t) {
      const std::size_t share = total / size_ * t + total % size_ * t / size_;  // t W / size, no overflow
      while (i < n && before < share) before += weight(i++);
      ranges_[t].next.store(i, std::memory_order_relaxed);
      if (t > 0) ranges_[t - 1].end = i;
    }
    ranges_[size_ - 1].end = n;
    start(lock, body, &ThreadPool::drain_ranges);
  }

  /// @brief Calls `body(i)` for every i in [0, n), each thread taking the next index
  ///        from one shared counter: the scheduling before contiguous ranges, kept so
  ///        that benchmarks can compare the two.
  template <class Body>
  void parallel_for_interleaved(std::size_t n, Body& body) {
    if (n == 0) return;
    if (workers_.empty() || n == 1) {
      for (std::size_t i = 0; i < n; ++i) body(i);
      return;
    }
    std::unique_lock lock(mutex_);
    ranges_[0].next.store(0, std::memory_order_relaxed);
    ranges_[0].end = n;
    start(lock, body, &ThreadPool::drain_shared);
  }

 private:
  void shutdown() noexcept {
#if defined(__linux__)
    // The constructing thread's own mask again, if this is that thread (another's
    // handle may name a thread that has exited).
    if (restore_caller_ && pthread_equal(pthread_self(), caller_) != 0) {
      pthread_setaffinity_np(caller_, sizeof caller_mask_, &caller_mask_);
      restore_caller_ = false;
    }
#endif
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
  }

  // Thread `self`'s own range first, then what is left of the others', from the front.
  void drain_ranges(unsigned self) {
    for (unsigned k = 0; k < size_; ++k) {
      Range& r = ranges_[(self + k) % size_];
      for (std::size_t i = r.next.fetch_add(1, std::memory_order_relaxed); i < r.end;
           i = r.next.fetch_add(1, std::memory_order_relaxed))
        invoke_(context_, i);
    }
  }
  void drain_shared(unsigned) {
    Range& r = ranges_[0];
    for (std::size_t i = r.next.fetch_add(1, std::memory_order_relaxed); i < r.end;
         i = r.next.fetch_add(1, std::memory_order_relaxed))
      invoke_(context_, i);
  }

  // Publishes the loop (ranges already set under `lock`), runs the caller's share as
  // thread 0 and waits for the workers.
  template <class Body>
  void start(std::unique_lock<std::mutex>& lock, Body& body, void (ThreadPool::*drain)(unsigned)) {
    context_ = &body;
    invoke_ = [](void* ctx, std::size_t i) { (*static_cast<Body*>(ctx))(i); };
    drain_ = drain;
    busy_ = static_cast<unsigned>(workers_.size());
    ++generation_;
    lock.unlock();
    wake_.notify_all();
    (this->*drain)(0);
    lock.lock();
    done_.wait(lock, [this] { return busy_ == 0; });
  }

#if defined(__linux__)
  static void pin(pthread_t thread, const std::vector<int>& cpus) {
    for (const int c : cpus)
      if (c < 0 || c >= CPU_SETSIZE) throw_invalid_argument("cannot pin a CPU thread to CPU {}: no such CPU", c);
    if (const int e = pin_thread(thread, cpus); e != 0)
      throw_invalid_argument("cannot pin a CPU thread to CPU(s) {}{}: error {} (outside this process's affinity mask?)",
                             cpus.front(), cpus.size() > 1 ? " and others" : "", e);
  }
#endif

  void worker_loop(unsigned self) {
    std::uint64_t seen = 0;
    for (;;) {
      void (ThreadPool::*drain)(unsigned) = nullptr;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        drain = drain_;
      }
      (this->*drain)(self);
      std::lock_guard lock(mutex_);
      if (--busy_ == 0) done_.notify_one();
    }
  }

  // One thread's range of the current loop, on its own cache line: the owner and any
  // thief bump `next`, and neighbouring counters must not share a line.
  struct alignas(64) Range {
    std::atomic<std::size_t> next{0};
    std::size_t end = 0;
  };

  unsigned size_;
  std::vector<int> cpus_;
#if defined(__linux__)
  pthread_t caller_{};
  cpu_set_t caller_mask_{};
  bool restore_caller_ = false;
#endif
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::uint64_t generation_ = 0;
  unsigned busy_ = 0;
  bool stop_ = false;
  // The current loop; written under the mutex before the generation changes.
  void* context_ = nullptr;
  void (*invoke_)(void*, std::size_t) = nullptr;
  void (ThreadPool::*drain_)(unsigned) = nullptr;
  std::vector<Range> ranges_;
};

}  // namespace dos
