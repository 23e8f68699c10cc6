#pragma once
/// @file
/// @brief XXH64, the 64-bit xxHash, for the per-tensor checksums of a checkpoint.
///
/// Why XXH64 and not CRC32C or FNV-1a: it reads 32 bytes per round in four
/// independent lanes, so one core checksums several GB/s without special
/// instructions (FNV-1a is one multiply per byte, under 1 GB/s; CRC32C needs SSE4.2
/// or a table to be fast), and 64 bits make an undetected corruption of a multi-GB
/// tensor vanishingly unlikely. It is specified (xxhash.com, XXH64), has published
/// test vectors, and the Python tool reimplements it in a few lines.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace dos::checkpoint {

namespace detail {
inline constexpr std::uint64_t xxh_prime1 = 0x9E3779B185EBCA87ull;
inline constexpr std::uint64_t xxh_prime2 = 0xC2B2AE3D27D4EB4Full;
inline constexpr std::uint64_t xxh_prime3 = 0x165667B19E3779F9ull;
inline constexpr std::uint64_t xxh_prime4 = 0x85EBCA77C2B2AE63ull;
inline constexpr std::uint64_t xxh_prime5 = 0x27D4EB2F165667C5ull;

// Little-endian loads through memcpy: the data need not be aligned.
inline std::uint64_t load64(const unsigned char* p) noexcept {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline std::uint32_t load32(const unsigned char* p) noexcept {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline std::uint64_t xxh_round(std::uint64_t acc, std::uint64_t input) noexcept {
  acc += input * xxh_prime2;
  acc = std::rotl(acc, 31);
  return acc * xxh_prime1;
}
inline std::uint64_t xxh_merge(std::uint64_t acc, std::uint64_t v) noexcept {
  acc ^= xxh_round(0, v);
  return acc * xxh_prime1 + xxh_prime4;
}
}  // namespace detail

static_assert(std::endian::native == std::endian::little, "dos checkpoints assume a little-endian host");

/// @brief XXH64 of @p size bytes at @p data with @p seed (the reference algorithm).
inline std::uint64_t xxh64(const void* data, std::size_t size, std::uint64_t seed = 0) noexcept {
  using namespace detail;
  const auto* p = static_cast<const unsigned char*>(data);
  const unsigned char* const end = p + size;
  std::uint64_t h;
  if (size >= 32) {
    std::uint64_t v1 = seed + xxh_prime1 + xxh_prime2, v2 = seed + xxh_prime2, v3 = seed, v4 = seed - xxh_prime1;
    const unsigned char* const limit = end - 32;
    do {
      v1 = xxh_round(v1, load64(p));
      v2 = xxh_round(v2, load64(p + 8));
      v3 = xxh_round(v3, load64(p + 16));
      v4 = xxh_round(v4, load64(p + 24));
      p += 32;
    } while (p <= limit);
    h = std::rotl(v1, 1) + std::rotl(v2, 7) + std::rotl(v3, 12) + std::rotl(v4, 18);
    h = xxh_merge(h, v1);
    h = xxh_merge(h, v2);
    h = xxh_merge(h, v3);
    h = xxh_merge(h, v4);
  } else {
    h = seed + xxh_prime5;
  }
  h += static_cast<std::uint64_t>(size);
  for (; p + 8 <= end; p += 8) {
    h ^= xxh_round(0, load64(p));
    h = std::rotl(h, 27) * xxh_prime1 + xxh_prime4;
  }
  if (p + 4 <= end) {
    h ^= static_cast<std::uint64_t>(load32(p)) * xxh_prime1;
    h = std::rotl(h, 23) * xxh_prime2 + xxh_prime3;
    p += 4;
  }
  for (; p < end; ++p) {
    h ^= static_cast<std::uint64_t>(*p) * xxh_prime5;
    h = std::rotl(h, 11) * xxh_prime1;
  }
  h ^= h >> 33;
  h *= xxh_prime2;
  h ^= h >> 29;
  h *= xxh_prime3;
  h ^= h >> 32;
  return h;
}

/// @brief A checksum as the index stores it: "xxh64:" and 16 lowercase hex digits.
inline std::string checksum_string(std::uint64_t h) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s = "xxh64:";
  for (int shift = 60; shift >= 0; shift -= 4) s += digits[(h >> shift) & 0xF];
  return s;
}

}  // namespace dos::checkpoint
