#pragma once
// ZeRO-1 and ZeRO-2 (ShardedOptimizer: dos shards the optimizer itself), checked on any
// communicator, by the thread-rank test and by the mpiexec test alike:
//  - shares: balanced (sizes differ by at most one element), tiling the model, an empty
//    share where ranks outnumber elements;
//  - ZeRO-1 without clipping: every rank's values are bit-identical to one process
//    (InterleavedOptimizer, SingleProcess) stepping the same gradients, and each rank's
//    master, m and v are bit-identical to that process's for its share; also on a model
//    of 3 elements, where a 4th rank owns nothing, and with bf16 values (gathered as
//    floats, rounded back);
//  - ZeRO-1 with clipping and loss scaling: the grad norm, the values and the share's
//    state bit-identical to one process (the norm taken from the whole model as one
//    process takes it), also with segments of several chunks; an inf in the (averaged, so every rank's) gradient skips the step
//    on every rank; bad input on the last rank (a gradient of the wrong size, a bad
//    scheduled lr) fails every rank naming it, with nothing changed, and the steps go on;
//  - ZeRO-2: each rank's own gradients; values within 1e-6 of one process stepping their
//    mean and bit-identical across ranks; an inf in the last rank's gradient alone makes
//    every rank skip; bad input fails every rank as above; without clipping, on the
//    3-element model too, and bit-exact with bf16 values on inputs whose sums are exact;
//  - grad_ready during backward, clipped: the same bits as without it (ZeRO-1: one
//    process; ZeRO-2: the step reducing every gradient); ZeRO-2 ranks reporting other
//    tensors, or stepping while one reports, or after an uneven begin_backward, or a
//    bad index, fail every rank, named, and all forget what was reported;
//  - construction: the last rank passing one tensor fewer, or asking for ZeRO-2 where
//    the others ask for ZeRO-1, fails every rank, naming it;
//    InterleavedOptimizer refuses zero1 and zero2, naming ShardedOptimizer.
// Every scenario runs on the CPU backend; on a device backend (the emulated device),
// the first ZeRO-1 and ZeRO-2 ones. Returns what failed, each line naming the rank.

#include "support/sharded.hpp"

#include <dos/shard/sharded_optimizer.hpp>

#include <bit>
#include <cstdint>
#include <span>

namespace dos::test {

// Every tensor, as every rank holds it in ZeRO-1 and ZeRO-2, with values of type V.
template <class V = float>
struct FullModel {
  std::vector<std::vector<V>> values;
  std::vector<std::vector<float>> grads;
  std::vector<VectorParam<V>> params;  // bf16 values with float32 gradients: ZeRO-2 reduces float32
  explicit FullModel(std::span<const std::size_t> sizes, std::size_t drop_last = 0) {
    for (std::size_t t = 0; t + drop_last < sizes.size(); ++t) {
      values.emplace_back(sizes[t]);
      grads.emplace_back(sizes[t]);
      for (std::size_t i = 0; i < sizes[t]; ++i) values[t][i] = V(initial_param(t, i));
    }
    for (std::size_t t = 0; t < values.size(); ++t) params.push_back({&values[t], &grads[t]});
  }
  // Rank @p rank's gradients: weighted by 1 + rank / 4 (exact), so ranks differ; with an
  // inf at element 0 of the last tensor at step @p inf_step.
  void set_gradients(std::int64_t step, double scale, int rank, std::int64_t inf_step) {
    for (std::size_t t = 0; t < grads.size(); ++t)
      for (std::size_t i = 0; i < grads[t].size(); ++i)
        grads[t][i] = gradient(t, step, i) * (1.0f + 0.25f * static_cast<float>(rank)) * static_cast<float>(scale);
    if (step == inf_step) grads.back()[0] = std::numeric_limits<float>::infinity();
  }
  // The mean over @p ranks ranks' gradients, summed in rank order, then divided.
  void set_mean_gradients(std::int64_t step, double scale, int ranks) {
    FullModel one(*this);
    for (auto& g : grads) std::fill(g.begin(), g.end(), 0.0f);
    for (int r = 0; r < ranks; ++r) {
      one.set_gradients(step, scale, r, -1);
      for (std::size_t t = 0; t < grads.size(); ++t)
        for (std::size_t i = 0; i < grads[t].size(); ++i) grads[t][i] += one.grads[t][i];
    }
    for (auto& g : grads)
      for (float& x : g) x /= static_cast<float>(ranks);
  }
  FullModel(const FullModel& o) : values(o.values), grads(o.grads) {
    for (std::size_t t = 0; t < values.size(); ++t) params.push_back({&values[t], &grads[t]});
  }
  // A 52-bit digest of every value's bits: equal on every rank iff (almost surely) the values are.
  double digest() const {
    std::uint64_t h = 0;
    for (const auto& v : values)
      for (const V x : v) h = mix(h ^ std::bit_cast<std::uint32_t>(static_cast<float>(x)));
    return static_cast<double>(h >> 12);
  }
};

template <class V>
bool same_bits(std::span<const V> a, std::span<const V> b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)  // float32 holds a bf16 exactly
    if (std::bit_cast<std::uint32_t>(static_cast<float>(a[i])) !=
        std::bit_cast<std::uint32_t>(static_cast<float>(b[i])))
      return false;
  return true;
}

