// WholeGradNorm (ZeRO-1's norm, taken by every rank from the whole model): its summary is
// one process's to the bit. One process here is the optimizer's own path: a ParamTable,
// a StateStore cut by the same partitioner, and GradNorm's parallel pass. Random models
// (empty tensors, tensors cut over several subgroups, segments of several 32K-element
// chunks, absent gradients, a non-finite one), float32 and bfloat16 gradients, 1 to 3
// threads, some tensors recorded early as backward would. The gradients span many
// magnitudes, so the order of the double sums matters: the test also checks that adding
// each tensor in one piece gives other bits somewhere.

#include <doctest/doctest.h>
#include <dos/cpu/cpu_adam.hpp>
#include <dos/partition/greedy_partitioner.hpp>
#include <dos/shard/whole_norm.hpp>
#include <dos/state/state_store.hpp>
#include <dos/train/grad_norm.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace {

template <class T>
struct Model {
  std::vector<std::vector<T>> values, grads;
  std::vector<dos::HostParam<T>> params;
  std::vector<std::size_t> sizes;
};

template <class T>
Model<T> random_model(std::mt19937_64& rng) {
  Model<T> m;
  const std::size_t tensors = 1 + rng() % 6;
  for (std::size_t t = 0; t < tensors; ++t) {
    const std::size_t n = rng() % 4 == 0 ? rng() % 20 : rng() % 90000;
    m.sizes.push_back(n);
    m.values.emplace_back(n, T(0.5f));
    std::vector<T> g(n);
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    std::uniform_int_distribution<int> exponent(-30, 30);
    for (T& x : g) x = T(std::ldexp(unit(rng), exponent(rng)));
    m.grads.push_back(std::move(g));
  }
  for (std::size_t t = 0; t < tensors; ++t) {
    const bool absent = tensors > 1 && rng() % 5 == 0;
    m.params.push_back({m.values[t], absent ? std::span<T>() : std::span<T>(m.grads[t])});
  }
  if (rng() % 4 == 0) {
    auto& g = m.grads[rng() % tensors];
    if (!g.empty()) g[rng() % g.size()] = T(std::numeric_limits<float>::infinity());
  }
  return m;
}

template <class T>
void check_against_one_process(std::uint64_t seed, int& order_matters) {
  std::mt19937_64 rng(seed);
  const Model<T> m = random_model<T>(rng);
  const std::size_t targets[] = {16, 1000, 40000, 1 << 20};
  const dos::GreedyPartitioner partitioner(targets[rng() % 4]);
  dos::cpu::CpuAdamExecutor cpu(dos::cpu::CpuConfig{.threads = static_cast<unsigned>(1 + rng() % 3)});
  dos::ParamTable table(m.params, std::vector<std::uint32_t>(m.params.size(), 0), false, false);
  dos::StateStore<dos::HostResource> store(
      [&](std::span<const std::size_t> sizes) { return partitioner.partition(sizes); }, table, {false},
      dos::HostResource{},
      [](const dos::TensorView& v, std::size_t off, std::span<float> out) {
        for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(static_cast<const T*>(v.data)[off + i]);
      },
      cpu);
  table.refresh([](std::size_t, const dos::ConstTensorView& g) { return g; });
  store.bind(cpu);
  dos::GradNorm norm(table.size(), store.chunks().size());
  const dos::GradSummary one =
      norm.gather(false, cpu, store, table, [](std::size_t) -> dos::GradStats { throw "no device parameter here"; });

  dos::WholeGradNorm whole(m.sizes, partitioner.partition(m.sizes));
  const dos::GradSummary w = whole.gather(cpu, [&](std::size_t t) { return table.grad(t); });
  INFO("seed ", seed, ", ", m.sizes.size(), " tensors, ", whole.pieces(), " pieces");
  CHECK(std::bit_cast<std::uint64_t>(w.sum_squares) == std::bit_cast<std::uint64_t>(one.sum_squares));
  CHECK(w.nonfinite_params == one.nonfinite_params);
  CHECK(w.first_nonfinite_param == one.first_nonfinite_param);
  // Some tensors reported during backward (`record`), the rest read at the step: the same bits.
  for (std::size_t t = 0; t < m.sizes.size(); ++t)
    if (rng() % 2 == 0) whole.record(t, table.grad(t));
  const dos::GradSummary r = whole.gather(cpu, [&](std::size_t t) { return table.grad(t); });
  CHECK(std::bit_cast<std::uint64_t>(r.sum_squares) == std::bit_cast<std::uint64_t>(one.sum_squares));
  CHECK(r.nonfinite_params == one.nonfinite_params);
  CHECK(r.first_nonfinite_param == one.first_nonfinite_param);

  double in_one_piece = 0;  // each tensor summed whole: another order
  for (std::size_t t = 0; t < m.sizes.size(); ++t)
    if (table.present(t)) in_one_piece += dos::cpu::grad_stats(table.grad(t).data, table.grad(t).dtype, 0, m.sizes[t]).sum_squares;
  order_matters += std::bit_cast<std::uint64_t>(in_one_piece) != std::bit_cast<std::uint64_t>(one.sum_squares);
}

}  // namespace

TEST_CASE("the whole model's norm, taken on one rank, is one process's to the bit") {
  int order_matters = 0;
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    check_against_one_process<float>(seed, order_matters);
    check_against_one_process<dos::bf16>(seed + 1000, order_matters);
  }
  CHECK_MESSAGE(order_matters > 0, "the models never made the order of the sums matter: the test would not see a wrong order");
}
