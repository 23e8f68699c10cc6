// BufferPool: fixed capacity, move-only leases, blocking and non-blocking acquire,
// peak statistics, and no allocation after construction.

#include <doctest/doctest.h>
#include <dos/memory/buffer_pool.hpp>

#include <atomic>
#include <set>
#include <thread>
#include <vector>

using dos::BufferPool;
using dos::HostResource;

TEST_CASE("blocks are distinct, sized, aligned, and returned by the lease") {
  BufferPool<HostResource> pool(3, 1000, {});
  CHECK(pool.capacity() == 3);
  CHECK(pool.block_bytes() == 1000);
  std::set<std::byte*> seen;
  {
    auto a = pool.acquire();
    auto b = pool.acquire();
    auto c = pool.acquire();
    for (auto* l : {&a, &b, &c}) {
      CHECK(l->size() == 1000);
      CHECK(reinterpret_cast<std::uintptr_t>(l->data()) % dos::DeviceBuffer<HostResource>::alignment == 0);
      seen.insert(l->data());
    }
    CHECK(seen.size() == 3);
    CHECK_FALSE(pool.try_acquire().has_value());
    CHECK(pool.stats().in_use == 3);
  }
  CHECK(pool.stats().in_use == 0);
  CHECK(pool.stats().peak_in_use == 3);
  CHECK(pool.stats().acquisitions == 3);
  auto again = pool.try_acquire();
  REQUIRE(again.has_value());
  CHECK(seen.count(again->data()) == 1);  // the same memory comes back: nothing new is allocated
}

TEST_CASE("leases move; a moved-from lease returns nothing") {
  BufferPool<HostResource> pool(1, 64, {});
  auto a = pool.acquire();
  auto b = std::move(a);
  CHECK_FALSE(static_cast<bool>(a));
  CHECK(static_cast<bool>(b));
  CHECK(pool.stats().in_use == 1);
  a = std::move(b);
  CHECK(pool.stats().in_use == 1);
  a.reset();
  CHECK(pool.stats().in_use == 0);
}

TEST_CASE("acquire blocks until a block is returned by another thread") {
  BufferPool<HostResource> pool(1, 64, {});
  auto held = pool.acquire();
  std::atomic<bool> got{false};
  std::thread waiter([&] {
    auto l = pool.acquire();
    got = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_FALSE(got.load());  // still waiting: the only block is held
  held.reset();
  waiter.join();
  CHECK(got.load());
}

TEST_CASE("many threads never hold more blocks than the capacity") {
  BufferPool<HostResource> pool(2, 64, {});
  std::atomic<int> holders{0}, most{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        auto l = pool.acquire();
        const int now = ++holders;
        int m = most.load();
        while (now > m && !most.compare_exchange_weak(m, now)) {}
        --holders;
      }
    });
  for (auto& t : threads) t.join();
  CHECK(most.load() <= 2);
  CHECK(pool.stats().peak_in_use <= 2);
  CHECK(pool.stats().acquisitions == 1200);
}

TEST_CASE("an empty pool refuses to wait forever") {
  BufferPool<HostResource> pool(0, 64, {});
  CHECK_FALSE(pool.try_acquire().has_value());
  CHECK_THROWS_AS(pool.acquire(), std::invalid_argument);
}
