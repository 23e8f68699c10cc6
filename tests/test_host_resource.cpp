// Host memory: alignment, zero initialisation (docs/design.md, "Traps" 4), ownership.

#include <doctest/doctest.h>
#include <dos/memory/host_resource.hpp>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

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

// The caller's memory moved onto huge pages: the contents keep every bit, only whole
// 2 MiB pages inside the range are touched, and what cannot move is left alone.
TEST_CASE("collapsing the caller's memory onto huge pages keeps its contents") {
  CHECK(dos::collapse_to_huge_pages(nullptr, 8 << 20) == 0);
  std::vector<std::uint32_t> small(1000, 7u);
  CHECK(dos::collapse_to_huge_pages(small.data(), small.size() * 4) == 0);  // no whole 2 MiB page inside

  std::mt19937 rng(11);
  for (const std::size_t bytes : {std::size_t{5} << 20, (std::size_t{9} << 20) + 12345}) {
    std::vector<std::uint32_t> data(bytes / 4);
    for (auto& x : data) x = static_cast<std::uint32_t>(rng());
    const std::vector<std::uint32_t> before = data;
    const std::size_t moved = dos::collapse_to_huge_pages(data.data(), data.size() * 4);
    CHECK(moved % (std::size_t{2} << 20) == 0);
    CHECK(moved <= data.size() * 4);
    CHECK(data == before);
    data[data.size() / 2] ^= 1u;  // still ordinary, writable memory
    CHECK(data != before);
  }
#if defined(__linux__)
  // Memory the kernel cannot collapse (read-only, unmapped) is refused quietly.
  const std::size_t page = std::size_t{2} << 20;
  void* ro = ::mmap(nullptr, 4 * page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(ro != MAP_FAILED);
  CHECK_NOTHROW((void)dos::collapse_to_huge_pages(ro, 4 * page));
  ::munmap(ro, 4 * page);
  CHECK(dos::collapse_to_huge_pages(ro, 4 * page) == 0);  // unmapped now
#endif
}
