#pragma once
/// @file
/// @brief `CudaBackend`: the `DeviceBackend` of a real GPU, through the CUDA runtime
///        API. Host C++ (any compiler, linked with `CUDA::cudart` and `dos::cuda`).
///
///  - pinned host memory: `cudaHostAlloc` at construction only, one block per
///    subgroup; when pinning fails, pageable memory with a warning on stderr;
///  - device memory: `cudaMalloc`; the staging budget defaults to `cudaMemGetInfo`'s
///    free bytes minus `CudaConfig::reserve_bytes`;
///  - non-blocking streams, one per lane, and timing events on every operation;
///  - the Adam kernel and the gradient reduction of `dos::cuda`.
/// Without a usable GPU (any error from `cudaGetDeviceCount`, such as 35, "driver
/// insufficient", on a machine with no driver), construction throws `cuda_error`,
/// or, with `MissingDevice::use_cpu`, the backend reports itself unavailable and the
/// optimizer updates everything on the CPU.

#include "dos/backend/device_backend.hpp"
#include "dos/cpu/cpu_adam.hpp"
#include "dos/cuda/error.hpp"
#include "dos/cuda/kernels.hpp"
#include "dos/memory/host_resource.hpp"

#include <cuda_runtime_api.h>
#include <fmt/core.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace dos {

/// @brief What to do when there is no usable GPU.
enum class MissingDevice : std::uint8_t {
  throw_error,  ///< construction throws `cuda_error` (the default)
  use_cpu,      ///< construct anyway; the optimizer updates everything on the CPU
};

struct CudaConfig {
  int device = 0;
  /// Device bytes kept out of the default staging budget, for the framework.
  std::size_t reserve_bytes = std::size_t{2} << 30;
  MissingDevice on_missing = MissingDevice::throw_error;
  /// The stream the framework computes gradients on. Before reading gradients or
  /// parameters dos records an event on it, which dos's streams wait on: the host does
  /// not wait, so backward keeps running ahead. The default, the legacy default stream
  /// (named explicitly: a null stream would mean the per-thread stream in code built
  /// with --default-stream per-thread), follows every blocking stream of the device.
  cudaStream_t framework_stream = cudaStreamLegacy;
  /// When set, names the framework's stream at each wait instead, from the calling
  /// thread, for frameworks whose current stream changes (torch: side streams, or
  /// hooks on other threads): `[] { return at::cuda::getCurrentCUDAStream().stream(); }`.
  std::function<cudaStream_t()> current_framework_stream{};
  /// Pin optimizer state with cudaHostAlloc; false, or a failure, gives pageable memory.
  bool pin = true;
};

namespace cuda {

/// @brief Whether a GPU can be used here, and if not, why (empty when it can).
inline std::string unavailable_reason() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess)
    return fmt::format("no usable CUDA device: cudaGetDeviceCount returned error {} ({})", static_cast<int>(e),
                       cudaGetErrorString(e));
  if (count == 0) return "no usable CUDA device: cudaGetDeviceCount found none";
  return {};
}

/// @brief Makes @p device current for its scope, then restores the caller's: the
///        current device is the calling thread's, and the framework's code after a dos
///        call expects its own.
class DeviceGuard {
 public:
  /// @param device the device to make current
  /// @param active false: does nothing (there may be no driver to ask).
  explicit DeviceGuard(int device, bool active = true) {
    if (!active) return;
    DOS_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) DOS_CUDA_CHECK(cudaSetDevice(device));
    else previous_ = -1;  // nothing to restore
  }
  ~DeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

/// @brief Owns a stream or event handle; destroys it once, when the last owner goes.
template <class H, cudaError_t (*Destroy)(H)>
class Handle {
 public:
  Handle() = default;
  explicit Handle(H h) noexcept : h_(h) {}
  Handle(Handle&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  Handle& operator=(Handle&& o) noexcept {
    std::swap(h_, o.h_);
    return *this;
  }
  ~Handle() {
    if (h_ != nullptr) Destroy(h_);
  }
  H get() const noexcept { return h_; }

 private:
  H h_ = nullptr;
};

/// @brief Device memory from cudaMalloc.
struct DeviceMemory {
  int device = 0;
  void* allocate(std::size_t bytes, std::size_t /*alignment: cudaMalloc gives 256*/) const {
    const DeviceGuard on(device);
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), fmt::format("cudaMalloc of {} bytes", bytes));
    return p;
  }
  void deallocate(void* p, std::size_t, std::size_t) const noexcept {
    int previous = 0;
    cudaGetDevice(&previous);
    if (previous != device) cudaSetDevice(device);
    cudaFree(p);
    if (previous != device) cudaSetDevice(previous);
  }
};

/// @brief Pinned host memory from cudaHostAlloc, or pageable memory (with one
///        warning) when pinning fails or is turned off.
class PinnedMemory {
 public:
  PinnedMemory() = default;
  explicit PinnedMemory(bool pin) : state_(std::make_shared<State>()) { state_->pin = pin; }

