// The NUMA layout dos reports: Linux CPU lists parsed exactly, and on this host the
// nodes of the affinity mask hold every CPU of it. Placement (cpu/placement.hpp): on
// every layout of 1 to 4 nodes of 1 to 9 CPUs and 1 to 10 ranks, each rank gets CPUs of
// the mask, within one node when ranks outnumber nodes, balanced, disjoint where the
// CPUs suffice, every CPU used; and a pinned pool's threads run where they were put.

#include <doctest/doctest.h>
#include <dos/cpu/cpu_adam.hpp>
#include <dos/cpu/numa.hpp>
#include <dos/cpu/thread_pool.hpp>

#include <dos/cpu/placement.hpp>
#include <dos/options.hpp>

#include <algorithm>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif

TEST_CASE("CPU lists parse as Linux writes them") {
  using dos::detail::parse_cpu_list;
  CHECK(parse_cpu_list("0-3,8,10-11") == std::vector<int>{0, 1, 2, 3, 8, 10, 11});
  CHECK(parse_cpu_list("5") == std::vector<int>{5});
  CHECK(parse_cpu_list("0-1\n") == std::vector<int>{0, 1});
  CHECK(parse_cpu_list("").empty());
  CHECK(parse_cpu_list("x").empty());
  CHECK(parse_cpu_list("2,y") == std::vector<int>{2});
}

TEST_CASE("the layout covers every CPU this process may run on, once") {
  const dos::NumaLayout layout = dos::numa_layout();
  REQUIRE(!layout.nodes.empty());
  CHECK(layout.host_nodes >= layout.nodes.size());
  unsigned cpus = 0;
  for (std::size_t i = 0; i < layout.nodes.size(); ++i) {
    cpus += layout.nodes[i].cpus;
    if (i > 0) CHECK(layout.nodes[i].id > layout.nodes[i - 1].id);
  }
#if defined(__linux__)
  CHECK(cpus == dos::available_threads());
#endif
  CHECK(layout.spans_nodes() == (layout.nodes.size() > 1));
  const dos::cpu::CpuAdamExecutor cpu(dos::cpu::CpuConfig{.threads = 1});
  CHECK(cpu.numa().nodes.size() == layout.nodes.size());
}

TEST_CASE("rank_cpus: each rank its own node or run of a node's CPUs, balanced, every CPU used") {
  for (unsigned nodes = 1; nodes <= 4; ++nodes)
    for (unsigned per = 1; per <= 9; ++per)
      for (int ranks = 1; ranks <= 10; ++ranks) {
        CAPTURE(nodes);
        CAPTURE(per);
        CAPTURE(ranks);
        dos::NumaLayout layout;
        layout.host_nodes = nodes;
        std::vector<int> node_of;  // CPU id -> node, for the checks
        for (unsigned n = 0; n < nodes; ++n) {
          // Node n's CPUs: n + nodes * k (interleaved ids, as many two-socket hosts number them).
          dos::NumaNode node{static_cast<int>(n), per, {}};
          for (unsigned k = 0; k < per; ++k) node.cpu_list.push_back(static_cast<int>(n + nodes * k));
          layout.nodes.push_back(node);
        }
        std::vector<std::vector<int>> sets;
        std::multiset<int> used;
        for (int r = 0; r < ranks; ++r) {
          sets.push_back(dos::rank_cpus(layout, r, ranks));
          const auto& set = sets.back();
          REQUIRE(!set.empty());
          CHECK(std::is_sorted(set.begin(), set.end()));
          std::set<unsigned> on;
          for (const int c : set) on.insert(static_cast<unsigned>(c) % nodes);
          if (static_cast<unsigned>(ranks) >= nodes) CHECK(on.size() == 1);  // one node
          else CHECK(on.size() >= nodes / static_cast<unsigned>(ranks));      // whole nodes
          used.insert(set.begin(), set.end());
        }
        std::set<int> distinct(used.begin(), used.end());
        CHECK(distinct.size() == static_cast<std::size_t>(nodes * per));  // every CPU
        if (static_cast<unsigned>(ranks) <= nodes * per && static_cast<unsigned>(ranks) <= nodes)
          CHECK(used.size() == distinct.size());  // whole nodes: disjoint
        if (static_cast<unsigned>(ranks) > nodes) {
          // The ranks of one node split it: sizes differ by at most one, disjoint where it has CPUs enough.
          for (unsigned n = 0; n < nodes; ++n) {
            std::vector<std::size_t> sizes;
            std::size_t total = 0;
            for (const auto& set : sets)
              if (static_cast<unsigned>(set.front()) % nodes == n) sizes.push_back(set.size()), total += set.size();
            if (sizes.empty()) continue;
            const auto [lo, hi] = std::minmax_element(sizes.begin(), sizes.end());
            CHECK(*hi - *lo <= 1);
            if (sizes.size() <= per) CHECK(total == per);
          }
        }
      }
  dos::NumaLayout empty;
  CHECK(dos::rank_cpus(empty, 0, 1).empty());
}

