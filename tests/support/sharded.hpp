#pragma once
// The sharded mode (FSDP / ZeRO-3: each rank's optimizer holds only its own tensors),
// checked on any communicator, by the thread-rank test and by the mpiexec test alike:
//  - after every step each rank's values agree with one process stepping every tensor,
//    within 1e-6 (relative to max(1, |value|));
//  - every rank reports the same gradient norm, bit for bit, and it is the global one;
//  - an inf in one rank's gradient makes every rank skip the step (loss scaling backs
//    off everywhere), and clipping by the global norm is active on the other steps;
//  - a bad scheduled lr, then a gradient of the wrong size, on the last rank fails
//    step() on every rank, naming that rank, with no state changed anywhere; the next
//    good step goes on together;
//  - the statistics taken in grad_ready during backward serve as well as step()'s own.
// Returns what failed, each line naming the rank.

#include "support/inputs.hpp"

#include <dos/optimizer.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace dos::test {

// A handle to storage, as a framework's tensor is: the views follow the vectors, so a
// test can change a tensor under the optimizer. Values of type V, float32 gradients.
template <class V>
struct VectorParam {
  std::vector<V>* value;
  std::vector<float>* grad;
};
using ShardParam = VectorParam<float>;

}  // namespace dos::test

template <class V>
struct dos::tensor_traits<dos::test::VectorParam<V>> {
  static TensorView value(const test::VectorParam<V>& p) { return {p.value->data(), p.value->size(), dtype_of<V>, Device::host}; }
  static ConstTensorView grad(const test::VectorParam<V>& p) {
    return {p.grad->data(), p.grad->size(), DType::f32, Device::host};
  }
};

