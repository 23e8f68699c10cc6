// The NUMA layout dos reports: Linux CPU lists parsed exactly, and on this host the
// nodes of the affinity mask hold every CPU of it.

#include <doctest/doctest.h>
#include <dos/cpu/cpu_adam.hpp>
#include <dos/cpu/numa.hpp>
#include <dos/cpu/thread_pool.hpp>

#include <vector>

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
