#pragma once
/// @file
/// @brief Host memory for optimizer state: the `MemoryResource` concept, the aligned
///        `HostResource` (optionally backed by transparent huge pages), and `HostBuffer`,
///        an owning, zero-initialised array.

#include "dos/error.hpp"

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <span>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace dos {

/// @brief Anything that hands out and takes back raw memory, in the manner of
///        `cuda::mr`: `allocate(bytes, alignment)` and `deallocate(ptr, bytes, alignment)`.
/// @code
/// dos::HostResource r{.huge_pages = true};
/// void* p = r.allocate(1 << 30, 64);
/// r.deallocate(p, 1 << 30, 64);
/// @endcode
template <class R>
concept MemoryResource = requires(R& r, void* p, std::size_t bytes, std::size_t alignment) {
  { r.allocate(bytes, alignment) } -> std::same_as<void*>;
  r.deallocate(p, bytes, alignment);
};

/// @brief Moves the caller's memory [@p p, @p p + @p bytes) onto transparent huge pages
///        where the kernel can: the 2 MiB-aligned pages inside the range are collapsed
///        in place (`MADV_COLLAPSE`, Linux 6.1 and later), contents untouched. The
///        update streams the caller's values and gradients beside its own state; on
///        4 KiB pages their TLB misses cost a 1-thread step 7-10% on a 2-vCPU EPYC
///        (docs/design.md, "Huge pages"). Advice only: on another system, an older
///        kernel, memory that cannot move (pinned, file-backed) or no free huge page,
///        nothing changes. Costs one copy of the range, once.
/// @return the bytes now on huge pages as far as the kernel reported success (0 when
///         nothing was collapsed).
inline std::size_t collapse_to_huge_pages(const void* p, std::size_t bytes) noexcept {
#if defined(__linux__)
  constexpr std::uintptr_t page = std::uintptr_t{2} << 20;
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t begin = (at + page - 1) / page * page, end = (at + bytes) / page * page;
  if (p == nullptr || end <= begin) return 0;
  constexpr int collapse = 25;  // MADV_COLLAPSE; older C libraries lack the name
  void* const first = reinterpret_cast<void*>(begin);
  return ::madvise(first, end - begin, collapse) == 0 ? end - begin : 0;
#else
  (void)p;
  (void)bytes;
  return 0;
#endif
}

/// @brief A range of the caller's host memory, [data, data + bytes).
struct HostRange {
  const void* data = nullptr;
  std::size_t bytes = 0;
};

/// @brief @p ranges sorted by address, with those that overlap or lie within
///        @p max_gap bytes of each other joined into one (empty ones dropped).
inline std::vector<HostRange> merge_ranges(std::vector<HostRange> ranges, std::size_t max_gap) {
  const auto begin = [](const HostRange& r) { return reinterpret_cast<std::uintptr_t>(r.data); };
  std::erase_if(ranges, [](const HostRange& r) { return r.data == nullptr || r.bytes == 0; });
  std::sort(ranges.begin(), ranges.end(), [&](const HostRange& a, const HostRange& b) { return begin(a) < begin(b); });
  std::vector<HostRange> out;
  for (const HostRange& r : ranges) {
    if (!out.empty()) {
      HostRange& last = out.back();
      const std::uintptr_t end = begin(last) + last.bytes;
      if (begin(r) <= end + max_gap) {
        last.bytes = std::max(end, begin(r) + r.bytes) - begin(last);
        continue;
      }
    }
    out.push_back(r);
  }
  return out;
}

/// @brief `collapse_to_huge_pages` over the union of @p ranges. Views of one flat
///        buffer lie end to end, and a view alone holds fewer whole 2 MiB pages than
///        the buffer: a 4 MiB view that is not 2 MiB aligned holds one, so collapsing
///        view by view left half of such a buffer on 4 KiB pages. Ranges less than a
///        4 KiB page apart are joined, so the memory collapsed beyond the caller's
///        own is at most the allocator's headers between its tensors.
/// @return the bytes now on huge pages as far as the kernel reported success.
inline std::size_t collapse_to_huge_pages(std::vector<HostRange> ranges) {
  std::size_t moved = 0;
  for (const HostRange& r : merge_ranges(std::move(ranges), 4096)) moved += collapse_to_huge_pages(r.data, r.bytes);
  return moved;
}

/// @brief Aligned host memory. With `huge_pages`, on Linux, blocks of 2 MiB and more
///        are fresh anonymous mappings, 2 MiB aligned and advised for transparent huge
///        pages before anything touches them (they get them where the kernel's THP
///        mode is `madvise` or `always` and it has them), which cuts TLB misses in the
///        bandwidth-bound update. Fresh, because advice cannot change pages already
///        there: a block the C allocator handed back from memory freed before kept
///        whatever pages it had, and in a process that had built and freed optimizers
///        of 64M parameters twice, the state of the third set lay 38-100% on huge
///        pages, copy by copy (docs/design.md, "Huge pages"). Elsewhere, and for
///        smaller blocks, `aligned_alloc`. `deallocate` must get the `bytes` and
///        `alignment` that `allocate` got, on a resource with the same `huge_pages`,
///        as `std::pmr` asks: they decide whether the block is unmapped or freed.
struct HostResource {
  bool huge_pages = false;

  static constexpr std::size_t huge_page_size = std::size_t{2} << 20;

  /// @throws std::invalid_argument when @p alignment is not a power of two of at least
  ///         `alignof(std::max_align_t)`; std::bad_alloc when the system has no memory left
  ///         or @p bytes is beyond any address space.
  void* allocate(std::size_t bytes, std::size_t alignment) const {
    if (alignment < alignof(std::max_align_t) || (alignment & (alignment - 1)) != 0)
      throw_invalid_argument("alignment must be a power of two >= {}, got {}", alignof(std::max_align_t), alignment);
    // A size the rounding below (or the slack of a huge-page mapping) would wrap past
    // zero, a count times an element size that overflowed say, must fail, not return
    // a block of a few bytes.
    constexpr std::size_t max = std::numeric_limits<std::size_t>::max();
    if (alignment > max / 4 || bytes > max - 2 * std::max(alignment, huge_page_size)) throw std::bad_alloc();
    const Layout l = layout(bytes, alignment);
#if defined(__linux__)
    if (l.huge) return map_huge(l);
#endif
    void* p = std::aligned_alloc(l.alignment, l.rounded);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) const noexcept {
    if (p == nullptr) return;  // as free(nullptr); munmap at 0 could unmap a non-PIE program
#if defined(__linux__)
    if (const Layout l = layout(bytes, alignment); l.huge) {
      ::munmap(p, l.rounded);
      return;
    }
#else
    (void)bytes;
    (void)alignment;
#endif
    std::free(p);
  }

 private:
  struct Layout {
    bool huge = false;
    std::size_t alignment = 0, rounded = 0;
  };
  Layout layout(std::size_t bytes, std::size_t alignment) const noexcept {
    Layout l;
    l.huge = huge_pages && bytes >= huge_page_size;
    l.alignment = l.huge ? std::max(alignment, huge_page_size) : alignment;
    l.rounded = (std::max<std::size_t>(bytes, 1) + l.alignment - 1) / l.alignment * l.alignment;
    return l;
  }
#if defined(__linux__)
  // Maps `rounded + alignment` bytes and unmaps the head and tail around the aligned
  // block: mmap itself promises only 4 KiB alignment.
  static void* map_huge(const Layout& l) {
    const std::size_t mapped = l.rounded + l.alignment;
    void* raw = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) throw std::bad_alloc();
    const auto at = reinterpret_cast<std::uintptr_t>(raw);
    const std::uintptr_t begin = (at + l.alignment - 1) / l.alignment * l.alignment, end = begin + l.rounded;
    if (begin > at) ::munmap(raw, begin - at);
    if (at + mapped > end) ::munmap(reinterpret_cast<void*>(end), at + mapped - end);
    void* p = reinterpret_cast<void*>(begin);
#if defined(MADV_HUGEPAGE)
    ::madvise(p, l.rounded, MADV_HUGEPAGE);  // advice only: failure is harmless
#endif
    return p;
  }
#endif
};
static_assert(MemoryResource<HostResource>);

