#pragma once
/// @file
/// @brief `BufferPool`: a fixed number of equal blocks, allocated once at construction
///        and handed out as move-only leases. The engine's staging slots live here, so
///        no step allocates or pins memory (pinning costs milliseconds per call).

#include "dos/error.hpp"
#include "dos/memory/device_buffer.hpp"
#include "dos/memory/host_resource.hpp"

#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace dos {

/// @brief Usage counters of a pool.
struct PoolStats {
  std::size_t capacity = 0;      ///< blocks
  std::size_t in_use = 0;        ///< blocks leased now
  std::size_t peak_in_use = 0;   ///< most blocks leased at once
  std::size_t acquisitions = 0;  ///< leases handed out so far
};

/// @brief Fixed-capacity pool of blocks from resource `R`. Thread-safe.
/// @code
/// dos::BufferPool<dos::HostResource> pool(2, 1 << 20, {});
/// auto a = pool.acquire();            // blocks while none is free
/// auto b = pool.try_acquire();        // std::nullopt when none is free
/// std::byte* p = a.data();
/// @endcode
template <MemoryResource R>
class BufferPool {
 public:
  /// @brief A block on loan; returned to the pool when destroyed.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& o) noexcept : pool_(std::exchange(o.pool_, nullptr)), index_(o.index_) {}
    Lease& operator=(Lease&& o) noexcept {
      if (this != &o) {
        reset();
        pool_ = std::exchange(o.pool_, nullptr);
        index_ = o.index_;
      }
      return *this;
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { reset(); }

    explicit operator bool() const noexcept { return pool_ != nullptr; }
    std::byte* data() const noexcept { return pool_->blocks_[index_].data(); }
    std::size_t size() const noexcept { return pool_->block_bytes_; }
    std::size_t index() const noexcept { return index_; }
    /// @brief Returns the block now.
    void reset() noexcept {
      if (pool_ != nullptr) std::exchange(pool_, nullptr)->release(index_);
    }

   private:
    friend class BufferPool;
    Lease(BufferPool* pool, std::size_t index) : pool_(pool), index_(index) {}
    BufferPool* pool_ = nullptr;
    std::size_t index_ = 0;
  };

  BufferPool() = default;
  /// @brief Allocates @p blocks blocks of @p block_bytes each, now and only now.
  BufferPool(std::size_t blocks, std::size_t block_bytes, R resource) : block_bytes_(block_bytes) {
    blocks_.reserve(blocks);
    free_.reserve(blocks);
    for (std::size_t i = 0; i < blocks; ++i) {
      blocks_.emplace_back(block_bytes, resource);
      free_.push_back(blocks - 1 - i);
    }
  }
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;
  ~BufferPool() = default;  // leases must not outlive their pool

  /// @brief A free block; waits until one is returned.
  /// @throws std::invalid_argument when the pool has no blocks at all (it would wait forever).
  Lease acquire() {
    std::unique_lock lock(mutex_);
    if (blocks_.empty()) throw_invalid_argument("acquire() on an empty buffer pool would wait forever");
    returned_.wait(lock, [&] { return !free_.empty(); });
    return take();
  }
  /// @brief A free block, or nothing when all are leased.
  std::optional<Lease> try_acquire() {
    std::lock_guard lock(mutex_);
    if (free_.empty()) return std::nullopt;
    return take();
  }

  std::size_t block_bytes() const noexcept { return block_bytes_; }
  std::size_t capacity() const noexcept { return blocks_.size(); }
  PoolStats stats() const {
    std::lock_guard lock(mutex_);
    return {blocks_.size(), blocks_.size() - free_.size(), peak_, acquisitions_};
  }

 private:
  Lease take() {
    const std::size_t i = free_.back();
    free_.pop_back();
    ++acquisitions_;
    peak_ = std::max(peak_, blocks_.size() - free_.size());
    return Lease(this, i);
  }
  void release(std::size_t i) noexcept {
    {
      std::lock_guard lock(mutex_);
      free_.push_back(i);  // never reallocates: capacity is the block count
    }
    returned_.notify_one();
  }

  std::vector<DeviceBuffer<R>> blocks_;
  std::vector<std::size_t> free_;
  std::size_t block_bytes_ = 0;
  std::size_t peak_ = 0;
  std::size_t acquisitions_ = 0;
  mutable std::mutex mutex_;
  std::condition_variable returned_;
};

}  // namespace dos