  void* allocate(std::size_t bytes, std::size_t alignment) const {
    if (state_ != nullptr && state_->pin) {
      void* p = nullptr;
      const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
      if (e == cudaSuccess) {
        std::lock_guard lock(state_->mutex);
        state_->pinned.insert(p);
        return p;
      }
      cudaGetLastError();  // clear it: falling back is not an error
      std::call_once(state_->warned, [&] {
        std::fprintf(stderr, "dos: warning: cudaHostAlloc of %zu bytes failed (%s); using pageable memory, "
                             "transfers will be slower\n", bytes, cudaGetErrorString(e));
      });
    }
    return HostResource{}.allocate(bytes, alignment);
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) const noexcept {
    if (state_ != nullptr) {
      std::lock_guard lock(state_->mutex);
      if (state_->pinned.erase(p) != 0) {
        cudaFreeHost(p);
        return;
      }
    }
    HostResource{}.deallocate(p, bytes, alignment);
  }
  /// @brief Bytes that fell back to pageable memory are not tracked; this says whether
  ///        @p p is pinned.
  bool is_pinned(const void* p) const {
    if (state_ == nullptr) return false;
    std::lock_guard lock(state_->mutex);
    return state_->pinned.count(const_cast<void*>(p)) != 0;
  }

 private:
  struct State {
    bool pin = true;
    std::mutex mutex;
    std::unordered_set<void*> pinned;
    std::once_flag warned;
  };
  std::shared_ptr<State> state_;
};

}  // namespace cuda

/// @brief A CUDA GPU, modelling `DeviceBackend`. Every call runs on `CudaConfig::device`
///        and leaves the calling thread's current device as it found it.
class CudaBackend {
 public:
  using Config = CudaConfig;
  static constexpr bool is_device_backend = true;
  /// Parameters of calibration's device Adam: 512 MB of state, well beyond any GPU's
  /// L2 cache, so the rate is the memory's.
  static constexpr std::size_t calibration_device_elements = std::size_t{1} << 25;

  /// @brief A non-blocking stream, and the last framework event it was ordered after.
  class Stream {
   public:
    Stream() = default;
    cudaStream_t get() const noexcept { return handle_.get(); }

   private:
    friend class CudaBackend;
    explicit Stream(cudaStream_t s) : handle_(s) {}
    cuda::Handle<cudaStream_t, cudaStreamDestroy> handle_;
    std::uint64_t framework_seen_ = 0;
  };
  using Event = cuda::Handle<cudaEvent_t, cudaEventDestroy>;

  /// @throws cuda_error when there is no usable GPU and `on_missing` is `throw_error`.
  explicit CudaBackend(const cpu::CpuConfig& /*host*/ = {}, const Config& config = {})
      : config_(config), device_{config.device}, pinned_(config.pin),
        reason_(cuda::unavailable_reason()) {
    if (!reason_.empty()) {
      if (config.on_missing == MissingDevice::throw_error) throw cuda_error("dos: " + reason_);
      pinned_ = cuda::PinnedMemory(false);  // no driver to pin with: plain host memory, no warning
      return;
    }
    const cuda::DeviceGuard on(config.device);
    scan_.emplace(make_stream());
    reduction_ = std::make_unique<cuda::GradReduction>();
    framework_done_ = make_event_flags(cudaEventDisableTiming);
  }

  /// @brief False when constructed without a usable GPU (`MissingDevice::use_cpu`).
  bool available() const noexcept { return reason_.empty(); }
  /// @brief Why the GPU is unavailable; empty when it is available.
  const std::string& unavailable_reason() const noexcept { return reason_; }

  cuda::DeviceMemory& device_memory() noexcept { return device_; }
  cuda::PinnedMemory& pinned_memory() noexcept { return pinned_; }
  const Config& config() const noexcept { return config_; }

  Stream make_stream() const {
    const auto on = use_device();
    cudaStream_t s = nullptr;
    DOS_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return Stream(s);
  }
  Event make_event() const { return make_event_flags(cudaEventDefault); }

