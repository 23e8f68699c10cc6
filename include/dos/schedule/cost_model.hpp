#pragma once
/// @file
/// @brief The cost model that chooses the split: a hardware profile, a prediction of a
///        plan's update time, and refinement from measured steps.
///
/// The first-order model (docs/design.md, "The cost model") times each operation from the
/// profile, schedules the plan's lanes as the executor runs them (each stream in issue
/// order; h2d and push share the host-to-device link; a half-duplex link is shared by
/// both directions), and bounds the result below by the host DRAM traffic that CPU
/// updates and DMA share.

#include "dos/schedule/plan.hpp"
#include "dos/schedule/timeline.hpp"

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <initializer_list>
#include <limits>
#include <utility>
#include <vector>

namespace dos {

/// @brief What the cost model knows about the machine. Rates are per second.
struct HardwareProfile {
  double cpu_rate = 0;         ///< CPU Adam, parameters/s, at the thread count in use
  double device_rate = 0;      ///< device Adam, parameters/s
  double h2d_bandwidth = 0;    ///< pinned host-to-device bytes/s
  double d2h_bandwidth = 0;    ///< pinned device-to-host bytes/s
  bool duplex = true;          ///< both directions run at full speed at once
  double host_bandwidth = 0;   ///< host DRAM bytes/s, shared by CPU updates and DMA; 0: unbounded

  /// @brief Bytes/s of a round trip over the link: the slower direction when both run
  ///        at once (duplex), else the two directions one after the other.
  double link_rate() const noexcept {
    if (h2d_bandwidth <= 0 || d2h_bandwidth <= 0) return 0;
    return duplex ? std::min(h2d_bandwidth, d2h_bandwidth) : 1 / (1 / h2d_bandwidth + 1 / d2h_bandwidth);
  }
  /// @brief Parameters/s of the streamed device path: state crosses the link both ways.
  double device_path_rate(double bytes_per_param = 12) const noexcept {
    return std::min(device_rate, link_rate() / bytes_per_param);
  }
};

/// @brief A policy that predicts plans and learns from measured steps.
///
/// Required: construction from the `HardwareProfile` calibration measured (or the one
/// the user passed); `predict(plan, timeline)`, the plan's update seconds, filling
/// `*timeline` with one `OpTiming` per op when it is not null; `refine(measured)`,
/// learning from a step that ran; `profile()`, what it believes now. Optional:
/// `reserve(subgroups)`, so that refining never allocates.
/// @code
/// struct Fixed {  // always says one second per op; never learns
///   dos::HardwareProfile p;
///   explicit Fixed(const dos::HardwareProfile& profile) : p(profile) {}
///   double predict(const dos::Plan& plan, std::vector<dos::OpTiming>* t = nullptr) const {
///     if (t) t->assign(plan.ops.size(), {0, 1});
///     return 1;
///   }
///   void refine(const dos::StepTimeline&) {}
///   const dos::HardwareProfile& profile() const { return p; }
/// };
/// static_assert(dos::CostModel<Fixed>);
/// @endcode
template <class M>
concept CostModel = std::constructible_from<M, const HardwareProfile&> && requires(M& m, const M& cm, const Plan& plan, const StepTimeline& t,
                             std::vector<OpTiming>* timeline) {
  { cm.predict(plan, timeline) } -> std::convertible_to<double>;
  m.refine(t);
  { cm.profile() } -> std::convertible_to<HardwareProfile>;
};

/// @brief The default cost model: list-scheduled lanes plus the DRAM bound, refined by
///        an exponential moving average of the rates each lane achieved.
class FirstOrderCostModel {
 public:
  FirstOrderCostModel() = default;
  explicit FirstOrderCostModel(const HardwareProfile& p, double learning_rate = 0.5)
      : profile_(p), learning_rate_(learning_rate) {}

  const HardwareProfile& profile() const noexcept { return profile_; }
  void set_profile(const HardwareProfile& p) noexcept { profile_ = p; }