namespace dos::test {

// Uneven on purpose: with 2 to 4 ranks, the shards differ in count and size.
inline constexpr std::size_t sharded_sizes[] = {1, 7, 10007, 1031, 513, 2048, 3};
inline constexpr std::size_t sharded_count = std::size(sharded_sizes);

// Tensor t lives on rank t % size.
struct Shard {
  std::vector<std::size_t> tensors;
  std::vector<std::vector<float>> values, grads;
  std::vector<ShardParam> params;
  Shard(int rank, int size) {
    for (std::size_t t = 0; t < sharded_count; ++t) {
      if (static_cast<int>(t % static_cast<std::size_t>(size)) != rank) continue;
      tensors.push_back(t);
      values.emplace_back(sharded_sizes[t]);
      grads.emplace_back(sharded_sizes[t]);
      for (std::size_t i = 0; i < sharded_sizes[t]; ++i) values.back()[i] = initial_param(t, i);
    }
    for (std::size_t k = 0; k < tensors.size(); ++k) params.push_back({&values[k], &grads[k]});
  }
  // The framework's scaled gradients; an inf in the last tensor at step @p inf_step.
  void set_gradients(std::int64_t step, double scale, std::int64_t inf_step) {
    for (std::size_t k = 0; k < tensors.size(); ++k) {
      for (std::size_t i = 0; i < grads[k].size(); ++i)
        grads[k][i] = gradient(tensors[k], step, i) * static_cast<float>(scale);
      if (step == inf_step && tensors[k] == sharded_count - 1) grads[k][0] = std::numeric_limits<float>::infinity();
    }
  }
};

// Whether @p x is the same, bit for bit, on every rank.
inline bool same_on_every_rank(AnyCommunicator& comm, double x) {
  std::vector<double> b{x, -x};
  comm.all_reduce(b, ReduceOp::max);
  return b[0] == x && -b[1] == x;
}

// Spoils the last rank's input, then steps every rank: each must fail naming the last
// rank and change neither @p values nor the step count; then mends it. Returns what did not hold.
template <class Opt, class Values>
std::vector<std::string> fails_on_every_rank(AnyCommunicator& comm, Opt& opt, const Values& values,
                                             const std::function<void()>& spoil, const std::function<void()>& mend) {
  const int last = comm.size() - 1;
  const Values before = values;
  const std::int64_t count = opt.step_count();
  if (comm.rank() == last) spoil();
  std::string what;
  try {
    opt.step();
  } catch (const std::invalid_argument& e) {
    what = e.what();
  }
  std::vector<std::string> fail;
  if (what.empty()) fail.push_back(fmt::format("bad input on rank {} did not fail this rank", last));
  if (comm.size() > 1 && what.find(fmt::format("rank {} failed", last)) == std::string::npos &&
      what.find(fmt::format("rank(s) {} failed", last)) == std::string::npos)
    fail.push_back(fmt::format("the error does not name rank {}: '{}'", last, what));
  if (!(values == before && opt.step_count() == count)) fail.push_back("the failed step changed state");
  if (comm.rank() == last) mend();
  return fail;
}

template <class Backend>
std::vector<std::string> check_sharded(AnyCommunicator comm) {
  const int rank = comm.rank(), size = comm.size();
  std::vector<std::string> fail;
  const auto expect = [&](bool ok, const std::string& what) {
    if (!ok) fail.push_back(fmt::format("rank {} of {}: {}", rank, size, what));
  };
  Options o;
  o.threads = 1;
  o.subgroup_elements = 1500;
  o.max_grad_norm = 0.05;  // small enough that every applied step clips
  o.loss_scaling = LossScaling{.init_scale = 1024, .growth_interval = 2};
  Shard mine(rank, size), all(0, 1);
  Options single = o;
  o.communicator = comm;
  InterleavedOptimizer<Backend> opt(mine.params, AdamW{.lr = 1e-2}, o);
  InterleavedOptimizer<Backend> ref(all.params, AdamW{.lr = 1e-2}, single);
  const auto agree_with_ref = [&](std::int64_t step) {
    double worst = 0;
    for (std::size_t k = 0; k < mine.tensors.size(); ++k)
      for (std::size_t i = 0; i < mine.values[k].size(); ++i) {
        const double a = mine.values[k][i], b = all.values[mine.tensors[k]][i];
        worst = std::max(worst, std::abs(a - b) / std::max(1.0, std::abs(b)));
      }
    expect(worst <= 1e-6, fmt::format("step {}: values differ from one process by {:g} (relative)", step, worst));
  };
  constexpr std::int64_t backward_step = 1, inf_step = 2, bad_step = 4, steps = 7;
  for (std::int64_t s = 0; s < steps; ++s) {
    mine.set_gradients(s, opt.loss_scale(), inf_step);
    all.set_gradients(s, ref.loss_scale(), inf_step);
    // Bad input on the last rank only: every rank's step() fails, naming it, and changes nothing.
    const auto fails_everywhere = [&](const std::function<void()>& spoil, const std::function<void()>& mend) {
      for (const auto& f : fails_on_every_rank(comm, opt, mine.values, spoil, mend)) expect(false, fmt::format("step {}: {}", s, f));
    };
    if (s == bad_step) {
      fails_everywhere([&] { opt.set_schedule(0, [](std::int64_t) { return -1.0; }); }, [&] { opt.set_schedule(0, {}); });
      fails_everywhere([&] { mine.grads.back().push_back(0); }, [&] { mine.grads.back().pop_back(); });
    }
    if (s == backward_step) {
      opt.begin_backward();
      ref.begin_backward();
      for (std::size_t p = 0; p < opt.num_params(); ++p) opt.grad_ready(p);
      for (std::size_t p = 0; p < ref.num_params(); ++p) ref.grad_ready(p);
    }
    const StepReport r = opt.step();
    const StepReport rr = ref.step();
    expect(same_on_every_rank(comm, r.grad_norm), fmt::format("step {}: grad norm {} differs across ranks", s, r.grad_norm));
    expect(same_on_every_rank(comm, r.loss_scale), fmt::format("step {}: loss scale differs across ranks", s));
    expect(r.applied == rr.applied && r.overflow == rr.overflow,
           fmt::format("step {}: applied {} (one process: {})", s, r.applied, rr.applied));
    expect(r.applied == (s != inf_step), fmt::format("step {}: applied {}, expected {}", s, r.applied, s != inf_step));
    if (r.applied) {
      expect(std::abs(r.grad_norm - rr.grad_norm) <= 1e-6 * rr.grad_norm,
             fmt::format("step {}: grad norm {} (one process: {})", s, r.grad_norm, rr.grad_norm));
      expect(rr.clip_coef < 1, fmt::format("step {}: the scenario does not clip (coef {})", s, rr.clip_coef));
    }
    expect(r.loss_scale == rr.loss_scale, fmt::format("step {}: loss scale {} (one process: {})", s, r.loss_scale, rr.loss_scale));
    agree_with_ref(s);
  }
  return fail;
}

}  // namespace dos::test