  void copy_h2d(void* dst, const void* src, std::size_t bytes, Stream& s) {
    const auto on = use_device();
    after_framework(s);
    DOS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s.get()));
  }
  void copy_d2h(void* dst, const void* src, std::size_t bytes, Stream& s) {
    const auto on = use_device();
    after_framework(s);
    DOS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s.get()));
  }
  /// @brief Copies the descriptors into the launch's parameters, so @p segments may
  ///        be reused as soon as this returns.
  void launch_adam(std::span<const DeviceSegment> segments, Stream& s) {
    const auto on = use_device();
    after_framework(s);
    cuda::launch_adam(segments, s.get());
  }
  /// @brief Pins the framework's host memory [@p p, @p p + @p bytes) in place
  ///        (cudaHostRegister), so that copies from and to it are asynchronous; true
  ///        also when it is pinned already. False: the engine stages its copies
  ///        through pinned buffers of its own (`SubgroupIo::staging`).
  bool register_host(const void* p, std::size_t bytes) {
    if (!available() || bytes == 0) return false;
    const auto on = use_device();
    if (pinned(p) && pinned(static_cast<const std::byte*>(p) + bytes - 1)) return true;
    if (cudaHostRegister(const_cast<void*>(p), bytes, cudaHostRegisterPortable) != cudaSuccess) {
      (void)cudaGetLastError();  // not an error: the engine stages these copies through pinned memory
      return false;
    }
    const std::lock_guard lock(sync_->framework_mutex);
    sync_->registered.push_back(p);
    return true;
  }
  /// @brief Releases what `register_host` pinned at @p p (nothing when it found it pinned).
  void unregister_host(const void* p) noexcept {
    {
      const std::lock_guard lock(sync_->framework_mutex);
      auto& r = sync_->registered;
      const auto it = std::find(r.begin(), r.end(), p);
      if (it == r.end()) return;
      *it = r.back();
      r.pop_back();
    }
    if (cudaHostUnregister(const_cast<void*>(p)) != cudaSuccess) (void)cudaGetLastError();
  }
  /// @brief Nothing to do on a real device: dead staging is simply overwritten.
  void discard(void*, std::size_t, Stream&) noexcept {}
  void record(Event& e, Stream& s) {
    const auto on = use_device();
    DOS_CUDA_CHECK(cudaEventRecord(e.get(), s.get()));
  }
  void wait(Stream& s, Event& e) {
    const auto on = use_device();
    DOS_CUDA_CHECK(cudaStreamWaitEvent(s.get(), e.get(), 0));
  }
  void synchronize(Event& e) { DOS_CUDA_CHECK(cudaEventSynchronize(e.get())); }
  void synchronize(Stream& s) { DOS_CUDA_CHECK(cudaStreamSynchronize(s.get())); }
  /// @brief Marks the framework's stream (an event recorded on it): every operation dos
  ///        issues from now on waits for what the framework issued so far, on the
  ///        device. The host does not wait. Safe from several threads at once.
  void wait_for_framework() {
    if (!available()) return;
    const auto on = use_device();
    const std::lock_guard lock(sync_->framework_mutex);
    const cudaStream_t fs = config_.current_framework_stream ? config_.current_framework_stream()
                                                             : config_.framework_stream;
    DOS_CUDA_CHECK(cudaEventRecord(framework_done_.get(), fs));
    ++sync_->framework_generation;
  }
  double elapsed(const Event& from, const Event& to) const {
    float ms = 0;
    DOS_CUDA_CHECK(cudaEventElapsedTime(&ms, from.get(), to.get()));
    return static_cast<double>(ms) * 1e-3;
  }
  /// @brief Free device memory now, minus the reserve.
  std::size_t staging_bytes_available() const {
    if (!available()) return 0;
    const auto on = use_device();
    std::size_t free = 0, total = 0;
    DOS_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return free > config_.reserve_bytes ? free - config_.reserve_bytes : 0;
  }
  /// @brief One CUB reduction, after the framework's work (blocks). Safe from several
  ///        threads at once: they take turns on the one scratch buffer.
  GradStats grad_stats(const void* device_data, DType dtype, std::size_t count) {
    if (count == 0 || !scan_) return {};
    const auto on = use_device();
    const std::lock_guard lock(sync_->scan_mutex);
    after_framework(*scan_);
    return (*reduction_)(device_data, dtype, count, scan_->get());
  }

 private:
  // The current device is per host thread: every entry that touches the device sets
  // it, since autograd hooks and training threads call from other threads, and puts
  // the caller's back.
  cuda::DeviceGuard use_device() const { return cuda::DeviceGuard(config_.device, available()); }
  Event make_event_flags(unsigned flags) const {
    const auto on = use_device();
    cudaEvent_t e = nullptr;
    DOS_CUDA_CHECK(cudaEventCreateWithFlags(&e, flags));
    return Event(e);
  }
  // Host memory the device copies asynchronously: pinned or registered by anyone.
  static bool pinned(const void* p) noexcept {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return a.type == cudaMemoryTypeHost;
  }
  // Orders @p s after the framework's latest marked work, once per mark.
  void after_framework(Stream& s) {
    const std::lock_guard lock(sync_->framework_mutex);
    if (s.framework_seen_ == sync_->framework_generation) return;
    DOS_CUDA_CHECK(cudaStreamWaitEvent(s.get(), framework_done_.get(), 0));
    s.framework_seen_ = sync_->framework_generation;
  }

  Config config_;
  cuda::DeviceMemory device_;
  cuda::PinnedMemory pinned_;
  std::string reason_;
  std::optional<Stream> scan_;
  std::unique_ptr<cuda::GradReduction> reduction_;
  Event framework_done_;
  // Behind a pointer, so the backend stays movable.
  struct Sync {
    std::mutex scan_mutex;       // one reduction at a time (grad_ready runs on several threads)
    std::mutex framework_mutex;  // the framework event's record and the streams' waits on it
    std::uint64_t framework_generation = 0;
    // What register_host pinned (under framework_mutex). Room for 4096 reserved, so
    // registering a moved view during a step allocates nothing.
    std::vector<const void*> registered = [] {
      std::vector<const void*> v;
      v.reserve(4096);
      return v;
    }();
  };
  std::unique_ptr<Sync> sync_ = std::make_unique<Sync>();
};
static_assert(DeviceBackend<CudaBackend>);

}  // namespace dos
