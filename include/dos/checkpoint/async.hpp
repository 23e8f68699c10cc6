#pragma once
/// @file
/// @brief Asynchronous saving: the caller's thread only records the counters and takes
///        a hold on the optimizer state; a background thread copies the state into host
///        buffers kept between saves, lets the optimizer go on, then checksums and
///        writes the copy.

#include "dos/checkpoint/writer.hpp"

#include <exception>
#include <filesystem>
#include <future>
#include <utility>

#if defined(__linux__)
#include <sys/resource.h>
#include <unistd.h>
#endif

namespace dos {

namespace detail {

// The write (checksums, copies into the page cache) runs while the next steps do: on
// Linux its thread yields the CPU to them (nice 10, this thread only), so it takes the
// cycles training leaves. Failure only loses the courtesy.
inline void yield_to_training() noexcept {
#if defined(__linux__)
  (void)setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
#endif
}

}  // namespace detail

/// @brief The outcome of one asynchronous save.
class SaveHandle {
 public:
  SaveHandle() = default;
  /// @brief Blocks until the checkpoint is durable on disk.
  /// @throws whatever the write threw (`std::runtime_error` naming the path).
  void wait() const {
    if (future_.valid()) future_.get();
  }
  /// @brief Whether the write has finished (successfully or not); never blocks.
  bool done() const {
    return !future_.valid() || future_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }

 private:
  friend class AsyncCheckpointer;
  explicit SaveHandle(std::shared_future<void> f) : future_(std::move(f)) {}
  std::shared_future<void> future_;
};

/// @brief Saves checkpoints while training goes on. `save()` records the counters,
///        takes a `StateHold` on the optimizer and returns; a background thread copies
///        the state into a host snapshot (allocated by the first save, reused by later
///        ones), releases the hold, then checksums and writes the copy. The next
///        `step()` waits only for what is left of the copy, so a copy that overlaps
///        forward and backward costs training nothing, and later steps never change
///        what is written. A device optimizer (whose resident state moves through its
///        stream) is copied before `save()` returns.
/// @code
/// dos::AsyncCheckpointer ckpt;
/// dos::SaveHandle saving;
/// for (int step = 1; ; ++step) {
///   opt.step();
///   if (step % 1000 == 0) { saving.wait(); saving = ckpt.save(opt, "ckpt"); }
/// }
/// saving.wait();
/// @endcode
/// One snapshot exists, so a save that finds the previous one still writing waits for
/// it first (its error, if any, stays with its handle). The destructor waits too. The
/// optimizer must outlive the copy (its destructor waits for the hold).
class AsyncCheckpointer {
 public:
  AsyncCheckpointer() = default;
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;
  ~AsyncCheckpointer() {
    if (pending_.valid()) pending_.wait();
  }

  /// @brief Saves @p opt's state as it is now to @p dir, in the background.
  /// @throws std::invalid_argument if the state cannot be listed (nothing is written);
  ///         copy and write errors are rethrown by the handle's `wait()`.
  template <CheckpointTarget O>
  SaveHandle save(O& opt, std::filesystem::path dir) {
    if (pending_.valid()) pending_.wait();
    if constexpr (requires { opt.hold_state(); }) {
      snapshot_.prepare(opt);
      pending_ = std::async(std::launch::async, [this, &opt, hold = opt.hold_state(), d = std::move(dir)]() mutable {
                   {
                     const StateHold held = std::move(hold);  // released once copied, before the write
                     snapshot_.copy_held(opt, held);
                   }
                   detail::yield_to_training();
                   checkpoint::write_snapshot(snapshot_, d);
                 }).share();
    } else {
      snapshot_.capture(opt);
      pending_ = std::async(std::launch::async, [this, d = std::move(dir)] {
                   detail::yield_to_training();
                   checkpoint::write_snapshot(snapshot_, d);
                 }).share();
    }
    return SaveHandle(pending_);
  }

  /// @brief The host snapshot (for its size: `capacity()` floats).
  const checkpoint::Snapshot& snapshot() const noexcept { return snapshot_; }

 private:
  checkpoint::Snapshot snapshot_;
  std::shared_future<void> pending_;
};

}  // namespace dos
