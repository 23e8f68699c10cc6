// The pool runs every index exactly once, for any size, again and again.

#include <doctest/doctest.h>
#include <dos/cpu/thread_pool.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

TEST_CASE("parallel_for visits every index exactly once") {
  for (unsigned threads : {1u, 2u, 3u, 8u}) {
    dos::ThreadPool pool(threads);
    CHECK(pool.size() == threads);
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{7}, std::size_t{1000}}) {
      for (int round = 0; round < 20; ++round) {
        std::vector<std::atomic<int>> hits(n);
        auto body = [&](std::size_t i) { hits[i].fetch_add(1); };
        pool.parallel_for(n, body);
        int wrong = 0;
        for (auto& h : hits) wrong += h.load() != 1;
        CHECK(wrong == 0);
      }
    }
  }
}

TEST_CASE("the default size is the available hardware threads") {
  dos::ThreadPool pool;
  CHECK(pool.size() == dos::available_threads());
  CHECK(dos::available_threads() >= 1);
}

TEST_CASE("work really spreads over several threads") {
  dos::ThreadPool pool(2);
  std::atomic<int> inside{0}, max_inside{0};
  auto body = [&](std::size_t) {
    const int now = ++inside;
    int seen = max_inside.load();
    while (now > seen && !max_inside.compare_exchange_weak(seen, now)) {
    }
    // Wait (bounded) for the other thread to arrive, so both are inside together.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (max_inside.load() < 2 && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
    --inside;
  };
  pool.parallel_for(2, body);
  CHECK(max_inside.load() == 2);
}

TEST_CASE("the weighted and the interleaved loops visit every index exactly once") {
  for (unsigned threads : {1u, 2u, 3u, 8u}) {
    dos::ThreadPool pool(threads);
    for (std::size_t n : {std::size_t{1}, std::size_t{2}, std::size_t{7}, std::size_t{1000}}) {
      std::vector<std::atomic<int>> hits(n);
      auto body = [&](std::size_t i) { hits[i].fetch_add(1); };
      pool.parallel_for_weighted(n, [](std::size_t i) { return i % 3; }, body);  // zero weights too
      pool.parallel_for_interleaved(n, body);
      int wrong = 0;
      for (auto& h : hits) wrong += h.load() != 2;
      CHECK(wrong == 0);
    }
  }
}

// Every thread's first index is held until all threads have one, so none can finish
// its range and steal before the others start: the first indices are the cut points.
TEST_CASE("each thread starts at its own cut point, by weight") {
  constexpr unsigned threads = 4;
  dos::ThreadPool pool(threads);
  const std::size_t n = 100;
  // Weight 3 for the first half, 1 for the rest: total 200, so cuts at weight 0, 50,
  // 100, 150 fall at indices 0, 17, 34, 50 (the first whose preceding weight reaches the cut).
  auto weight = [](std::size_t i) { return std::size_t{i < 50 ? 3u : 1u}; };
  std::atomic<unsigned> arrived{0};
  std::vector<std::atomic<std::size_t>> first(threads);
  for (auto& f : first) f.store(n);
  auto body = [&](std::size_t i) {
    thread_local std::uint64_t seen_loop = 0;
    static std::atomic<std::uint64_t> loop{1};
    if (seen_loop == loop.load()) return;
    seen_loop = loop.load();
    first[arrived.fetch_add(1)].store(i);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (arrived.load() < threads && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
  };
  pool.parallel_for_weighted(n, weight, body);
  std::vector<std::size_t> starts;
  for (auto& f : first) starts.push_back(f.load());
  std::sort(starts.begin(), starts.end());
  CHECK(starts == std::vector<std::size_t>{0, 17, 34, 50});
}

// A node's ranks share its cores: an even share of the mask when every rank sees the
// whole node, the mask as it is when the launcher gave each rank its own cores.
TEST_CASE("threads_for_rank shares the node's CPUs among its ranks") {
  const unsigned all = dos::available_threads();
  CHECK(dos::threads_for_rank(1) == all);
  CHECK(dos::threads_for_rank(0) == all);
#if defined(__linux__)
  const long online = ::sysconf(_SC_NPROCESSORS_ONLN);
  if (all == static_cast<unsigned long>(online)) {
    for (int ranks : {2, 3, 4, 64}) CHECK(dos::threads_for_rank(ranks) == std::max(1u, all / static_cast<unsigned>(ranks)));
  }
  // A thread bound to one CPU, as a launcher binds a rank: the mask is its share.
  std::thread([] {
    cpu_set_t one;
    CPU_ZERO(&one);
    cpu_set_t now;
    REQUIRE(sched_getaffinity(0, sizeof now, &now) == 0);
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &now)) {
        CPU_SET(c, &one);
        break;
      }
    REQUIRE(sched_setaffinity(0, sizeof one, &one) == 0);
    CHECK(dos::threads_for_rank(4) == 1);
    CHECK(dos::threads_for_rank(1) == 1);
  }).join();
#endif
}
