// Host memory: alignment, zero initialisation (docs/design.md, "Traps" 4), ownership.

#include <doctest/doctest.h>
#include <dos/memory/host_resource.hpp>

#include <cstdint>
#include <cstring>

TEST_CASE("buffers are aligned and zero, even when the memory was dirty before") {
  for (bool huge : {false, true}) {
    for (int round = 0; round < 4; ++round) {
      {
        dos::HostBuffer<float> dirty(1 << 20, dos::HostResource{huge});
        std::memset(dirty.data(), 0xFF, dirty.size() * sizeof(float));
      }
      dos::HostBuffer<float> b((1 << 20) + round, dos::HostResource{huge});
      CHECK(reinterpret_cast<std::uintptr_t>(b.data()) % 64 == 0);
      bool zero = true;
      for (float x : b.span()) zero &= (x == 0.0f && !std::signbit(x));
      CHECK(zero);
    }
  }
}

TEST_CASE("huge-page blocks are 2 MiB aligned") {
  dos::HostResource r{.huge_pages = true};
  void* p = r.allocate(8 << 20, 64);
  CHECK(reinterpret_cast<std::uintptr_t>(p) % (2 << 20) == 0);
  r.deallocate(p, 8 << 20, 64);
}

TEST_CASE("buffers move and own exactly once") {
  dos::HostBuffer<float> a(100);
  float* p = a.data();
  dos::HostBuffer<float> b(std::move(a));
  CHECK(b.data() == p);
  CHECK(a.data() == nullptr);  // NOLINT(bugprone-use-after-move): the moved-from state is specified
  a = std::move(b);
  CHECK(a.data() == p);
  CHECK(a.size() == 100);
  dos::HostBuffer<float> empty(0);
  CHECK(empty.data() == nullptr);
}

TEST_CASE("a bad alignment is rejected") {
  dos::HostResource r;
  CHECK_THROWS_AS((void)r.allocate(64, 3), std::invalid_argument);
}
