#pragma once
/// @file
/// @brief The explicit plan of one update phase: operations on lanes, in issue order,
///        with their dependencies.
///
/// Lanes and what orders them:
///  - `cpu`:    the calling thread and its pool run CPU updates, one after another;
///  - `h2d`:    a stream of host-to-device copies (subgroup state into a staging slot);
///  - `device`: a stream of device Adam launches;
///  - `d2h`:    a stream of device-to-host copies (state back, gradients out);
///  - `push`:   a stream of host-to-device copies of updated parameters.
/// Operations on one stream run in issue order. A dependency on an operation of
/// another stream lane needs an event; a dependency on a CPU operation is met by
/// issue order, because the host issues nothing after a CPU operation until it returns.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace dos {

/// @brief Where a subgroup is updated in one step.
enum class Place : std::uint8_t {
  cpu,       ///< on the host, by the CPU executor
  device,    ///< streamed through a staging slot and updated by the device
  resident,  ///< state lives on the device for good (TwinFlow); updated there
};

/// @brief An ordered execution lane.
enum class Lane : std::uint8_t { cpu, h2d, device, d2h, push };
inline constexpr std::size_t lane_count = 5;

/// @brief What an operation does.
enum class OpKind : std::uint8_t {
  cpu_update,     ///< CPU Adam over one subgroup (lane cpu)
  fetch_grad,     ///< device gradients of a CPU subgroup to pinned host memory (lane d2h)
  upload,         ///< state (and host gradients) of a device subgroup into its slot (lane h2d)
  device_update,  ///< device Adam over one subgroup (lane device)
  download,       ///< state and host-resident parameters back from the slot (lane d2h)
  push_params,    ///< parameters updated on the CPU to their device copies (lane push)
};

constexpr std::string_view lane_name(Lane l) noexcept {
  constexpr std::array<std::string_view, lane_count> names{"cpu update", "h2d", "device update", "d2h", "param push"};
  return names[static_cast<std::size_t>(l)];
}
constexpr std::string_view op_name(OpKind k) noexcept {
  constexpr std::array<std::string_view, 6> names{"cpu_update", "fetch_grad", "upload",
                                                  "device_update", "download", "push_params"};
  return names[static_cast<std::size_t>(k)];
}
/// @brief The lane an operation kind runs on.
constexpr Lane lane_of(OpKind k) noexcept {
  switch (k) {
    case OpKind::cpu_update: return Lane::cpu;
    case OpKind::upload: return Lane::h2d;
    case OpKind::device_update: return Lane::device;
    case OpKind::fetch_grad:
    case OpKind::download: return Lane::d2h;
    case OpKind::push_params: return Lane::push;
  }
  return Lane::cpu;
}

/// @brief "Wait for operation `op` (an index into the plan) to complete."
struct Dependency {
  std::uint32_t op = 0;
  bool event = false;  ///< met by waiting on the producer's completion event
};

/// @brief One operation. At most two dependencies: every op in a dos plan needs no more.
struct Op {
  static constexpr std::int32_t no_slot = -1;

  OpKind kind = OpKind::cpu_update;
  Lane lane = Lane::cpu;
  std::uint32_t subgroup = 0;
  std::int32_t slot = no_slot;    ///< the staging slot it reads or writes
  std::size_t bytes = 0;          ///< bytes moved (copies) or touched in host memory (updates)
  std::size_t elements = 0;       ///< parameters updated (updates)
  std::array<Dependency, 2> deps{};
  std::uint8_t dep_count = 0;
  bool records_event = false;     ///< the executor records a completion event after it

  void depend(std::uint32_t producer, bool via_event) { deps[dep_count++] = {producer, via_event}; }
  std::span<const Dependency> dependencies() const noexcept { return {deps.data(), dep_count}; }
};

/// @brief What the planner needs to know about one subgroup.
struct SubgroupShape {
  std::size_t elements = 0;
  std::size_t slot_bytes = 0;        ///< staging bytes it needs on the device
  std::size_t upload_bytes = 0;      ///< host to device when streamed
  std::size_t download_bytes = 0;    ///< device to host when streamed
  std::size_t resident_upload_bytes = 0;    ///< host to device when resident (host gradients)
  std::size_t resident_download_bytes = 0;  ///< device to host when resident (host parameters)
  std::size_t fetch_bytes = 0;       ///< device gradients to fetch when updated on the CPU
  std::size_t push_bytes = 0;        ///< parameters to push when updated on the CPU
  std::size_t cpu_bytes = 0;         ///< host bytes a CPU update reads and writes
  std::size_t mirror_bytes = 0;      ///< pinned host mirror of its device tensors (gradients and values)
};

/// @brief A complete plan for one update phase.
struct Plan {
  std::vector<Op> ops;             ///< in issue order
  std::vector<Place> placement;    ///< per subgroup, as executed
  std::vector<SubgroupShape> shapes;  ///< per subgroup: what it must move, so the validator can demand it
  std::size_t slot_bytes = 0;      ///< bytes of one staging slot
  std::size_t slots = 0;           ///< staging slots in use
  std::size_t budget = 0;          ///< staging bytes the plan may use
  std::uint32_t stride = 0;        ///< k, when the assignment is a stride; 0 otherwise
  std::string_view fallback;       ///< why the step fell back to the CPU; empty if it did not
  bool explored = false;           ///< the policy ran this plan to measure it, not as its best
  /// Planner workspace, kept so that re-planning every step allocates nothing.
  std::array<std::vector<std::uint32_t>, 2> workspace;

  /// Peak device staging bytes.
  std::size_t staging_bytes() const noexcept { return slots * slot_bytes; }
  std::size_t device_subgroups() const noexcept {
    std::size_t n = 0;
    for (Place p : placement) n += p != Place::cpu ? 1 : 0;
    return n;
  }
};

}  // namespace dos
