#pragma once
/// @file
/// @brief `EmulatedDeviceBackend`: a device made of host threads, for machines without
///        a GPU. It runs the whole interleaved engine with CUDA's semantics, and it is
///        built to expose ordering bugs rather than hide them:
///  - device memory is a separate host allocation, never aliasing host state, filled
///    with NaN when allocated and again when `discard`ed, so reading a slot before it
///    is filled or after it is released gives NaN results;
///  - pinned memory comes back filled with NaN too (cudaHostAlloc does not zero), so
///    state that is not explicitly zeroed shows up;
///  - each stream is one worker thread running its queue in order; an operation's
///    reads and writes happen when it completes, after its throttled duration, so a
///    consumer that does not wait for it sees stale or poisoned data;
///  - copies can be throttled to a bandwidth (h2d and param pushes share one link;
///    a half-duplex link is shared by both directions), and Adam launches to a rate;
///  - as CUDA's, a copy from or to host memory that is neither `pinned_memory()`'s nor
///    registered (`register_host`) blocks the thread that issues it until it is done.
/// The device Adam is a CPU kernel compiled from the same one step (adam_step.inl) as
/// every executor, at the widest instruction set (bit-identical to the scalar one).

#include "dos/backend/device_backend.hpp"
#include "dos/cpu/cpu_adam.hpp"
#include "dos/cpu/simd.hpp"
#include "dos/cpu/thread_pool.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/ranges.h>

#if defined(__linux__)
#include <pthread.h>
#endif

namespace dos {

/// @brief How fast the emulated device is. Zero means "as fast as the host can go".
struct EmulatedDeviceConfig {
  double h2d_bandwidth = 0;   ///< bytes/s host to device
  double d2h_bandwidth = 0;   ///< bytes/s device to host
  bool duplex = true;         ///< false: both directions share one link
  double device_rate = 0;     ///< Adam parameters/s on the device
  std::size_t memory_bytes = std::size_t{16} << 30;  ///< device memory capacity
  std::size_t reserve_bytes = 0;  ///< kept out of `staging_bytes_available()`
  SimdLevel simd = SimdLevel::automatic;  ///< the kernel family the device's Adam runs
  /// A copy from or to pageable host memory (neither pinned nor registered) blocks the
  /// issuing thread until it completes, as CUDA's does.
  bool pageable_copies_block = true;
  /// `register_host` refuses every range (returns false), as cudaHostRegister does
  /// where pinning is not allowed, so the engine's pinned staging can be tested.
  bool refuse_registration = false;
  /// The CPUs the streams' threads run on; empty: wherever the OS puts them. A real
  /// device computes on its own silicon, an emulated one on the host's cores, beside
  /// the CPU executor. Unpinned on a 2-vCPU VM, the OS now and then ran a stream's Adam
  /// on the executor's core, and kept doing so for as long as that optimizer lived:
  /// copies of one plan read up to 30% apart (docs/design.md, "The emulated device's
  /// threads"). Give the streams CPUs the executor does not use, and keep the
  /// executor's threads off them (its `CpuConfig::cpus`, or the caller's own mask).
  std::vector<int> cpus{};
};

namespace emulated {

using Clock = std::chrono::steady_clock;

/// Bytes every fresh or discarded allocation is filled with: NaN as float, bf16 and fp16.
inline constexpr unsigned char poison_byte = 0xFF;

/// @brief Device memory: host allocations with a capacity and NaN poisoning. Blocks of
///        2 MiB and more lie, on Linux, on fresh huge-page mappings (`HostResource`,
///        whatever `CpuConfig::huge_pages` says), so that the device Adam's memory
///        never depends on what the process freed before, as the state's did
///        (docs/design.md, "Huge pages"). The capacity counts the bytes asked for,
///        not the rounding of each block to 2 MiB.
class DeviceMemory {
 public:
  DeviceMemory() = default;
  explicit DeviceMemory(std::size_t capacity) : state_(std::make_shared<State>()) { state_->capacity = capacity; }

