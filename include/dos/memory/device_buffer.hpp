#pragma once
/// @file
/// @brief `DeviceBuffer`: owning raw bytes from any `MemoryResource`, never touched by
///        the host (device memory cannot be memset from the host).

#include "dos/memory/host_resource.hpp"

#include <cstddef>
#include <utility>

namespace dos {

/// @brief Owning, uninitialised bytes from a resource (typically device memory).
template <MemoryResource R>
class DeviceBuffer {
 public:
  static constexpr std::size_t alignment = 256;  // what cudaMalloc guarantees

  DeviceBuffer() = default;
  DeviceBuffer(std::size_t bytes, R resource) : resource_(std::move(resource)), bytes_(bytes) {
    if (bytes_ > 0) data_ = static_cast<std::byte*>(resource_.allocate(bytes_, alignment));
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : resource_(std::move(o.resource_)), data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      resource_ = std::move(o.resource_);
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  ~DeviceBuffer() { release(); }

  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return bytes_; }

 private:
  void release() noexcept {
    if (data_ != nullptr) resource_.deallocate(data_, bytes_, alignment);
    data_ = nullptr;
  }
  R resource_{};
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace dos
