#pragma once
/// @file
/// @brief A persistent pool of worker threads for data-parallel loops.
///
/// Threads are created once, at construction, because a training step must not pay
/// thread start-up. `parallel_for` neither allocates nor type-erases through the heap,
/// so it is safe inside `step()`. The calling thread takes part in the work.

#include "dos/error.hpp"

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sched.h>
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

/// @brief A fixed set of threads that run `parallel_for` loops together.
class ThreadPool {
 public:
  /// @param threads participants, including the caller of `parallel_for`; 0 means
  ///        `available_threads()`.
  explicit ThreadPool(unsigned threads = 0) : size_(threads == 0 ? available_threads() : threads) {
    workers_.reserve(size_ - 1);
    try {
      for (unsigned i = 1; i < size_; ++i) workers_.emplace_back([this] { worker_loop(); });
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

  /// @brief Calls `body(i)` once for every i in [0, n), spread over the pool; returns
  ///        when all calls have returned. `body` must not throw. Not reentrant: one
  ///        loop at a time per pool.
  template <class Body>
  void parallel_for(std::size_t n, Body& body) {
    if (n == 0) return;
    if (workers_.empty() || n == 1) {
      for (std::size_t i = 0; i < n; ++i) body(i);
      return;
    }
    {
      std::lock_guard lock(mutex_);
      context_ = &body;
      invoke_ = [](void* ctx, std::size_t i) { (*static_cast<Body*>(ctx))(i); };
      count_ = n;
      next_.store(0, std::memory_order_relaxed);
      busy_ = static_cast<unsigned>(workers_.size());
      ++generation_;
    }
    wake_.notify_all();
    drain();
    std::unique_lock lock(mutex_);
    done_.wait(lock, [this] { return busy_ == 0; });
  }

 private:
  void shutdown() noexcept {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
  }

  void drain() {
    for (std::size_t i = next_.fetch_add(1, std::memory_order_relaxed); i < count_;
         i = next_.fetch_add(1, std::memory_order_relaxed))
      invoke_(context_, i);
  }

  void worker_loop() {
    std::uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      drain();
      std::lock_guard lock(mutex_);
      if (--busy_ == 0) done_.notify_one();
    }
  }

  unsigned size_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::uint64_t generation_ = 0;
  unsigned busy_ = 0;
  bool stop_ = false;
  // The current loop; written under the mutex before the generation changes.
  void* context_ = nullptr;
  void (*invoke_)(void*, std::size_t) = nullptr;
  std::size_t count_ = 0;
  std::atomic<std::size_t> next_{0};
};

}  // namespace dos
