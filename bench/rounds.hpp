// What the benchmarks that compare copies of one model share: a median, and rounds in
// which every copy steps once, in an order shuffled afresh each round, each copy's
// step taken over the round's median step. A phase of the shared VM that slows a
// whole round moves every copy's step alike, and the ratio cancels it; the shuffled
// order keeps any one copy from always running first or last after another's.
#pragma once

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <vector>

namespace bench {

/// The median of @p v: its middle value, or the mean of the two middle ones. @p v
/// must not be empty.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// Runs @p rounds rounds over @p copies copies, calling `step(i)` (which steps copy i
/// and returns its seconds) once per copy per round in an order drawn from @p rng.
/// Returns, per copy, its step over the round's median step, round by round, but for
/// the first @p skip rounds (a copy's first steps after a change of plan may still be
/// settling).
template <class Step, class Rng>
std::vector<std::vector<double>> over_round_median(std::size_t copies, int rounds, int skip, Rng& rng, Step&& step) {
  std::vector<std::size_t> order(copies);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::vector<std::vector<double>> over(copies);
  std::vector<double> t(copies);
  for (int round = 0; round < rounds; ++round) {
    std::shuffle(order.begin(), order.end(), rng);
    for (const std::size_t i : order) t[i] = step(i);
    if (round < skip) continue;
    const double mid = median(t);
    for (std::size_t i = 0; i < copies; ++i) over[i].push_back(t[i] / mid);
  }
  return over;
}

}  // namespace bench
