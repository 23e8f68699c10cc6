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
#include "dos/core/tensor.hpp"
#include "dos/cpu/cpu_adam.hpp"
#include "dos/cpu/kernel.hpp"
#include "dos/memory/host_resource.hpp"
#include "dos/optim/adam.hpp"

#include <concepts>
#include <cstddef>
#include <span>

namespace dos {

/// @brief A device the interleaved engine can stream optimizer state through.
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
concept DeviceBackend = requires(B& b, const B& cb, typename B::Stream& s, typename B::Event& e,
                                 const typename B::Event& ce, void* dst, const void* src, std::size_t bytes, std::size_t count,
                                 std::span<const DeviceSegment> segments, DType dtype) {
  typename B::Config;
  { cb.available() } -> std::convertible_to<bool>;  ///< false: no device, update on the CPU
  { b.cpu() } -> std::same_as<cpu::CpuAdamExecutor&>;
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

}  // namespace dos
