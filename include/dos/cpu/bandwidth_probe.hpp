#pragma once
/// @file
/// @brief The memory-bandwidth limit of an Adam-shaped update: a plain loop that
///        reads four float arrays and writes three back in place (28 B per element),
///        with next to no arithmetic. A CPU Adam can at best match its rate.

#include "dos/cpu/cpu_adam.hpp"
#include "dos/cpu/thread_pool.hpp"

#include <algorithm>
#include <cstddef>
#include <span>

namespace dos {

/// @brief Bytes of memory traffic per element of an Adam-shaped update
///        (read p, g, m, v; write p, m, v; fp32).
inline constexpr double adam_bytes_per_element = 28.0;

/// @brief One pass of the probe over elements [begin, end).
inline void adam_shaped_pass(float* p, const float* g, float* m, float* v, std::size_t begin, std::size_t end) noexcept {
  for (std::size_t i = begin; i < end; ++i) {
    const float gi = g[i];
    const float mi = m[i] + gi;
    const float vi = v[i] + gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] - mi - vi;
  }
}

/// @brief One pass of the probe over all elements, spread over @p pool in the same
///        chunks the CPU executor uses.
inline void adam_shaped_pass(ThreadPool& pool, std::span<float> p, std::span<const float> g, std::span<float> m,
                             std::span<float> v) {
  const std::size_t n = p.size();
  const std::size_t chunks = (n + cpu::chunk_elements - 1) / cpu::chunk_elements;
  auto body = [&](std::size_t c) {
    const std::size_t b = c * cpu::chunk_elements;
    adam_shaped_pass(p.data(), g.data(), m.data(), v.data(), b, std::min(n, b + cpu::chunk_elements));
  };
  pool.parallel_for(chunks, body);
}

}  // namespace dos