  void* allocate(std::size_t bytes, std::size_t alignment) const {
    const std::size_t used = state_->used.fetch_add(bytes) + bytes;
    if (used > state_->capacity) {
      state_->used.fetch_sub(bytes);
      throw std::bad_alloc();
    }
    void* p = nullptr;
    try {
      p = HostResource{true}.allocate(bytes, std::max<std::size_t>(alignment, 64));
    } catch (...) {
      state_->used.fetch_sub(bytes);  // nothing was taken
      throw;
    }
    std::memset(p, poison_byte, bytes);
    return p;
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) const noexcept {
    if (state_ != nullptr) state_->used.fetch_sub(bytes);  // a default handle owns nothing
    HostResource{true}.deallocate(p, bytes, std::max<std::size_t>(alignment, 64));
  }
  std::size_t used() const noexcept { return state_->used.load(); }
  std::size_t capacity() const noexcept { return state_->capacity; }

 private:
  struct State {
    std::size_t capacity = 0;
    std::atomic<std::size_t> used{0};
  };
  std::shared_ptr<State> state_;
};

/// @brief The host ranges the device can copy asynchronously: pinned allocations and
///        registered ranges. A flat list with room reserved for 4096, so registering a
///        moved view during a step allocates nothing.
class HostRegistry {
 public:
  HostRegistry() { ranges_.reserve(4096); }
  void add(const void* p, std::size_t bytes) {
    std::lock_guard lock(mutex_);
    ranges_.push_back({address(p), address(p) + bytes});
  }
  void remove(const void* p) noexcept {
    std::lock_guard lock(mutex_);
    for (auto& r : ranges_)
      if (r.first == address(p)) {
        r = ranges_.back();
        ranges_.pop_back();
        return;
      }
  }
  /// @brief Whether [p, p + bytes) lies in one known range.
  bool covers(const void* p, std::size_t bytes) const {
    std::lock_guard lock(mutex_);
    return std::any_of(ranges_.begin(), ranges_.end(),
                       [&](const auto& r) { return r.first <= address(p) && address(p) + bytes <= r.second; });
  }

 private:
  static std::uintptr_t address(const void* p) noexcept { return reinterpret_cast<std::uintptr_t>(p); }
  mutable std::mutex mutex_;
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges_;
};

/// @brief Pinned host memory: aligned host memory that arrives poisoned, as
///        cudaHostAlloc's arrives uninitialised, and is known to the registry.
struct PinnedMemory {
  bool huge_pages = false;
  std::shared_ptr<HostRegistry> registry{};
  void* allocate(std::size_t bytes, std::size_t alignment) const {
    void* p = HostResource{huge_pages}.allocate(bytes, alignment);
    std::memset(p, poison_byte, bytes);
    if (registry) registry->add(p, bytes);
    return p;
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) const noexcept {
    if (registry) registry->remove(p);
    HostResource{huge_pages}.deallocate(p, bytes, alignment);
  }
};

/// @brief A CUDA-like event: `record` bumps the generation, the stream completes it.
struct EventState {
  std::mutex mutex;
  std::condition_variable completed_cv;
  std::uint64_t recorded = 0;   // generation of the latest record() (host side)
  std::uint64_t completed = 0;  // latest generation a stream reached
  Clock::time_point time{};     // when `completed` was reached

  void wait_for(std::uint64_t generation) {
    std::unique_lock lock(mutex);
    completed_cv.wait(lock, [&] { return completed >= generation; });
  }
};

/// @brief Serialises transfers that share a link, in time.
struct Link {
  std::mutex mutex;
  Clock::time_point free{};
  Clock::time_point reserve(double seconds) {
    std::lock_guard lock(mutex);
    const auto now = Clock::now();
    const auto start = std::max(now, free);
    free = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    return free;
  }
};

struct Task {
  enum class Kind : std::uint8_t { copy, adam, discard, record, wait } kind = Kind::copy;
  void* dst = nullptr;
  const void* src = nullptr;
  std::size_t bytes = 0;
  Link* link = nullptr;
  double bandwidth = 0;
  const DeviceSegment* segments = nullptr;
  std::size_t count = 0;
  EventState* event = nullptr;
  std::uint64_t generation = 0;
};

/// @brief One stream: a worker thread draining a fixed ring of tasks in order.
class Worker {
 public:
  static constexpr std::size_t capacity = 4096;