inline constexpr std::size_t tiny_sizes[] = {2, 1};  // 3 elements: with 4 ranks, rank 3 owns none
// With 50000-element subgroups: segments of several 32K-element chunks, and a tensor cut in two.
inline constexpr std::size_t chunked_sizes[] = {70001, 3, 40000, 5};

template <class Backend>
class ZeroCheck {
 public:
  explicit ZeroCheck(AnyCommunicator comm) : comm_(std::move(comm)), rank_(comm_.rank()), size_(comm_.size()) {}

  std::vector<std::string> run() {
    exact(sharded_sizes, Sharding::zero1, true);
    if constexpr (DeviceBackend<Backend>) {
      // The emulated device takes its time per transfer: the local optimizer on it in
      // both modes, once each (the CPU runs every scenario; sharded.hpp clips on it).
      exact(sharded_sizes, Sharding::zero2, false);
      return fail_;
    }
    exact(tiny_sizes, Sharding::zero1, true);
    exact(sharded_sizes, Sharding::zero2, false);
    exact(tiny_sizes, Sharding::zero2, false);
    exact<bf16>(sharded_sizes, Sharding::zero1, true);
    // These gradients are small dyadic numbers: their sum is exact in any order, so the
    // mean is one process's to the bit, and so are bf16 values rounded from it.
    exact<bf16>(sharded_sizes, Sharding::zero2, true);
    clipped(Sharding::zero1);
    clipped(Sharding::zero1, chunked_sizes, 50000);
    clipped(Sharding::zero2);
    reported(Sharding::zero1);
    reported(Sharding::zero2);
    construction();
    return fail_;
  }

 private:
  void expect(bool ok, const std::string& what) {
    if (!ok) fail_.push_back(fmt::format("rank {} of {}: {}", rank_, size_, what));
  }
  Options options(Sharding mode) const {
    Options o;
    o.threads = 1;
    o.subgroup_elements = 1500;
    o.sharding = mode;
    o.communicator = comm_;
    return o;
  }
  static Options single(Options o) {
    o.sharding = Sharding::framework;
    o.communicator = AnyCommunicator{};
    return o;
  }
  void check_share(const ZeroShare& s, std::size_t total, const char* what) {
    const std::size_t lo = total / static_cast<std::size_t>(size_);
    expect(s.numel() == lo || s.numel() == lo + 1,
           fmt::format("{}: a share of {} elements of {}", what, s.numel(), total));
    std::vector<double> sum{static_cast<double>(s.numel())};
    comm_.all_reduce(sum, ReduceOp::sum);
    expect(sum[0] == static_cast<double>(total), fmt::format("{}: the shares add up to {} of {}", what, sum[0], total));
  }

