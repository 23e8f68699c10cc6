#pragma once
/// @file
/// @brief Library version.

#define DOS_VERSION_MAJOR 0
#define DOS_VERSION_MINOR 1
#define DOS_VERSION_PATCH 0

namespace dos {
/// @brief The library version as `major * 10000 + minor * 100 + patch`.
inline constexpr int version = DOS_VERSION_MAJOR * 10000 + DOS_VERSION_MINOR * 100 + DOS_VERSION_PATCH;
}  // namespace dos