  /// @param device_rate Adam parameters/s the stream's launches are throttled to (0: as fast as it goes).
  /// @param simd the kernel family its Adam runs.
  /// @param cpus where the thread runs (empty: anywhere).
  /// @throws std::invalid_argument when the thread cannot be kept on @p cpus (a CPU
  ///         outside this process's allowed set).
  Worker(double device_rate, SimdLevel simd, const std::vector<int>& cpus = {})
      : device_rate_(device_rate), simd_(simd), cpus_(cpus), thread_([this] { run(); }) {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return started_; });
    if (pin_error_ == 0) return;
    // The thread runs but is not where it was asked to be: stop it, then say why.
    stop_ = true;
    lock.unlock();
    changed_.notify_all();
    thread_.join();
    throw_invalid_argument("EmulatedDeviceConfig::cpus: cannot run a stream's thread on CPU(s) {}: error {} "
                           "(a CPU outside this process's allowed set?)",
                           fmt::join(cpus_, ","), pin_error_);
  }
  ~Worker() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  /// @brief The thread that runs the queue (tests read its affinity).
  std::thread::native_handle_type native_handle() { return thread_.native_handle(); }

  /// @brief Queues @p t; returns its ticket (for `wait`).
  std::uint64_t push(const Task& t) {
    std::uint64_t ticket = 0;
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return issued_ - finished_ < capacity; });
      ring_[issued_ % capacity] = t;
      ticket = ++issued_;
    }
    changed_.notify_all();
    return ticket;
  }
  /// @brief Blocks until the task with @p ticket has completed.
  void wait(std::uint64_t ticket) {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return finished_ >= ticket; });
  }
  void drain() {
    std::unique_lock lock(mutex_);
    const std::uint64_t target = issued_;
    changed_.wait(lock, [&] { return finished_ >= target; });
  }

 private:
  void run() {
    {
      const int error = pin_self();
      std::lock_guard lock(mutex_);
      pin_error_ = error;
      started_ = true;
    }
    changed_.notify_all();
    for (;;) {
      Task t;
      {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [&] { return stop_ || finished_ < issued_; });
        if (finished_ == issued_) return;  // stopping, and nothing left
        t = ring_[finished_ % capacity];
      }
      execute(t);
      {
        std::lock_guard lock(mutex_);
        ++finished_;
      }
      changed_.notify_all();
    }
  }

  // Keeps the calling thread on cpus_; the error number, or 0.
  int pin_self() const noexcept {
#if defined(__linux__)
    return cpus_.empty() ? 0 : pin_thread(pthread_self(), cpus_);
#else
    return 0;  // advice only where threads cannot be pinned
#endif
  }

  void execute(const Task& t) {
    using Kind = Task::Kind;
    switch (t.kind) {
      case Kind::copy:
        // The bytes land when the transfer completes, not when it starts.
        if (t.bandwidth > 0) std::this_thread::sleep_until(t.link->reserve(static_cast<double>(t.bytes) / t.bandwidth));
        std::memcpy(t.dst, t.src, t.bytes);
        break;
      case Kind::discard: std::memset(t.dst, poison_byte, t.bytes); break;
      case Kind::adam: {
        if (device_rate_ > 0) {
          std::size_t elements = 0;
          for (std::size_t i = 0; i < t.count; ++i) elements += t.segments[i].count;
          std::this_thread::sleep_for(std::chrono::duration<double>(static_cast<double>(elements) / device_rate_));
        }
        [[maybe_unused]] const cpu::detail::DefaultFloatEnvironment fenv;
        for (std::size_t i = 0; i < t.count; ++i) {
          const DeviceSegment& s = t.segments[i];
          select_kernel(simd_, s.value, s.grad, s.amsgrad)(s.args, 0, s.count, s.coefficients);
        }
        break;
      }
      case Kind::record: {
        // Notify under the lock: once a waiter sees the completion it may destroy
        // the event, so the event must not be touched after the lock is released.
        std::lock_guard lock(t.event->mutex);
        t.event->completed = std::max(t.event->completed, t.generation);
        t.event->time = Clock::now();
        t.event->completed_cv.notify_all();
        break;
      }
      case Kind::wait: t.event->wait_for(t.generation); break;
    }
  }

  double device_rate_;
  SimdLevel simd_;
  std::vector<int> cpus_;
  std::array<Task, capacity> ring_{};
  std::uint64_t issued_ = 0;
  std::uint64_t finished_ = 0;
  bool stop_ = false;
  bool started_ = false;  // the thread has pinned itself (or failed to: pin_error_)
  int pin_error_ = 0;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::thread thread_;  // last: starts after everything it uses exists
};

}  // namespace emulated

