// dos sharding the optimizer over MPI ranks on one node: for each mode (ZeRO-1, ZeRO-2),
// the step time and the bytes each rank handed to the collectives, against the rank
// count it runs with. Run it once per rank count and compare:
//
//   mpiexec -n 1 build/release/bench/bench_sharded [--params M] [--steps N]
//   mpiexec -n 2 build/release/bench/bench_sharded [--params M] [--steps N]
//
// Each rank holds every parameter (fp32, one tensor per 4M elements) and a gradient;
// every step is timed on rank 0 between barriers, median over the steps. "Moved" counts
// the buffers this rank handed to the collectives, input and output (the gradient
// reduce-scatter, the value all-gather and the small agreements), not what MPI copied
// internally; with one rank the collectives are local copies.

#include <dos/comm/mpi.hpp>
#include <dos/shard/sharded_optimizer.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

// A communicator that counts the bytes of the buffers handed to each collective.
struct Counting {
  dos::AnyCommunicator inner;
  std::size_t* bytes;
  int rank() const { return inner.rank(); }
  int size() const { return inner.size(); }
  int local_rank() const { return inner.local_rank(); }
  int local_size() const { return inner.local_size(); }
  void all_reduce(std::span<double> b, dos::ReduceOp op) {
    *bytes += b.size_bytes();
    inner.all_reduce(b, op);
  }
  void all_gather(std::span<const float> mine, std::span<float> all, std::span<const std::size_t> counts) {
    *bytes += mine.size_bytes() + all.size_bytes();
    inner.all_gather(mine, all, counts);
  }
  void reduce_scatter(std::span<const float> all, std::span<float> mine, std::span<const std::size_t> counts) {
    *bytes += all.size_bytes() + mine.size_bytes();
    inner.reduce_scatter(all, mine, counts);
  }
  void barrier() { inner.barrier(); }
};

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  std::size_t params = std::size_t{16} << 20;
  int steps = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--params") params = std::strtoull(argv[i + 1], nullptr, 10) << 20;
    else if (flag == "--steps") steps = std::max(1, std::atoi(argv[i + 1]));
  }
  {
    dos::AnyCommunicator world(dos::MpiCommunicator(MPI_COMM_WORLD));
    const int rank = world.rank(), ranks = world.size();
    const std::size_t per_tensor = std::size_t{4} << 20;
    std::vector<std::vector<float>> values, grads;
    for (std::size_t at = 0; at < params; at += per_tensor) {
      const std::size_t n = std::min(per_tensor, params - at);
      values.emplace_back(n, 0.5f);
      grads.emplace_back(n, 1e-3f * static_cast<float>(rank + 1));
    }
    std::vector<dos::HostParam<float>> list;
    for (std::size_t t = 0; t < values.size(); ++t) list.push_back({values[t], grads[t]});
    if (rank == 0)
      fmt::print("bench_sharded: {}M fp32 parameters, {} rank{} on this node, {} steps\n", params >> 20, ranks,
                 ranks > 1 ? "s" : "", steps);
    for (const dos::Sharding mode : {dos::Sharding::zero1, dos::Sharding::zero2}) {
      std::size_t bytes = 0;
      dos::Options o{.subgroup_elements = std::size_t{8} << 20, .max_grad_norm = 1.0, .sharding = mode};
      o.communicator = Counting{world, &bytes};
      dos::ShardedOptimizer<> opt(list, dos::AdamW{.lr = 1e-6}, o);
      opt.step();  // first touch
      bytes = 0;
      std::vector<double> seconds;
      for (int s = 0; s < steps; ++s) {
        world.barrier();
        const auto t0 = std::chrono::steady_clock::now();
        opt.step();
        world.barrier();
        seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      if (rank == 0)
        fmt::print("  {}: step {:.2f} ms (median), {} threads per rank, this rank updates {:.1f}M, moved {:.1f} MB "
                   "per step ({:.2f} B per parameter)\n",
                   dos::sharding_name(mode), median(seconds) * 1e3, opt.local().threads(),
                   static_cast<double>(opt.share().numel()) / (1 << 20),
                   static_cast<double>(bytes) / steps / 1e6, static_cast<double>(bytes) / steps / static_cast<double>(params));
    }
  }
  MPI_Finalize();
  return 0;
}
