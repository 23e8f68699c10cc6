#pragma once
/// @file
/// @brief Simulation mode: the cost model and the planner without execution. Given a
///        hardware profile and a model size, predict the update time and throughput
///        of every stride, for machines you do not have (the paper's 4xH100 node, say).

#include "dos/schedule/cost_model.hpp"
#include "dos/schedule/plan.hpp"
#include "dos/schedule/planner.hpp"
#include "dos/schedule/any_policy.hpp"
#include "dos/schedule/policy.hpp"
#include "dos/schedule/timeline.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace dos {

/// @brief Bytes per parameter of each transfer and update, for `uniform_shapes`. The
///        defaults are DOS's bf16 recipe: gradients already where they are needed
///        (device gradients stay on the device; host ones were flushed during
///        backward), fp32 master, m and v streamed each way, bf16 values pushed.
struct BytesPerParam {
  double stream = 12;  ///< each way, for a streamed subgroup
  double slot = 12;    ///< device staging
  double push = 2;     ///< values pushed after a CPU update
  double fetch = 0;    ///< gradients fetched for a CPU update during the update phase
  double cpu = 28;     ///< host traffic of a CPU update
};

/// @brief Subgroups of @p subgroup parameters (the last one shorter) covering @p total.
inline std::vector<SubgroupShape> uniform_shapes(std::size_t total, std::size_t subgroup, const BytesPerParam& b = {}) {
  std::vector<SubgroupShape> out;
  for (std::size_t done = 0; done < total; done += subgroup) {
    const std::size_t n = std::min(subgroup, total - done);
    const auto bytes = [n](double per) { return static_cast<std::size_t>(per * static_cast<double>(n)); };
    out.push_back({.elements = n, .slot_bytes = bytes(b.slot), .upload_bytes = bytes(b.stream),
                   .download_bytes = bytes(b.stream), .resident_upload_bytes = 0, .resident_download_bytes = 0,
                   .fetch_bytes = bytes(b.fetch), .push_bytes = bytes(b.push), .cpu_bytes = bytes(b.cpu)});
  }
  return out;
}

/// @brief One point of a predicted k-curve.
struct StridePrediction {
  std::uint32_t stride = 0;  ///< 0: all-CPU
  double seconds = 0;
  double params_per_second = 0;
};

/// @brief Predicted update time of all-CPU and of every k in 1..max_stride.
template <CostModel Model = FirstOrderCostModel>
std::vector<StridePrediction> simulate_strides(const Model& model, const std::vector<SubgroupShape>& shapes,
                                               std::uint32_t max_stride, const PlanLimits& limits) {
  double total = 0;
  for (const SubgroupShape& s : shapes) total += static_cast<double>(s.elements);
  std::vector<StridePrediction> out;
  std::vector<Place> assignment;
  Plan plan;
  for (std::uint32_t k = 0; k <= max_stride; ++k) {
    if (k == 0) assignment.assign(shapes.size(), Place::cpu);
    else stride_assignment(assignment, shapes.size(), k);
    make_plan(plan, shapes, assignment, limits, k);
    const double t = model.predict(plan);
    out.push_back({k, t, t > 0 ? total / t : 0});
  }
  return out;
}

/// @brief What a policy would do on a machine you do not have.
struct PolicyPrediction {
  double seconds = 0;
  double params_per_second = 0;
  std::size_t resident = 0;  ///< subgroups kept resident on the device
  std::uint32_t stride = 0;  ///< k of the chosen plan; 0 when not a stride
  std::size_t device_subgroups = 0;
};

/// @brief Predicted update of @p policy: residency chosen for @p device_bytes of device
///        memory beyond the staging slots of @p limits, then @p steps steps in which
///        the model's prediction stands for the measurement (a policy that explores
///        settles on what the model finds best, residents moved as it asks). Returns
///        the last step's choice that was not an exploration.
template <CostModel Model = FirstOrderCostModel>
PolicyPrediction simulate_policy(const Model& model, const std::vector<SubgroupShape>& shapes, AnyPolicy policy,
                                 const PlanLimits& limits, std::size_t device_bytes, int steps = 64) {
  const auto predict = [&](const Plan& p) { return model.predict(p); };
  Plan scratch;
  StepTimeline t;
  std::vector<Place> assignment, residency;
  policy.residency({shapes, device_bytes, limits, predict, scratch, assignment}, residency);
  policy.reserve(shapes.size());
  double total = 0;
  for (const SubgroupShape& s : shapes) total += static_cast<double>(s.elements);
  PolicyPrediction out;
  std::vector<Place> next;
  for (int step = 0; step < steps; ++step) {
    const double seconds = policy.choose({shapes, residency, limits, model.profile(), predict, scratch, assignment}, t.plan);
    if (!t.plan.explored || step == 0) {
      out.resident = static_cast<std::size_t>(std::count(residency.begin(), residency.end(), Place::resident));
      out.seconds = seconds;
      out.params_per_second = seconds > 0 ? total / seconds : 0;
      out.stride = t.plan.stride;
      out.device_subgroups = t.plan.device_subgroups();
    }
    t.step = step;
    t.predicted_seconds = t.measured_seconds = seconds;
    policy.observe(t);
    if (policy.next_residency(next)) residency = next;  // a policy that measures residencies moves them
  }
  return out;
}

}  // namespace dos
