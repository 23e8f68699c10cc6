// The pool runs every index exactly once, for any size, again and again.

#include <doctest/doctest.h>
#include <dos/cpu/thread_pool.hpp>

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