/// @brief Owning, uninitialised bytes from a resource, aligned to `Alignment`; the
///        one owner every dos buffer builds on. Never touches the bytes, so it serves
///        device memory too (see `DeviceBuffer`).
template <MemoryResource R, std::size_t Alignment>
class RawBuffer {
 public:
  static constexpr std::size_t alignment = Alignment;

  RawBuffer() = default;
  RawBuffer(std::size_t bytes, R resource) : resource_(std::move(resource)), bytes_(bytes) {
    if (bytes_ > 0) data_ = static_cast<std::byte*>(resource_.allocate(bytes_, alignment));
  }
  RawBuffer(RawBuffer&& o) noexcept
      : resource_(std::move(o.resource_)), data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  RawBuffer& operator=(RawBuffer&& o) noexcept {
    if (this != &o) {
      release();
      resource_ = std::move(o.resource_);
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  RawBuffer(const RawBuffer&) = delete;
  RawBuffer& operator=(const RawBuffer&) = delete;
  ~RawBuffer() { release(); }

  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return bytes_; }

 private:
  void release() noexcept {
    if (data_ != nullptr) resource_.deallocate(data_, bytes_, alignment);
    data_ = nullptr;
  }
  [[no_unique_address]] R resource_{};
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
};

/// @brief An owning array of trivially copyable `T` from a `MemoryResource`,
///        zero-initialised: optimizer moments must start at exactly zero
///        (docs/design.md, "Traps"), never at whatever the allocator returned.
/// @brief Tag: a `HostBuffer` whose bytes its owner writes, all of them, before any is
///        read (the state store zeroes its blocks from the threads that will update
///        them, so that each page lands on their NUMA node).
struct Uninitialized {};
inline constexpr Uninitialized uninitialized{};

template <class T, MemoryResource R = HostResource>
class HostBuffer {
 public:
  static constexpr std::size_t alignment = 64;  // a cache line, and one AVX-512 vector

  HostBuffer() = default;
  /// @throws std::bad_alloc where @p count elements do not fit in memory, or their
  ///         size in bytes does not fit in a `size_t`.
  explicit HostBuffer(std::size_t count, R resource = {}) : bytes_(byte_size(count), std::move(resource)) {
    if (count > 0) std::memset(bytes_.data(), 0, bytes_.size());
  }
  /// @brief Untouched memory: the owner must write every element before reading any.
  HostBuffer(std::size_t count, R resource, Uninitialized) : bytes_(byte_size(count), std::move(resource)) {}

  T* data() noexcept { return reinterpret_cast<T*>(bytes_.data()); }
  const T* data() const noexcept { return reinterpret_cast<const T*>(bytes_.data()); }
  std::size_t size() const noexcept { return bytes_.size() / sizeof(T); }
  std::span<T> span() noexcept { return {data(), size()}; }
  std::span<const T> span() const noexcept { return {data(), size()}; }

 private:
  static std::size_t byte_size(std::size_t count) {
    if (count > std::numeric_limits<std::size_t>::max() / sizeof(T)) throw std::bad_alloc();
    return count * sizeof(T);
  }
  RawBuffer<R, alignment> bytes_;
};

}  // namespace dos