  // Without clipping: ZeRO-1 bit-identical to one process (values and the share's state);
  // ZeRO-2 within 1e-6 of one process stepping the mean.
  template <class V = float>
  void exact(std::span<const std::size_t> sizes, Sharding mode, bool bitwise) {
    const std::string what =
        fmt::format("{} on {} {} tensors", sharding_name(mode), sizes.size(), dtype_name(dtype_of<V>));
    FullModel<V> mine(sizes), ref(sizes);
    ShardedOptimizer<Backend> opt(mine.params, AdamW{.lr = 1e-2}, options(mode));
    InterleavedOptimizer<Backend> one(ref.params, AdamW{.lr = 1e-2}, single(options(mode)));
    std::size_t total = 0;
    for (const std::size_t n : sizes) total += n;
    check_share(opt.share(), total, what.c_str());
    for (std::int64_t s = 0; s < 4; ++s) {
      mine.set_gradients(s, 1, mode == Sharding::zero1 ? 0 : rank_, -1);
      ref.set_mean_gradients(s, 1, mode == Sharding::zero1 ? 1 : size_);
      const StepReport r = opt.step();
      one.step();
      expect(r.applied && opt.step_count() == s + 1, fmt::format("{}: step {} not applied", what, s));
      for (std::size_t t = 0; t < sizes.size(); ++t)
        if (bitwise) {
          expect(same_bits<V>(mine.values[t], ref.values[t]),
                 fmt::format("{}: step {}: tensor {} is not bit-identical to one process", what, s, t));
        } else {
          expect(worst(mine.values[t], ref.values[t]) <= 1e-6,
                 fmt::format("{}: step {}: tensor {} differs from one process by {:g}", what, s, t,
                             worst(mine.values[t], ref.values[t])));
        }
      expect(same_on_every_rank(comm_, mine.digest()), fmt::format("{}: step {}: values differ across ranks", what, s));
    }
    if (bitwise) same_state(opt, one, sizes, what);
  }

  // Each piece's master, m and v against one process's, bit for bit.
  void same_state(ShardedOptimizer<Backend>& opt, InterleavedOptimizer<Backend>& one,
                  std::span<const std::size_t> sizes, const std::string& what) {
    const auto& pieces = opt.share().pieces();
    for (std::size_t k = 0; k < pieces.size(); ++k)
      for (const StateKind kind : {StateKind::master, StateKind::exp_avg, StateKind::exp_avg_sq}) {
        std::vector<float> part(pieces[k].numel), whole(sizes[pieces[k].tensor]);
        opt.local().read_state(k, kind, part);
        one.read_state(pieces[k].tensor, kind, whole);
        expect(same_bits<float>(part, std::span<const float>(whole).subspan(pieces[k].offset, pieces[k].numel)),
               fmt::format("{}: piece {} (tensor {}): state {} not bit-identical to one process", what, k,
                           pieces[k].tensor, static_cast<int>(kind)));
      }
  }

  // Clipping by the global norm and loss scaling, an overflow, and bad input on the last
  // rank. ZeRO-1 takes the norm as one process does: bit-identical to it, also on tensors
  // whose segments hold several 32K-element chunks (@p sizes, @p subgroup_elements).
  void clipped(Sharding mode, std::span<const std::size_t> sizes = sharded_sizes, std::size_t subgroup_elements = 1500) {
    const std::string what = fmt::format("{} clipped, {} elements per subgroup", sharding_name(mode), subgroup_elements);
    const bool bitwise = mode == Sharding::zero1;
    Options o = options(mode);
    o.subgroup_elements = subgroup_elements;
    o.max_grad_norm = 0.05;  // small enough that every applied step clips
    o.loss_scaling = LossScaling{.init_scale = 1024, .growth_interval = 2};
    FullModel<> mine(sizes), ref(sizes);
    ShardedOptimizer<Backend> opt(mine.params, AdamW{.lr = 1e-2}, o);
    InterleavedOptimizer<Backend> one(ref.params, AdamW{.lr = 1e-2}, single(o));
    constexpr std::int64_t inf_step = 2, bad_step = 4, steps = 6;
    const int grad_rank = mode == Sharding::zero1 ? 0 : rank_;  // ZeRO-1: the averaged gradient, the same everywhere
    for (std::int64_t s = 0; s < steps; ++s) {
      const bool inf_here = mode == Sharding::zero1 || rank_ == size_ - 1;  // ZeRO-2: the last rank's alone
      mine.set_gradients(s, opt.loss_scale(), grad_rank, inf_here ? inf_step : -1);
      ref.set_mean_gradients(s, one.loss_scale(), mode == Sharding::zero1 ? 1 : size_);
      if (s == inf_step) ref.grads.back()[0] = std::numeric_limits<float>::infinity();
      if (s == bad_step) {
        fails_everywhere(
            opt, mine, what, [&] { mine.grads[2].push_back(0); }, [&] { mine.grads[2].pop_back(); });
        fails_everywhere(
            opt, mine, what, [&] { opt.local().set_schedule(0, [](std::int64_t) { return -1.0; }); },
            [&] { opt.local().set_schedule(0, {}); });
      }
      const StepReport r = opt.step();
      const StepReport rr = one.step();
      expect(r.applied == (s != inf_step) && rr.applied == r.applied,
             fmt::format("{}: step {}: applied {}", what, s, r.applied));
      expect(same_on_every_rank(comm_, r.grad_norm),
             fmt::format("{}: step {}: grad norm differs across ranks", what, s));
      expect(same_on_every_rank(comm_, mine.digest()), fmt::format("{}: step {}: values differ across ranks", what, s));
      expect(r.loss_scale == rr.loss_scale,
             fmt::format("{}: step {}: loss scale {} (one process: {})", what, s, r.loss_scale, rr.loss_scale));
      if (r.applied && bitwise) {
        expect(std::bit_cast<std::uint64_t>(r.grad_norm) == std::bit_cast<std::uint64_t>(rr.grad_norm),
               fmt::format("{}: step {}: grad norm {:.17g} (one process: {:.17g})", what, s, r.grad_norm, rr.grad_norm));
        for (std::size_t t = 0; t < mine.values.size(); ++t)
          expect(same_bits<float>(mine.values[t], ref.values[t]),
                 fmt::format("{}: step {}: tensor {} is not bit-identical to one process", what, s, t));
      }
      if (r.applied) {
        expect(std::abs(r.grad_norm - rr.grad_norm) <= 1e-6 * rr.grad_norm,
               fmt::format("{}: step {}: grad norm {} (one process: {})", what, s, r.grad_norm, rr.grad_norm));
        expect(rr.clip_coef < 1, fmt::format("{}: step {}: the scenario does not clip", what, s));
      }
      for (std::size_t t = 0; t < mine.values.size(); ++t)
        expect(worst(mine.values[t], ref.values[t]) <= 1e-6,
               fmt::format("{}: step {}: tensor {} differs from one process by {:g}", what, s, t,
                           worst(mine.values[t], ref.values[t])));
    }
    if (bitwise) same_state(opt, one, sizes, what);
  }

