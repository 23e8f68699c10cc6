#pragma once
/// @file
/// @brief `NumaLayout`: the NUMA nodes of the host and those this process's CPUs sit
///        on, as Linux describes them in /sys/devices/system/node. What dos saw is
///        reported (`CpuAdamExecutor::numa()`) so that a user can tell whether a rank's
///        threads span sockets, which makes every step cross the socket interconnect.

#include <cstddef>
#include <fstream>
#include <utility>
#include <string>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif

namespace dos {

/// @brief One NUMA node: its id and how many of this process's CPUs it holds.
struct NumaNode {
  int id = 0;
  unsigned cpus = 0;          ///< CPUs of this process's affinity mask on the node
  std::vector<int> cpu_list;  ///< those CPUs, ascending
};

/// @brief The host's NUMA nodes, and which of them this process's CPUs are on.
struct NumaLayout {
  unsigned host_nodes = 1;      ///< nodes with CPUs on this host (1 where unknown)
  std::vector<NumaNode> nodes;  ///< the nodes this process may run on, by id
  /// @brief Whether this process's CPUs span more than one node.
  bool spans_nodes() const noexcept { return nodes.size() > 1; }
};

namespace detail {
// Parses a Linux CPU list ("0-3,8,10-11") into its members.
inline std::vector<int> parse_cpu_list(const std::string& text) {
  std::vector<int> out;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t used = 0;
    int first = 0;
    try {
      first = std::stoi(text.substr(at), &used);
    } catch (...) {
      break;  // not a list: stop at what was read
    }
    at += used;
    int last = first;
    if (at < text.size() && text[at] == '-') {
      try {
        last = std::stoi(text.substr(at + 1), &used);
      } catch (...) {
        break;
      }
      at += 1 + used;
    }
    for (int c = first; c <= last && c - first < 65536; ++c) out.push_back(c);
    if (at < text.size() && text[at] == ',') ++at;
    else break;
  }
  return out;
}
}  // namespace detail

/// @brief Reads the layout from /sys/devices/system/node (nodes 0-1023); one node with
///        every CPU of the mask where that is missing (another OS, a container without
///        sysfs).
#if defined(__linux__)
/// @brief The layout as seen from affinity mask @p given (null: every CPU).
inline NumaLayout numa_layout(const cpu_set_t* given) {
  NumaLayout layout;
  cpu_set_t mask;
  CPU_ZERO(&mask);
  const bool have_mask = given != nullptr;
  if (have_mask) mask = *given;
  unsigned host_nodes = 0;
  for (int node = 0; node < 1024; ++node) {
    std::ifstream in("/sys/devices/system/node/node" + std::to_string(node) + "/cpulist");
    if (!in) continue;
    std::string text;
    std::getline(in, text);
    const std::vector<int> cpus = detail::parse_cpu_list(text);
    if (cpus.empty()) continue;  // a memory-only node
    ++host_nodes;
    std::vector<int> mine;
    for (const int c : cpus)
      if (!have_mask || (c < CPU_SETSIZE && CPU_ISSET(c, &mask))) mine.push_back(c);
    if (!mine.empty()) layout.nodes.push_back({node, static_cast<unsigned>(mine.size()), std::move(mine)});
  }
  if (host_nodes > 0) {
    layout.host_nodes = host_nodes;
    return layout;
  }
  std::vector<int> all;
  for (int c = 0; have_mask && c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &mask)) all.push_back(c);
  layout.nodes.push_back({0, static_cast<unsigned>(all.size()), std::move(all)});
  return layout;
}
#endif

/// @brief The layout as the calling thread's affinity mask sees it.
inline NumaLayout numa_layout() {
#if defined(__linux__)
  cpu_set_t mask;
  CPU_ZERO(&mask);
  return numa_layout(sched_getaffinity(0, sizeof mask, &mask) == 0 ? &mask : nullptr);
#else
  NumaLayout layout;
  layout.nodes.push_back({0, 0, {}});
  return layout;
#endif
}

}  // namespace dos