/// @brief A device emulated by host threads, modelling `DeviceBackend`.
/// @code
/// dos::EmulatedDeviceBackend dev;                       // unthrottled, 16 GiB
/// dos::EmulatedDeviceBackend pcie({.threads = 1}, {.h2d_bandwidth = 12e9, .d2h_bandwidth = 12e9});
/// @endcode
class EmulatedDeviceBackend {
 public:
  using Config = EmulatedDeviceConfig;
  static constexpr bool is_device_backend = true;

  /// @brief An ordered queue; move-only.
  class Stream {
   public:
    Stream() = default;
    emulated::Worker* worker() const noexcept { return worker_.get(); }

   private:
    friend class EmulatedDeviceBackend;
    Stream(double rate, SimdLevel simd, const std::vector<int>& cpus)
        : worker_(std::make_unique<emulated::Worker>(rate, simd, cpus)) {}
    std::unique_ptr<emulated::Worker> worker_;
  };
  /// @brief A CUDA-like event; move-only.
  class Event {
   public:
    Event() = default;

   private:
    friend class EmulatedDeviceBackend;
    explicit Event(int) : state_(std::make_unique<emulated::EventState>()) {}
    std::unique_ptr<emulated::EventState> state_;
  };

  explicit EmulatedDeviceBackend(const cpu::CpuConfig& host = {}, const Config& config = {})
      : config_(config), device_(config.memory_bytes), pinned_{host.huge_pages, registry_},
        device_simd_(resolve_simd(config.simd)) {}

  /// @brief Always: the emulated device exists wherever the host does.
  bool available() const noexcept { return true; }
  emulated::DeviceMemory& device_memory() noexcept { return device_; }
  emulated::PinnedMemory& pinned_memory() noexcept { return pinned_; }
  const Config& config() const noexcept { return config_; }

  /// @throws std::invalid_argument when `Config::cpus` names a CPU its thread cannot run on.
  Stream make_stream() const { return Stream(config_.device_rate, device_simd_, config_.cpus); }
  Event make_event() const { return Event(0); }

