#pragma once
/// @file
/// @brief The `DeviceBackend` concept: everything the interleaved engine needs from a
///        device. `EmulatedDeviceBackend` (host threads) and `CudaBackend` model it.
///
/// Memory: a device resource (staging slots, resident state) and a pinned host
/// resource (optimizer state, gradient and parameter mirrors), both allocated at
/// construction only. Work: ordered asynchronous streams; copies and Adam launches are
/// enqueued on them; events order one stream after another, or the host after a stream.
/// Events follow CUDA: `wait` and `synchronize` refer to the most recent `record`.

#include "dos/backend/device_segment.hpp"
#include "dos/core/grad_stats.hpp"
#include "dos/core/tensor.hpp"
#include "dos/cpu/executor.hpp"
#include "dos/memory/host_resource.hpp"

#include <concepts>
#include <cstddef>
#include <span>

namespace dos {

/// @brief A backend opts in to being a device backend with
///        `static constexpr bool is_device_backend = true;`. From then on it must model
///        `DeviceBackend` in full, or the optimizer refuses it at compile time, instead
///        of quietly running everything on the CPU.
template <class B>
concept DeclaresDeviceBackend = requires { requires B::is_device_backend; };

/// @brief A device the interleaved engine can stream optimizer state through.
///
/// Besides the operations below: `B::Config` (its own settings) and construction as
/// `B(const cpu::CpuConfig&, const B::Config&)`; the CPU configuration tells it, for
/// instance, whether pinned blocks should use huge pages. The CPU executor is not the
/// backend's: the optimizer owns it.
/// @code
/// template <dos::DeviceBackend B>
/// void round_trip(B& b, float* host, float* dev, std::size_t n) {
///   auto h2d = b.make_stream(), d2h = b.make_stream();
///   auto copied = b.make_event();
///   b.copy_h2d(dev, host, n * sizeof(float), h2d);
///   b.record(copied, h2d);
///   b.wait(d2h, copied);                 // d2h runs only after the upload
///   b.copy_d2h(host, dev, n * sizeof(float), d2h);
///   b.synchronize(d2h);
/// }
/// @endcode
template <class B>
concept DeviceBackend = DeclaresDeviceBackend<B> &&
                        std::constructible_from<B, const cpu::CpuConfig&, const typename B::Config&> &&
                        requires(B& b, const B& cb, typename B::Stream& s, typename B::Event& e,
                                 const typename B::Event& ce, void* dst, const void* src, std::size_t bytes, std::size_t count,
                                 std::span<const DeviceSegment> segments, DType dtype) {
  { cb.available() } -> std::convertible_to<bool>;  ///< false: no device, update on the CPU
  { b.device_memory() } -> MemoryResource;
  { b.pinned_memory() } -> MemoryResource;
  { b.make_stream() } -> std::same_as<typename B::Stream>;
  { b.make_event() } -> std::same_as<typename B::Event>;
  b.copy_h2d(dst, src, bytes, s);
  b.copy_d2h(dst, src, bytes, s);
  b.launch_adam(segments, s);
  b.discard(dst, bytes, s);       ///< the contents are dead from here on (emulators poison them)
  b.record(e, s);
  b.wait(s, e);                   ///< the stream waits for the event
  b.synchronize(e);               ///< the host waits for the event
  b.synchronize(s);               ///< the host waits for everything issued to the stream
  b.wait_for_framework();         ///< the framework's device work so far is complete (before reading it)
  { cb.elapsed(ce, ce) } -> std::convertible_to<double>;  ///< seconds between two completed events
  { cb.staging_bytes_available() } -> std::convertible_to<std::size_t>;
  { b.grad_stats(src, dtype, count) } -> std::same_as<GradStats>;  ///< of device memory; blocks
};

/// @brief A backend with no device: every subgroup is updated on the CPU (`CpuBackend`).
///        It needs only `B::Config` and the same constructor as a device backend.
template <class B>
concept HostBackend = !DeclaresDeviceBackend<B> &&
                      std::constructible_from<B, const cpu::CpuConfig&, const typename B::Config&>;

/// @brief True for a backend the optimizer can use; otherwise a compile error that
///        names what is missing (the compiler's notes list the failed requirement).
template <class B>
consteval bool check_backend() {
  if constexpr (DeclaresDeviceBackend<B>)
    static_assert(DeviceBackend<B>, "dos: this backend declares is_device_backend but does not model "
                                    "dos::DeviceBackend; the notes below name the requirement it misses");
  else
    static_assert(HostBackend<B>, "dos: a backend needs a Config type and a constructor "
                                  "(const cpu::CpuConfig&, const Config&)");
  return true;
}

}  // namespace dos
