// Host memory: alignment, zero initialisation (docs/design.md, "Traps" 4), ownership.

#include <doctest/doctest.h>
#include <dos/memory/host_resource.hpp>

#include <algorithm>
#include <cstddef>
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

#if defined(__linux__)
// Huge-page advice acts when a page is first touched; it cannot change pages already
// there. So a huge-page block must be fresh memory, whatever the process freed before:
// none of its pages resident until touched. glibc maps a block this large afresh only
// until the process frees a larger one; from then on it serves it from its heap, and
// an 8 MiB block from `aligned_alloc` came back with all 2048 pages resident.
TEST_CASE("huge-page blocks are fresh memory, never pages the process freed before") {
  const dos::HostResource r{.huge_pages = true};
  constexpr std::size_t bytes = 8 << 20, page = 4096;
  { std::vector<char> larger(24 << 20, 1); }  // raises glibc's threshold for fresh mappings
  std::vector<std::vector<int>> kept;  // small blocks above each freed one: the heap cannot shrink past them
  for (int round = 0; round < 6; ++round) {
    {
      dos::HostBuffer<std::byte> dirty(bytes, r);  // zeroed: every page touched
      kept.emplace_back(16, round);
    }
    void* p = r.allocate(bytes, 64);
    std::vector<unsigned char> resident(bytes / page);
    REQUIRE(::mincore(p, bytes, resident.data()) == 0);
    CHECK(std::count_if(resident.begin(), resident.end(), [](unsigned char c) { return (c & 1) != 0; }) == 0);
    std::memset(p, 0xAB, bytes);  // ordinary writable memory, all of it
    CHECK(static_cast<unsigned char*>(p)[bytes - 1] == 0xAB);
    r.deallocate(p, bytes, 64);
  }
}

TEST_CASE("huge-page blocks keep their alignment and their bytes for any size and alignment") {
  const dos::HostResource r{.huge_pages = true};
  for (const std::size_t bytes : {std::size_t{2} << 20, (std::size_t{2} << 20) + 1, std::size_t{7} << 20, std::size_t{33} << 20})
    for (const std::size_t alignment : {std::size_t{64}, std::size_t{4096}, std::size_t{4} << 20}) {
      auto* p = static_cast<unsigned char*>(r.allocate(bytes, alignment));
      CHECK(reinterpret_cast<std::uintptr_t>(p) % std::max(alignment, dos::HostResource::huge_page_size) == 0);
      p[0] = 1;
      p[bytes - 1] = 2;
      CHECK(p[0] + p[bytes - 1] == 3);
      r.deallocate(p, bytes, alignment);
    }
}
#endif

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

// A size whose rounding to the alignment wraps past zero, as a count times an element
// size that overflowed gives, is no allocation: the code before returned a block of a
// few bytes for it.
TEST_CASE("a size beyond any address space is refused, not wrapped") {
  for (bool huge : {false, true}) {
    const dos::HostResource r{huge};
    for (const std::size_t bytes : {SIZE_MAX, SIZE_MAX - 10, SIZE_MAX - (std::size_t{2} << 20)})
      CHECK_THROWS_AS((void)r.allocate(bytes, 64), std::bad_alloc);
  }
  // A count whose size in bytes wraps to a few bytes: the code before handed back a
  // buffer of one element for it.
  CHECK_THROWS_AS(dos::HostBuffer<float>(SIZE_MAX / 4 + 2), std::bad_alloc);
  CHECK_THROWS_AS(dos::HostBuffer<double>(SIZE_MAX / 8 + 2, dos::HostResource{true}), std::bad_alloc);
  // An alignment whose slack would wrap the guard itself.
  CHECK_THROWS_AS((void)dos::HostResource{true}.allocate(std::size_t{4} << 20, std::size_t{1} << 63), std::bad_alloc);
  // A size that fits, but that no system has: the mapping fails. (Not asked of the C
  // allocator here: under AddressSanitizer, a request that large ends the process.)
  CHECK_THROWS_AS((void)dos::HostResource{true}.allocate(std::size_t{1} << 62, 64), std::bad_alloc);
}