  /// @brief Seconds operation @p op takes alone.
  double duration(const Op& op) const noexcept {
    const auto per = [](double work, double rate) { return rate > 0 ? work / rate : 0.0; };
    switch (op.kind) {
      case OpKind::cpu_update: return per(static_cast<double>(op.elements), profile_.cpu_rate);
      case OpKind::device_update: return per(static_cast<double>(op.elements), profile_.device_rate);
      case OpKind::upload:
      case OpKind::push_params: return per(static_cast<double>(op.bytes), profile_.h2d_bandwidth);
      case OpKind::download:
      case OpKind::fetch_grad: return per(static_cast<double>(op.bytes), profile_.d2h_bandwidth);
    }
    return 0;
  }

  /// @brief Predicted seconds of the update phase of @p plan: the first-order time
  ///        times what this model has learned of its error for plans that put as many
  ///        subgroups on the device (1 until such a plan was measured). Fills
  ///        @p timeline (first-order, one entry per op) when given.
  double predict(const Plan& plan, std::vector<OpTiming>* timeline = nullptr) const {
    return first_order(plan, timeline) * residual(plan.device_subgroups());
  }

  /// @brief The learned ratio of measured to first-order time, for plans with
  ///        @p device_subgroups subgroups on the device.
  double residual(std::size_t device_subgroups) const noexcept {
    return device_subgroups < residual_.size() ? residual_[device_subgroups] : 1.0;
  }
  /// @brief Room for plans over up to @p subgroups subgroups (at most 3 per subgroup
  ///        plus one operations), so that neither predicting nor refining allocates,
  ///        from the first step on.
  void reserve(std::size_t subgroups) {
    residual_.reserve(subgroups + 1);
    const std::size_t ops = 3 * subgroups + 1;
    work_.intervals.reserve(ops);
    work_.timing.reserve(ops);
    work_.done.reserve(ops);
    for (auto& q : work_.queue) q.reserve(ops);
  }

  /// @brief The first-order prediction alone: lanes list-scheduled from the profile,
  ///        bounded below by host DRAM traffic.
  double first_order(const Plan& plan, std::vector<OpTiming>* timeline = nullptr) const {
    const std::size_t n = plan.ops.size();
    // Sized for the largest plan the caller reserved, so that predicting every
    // candidate plan of every step allocates only on the first call.
    const std::size_t most = std::max(n, plan.ops.capacity());
    std::vector<OpTiming>& t = timeline != nullptr ? *timeline : work_.timing;
    t.reserve(most);
    t.assign(n, OpTiming{});
    std::vector<std::uint8_t>& done = work_.done;
    done.reserve(most);
    done.assign(n, 0);
    auto& queue = work_.queue;
    for (auto& q : queue) {
      q.reserve(most);
      q.clear();
    }
    for (std::uint32_t i = 0; i < n; ++i) queue[static_cast<std::size_t>(plan.ops[i].lane)].push_back(i);
    std::array<std::size_t, lane_count> head{};
    std::array<double, lane_count> lane_free{};
    std::array<double, 2> link_free{};  // [0]: host to device, [1]: device to host
    const auto link_of = [&](Lane l) -> int {
      if (l == Lane::h2d || l == Lane::push) return 0;
      if (l == Lane::d2h) return profile_.duplex ? 1 : 0;
      return -1;
    };
    double makespan = 0, host_bytes = 0;
    for (std::size_t scheduled = 0; scheduled < n; ++scheduled) {
      double best = std::numeric_limits<double>::infinity();
      std::size_t best_lane = lane_count;
      for (std::size_t l = 0; l < lane_count; ++l) {
        if (head[l] == queue[l].size()) continue;
        const Op& op = plan.ops[queue[l][head[l]]];
        double start = lane_free[l];
        bool ready = true;
        for (const Dependency& d : op.dependencies()) {
          if (done[d.op] == 0) ready = false;
          else start = std::max(start, t[d.op].end);
        }
        if (!ready) continue;
        if (const int k = link_of(op.lane); k >= 0) start = std::max(start, link_free[static_cast<std::size_t>(k)]);
        if (start < best) best = start, best_lane = l;
      }
      if (best_lane == lane_count) break;  // a dependency cycle: the validator reports it
      const std::uint32_t i = queue[best_lane][head[best_lane]++];
      const Op& op = plan.ops[i];
      t[i] = {best, best + duration(op)};
      done[i] = 1;
      lane_free[best_lane] = t[i].end;
      if (const int k = link_of(op.lane); k >= 0) link_free[static_cast<std::size_t>(k)] = t[i].end;
      makespan = std::max(makespan, t[i].end);
      if (op.lane != Lane::device) host_bytes += static_cast<double>(op.bytes);
    }
    if (profile_.host_bandwidth > 0) makespan = std::max(makespan, host_bytes / profile_.host_bandwidth);
    return makespan;
  }

