#pragma once
/// @file
/// @brief Where a rank's CPU threads run. Ranks sharing a host with several NUMA nodes
///        (sockets) and left unbound by the launcher would let every thread wander over
///        every socket: the state a thread first touched lands on its node, and every
///        later step may stream it across the socket interconnect. `rank_cpus` gives
///        each local rank a place: whole nodes when ranks are fewer than nodes, else
///        consecutive ranks share a node and split its CPUs into contiguous runs.
///        `placed_cpus` applies `ThreadPlacement` (`Options::placement`); `ThreadPool`
///        pins its threads to the result.

#include "dos/cpu/numa.hpp"

#include <algorithm>
#include <cstddef>
#include <optional>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#include <unistd.h>
#endif

namespace dos {

/// @brief Whether dos places a rank's threads itself.
enum class ThreadPlacement {
  /// Place them where it matters: several ranks on a host with several NUMA nodes,
  /// none bound by the launcher (each rank's mask is the whole host). Else leave them.
  automatic,
  /// Always place them (`rank_cpus`), also with one rank or one node.
  bind,
  /// Never: the OS, the launcher or the caller decides.
  none,
};

/// @brief The CPUs local rank @p local_rank of @p local_ranks keeps its threads on, from
///        the NUMA nodes of @p layout (their `cpu_list`s, this process's CPUs): with
///        ranks no more than nodes, rank r takes nodes [r*S/L, (r+1)*S/L) whole; with
///        more, rank r goes to node floor(r*S/L), whose ranks split its CPUs into
///        contiguous, balanced runs (a rank left without a CPU of its own shares one).
/// @return ascending CPU ids, never empty where the layout has a CPU.
inline std::vector<int> rank_cpus(const NumaLayout& layout, int local_rank, int local_ranks) {
  std::vector<const std::vector<int>*> nodes;
  for (const NumaNode& n : layout.nodes)
    if (!n.cpu_list.empty()) nodes.push_back(&n.cpu_list);
  std::vector<int> out;
  if (nodes.empty() || local_ranks < 1 || local_rank < 0 || local_rank >= local_ranks) return out;
  const auto s = nodes.size(), l = static_cast<std::size_t>(local_ranks), r = static_cast<std::size_t>(local_rank);
  if (l <= s) {
    for (std::size_t k = r * s / l; k < (r + 1) * s / l; ++k) out.insert(out.end(), nodes[k]->begin(), nodes[k]->end());
    std::sort(out.begin(), out.end());
    return out;
  }
  const std::size_t node = r * s / l;
  std::size_t first = 0, count = 0;  // the ranks on this node: [first, first + count)
  for (std::size_t q = 0; q < l; ++q)
    if (q * s / l == node) {
      if (count == 0) first = q;
      ++count;
    }
  const std::vector<int>& cpus = *nodes[node];
  const std::size_t j = r - first, c = cpus.size();
  const std::size_t begin = j * c / count, end = (j + 1) * c / count;
  if (begin == end) return {cpus[j % c]};
  return {cpus.begin() + static_cast<std::ptrdiff_t>(begin), cpus.begin() + static_cast<std::ptrdiff_t>(end)};
}

/// @brief Whether the launcher already bound this process: its affinity mask is
///        narrower than the host's online CPUs.
inline bool launcher_bound(const NumaLayout& layout) noexcept {
#if defined(__linux__)
  unsigned mine = 0;
  for (const NumaNode& n : layout.nodes) mine += n.cpus;
  const long online = ::sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 && mine < static_cast<unsigned long>(online);
#else
  (void)layout;
  return false;
#endif
}

namespace detail {
// The layout from the affinity mask the first placement saw. A pool pins the thread that
// builds it, so the same thread's mask is narrower afterwards; placing again from it
// would split the rank's CPUs again (or take the pin for a launcher's binding).
inline NumaLayout first_layout() {
#if defined(__linux__)
  static const std::optional<cpu_set_t> first = [] {
    cpu_set_t mask;
    CPU_ZERO(&mask);
    return sched_getaffinity(0, sizeof mask, &mask) == 0 ? std::optional(mask) : std::nullopt;
  }();
  return numa_layout(first ? &*first : nullptr);
#else
  return numa_layout();
#endif
}
}  // namespace detail

/// @brief The CPUs to pin local rank @p local_rank of @p local_ranks to under
///        @p placement (see `ThreadPlacement`); empty: do not pin. It starts from the
///        affinity mask the process's first placement saw, so calling it again (a
///        second optimizer, `calibrate_node` then the optimizer) gives the same CPUs.
inline std::vector<int> placed_cpus(ThreadPlacement placement, int local_rank, int local_ranks) {
  if (placement == ThreadPlacement::none) return {};
  const NumaLayout layout = detail::first_layout();
  if (placement == ThreadPlacement::automatic &&
      (local_ranks <= 1 || layout.host_nodes <= 1 || launcher_bound(layout)))
    return {};
  return rank_cpus(layout, local_rank, local_ranks);
}

}  // namespace dos
