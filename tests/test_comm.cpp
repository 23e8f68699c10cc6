// The Communicator concept: SingleProcess (the default), a communicator whose ranks are
// threads (tests/support/thread_communicator.hpp) plugged into the optimizer in place of
// MPI, the agreement of a step across ranks, and the sharded mode's properties
// (tests/support/sharded.hpp) with 1 to 4 ranks on the CPU and the emulated device;
// ZeroShare, and ZeRO-1 and ZeRO-2 (tests/support/zero.hpp) likewise.

#include "support/collectives.hpp"
#include "support/sharded.hpp"
#include "support/thread_communicator.hpp"
#include "support/zero.hpp"

#include <doctest/doctest.h>
#include <dos/comm/any_communicator.hpp>
#include <dos/comm/single_process.hpp>
#include <dos/optimizer.hpp>
#include <dos/train/rank_agreement.hpp>

#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace dos;

// Runs @p body(comm) on @p n thread ranks and returns what each returned.
template <class R>
std::vector<R> on_ranks(int n, const std::function<R(AnyCommunicator)>& body) {
  auto world = std::make_shared<test::ThreadWorld>(n);
  std::vector<R> out(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] { out[static_cast<std::size_t>(r)] = body(AnyCommunicator(test::ThreadRanks(world, r))); });
  for (auto& t : threads) t.join();
  return out;
}

}  // namespace

TEST_CASE("SingleProcess is one rank whose collectives are the identity") {
  AnyCommunicator c;  // the default
  CHECK(c.rank() == 0);
  CHECK(c.size() == 1);
  CHECK(c.local_size() == 1);
  std::vector<double> small{1.5, -2};
  c.all_reduce(small, ReduceOp::sum);
  CHECK(small == std::vector<double>{1.5, -2});
  const std::vector<float> mine{1, 2, 3};
  std::vector<float> all(3);
  const std::size_t counts[] = {3};
  c.all_gather(mine, all, counts);
  CHECK(all == mine);
  std::vector<float> wrong(4);
  CHECK_THROWS_AS(c.all_gather(mine, wrong, counts), std::invalid_argument);
}

TEST_CASE("thread ranks keep the Communicator contract, 1 to 4 ranks") {
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    for (const auto& rank : on_ranks<std::vector<std::string>>(n, test::check_collectives))
      for (const auto& f : rank) FAIL_CHECK(f);
  }
}

TEST_CASE("agree_across_ranks: one rank's error fails every rank, naming it; the sums are global") {
  const auto outcomes = on_ranks<std::string>(3, [](AnyCommunicator c) -> std::string {
    try {
      const GradSummary g = agree_across_ranks(c, [&] {
        if (c.rank() == 1) throw_invalid_argument("parameter 4: bad view");
        return GradSummary{.sum_squares = 1.0 + c.rank(), .nonfinite_params = 0};
      });
      return fmt::format("no error, sum {}", g.sum_squares);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
  });
  CHECK(outcomes[1].find("rank 1 failed: parameter 4: bad view") != std::string::npos);
  CHECK(outcomes[0].find("rank(s) 1 failed") != std::string::npos);
  CHECK(outcomes[2].find("rank(s) 1 failed") != std::string::npos);

  const auto sums = on_ranks<double>(3, [](AnyCommunicator c) {
    return agree_across_ranks(c, [&] { return GradSummary{.sum_squares = 1.0 + c.rank(), .nonfinite_params = c.rank() == 2 ? 1u : 0u}; })
               .sum_squares;
  });
  CHECK(sums == std::vector<double>{6, 6, 6});
}

TEST_CASE_TEMPLATE("sharded mode on thread ranks agrees with one process stepping every shard", Backend, CpuBackend,
                   EmulatedDeviceBackend) {
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    const auto failures = on_ranks<std::vector<std::string>>(n, [](AnyCommunicator c) { return test::check_sharded<Backend>(c); });
    for (const auto& rank : failures)
      for (const auto& f : rank) FAIL_CHECK(f);
  }
}

