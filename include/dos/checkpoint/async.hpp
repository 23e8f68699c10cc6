#pragma once
/// @file
/// @brief Asynchronous saving: the caller's thread only copies the state into host
///        buffers kept between saves; a background thread checksums and writes them.

#include "dos/checkpoint/writer.hpp"

#include <exception>
#include <filesystem>
#include <future>
#include <utility>

namespace dos {

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

/// @brief Saves checkpoints while training goes on. `save()` copies the optimizer's
///        state into a host snapshot (allocated by the first save, reused by later
///        ones) and returns; a background thread writes the copy, so later steps
///        never change what is written.
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
/// it first (its error, if any, stays with its handle). The destructor waits too.
class AsyncCheckpointer {
 public:
  AsyncCheckpointer() = default;
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;
  ~AsyncCheckpointer() {
    if (pending_.valid()) pending_.wait();
  }

  /// @brief Snapshots @p opt now and writes it to @p dir in the background.
  /// @throws std::invalid_argument if the state cannot be read (nothing is written);
  ///         write errors are rethrown by the handle's `wait()`.
  template <CheckpointTarget O>
  SaveHandle save(O& opt, std::filesystem::path dir) {
    if (pending_.valid()) pending_.wait();
    snapshot_.capture(opt);
    pending_ = std::async(std::launch::async, [this, d = std::move(dir)] { checkpoint::write_snapshot(snapshot_, d); }).share();
    return SaveHandle(pending_);
  }

  /// @brief The host snapshot (for its size: `capacity()` floats).
  const checkpoint::Snapshot& snapshot() const noexcept { return snapshot_; }

 private:
  checkpoint::Snapshot snapshot_;
  std::shared_future<void> pending_;
};

}  // namespace dos
