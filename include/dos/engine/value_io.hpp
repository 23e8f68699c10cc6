#pragma once
/// @file
/// @brief `ValueIo`: reads and writes a parameter's values as floats wherever they live.
///        Host views are converted in place; device views are copied synchronously, on
///        a stream of their own, through a pinned staging buffer of at most
///        `staging_chunk_bytes` (a copy from pageable memory runs at a fraction of the
///        link's rate), chunk by chunk, each chunk converted on the executor's threads
///        where a parallel loop is given (device views only: a device backend's
///        callers hold the optimizer exclusively, so the executor is idle).
///        Construction and checkpoint access only: never on the step's hot path.

#include "dos/backend/device_backend.hpp"
#include "dos/core/function_ref.hpp"
#include "dos/core/tensor.hpp"
#include "dos/memory/host_resource.hpp"

#include <algorithm>
#include <cstddef>
#include <functional>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>

namespace dos::engine {

namespace detail {
template <class B, bool = DeviceBackend<B>>
struct StreamOf {
  struct type {};
};
template <class B>
struct StreamOf<B, true> {
  using type = typename B::Stream;
};
// Host memory the staging comes from: the backend's pinned memory where it has a device.
template <class B, bool = DeviceBackend<B>>
struct StagingOf {
  using type = HostResource;
};
template <class B>
struct StagingOf<B, true> {
  using type = std::remove_cvref_t<decltype(std::declval<B&>().pinned_memory())>;
};
}  // namespace detail

/// @brief A parallel loop, body(i) for every i in [0, n): the CPU executor's.
using ParallelFor = std::function<void(std::size_t, FunctionRef<void(std::size_t)>)>;

/// @brief Value access for backend @p B (host views only when it has no device).
template <class B>
class ValueIo {
 public:
  /// Largest staged copy: 16 MiB (8M 16-bit elements), kept for checkpoint access.
  static constexpr std::size_t staging_chunk_bytes = std::size_t{16} << 20;

  /// @param backend where device views live; outlives this object
  /// @param parallel converts staged chunks on several threads (serially when empty).
  explicit ValueIo(B& backend, ParallelFor parallel = {}) : backend_(&backend), parallel_(std::move(parallel)) {
    if constexpr (DeviceBackend<B>)
      if (backend.available()) {
        sync_.emplace(backend.make_stream());
        backend.wait_for_framework();  // the framework may still be initialising the values
      }
  }

  /// @brief Elements [offset, offset + out.size()) of @p v, as floats.
  void read(const TensorView& v, std::size_t offset, std::span<float> out) {
    if (v.device == Device::host) {
      for (std::size_t e = 0; e < out.size(); ++e) out[e] = load_element(v.data, v.dtype, offset + e);
      return;
    }
    const std::size_t es = dtype_size(v.dtype);
    const auto* src = static_cast<const std::byte*>(v.data) + offset * es;
    staged(es, out.size(), [&](std::byte* host, std::size_t first, std::size_t n) {
      copy_d2h(host, src + first * es, n * es);
      convert(n, [&](std::size_t e) { out[first + e] = load_element(host, v.dtype, e); });
    });
  }
  /// @brief Writes @p in, rounded to the view's type, from element @p offset on.
  void write(const TensorView& v, std::size_t offset, std::span<const float> in) {
    if (v.device == Device::host) {
      for (std::size_t e = 0; e < in.size(); ++e) store_element(v.data, v.dtype, offset + e, in[e]);
      return;
    }
    const std::size_t es = dtype_size(v.dtype);
    auto* dst = static_cast<std::byte*>(v.data) + offset * es;
    staged(es, in.size(), [&](std::byte* host, std::size_t first, std::size_t n) {
      convert(n, [&](std::size_t e) { store_element(host, v.dtype, e, in[first + e]); });
      copy_h2d(dst + first * es, host, n * es);
    });
  }
  /// @brief Bytes of host staging held now (at most `staging_chunk_bytes`).
  std::size_t staging_bytes() const noexcept { return staging_.size(); }

  /// @brief Synchronous copies between host memory and device memory.
  void copy_d2h(void* host, const void* device, std::size_t bytes) {
    if constexpr (DeviceBackend<B>) {
      backend_->copy_d2h(host, device, bytes, *sync_);
      backend_->synchronize(*sync_);
    }
  }
  void copy_h2d(void* device, const void* host, std::size_t bytes) {
    if constexpr (DeviceBackend<B>) {
      backend_->copy_h2d(device, host, bytes, *sync_);
      backend_->synchronize(*sync_);
    }
  }

 private:
  // f(host, first, n) for consecutive chunks of [0, count), each of n elements of
  // @p es bytes staged at host.
  template <class F>
  void staged(std::size_t es, std::size_t count, F&& f) {
    const std::size_t per_chunk = std::max<std::size_t>(1, staging_chunk_bytes / es);
    const std::size_t bytes = std::min(count, per_chunk) * es;
    if (staging_.size() < bytes) {
      staging_ = {};  // the old block goes first: pinned memory is scarce
      if constexpr (DeviceBackend<B>) staging_ = HostBuffer<std::byte, Staging>(bytes, backend_->pinned_memory());
      else staging_ = HostBuffer<std::byte, Staging>(bytes);
    }
    for (std::size_t first = 0; first < count; first += per_chunk) f(staging_.data(), first, std::min(per_chunk, count - first));
  }
  // body(e) for every e in [0, n), in blocks on the executor's threads when large.
  template <class F>
  void convert(std::size_t n, F&& body) {
    constexpr std::size_t block = std::size_t{1} << 16;
    if (!parallel_ || n <= block) {
      for (std::size_t e = 0; e < n; ++e) body(e);
      return;
    }
    parallel_((n + block - 1) / block, [&](std::size_t b) {
      for (std::size_t e = b * block, end = std::min(n, e + block); e < end; ++e) body(e);
    });
  }

  using Staging = typename detail::StagingOf<B>::type;
  B* backend_;
  ParallelFor parallel_;
  std::optional<typename detail::StreamOf<B>::type> sync_;
  HostBuffer<std::byte, Staging> staging_;
};

}  // namespace dos::engine