TEST_CASE("ZeroShare: balanced contiguous shares of the concatenation, cut into pieces, counts per tensor") {
  const std::size_t sizes[] = {5, 0, 3};  // 8 elements over 3 ranks: 3, 3, 2
  const ZeroShare r0(sizes, 0, 3), r1(sizes, 1, 3), r2(sizes, 2, 3);
  CHECK(r0.begin() == 0);
  CHECK(r0.end() == 3);
  CHECK(r1.begin() == 3);
  CHECK(r1.end() == 6);
  CHECK(r2.begin() == 6);
  CHECK(r2.end() == 8);
  REQUIRE(r1.pieces().size() == 2);  // the end of tensor 0, the start of tensor 2; tensor 1 has nothing
  CHECK((r1.pieces()[0].tensor == 0 && r1.pieces()[0].offset == 3 && r1.pieces()[0].numel == 2 && r1.pieces()[0].at == 0));
  CHECK((r1.pieces()[1].tensor == 2 && r1.pieces()[1].offset == 0 && r1.pieces()[1].numel == 1 && r1.pieces()[1].at == 2));
  CHECK(std::vector<std::size_t>(r1.counts(0).begin(), r1.counts(0).end()) == std::vector<std::size_t>{3, 2, 0});
  CHECK(std::vector<std::size_t>(r1.counts(1).begin(), r1.counts(1).end()) == std::vector<std::size_t>{0, 0, 0});
  CHECK(std::vector<std::size_t>(r1.counts(2).begin(), r1.counts(2).end()) == std::vector<std::size_t>{0, 1, 2});
  const std::size_t two[] = {2};  // more ranks than elements: the last ones own nothing
  const ZeroShare last(two, 3, 4), first(two, 0, 4);
  CHECK(last.empty());
  CHECK(last.pieces().empty());
  CHECK(first.numel() == 1);
  CHECK(std::vector<std::size_t>(last.counts(0).begin(), last.counts(0).end()) == std::vector<std::size_t>{1, 1, 0, 0});
  CHECK_THROWS_AS(ZeroShare(two, 4, 4), std::invalid_argument);
}

TEST_CASE_TEMPLATE("ZeRO-1 and ZeRO-2 on thread ranks: exact or close to one process, identical across ranks", Backend,
                   CpuBackend, EmulatedDeviceBackend) {
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    const auto failures = on_ranks<std::vector<std::string>>(n, [](AnyCommunicator c) { return test::check_zero<Backend>(c); });
    for (const auto& rank : failures)
      for (const auto& f : rank) FAIL_CHECK(f);
  }
}

TEST_CASE("calibrate_node: the ranks calibrate together and all plan with the same profile") {
  // Every rank calls it before building its optimizer. A rank that cannot calibrate, or
  // cannot build its executor, fails every rank, naming it, with none left waiting.
  const auto fields = [](const HardwareProfile& p) {
    return std::vector<double>{p.cpu_rate, p.device_rate, p.h2d_bandwidth, p.d2h_bandwidth, p.duplex ? 1.0 : 0.0,
                               p.host_bandwidth};
  };
  for (int n = 1; n <= 3; ++n) {
    CAPTURE(n);
    const auto profiles = on_ranks<std::vector<double>>(n, [&](AnyCommunicator c) {
      std::vector<float> values(4096, 0.5f), grads(4096, 0.01f);
      const std::vector<HostParam<float>> params{{values, grads}};
      Options o;
      o.threads = 1;
      o.communicator = c;
      o.interleave.profile = calibrate_node<EmulatedDeviceBackend>(c, o.cpu());
      InterleavedOptimizer<EmulatedDeviceBackend> opt(params, AdamW{}, o);
      return fields(opt.cost_model().profile());
    });
    for (int r = 1; r < n; ++r) CHECK(profiles[static_cast<std::size_t>(r)] == profiles[0]);
    for (const double x : {profiles[0][0], profiles[0][1], profiles[0][2], profiles[0][3], profiles[0][5]}) CHECK(x > 0);

    // The last rank cannot calibrate (no device memory), then cannot even build its
    // executor (a CPU that does not exist to pin to): both fail every rank, naming it.
    for (const bool build_fails : {false, true}) {
      CAPTURE(build_fails);
      const auto errors = on_ranks<std::string>(n, [&](AnyCommunicator c) {
        EmulatedDeviceBackend::Config config;
        cpu::CpuConfig host{.threads = 1};
        if (c.rank() == n - 1 && !build_fails) config.memory_bytes = 0;
        if (c.rank() == n - 1 && build_fails) host.cpus = {-1};
        try {
          calibrate_node<EmulatedDeviceBackend>(c, host, config);
        } catch (const std::invalid_argument& e) {
          return std::string(e.what());
        } catch (const std::exception& e) {
          return "another exception: " + std::string(e.what());
        }
        return std::string();
      });
      for (int r = 0; r < n; ++r) {
        CAPTURE(r);
        const std::string& e = errors[static_cast<std::size_t>(r)];
        CHECK(!e.empty());
        if (n > 1) CHECK(e.find(fmt::format("{} failed", n - 1)) != std::string::npos);
        if (build_fails && r == n - 1) CHECK(e.find("CPU -1") != std::string::npos);
      }
    }
  }
}
