#pragma once
/// @file
/// @brief `ZeroShare`: which elements of a model each rank updates when dos shards the
///        optimizer itself (ZeRO-1, ZeRO-2). Every tensor is laid end to end in one flat
///        range of N elements; rank r of S owns the contiguous part
///        [r * (N / S) + min(r, N % S), (r + 1) * (N / S) + min(r + 1, N % S)): shares
///        differ by at most one element, depend only on the sizes and the rank count, and
///        a share is empty when S > N. A share cuts tensors where it must; the pieces
///        say which part of which tensor this rank owns.

#include "dos/error.hpp"

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

namespace dos {

/// @brief This rank's share of the flat concatenation of every tensor.
class ZeroShare {
 public:
  /// @brief One part of a tensor this rank owns.
  struct Piece {
    std::size_t tensor = 0;  ///< index of the tensor in the list given
    std::size_t offset = 0;  ///< first element owned, within the tensor
    std::size_t numel = 0;   ///< elements owned, at least one
    std::size_t at = 0;      ///< where the piece starts within this rank's share
  };

  /// @brief The share of rank @p rank among @p size ranks of tensors of @p sizes elements.
  /// @throws std::invalid_argument for a rank outside [0, size) or size < 1.
  ZeroShare(std::span<const std::size_t> sizes, int rank, int size)
      : rank_(rank),
        size_(size),
        tensors_(sizes.size()),
        counts_(sizes.size() * static_cast<std::size_t>(std::max(size, 0))) {
    if (size < 1 || rank < 0 || rank >= size) throw_invalid_argument("ZeroShare: rank {} of {} ranks", rank, size);
    std::size_t total = 0;
    for (const std::size_t n : sizes) total += n;
    total_ = total;
    begin_ = first(rank);
    end_ = first(rank + 1);
    const auto ranks = static_cast<std::size_t>(size);
    std::size_t start = 0;  // the tensor's first flat element
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      const std::size_t stop = start + sizes[t];
      for (int r = 0; r < size; ++r)
        counts_[t * ranks + static_cast<std::size_t>(r)] = overlap(start, stop, first(r), first(r + 1));
      const std::size_t mine = overlap(start, stop, begin_, end_);
      if (mine > 0) {
        const std::size_t from = std::max(start, begin_);
        pieces_.push_back({t, from - start, mine, from - begin_});
      }
      start = stop;
    }
  }

  int rank() const noexcept { return rank_; }
  int ranks() const noexcept { return size_; }
  /// @brief Elements of every tensor together (N).
  std::size_t total() const noexcept { return total_; }
  /// @brief This rank's flat range [begin, end).
  std::size_t begin() const noexcept { return begin_; }
  std::size_t end() const noexcept { return end_; }
  /// @brief Elements this rank owns (end - begin); 0 when there are more ranks than elements.
  std::size_t numel() const noexcept { return end_ - begin_; }
  bool empty() const noexcept { return numel() == 0; }
  /// @brief The parts of tensors this rank owns, in tensor order.
  const std::vector<Piece>& pieces() const noexcept { return pieces_; }
  /// @brief How many elements of tensor @p t each rank owns: the counts of that tensor's
  ///        `all_gather` and `reduce_scatter` (they add up to the tensor's size).
  std::span<const std::size_t> counts(std::size_t t) const {
    const auto ranks = static_cast<std::size_t>(size_);
    return std::span<const std::size_t>(counts_).subspan(t * ranks, ranks);
  }
  /// @brief Tensors the share was computed over.
  std::size_t tensors() const noexcept { return tensors_; }

 private:
  // The first flat element of rank r's share (r == size: the end).
  std::size_t first(int r) const noexcept {
    const auto ranks = static_cast<std::size_t>(size_), q = static_cast<std::size_t>(r);
    return (total_ / ranks) * q + std::min(q, total_ % ranks);
  }
  static std::size_t overlap(std::size_t a, std::size_t b, std::size_t c, std::size_t d) noexcept {
    const std::size_t lo = std::max(a, c), hi = std::min(b, d);
    return hi > lo ? hi - lo : 0;
  }

  int rank_, size_;
  std::size_t tensors_, total_ = 0, begin_ = 0, end_ = 0;
  std::vector<Piece> pieces_;
  std::vector<std::size_t> counts_;  // tensor-major: counts_[t * size + r]
};

}  // namespace dos
