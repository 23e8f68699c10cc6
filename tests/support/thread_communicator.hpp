#pragma once
// ThreadRanks: a Communicator whose ranks are threads of one process, to test the
// sharded modes without MPI (the "plug in another" test of the Communicator concept).
// Every collective publishes this rank's buffer, meets the others at a barrier, reads
// every rank's buffer in rank order, and meets them again before anyone reuses one.

#include <dos/comm/communicator.hpp>

#include <algorithm>
#include <barrier>
#include <cstddef>
#include <limits>
#include <memory>
#include <span>
#include <vector>

namespace dos::test {

struct ThreadWorld {
  explicit ThreadWorld(int n) : size(n), sync(n), in(static_cast<std::size_t>(n)) {}
  int size;
  std::barrier<> sync;
  std::vector<const void*> in;
};

class ThreadRanks {
 public:
  ThreadRanks(std::shared_ptr<ThreadWorld> world, int rank) : w_(std::move(world)), rank_(rank) {}
  int rank() const { return rank_; }
  int size() const { return w_->size; }
  int local_rank() const { return rank_; }
  int local_size() const { return w_->size; }
  void all_reduce(std::span<double> buf, ReduceOp op) {
    publish(buf.data());
    std::vector<double> out(buf.size(), op == ReduceOp::sum ? 0.0 : -std::numeric_limits<double>::infinity());
    for (int r = 0; r < size(); ++r) {
      const auto* other = static_cast<const double*>(w_->in[static_cast<std::size_t>(r)]);
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = op == ReduceOp::sum ? out[i] + other[i] : std::max(out[i], other[i]);
    }
    w_->sync.arrive_and_wait();
    std::copy(out.begin(), out.end(), buf.begin());
  }
  void all_gather(std::span<const float> mine, std::span<float> all, std::span<const std::size_t> counts) {
    check_collective_shape("all_gather", rank_, size(), mine.size(), all.size(), counts);
    publish(mine.data());
    std::size_t at = 0;
    for (int r = 0; r < size(); ++r) {
      const auto* other = static_cast<const float*>(w_->in[static_cast<std::size_t>(r)]);
      std::copy(other, other + counts[static_cast<std::size_t>(r)], all.begin() + static_cast<std::ptrdiff_t>(at));
      at += counts[static_cast<std::size_t>(r)];
    }
    w_->sync.arrive_and_wait();
  }
  void reduce_scatter(std::span<const float> all, std::span<float> mine, std::span<const std::size_t> counts) {
    check_collective_shape("reduce_scatter", rank_, size(), mine.size(), all.size(), counts);
    publish(all.data());
    std::size_t at = 0;
    for (int r = 0; r < rank_; ++r) at += counts[static_cast<std::size_t>(r)];
    std::fill(mine.begin(), mine.end(), 0.0f);
    for (int r = 0; r < size(); ++r) {
      const auto* other = static_cast<const float*>(w_->in[static_cast<std::size_t>(r)]) + at;
      for (std::size_t i = 0; i < mine.size(); ++i) mine[i] += other[i];
    }
    w_->sync.arrive_and_wait();
  }
  void barrier() { w_->sync.arrive_and_wait(); }

 private:
  void publish(const void* p) {
    w_->in[static_cast<std::size_t>(rank_)] = p;
    w_->sync.arrive_and_wait();
  }
  std::shared_ptr<ThreadWorld> w_;
  int rank_;
};
static_assert(Communicator<ThreadRanks>);

}  // namespace dos::test