  /// @brief Moves each rate toward what the lanes achieved in a measured step, so
  ///        the choice adapts when, say, data-loader threads take CPU time away.
  ///        Work is divided by the time a resource was busy (the union of its
  ///        operations' intervals), so transfers that share a link and wait for each
  ///        other are not counted twice.
  void refine(const StepTimeline& measured) {
    // What the first-order model missed for this kind of plan (contention it does not
    // model, fill and drain), learned before the rates move.
    const double raw = first_order(measured.plan);
    if (measured.measured_seconds >= min_seconds && raw > 0) {
      const std::size_t key = measured.plan.device_subgroups();
      if (key >= residual_.size()) residual_.resize(key + 1, 1.0);
      const double ratio = measured.measured_seconds / raw;
      residual_[key] = (1 - learning_rate_) * residual_[key] + learning_rate_ * ratio;
    }
    const auto learn = [&](double& rate, std::initializer_list<Lane> lanes) {
      double w = 0;
      auto& busy = work_.intervals;
      busy.reserve(measured.plan.ops.capacity());  // once: refining every step allocates nothing
      busy.clear();
      for (std::size_t i = 0; i < measured.plan.ops.size() && i < measured.measured.size(); ++i) {
        const Op& op = measured.plan.ops[i];
        if (std::find(lanes.begin(), lanes.end(), op.lane) == lanes.end()) continue;
        const bool update = op.kind == OpKind::cpu_update || op.kind == OpKind::device_update;
        w += static_cast<double>(update ? op.elements : op.bytes);
        busy.emplace_back(measured.measured[i].begin, measured.measured[i].end);
      }
      const double s = detail::merge_intervals(busy);
      if (w <= 0 || s < min_seconds) return;  // too little evidence to move a rate
      rate = rate > 0 ? (1 - learning_rate_) * rate + learning_rate_ * (w / s) : w / s;
    };
    learn(profile_.cpu_rate, {Lane::cpu});
    learn(profile_.device_rate, {Lane::device});
    if (profile_.duplex) {
      learn(profile_.h2d_bandwidth, {Lane::h2d, Lane::push});
      learn(profile_.d2h_bandwidth, {Lane::d2h});
    } else {
      // One shared link: both directions learn its measured rate.
      double shared = profile_.h2d_bandwidth;
      learn(shared, {Lane::h2d, Lane::push, Lane::d2h});
      profile_.d2h_bandwidth += shared - profile_.h2d_bandwidth;
      profile_.h2d_bandwidth = shared;
    }
  }

  /// Measurements shorter than this do not move a rate: timer noise dominates them.
  static constexpr double min_seconds = 200e-6;

 private:
  // Scratch reused across predictions, so choosing k every step allocates nothing.
  struct Workspace {
    std::vector<std::pair<double, double>> intervals;
    std::vector<OpTiming> timing;
    std::vector<std::uint8_t> done;
    std::array<std::vector<std::uint32_t>, lane_count> queue;
  };
  HardwareProfile profile_{};
  double learning_rate_ = 0.5;
  std::vector<double> residual_;  // by device-subgroup count: measured / first-order
  mutable Workspace work_;
};
static_assert(CostModel<FirstOrderCostModel>);

}  // namespace dos
