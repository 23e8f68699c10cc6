// The Communicator concept: SingleProcess (the default), a communicator whose ranks are
// threads (tests/support/thread_communicator.hpp) plugged into the optimizer in place of
// MPI, the agreement of a step across ranks, and the sharded mode's properties
// (tests/support/sharded.hpp) with 1 to 4 ranks on the CPU and the emulated device.

#include "support/collectives.hpp"
#include "support/sharded.hpp"
#include "support/thread_communicator.hpp"

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
