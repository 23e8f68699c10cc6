#pragma once
/// @file
/// @brief `ValueIo`: reads and writes a parameter's values as floats wherever they live.
///        Host views are converted in place; device views go through one staged,
///        synchronous copy on a stream of their own. Construction and checkpoint
///        access only: never on the step's hot path.

#include "dos/backend/device_backend.hpp"
#include "dos/core/tensor.hpp"

#include <cstddef>
#include <optional>
#include <span>
#include <vector>

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
}  // namespace detail

/// @brief Value access for backend @p B (host views only when it has no device).
template <class B>
class ValueIo {
 public:
  explicit ValueIo(B& backend) : backend_(&backend) {
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
    staged(v, offset, out.size(), [&](std::byte* host) {
      copy_d2h(host, static_cast<const std::byte*>(v.data) + offset * dtype_size(v.dtype), out.size() * dtype_size(v.dtype));
      for (std::size_t e = 0; e < out.size(); ++e) out[e] = load_element(host, v.dtype, e);
    });
  }
  /// @brief Writes @p in, rounded to the view's type, from element @p offset on.
  void write(const TensorView& v, std::size_t offset, std::span<const float> in) {
    if (v.device == Device::host) {
      for (std::size_t e = 0; e < in.size(); ++e) store_element(v.data, v.dtype, offset + e, in[e]);
      return;
    }
    staged(v, offset, in.size(), [&](std::byte* host) {
      for (std::size_t e = 0; e < in.size(); ++e) store_element(host, v.dtype, e, in[e]);
      copy_h2d(static_cast<std::byte*>(v.data) + offset * dtype_size(v.dtype), host, in.size() * dtype_size(v.dtype));
    });
  }

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
  template <class F>
  void staged(const TensorView& v, std::size_t, std::size_t count, F&& f) {
    staging_.resize(count * dtype_size(v.dtype));
    f(staging_.data());
  }

  B* backend_;
  std::optional<typename detail::StreamOf<B>::type> sync_;
  std::vector<std::byte> staging_;
};

}  // namespace dos::engine
