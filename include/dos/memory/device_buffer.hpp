#pragma once
/// @file
/// @brief `DeviceBuffer`: owning raw bytes from any `MemoryResource`, never touched by
///        the host (device memory cannot be memset from the host).

#include "dos/memory/host_resource.hpp"

#include <cstddef>

namespace dos {

/// @brief Owning, uninitialised bytes from a resource (typically device memory),
///        256-byte aligned as cudaMalloc's are.
template <MemoryResource R>
using DeviceBuffer = RawBuffer<R, 256>;

}  // namespace dos