TEST_CASE("placement: automatic leaves one rank, or a one-node host, alone; none never pins") {
  CHECK(dos::placed_cpus(dos::ThreadPlacement::automatic, 0, 1).empty());
  CHECK(dos::placed_cpus(dos::ThreadPlacement::none, 0, 4).empty());
  const dos::NumaLayout layout = dos::numa_layout();
  if (layout.host_nodes <= 1) CHECK(dos::placed_cpus(dos::ThreadPlacement::automatic, 1, 2).empty());
  CHECK(dos::placed_cpus(dos::ThreadPlacement::bind, 0, 1) == dos::rank_cpus(layout, 0, 1));
}

#if defined(__linux__)
TEST_CASE("a pinned pool's workers run on their CPUs, and the constructing thread within the set") {
  cpu_set_t before;
  REQUIRE(sched_getaffinity(0, sizeof before, &before) == 0);
  const dos::NumaLayout layout = dos::numa_layout();
  std::vector<int> mask;
  for (const auto& n : layout.nodes) mask.insert(mask.end(), n.cpu_list.begin(), n.cpu_list.end());
  std::sort(mask.begin(), mask.end());
  const std::vector<int> cpus{mask.back(), mask.front()};  // worker 1 on cpus[1]: the first CPU
  {
    dos::ThreadPool pool(3, cpus);
    CHECK(pool.cpus() == cpus);
    std::mutex m;
    std::vector<std::pair<std::thread::id, int>> seen;
    auto body = [&](std::size_t) {
      const std::lock_guard lock(m);
      seen.emplace_back(std::this_thread::get_id(), sched_getcpu());
    };
    for (int round = 0; round < 50; ++round) pool.parallel_for(64, body);
    for (const auto& [id, cpu] : seen)
      CHECK(std::find(cpus.begin(), cpus.end(), cpu) != cpus.end());  // nobody ran elsewhere
    cpu_set_t now;
    REQUIRE(sched_getaffinity(0, sizeof now, &now) == 0);
    CHECK(CPU_COUNT(&now) == static_cast<int>(std::set<int>(cpus.begin(), cpus.end()).size()));
    CHECK_THROWS_AS(dos::ThreadPool(2, std::vector<int>{-1}), std::invalid_argument);
  }
  cpu_set_t after;  // the pool gave the constructing thread its mask back
  REQUIRE(sched_getaffinity(0, sizeof after, &after) == 0);
  CHECK(CPU_EQUAL(&after, &before));
  // Options::cpu(): bind takes as many threads as CPUs it places on, and placing again
  // while a pool pins this thread gives the same CPUs (not a split of the pin).
  dos::Options o;
  o.placement = dos::ThreadPlacement::bind;
  const dos::cpu::CpuConfig c = o.cpu();
  CHECK(c.cpus == dos::rank_cpus(layout, 0, 1));
  CHECK(c.threads == c.cpus.size());
  {
    const dos::ThreadPool narrow(1, std::vector<int>{mask.front()});
    CHECK(o.cpu().cpus == c.cpus);
  }
  REQUIRE(sched_getaffinity(0, sizeof after, &after) == 0);
  CHECK(CPU_EQUAL(&after, &before));
}
#endif