  // Gradients reported during backward (begin_backward, grad_ready from the last tensor
  // to the first, some of them only in ZeRO-1), clipped and loss-scaled: the same bits
  // as a step that reads them all (ZeRO-1: one process; ZeRO-2: the same sharded
  // optimizer without reports). In ZeRO-2 ranks reporting different tensors, or one
  // reporting while the others step, fail every rank, naming the odd one, changing nothing.
  void reported(Sharding mode) {
    const std::string what = fmt::format("{} with grad_ready", sharding_name(mode));
    Options o = options(mode);
    o.max_grad_norm = 0.05;
    o.loss_scaling = LossScaling{.init_scale = 1024, .growth_interval = 2};
    FullModel<> mine(sharded_sizes), ref(sharded_sizes);
    ShardedOptimizer<Backend> opt(mine.params, AdamW{.lr = 1e-2}, o);
    std::optional<InterleavedOptimizer<Backend>> one;
    std::optional<ShardedOptimizer<Backend>> plain;
    if (mode == Sharding::zero1) one.emplace(ref.params, AdamW{.lr = 1e-2}, single(o));
    else plain.emplace(ref.params, AdamW{.lr = 1e-2}, o);
    const int grad_rank = mode == Sharding::zero1 ? 0 : rank_;
    const int last = size_ - 1;
    for (std::int64_t s = 0; s < 4; ++s) {
      const double scale = opt.loss_scale();
      mine.set_gradients(s, scale, grad_rank, -1);
      ref.set_gradients(s, scale, grad_rank, -1);
      if (s == 1 && mode == Sharding::zero2 && size_ > 1) {
        const double before = mine.digest();
        const auto odd = [&](std::function<void()> mine_call, std::function<void()> last_call, const std::string& named) {
          std::string error;
          try {
            if (rank_ == last) last_call();
            else mine_call();
          } catch (const std::invalid_argument& e) {
            error = e.what();
          }
          expect(error.find(named) != std::string::npos,
                 fmt::format("{}: rank {} elsewhere: the error does not say '{}': '{}'", what, last, named, error));
        };
        opt.begin_backward();
        opt.grad_ready(0);  // every rank: tensor 0 reduced
        // One rank reports while the others step: all fail and all forget tensor 0, so
        // the next calls pair up again without a begin_backward.
        odd([&] { opt.step(); }, [&] { opt.grad_ready(2); }, "grad_ready(2)");
        opt.grad_ready(0);
        // An uneven begin_backward: rank 0 forgot tensor 0, the others did not.
        if (rank_ == 0) opt.begin_backward();
        odd([&] { opt.step(); }, [&] { opt.step(); }, "after other reports");
        odd([&] { opt.grad_ready(0); }, [&] { opt.grad_ready(1); }, fmt::format("rank {} in grad_ready(1)", last));
        odd([&] { opt.grad_ready(0); }, [&] { opt.grad_ready(sharded_count); },
            fmt::format("{} failed", last));
        expect(mine.digest() == before && opt.step_count() == s, what + ": a refused report changed something");
      }
      opt.begin_backward();
      for (std::size_t t = sharded_count; t-- > 0;)
        if (mode == Sharding::zero2 || t % 2 == 0) opt.grad_ready(t);
      const StepReport r = opt.step();
      const StepReport rr = one ? one->step() : plain->step();
      expect(r.applied && rr.applied, fmt::format("{}: step {} not applied", what, s));
      expect(std::bit_cast<std::uint64_t>(r.grad_norm) == std::bit_cast<std::uint64_t>(rr.grad_norm),
             fmt::format("{}: step {}: grad norm {:.17g}, without reports {:.17g}", what, s, r.grad_norm, rr.grad_norm));
      for (std::size_t t = 0; t < sharded_count; ++t)
        expect(same_bits<float>(mine.values[t], ref.values[t]),
               fmt::format("{}: step {}: tensor {} is not bit-identical to the step without reports", what, s, t));
    }
  }

