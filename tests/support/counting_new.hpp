#pragma once
// Replaces the global operator new and delete with ones that count allocations, for
// the tests that prove step() allocates nothing. Include it in exactly one translation
// unit of a test executable.

#include <atomic>
#include <cstdlib>
#include <new>

namespace dos::test {
/// Every global operator new in this process, counted.
inline std::atomic<long> allocations{0};
}  // namespace dos::test

// The replacements pair malloc with free on purpose; GCC cannot see that they match.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

void* operator new(std::size_t n) {
  dos::test::allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
