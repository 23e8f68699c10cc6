#pragma once
/// @file
/// @brief The timeline of one step, predicted and measured, per operation of its plan;
///        its Chrome trace export (Perfetto, chrome://tracing) and one-line summary.

#include "dos/schedule/plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace dos {

/// @brief When one operation ran, in seconds from the start of the step.
struct OpTiming {
  double begin = 0;
  double end = 0;
  double seconds() const noexcept { return end - begin; }
};

/// @brief One step's plan with both timelines; `predicted[i]` and `measured[i]` time
///        `plan.ops[i]`.
struct StepTimeline {
  Plan plan;
  std::vector<OpTiming> predicted;
  std::vector<OpTiming> measured;
  double predicted_seconds = 0;  ///< the cost model's makespan (with the DRAM bound)
  double measured_seconds = 0;   ///< wall time of the update phase
  std::int64_t step = 0;
  std::string_view policy;
};

namespace detail {

/// Sorts @p v and merges overlapping intervals in place, without allocating (the cost
/// model calls it every step); returns the length of their union.
inline double merge_intervals(std::vector<std::pair<double, double>>& v) {
  std::sort(v.begin(), v.end());
  std::size_t kept = 0;
  for (const auto& iv : v) {
    if (kept > 0 && iv.first <= v[kept - 1].second) v[kept - 1].second = std::max(v[kept - 1].second, iv.second);
    else v[kept++] = iv;
  }
  v.resize(kept);
  double total = 0;
  for (const auto& [b, e] : v) total += std::max(0.0, e - b);
  return total;
}

// Length of the intersection of two unions of intervals.
inline double overlap_length(std::vector<std::pair<double, double>> a, std::vector<std::pair<double, double>> b) {
  merge_intervals(a);
  merge_intervals(b);
  double total = 0;
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    total += std::max(0.0, std::min(a[i].second, b[j].second) - std::max(a[i].first, b[j].first));
    (a[i].second < b[j].second) ? ++i : ++j;
  }
  return total;
}

}  // namespace detail

/// @brief Bytes the step moved across the link, both directions.
inline std::size_t bytes_moved(const Plan& plan) {
  std::size_t bytes = 0;
  for (const Op& op : plan.ops)
    if (op.lane != Lane::cpu && op.lane != Lane::device) bytes += op.bytes;
  return bytes;
}

/// @brief The fraction of transfer time (h2d, d2h, push) hidden behind CPU updates,
///        in the measured timeline; 0 when nothing crossed the link.
inline double overlap_fraction(const StepTimeline& t) {
  std::vector<std::pair<double, double>> transfers, cpu;
  double transfer_total = 0;
  for (std::size_t i = 0; i < t.plan.ops.size() && i < t.measured.size(); ++i) {
    const Lane l = t.plan.ops[i].lane;
    const OpTiming& m = t.measured[i];
    if (l == Lane::cpu) cpu.emplace_back(m.begin, m.end);
    else if (l != Lane::device) transfers.emplace_back(m.begin, m.end);
  }
  for (const auto& [b, e] : transfers) transfer_total += e - b;
  if (transfer_total <= 0) return 0;
  std::vector<std::pair<double, double>> merged = transfers;
  const double transfer_union = detail::merge_intervals(merged);
  return transfer_union > 0 ? detail::overlap_length(std::move(transfers), std::move(cpu)) / transfer_union : 0;
}

/// @brief One line: step, time, policy and k, bytes moved, overlap.
inline std::string summary(const StepTimeline& t) {
  const std::size_t dev = t.plan.device_subgroups();
  const auto resident = std::count(t.plan.placement.begin(), t.plan.placement.end(), Place::resident);
  return fmt::format("step {}: {:.4f} s (predicted {:.4f} s), {} k={}, {}/{} subgroups on the device{}, {:.1f} MB "
                     "moved, {:.0f}% of transfers overlapped{}{}{}",
                     t.step, t.measured_seconds, t.predicted_seconds, t.policy, t.plan.stride, dev,
                     t.plan.placement.size(), resident > 0 ? fmt::format(" ({} resident)", resident) : std::string(),
                     static_cast<double>(bytes_moved(t.plan)) / 1e6,
                     100 * overlap_fraction(t), t.plan.explored ? "; explored" : "",
                     t.plan.fallback.empty() ? "" : "; fell back to the CPU: ", t.plan.fallback);
}

/// @brief The step as Chrome trace JSON: process 1 is the prediction, process 2 the
///        measurement, one thread per lane, so the two timelines sit side by side.
inline std::string chrome_trace(const StepTimeline& t) {
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  const auto meta = [&](int pid, std::string_view name) {
    out += fmt::format("{{\"ph\":\"M\",\"pid\":{},\"name\":\"process_name\",\"args\":{{\"name\":\"{}\"}}}},\n", pid, name);
    for (std::size_t l = 0; l < lane_count; ++l)
      out += fmt::format("{{\"ph\":\"M\",\"pid\":{},\"tid\":{},\"name\":\"thread_name\",\"args\":{{\"name\":\"{}\"}}}},\n",
                         pid, l, lane_name(static_cast<Lane>(l)));
  };
  const std::string_view explored = t.plan.explored ? ", explored" : "";
  meta(1, fmt::format("predicted (step {}, k={}{})", t.step, t.plan.stride, explored));
  meta(2, fmt::format("measured (step {}, k={}{})", t.step, t.plan.stride, explored));
  const auto events = [&](int pid, const std::vector<OpTiming>& times) {
    for (std::size_t i = 0; i < t.plan.ops.size() && i < times.size(); ++i) {
      const Op& op = t.plan.ops[i];
      out += fmt::format("{{\"ph\":\"X\",\"pid\":{},\"tid\":{},\"name\":\"{} s{}\",\"ts\":{:.3f},\"dur\":{:.3f},"
                         "\"args\":{{\"bytes\":{},\"elements\":{},\"slot\":{}}}}},\n",
                         pid, static_cast<int>(op.lane), op_name(op.kind), op.subgroup, times[i].begin * 1e6,
                         times[i].seconds() * 1e6, op.bytes, op.elements, op.slot);
    }
  };
  events(1, t.predicted);
  events(2, t.measured);
  out += fmt::format("{{\"ph\":\"i\",\"pid\":2,\"tid\":0,\"s\":\"g\",\"name\":\"step end\",\"ts\":{:.3f}}}\n]}}\n",
                     t.measured_seconds * 1e6);
  return out;
}

}  // namespace dos