  void fails_everywhere(ShardedOptimizer<Backend>& opt, FullModel<>& mine, const std::string& what,
                        const std::function<void()>& spoil, const std::function<void()>& mend) {
    for (const auto& f : fails_on_every_rank(comm_, opt, mine.values, spoil, mend)) expect(false, what + ": " + f);
  }

  void construction() {
    FullModel<> mine(sharded_sizes, rank_ == size_ - 1 && size_ > 1 ? 1 : 0);
    std::string error;
    try {
      ShardedOptimizer<Backend> opt(mine.params, AdamW{}, options(Sharding::zero1));
    } catch (const std::invalid_argument& e) {
      error = e.what();
    }
    if (size_ > 1)
      expect(error.find(fmt::format("rank {} (6 tensors", size_ - 1)) != std::string::npos,
             fmt::format("one tensor fewer on rank {}: '{}'", size_ - 1, error));
    else
      expect(error.empty(), "one rank alone failed to build: " + error);
    error.clear();
    FullModel<> same(sharded_sizes);  // the last rank asks for ZeRO-2, the others for ZeRO-1
    try {
      ShardedOptimizer<Backend> opt(same.params, AdamW{},
                                    options(rank_ == size_ - 1 && size_ > 1 ? Sharding::zero2 : Sharding::zero1));
    } catch (const std::invalid_argument& e) {
      error = e.what();
    }
    if (size_ > 1)
      expect(error.find(fmt::format("rank {} (7 tensors", size_ - 1)) != std::string::npos,
             fmt::format("another mode on rank {}: '{}'", size_ - 1, error));
    error.clear();
    try {
      InterleavedOptimizer<Backend> wrong(mine.params, AdamW{}, options(Sharding::zero2));
    } catch (const std::invalid_argument& e) {
      error = e.what();
    }
    expect(error.find("ShardedOptimizer") != std::string::npos, "InterleavedOptimizer took zero2: '" + error + "'");
  }

  template <class V>
  static double worst(const std::vector<V>& a, const std::vector<V>& b) {
    double w = 0;
    for (std::size_t i = 0; i < a.size(); ++i)
      w = std::max(w, std::abs(static_cast<double>(static_cast<float>(a[i])) - static_cast<float>(b[i])) /
                          std::max(1.0, std::abs(static_cast<double>(static_cast<float>(b[i])))));
    return w;
  }

  AnyCommunicator comm_;
  int rank_, size_;
  std::vector<std::string> fail_;
};

template <class Backend>
std::vector<std::string> check_zero(AnyCommunicator comm) {
  return ZeroCheck<Backend>(std::move(comm)).run();
}

}  // namespace dos::test
