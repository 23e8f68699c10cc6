#pragma once
// Deterministic test inputs shared with tests/reference/generate_torch_reference.py.
// byte_value() returns k/128 for k in [-128, 127]: exact in float32, bf16 and fp16,
// so the same trajectory can be fed to every parameter type.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dos::test {

constexpr std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  std::uint64_t z = x;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static_assert(mix(0) == 0xE220A8397B1DCDAFull);

constexpr float byte_value(std::uint64_t stream, std::uint64_t tensor, std::uint64_t step, std::uint64_t i) {
  const std::uint64_t h = mix((stream << 56) + (tensor << 48) + (step << 32) + i);
  return static_cast<float>(static_cast<int>(h >> 56) - 128) / 128.0f;
}

inline float initial_param(std::size_t tensor, std::size_t i) { return byte_value(0, tensor, 0, i); }

inline float gradient(std::size_t tensor, std::int64_t step, std::size_t i) {
  const float scale = 1.0f / static_cast<float>(1u << (2 * (tensor % 4)));
  return byte_value(1, tensor, static_cast<std::uint64_t>(step), i) * scale;
}

/// A small xorshift generator for property tests: fast, seedable, no <random> state.
struct Rng {
  std::uint64_t s;
  explicit Rng(std::uint64_t seed) : s(mix(seed)) {}
  std::uint64_t next() { return s = mix(s); }
  std::size_t below(std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(next() % n); }
  float uniform(float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>(next() >> 40) * (1.0f / 16777216.0f);
  }
};

}  // namespace dos::test