  void copy_h2d(void* dst, const void* src, std::size_t bytes, Stream& s) {
    push_copy(dst, src, bytes, h2d_link_, config_.h2d_bandwidth, s, src);
  }
  void copy_d2h(void* dst, const void* src, std::size_t bytes, Stream& s) {
    push_copy(dst, src, bytes, config_.duplex ? d2h_link_ : h2d_link_, config_.d2h_bandwidth, s, dst);
  }
  /// @brief Copies from and to [@p p, @p p + @p bytes) become asynchronous, as after
  ///        cudaHostRegister. Succeeds unless `Config::refuse_registration`.
  bool register_host(const void* p, std::size_t bytes) {
    if (config_.refuse_registration) return false;
    registry_->add(p, bytes);
    return true;
  }
  /// @brief Copies issued so far whose host side was neither pinned nor registered
  ///        (each one synchronous on a real device).
  std::size_t pageable_copies() const noexcept { return pageable_copies_.load(); }
  void unregister_host(const void* p) noexcept { registry_->remove(p); }
  /// @brief Runs Adam over @p segments; the span must stay valid until it completes.
  void launch_adam(std::span<const DeviceSegment> segments, Stream& s) {
    emulated::Task t;
    t.kind = emulated::Task::Kind::adam;
    t.segments = segments.data();
    t.count = segments.size();
    s.worker()->push(t);
  }
  void discard(void* dst, std::size_t bytes, Stream& s) {
    emulated::Task t;
    t.kind = emulated::Task::Kind::discard;
    t.dst = dst;
    t.bytes = bytes;
    s.worker()->push(t);
  }
  /// @brief The event completes when the stream reaches this point.
  void record(Event& e, Stream& s) { push_event_task(emulated::Task::Kind::record, e, s); }
  /// @brief The stream waits for the event's latest record.
  void wait(Stream& s, Event& e) { push_event_task(emulated::Task::Kind::wait, e, s); }
  void synchronize(Event& e) {
    std::uint64_t g = 0;
    {
      std::lock_guard lock(e.state_->mutex);
      g = e.state_->recorded;
    }
    e.state_->wait_for(g);
  }
  void synchronize(Stream& s) { s.worker()->drain(); }
  /// @brief The "framework" writes emulated device memory synchronously: nothing to wait for.
  void wait_for_framework() noexcept {}
  /// @brief Seconds from @p from to @p to; both must have completed.
  double elapsed(const Event& from, const Event& to) const {
    const auto time = [](const Event& e) {
      std::lock_guard lock(e.state_->mutex);
      return e.state_->time;
    };
    return std::chrono::duration<double>(time(to) - time(from)).count();
  }
  std::size_t staging_bytes_available() const noexcept {
    const std::size_t used = device_.used() + config_.reserve_bytes;
    return used >= device_.capacity() ? 0 : device_.capacity() - used;
  }
  GradStats grad_stats(const void* device_data, DType dtype, std::size_t count) {
    return cpu::grad_stats(device_data, dtype, 0, count);
  }

 private:
  // record() starts a new generation; wait() captures the current one, as CUDA does.
  static void push_event_task(emulated::Task::Kind kind, Event& e, Stream& s) {
    emulated::Task t;
    t.kind = kind;
    t.event = e.state_.get();
    {
      std::lock_guard lock(t.event->mutex);
      t.generation = kind == emulated::Task::Kind::record ? ++t.event->recorded : t.event->recorded;
    }
    s.worker()->push(t);
  }
  void push_copy(void* dst, const void* src, std::size_t bytes, emulated::Link& link, double bandwidth, Stream& s,
                 const void* host) {
    emulated::Task t;
    t.kind = emulated::Task::Kind::copy;
    t.dst = dst;
    t.src = src;
    t.bytes = bytes;
    t.link = &link;
    t.bandwidth = bandwidth;
    const std::uint64_t ticket = s.worker()->push(t);
    // Pageable memory: CUDA stages the copy, and the issuing thread waits for it.
    if (registry_->covers(host, bytes)) return;
    pageable_copies_.fetch_add(1);
    if (config_.pageable_copies_block) s.worker()->wait(ticket);
  }

  Config config_;
  std::shared_ptr<emulated::HostRegistry> registry_ = std::make_shared<emulated::HostRegistry>();
  emulated::DeviceMemory device_;
  emulated::PinnedMemory pinned_;
  SimdLevel device_simd_;
  emulated::Link h2d_link_;
  emulated::Link d2h_link_;
  std::atomic<std::size_t> pageable_copies_{0};
};
static_assert(DeviceBackend<EmulatedDeviceBackend>);

}  // namespace dos