// The caller's memory moved onto huge pages: the contents keep every bit, only whole
// 2 MiB pages inside the range are touched, and what cannot move is left alone.
// The union of the caller's ranges, as the collapse sees it: every byte of every range
// lies in exactly one merged range, the merged ranges are sorted and further apart than
// the gap, and nothing outside the ranges and their small gaps is added.
TEST_CASE("merge_ranges joins what overlaps or nearly touches, and only that") {
  std::mt19937 rng(5);
  alignas(64) static std::byte arena[1 << 16];
  for (int trial = 0; trial < 200; ++trial) {
    const std::size_t gap = trial % 2 == 0 ? 0 : 64;
    std::vector<dos::HostRange> in;
    const int n = static_cast<int>(rng() % 12);
    for (int i = 0; i < n; ++i) {
      const std::size_t at = rng() % (sizeof arena - 4096), bytes = rng() % 4096;
      in.push_back({arena + at, bytes});
    }
    const std::vector<dos::HostRange> out = dos::merge_ranges(in, gap);
    const auto addr = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p); };
    for (std::size_t j = 0; j + 1 < out.size(); ++j)
      CHECK(addr(out[j].data) + out[j].bytes + gap < addr(out[j + 1].data));
    std::size_t covered_in = 0, covered_out = 0, doubly = 0, lost = 0;
    for (std::size_t b = 0; b < sizeof arena; ++b) {
      const std::uintptr_t x = addr(arena + b);
      const auto inside = [&](const dos::HostRange& r) { return addr(r.data) <= x && x < addr(r.data) + r.bytes; };
      const bool in_any = std::any_of(in.begin(), in.end(), inside);
      const auto hits = static_cast<std::size_t>(std::count_if(out.begin(), out.end(), inside));
      doubly += hits > 1;
      lost += in_any && hits == 0;
      covered_in += in_any;
      covered_out += hits;
    }
    CHECK(doubly == 0);
    CHECK(lost == 0);
    // What merging adds is the gaps it bridged: at most `gap` bytes per join.
    CHECK(covered_out >= covered_in);
    CHECK(covered_out - covered_in <= gap * in.size());
    for (const dos::HostRange& r : out) CHECK(r.bytes > 0);
  }
  CHECK(dos::merge_ranges({{nullptr, 64}, {arena, 0}}, 4096).empty());
}

// A flat buffer passed as views that are not 2 MiB aligned: collapsed view by view, a
// 4 MiB view holds one whole huge page; the union of the views holds nearly all.
TEST_CASE("views of one buffer are collapsed as the buffer they form") {
  constexpr std::size_t page = std::size_t{2} << 20, view = 2 * page;
  std::vector<std::uint32_t> data((8 * view + 2 * page) / 4);
  std::mt19937 rng(3);
  for (auto& x : data) x = static_cast<std::uint32_t>(rng());
  const std::vector<std::uint32_t> before = data;
  // Start one 4 KiB page past a 2 MiB boundary, so no view is aligned.
  const auto at = reinterpret_cast<std::uintptr_t>(data.data());
  auto* first = reinterpret_cast<std::byte*>((at + page - 1) / page * page + 4096);
  std::vector<dos::HostRange> views;
  for (std::size_t i = 0; i < 8; ++i) views.push_back({first + i * view, view});
  const std::size_t moved = dos::collapse_to_huge_pages(views);
  CHECK(data == before);
  CHECK(moved % page == 0);
  // The union [first, first + 8 views) holds 15 whole pages; the views one by one, 8.
  // Where the kernel collapses nothing (no free huge page, no MADV_COLLAPSE), 0.
  if (moved > 0) CHECK(moved == 15 * page);
}

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
