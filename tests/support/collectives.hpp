#pragma once
// The Communicator contract, checked on any communicator with any rank count (the
// thread-rank test and the mpiexec test): sum and max all-reduce, all-gather and
// reduce-scatter with uneven counts (rank r holds r + 1 elements), local ranks within
// the node, barrier. Returns what failed, each line naming the rank.

#include <dos/comm/any_communicator.hpp>

#include <fmt/format.h>

#include <cstddef>
#include <string>
#include <vector>

namespace dos::test {

inline std::vector<std::string> check_collectives(AnyCommunicator c) {
  const int r = c.rank(), n = c.size();
  std::vector<std::string> fail;
  const auto expect = [&](bool ok, const std::string& what) {
    if (!ok) fail.push_back(fmt::format("rank {} of {}: {}", r, n, what));
  };
  expect(0 <= r && r < n && 0 <= c.local_rank() && c.local_rank() < c.local_size() && c.local_size() <= n,
         fmt::format("ranks: local {} of {}", c.local_rank(), c.local_size()));
  const double ranks_sum = n * (n - 1) / 2.0;
  std::vector<double> small{static_cast<double>(r), 2.0 * r};
  c.all_reduce(small, ReduceOp::sum);
  expect(small[0] == ranks_sum && small[1] == 2 * ranks_sum, fmt::format("all_reduce sum gave {}, {}", small[0], small[1]));
  std::vector<double> top{static_cast<double>(r)};
  c.all_reduce(top, ReduceOp::max);
  expect(top[0] == n - 1, fmt::format("all_reduce max gave {}", top[0]));

  std::vector<std::size_t> counts;
  std::vector<float> expected;  // rank q holds q * 10 + i for i <= q
  for (int q = 0; q < n; ++q) {
    counts.push_back(static_cast<std::size_t>(q + 1));
    for (int i = 0; i <= q; ++i) expected.push_back(static_cast<float>(q * 10 + i));
  }
  const std::size_t at = static_cast<std::size_t>(r * (r + 1) / 2);
  const std::vector<float> mine(expected.begin() + static_cast<std::ptrdiff_t>(at),
                                expected.begin() + static_cast<std::ptrdiff_t>(at + counts[static_cast<std::size_t>(r)]));
  std::vector<float> all(expected.size());
  c.all_gather(mine, all, counts);
  expect(all == expected, "all_gather: wrong values or places");
  // Every rank contributes expected + its rank: rank r's part of the sum is
  // n * expected + n(n-1)/2, exact in float for these small integers.
  std::vector<float> contribution(expected);
  for (float& x : contribution) x += static_cast<float>(r);
  std::vector<float> part(mine.size());
  c.reduce_scatter(contribution, part, counts);
  for (std::size_t i = 0; i < part.size(); ++i)
    expect(part[i] == static_cast<float>(n) * mine[i] + static_cast<float>(ranks_sum),
           fmt::format("reduce_scatter: element {} is {}", i, part[i]));
  c.barrier();
  return fail;
}

}  // namespace dos::test
