// The all-CPU InterleavedOptimizer: construction, bad input (rejected with a clear
// message and no state change), the non-finite policy, parameter groups and lr
// schedules, state access, and independence from threads and subgroup sizes.

#include "support/inputs.hpp"
#include "support/trajectory.hpp"

#include <doctest/doctest.h>
#include <dos/optimizer.hpp>

#include <cmath>
#include <cstring>
#include <tuple>
#include <limits>
#include <variant>
#include <vector>

namespace {

using namespace dos;

struct Fixture {
  std::vector<std::vector<float>> values, grads;
  std::vector<HostParam<float>> params;
  explicit Fixture(std::vector<std::size_t> sizes = {1, 7, 10007, 1031}) {
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      values.emplace_back(sizes[t]);
      grads.emplace_back(sizes[t]);
      for (std::size_t i = 0; i < sizes[t]; ++i) values[t][i] = test::initial_param(t, i);
    }
    for (std::size_t t = 0; t < sizes.size(); ++t) params.push_back({values[t], grads[t]});
  }
  void set_gradients(std::int64_t step) {
    for (std::size_t t = 0; t < grads.size(); ++t)
      for (std::size_t i = 0; i < grads[t].size(); ++i) grads[t][i] = test::gradient(t, step, i);
  }
};

// Every byte of optimizer-owned and framework-owned state.
template <class Opt>
std::vector<float> snapshot(Opt& opt, const Fixture& f) {
  std::vector<float> all;
  for (auto kind : {StateKind::master, StateKind::exp_avg, StateKind::exp_avg_sq}) {
    const auto s = test::read_all(opt, kind);
    all.insert(all.end(), s.begin(), s.end());
  }
  for (const auto& v : f.values) all.insert(all.end(), v.begin(), v.end());
  return all;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("construction reports threads, kernels and subgroups") {
  Fixture f;
  InterleavedOptimizer<CpuBackend> opt(f.params, AdamW{}, {.subgroup_elements = 4096, .threads = 2});
  CHECK(opt.threads() == 2);
  CHECK(opt.simd_level() == detect_simd());
  CHECK(opt.num_params() == 4);
  CHECK(opt.num_groups() == 1);
  CHECK(opt.subgroups().size() == 4);  // [1 7] [10007 split] ... [1031 + rest]
  CHECK(opt.step_count() == 0);
  CpuOptimizer all_threads(f.params, Adam{});
  CHECK(all_threads.threads() == available_threads());
}

TEST_CASE("a large subgroup's state arrays are staggered, never a power of two apart") {
  for (const std::size_t n : {std::size_t{1} << 18, std::size_t{1} << 20}) {
    std::vector<float> value(n, 0.5f), grad(n, 1e-3f);
    std::vector<HostParam<float>> params{{value, grad}};
    CpuOptimizer opt(params, AdamW{}, {.subgroup_elements = n, .threads = 1});
    const std::size_t stride_bytes = opt.subgroups()[0].state_elements * sizeof(float);
    CHECK(stride_bytes % 4096 != 0);
    CHECK(stride_bytes % 64 == 0);  // every array still starts on a cache line
  }
  // Small subgroups are left alone: their copies to a device stay exact.
  std::vector<float> value(1024, 0.5f), grad(1024, 1e-3f);
  std::vector<HostParam<float>> params{{value, grad}};
  CpuOptimizer small(params, AdamW{}, {.subgroup_elements = 1024, .threads = 1});
  CHECK(small.subgroups()[0].state_elements == 1024);
}

TEST_CASE("step reports what it did") {
  Fixture f;
  CpuOptimizer opt(f.params, AdamW{}, {.threads = 1});
  f.set_gradients(1);
  const StepReport r = opt.step();
  CHECK(r.applied);
  CHECK(r.step == 1);
  CHECK(r.elements == 1 + 7 + 10007 + 1031);
  CHECK(r.seconds >= 0);
  CHECK(opt.step_count() == 1);
}

TEST_CASE("construction rejects null, misaligned and device-resident values") {
  std::vector<float> v(10);
  std::vector<unsigned char> raw(4 * 10 + 4);
  std::vector<HostParam<float>> null_value{{std::span<float>(static_cast<float*>(nullptr), 10), v}};
  CHECK_THROWS_WITH_AS(CpuOptimizer(null_value, AdamW{}), doctest::Contains("parameter 0: value pointer is null"),
                       std::invalid_argument);
  std::vector<HostParam<float>> misaligned{{v, v}, {std::span<float>(reinterpret_cast<float*>(raw.data() + 1), 10), v}};
  CHECK_THROWS_WITH_AS(CpuOptimizer(misaligned, AdamW{}), doctest::Contains("parameter 1: value pointer"),
                       std::invalid_argument);
}

namespace dos {
template <>
struct tensor_traits<std::pair<std::span<float>*, std::span<const float>*>> {
  static TensorView value(const std::pair<std::span<float>*, std::span<const float>*>& p) {
    return {p.first->data(), p.first->size(), DType::f32, Device::host};
  }
  static ConstTensorView grad(const std::pair<std::span<float>*, std::span<const float>*>& p) {
    return {p.second->data(), p.second->size(), DType::f32, Device::host};
  }
};
}  // namespace dos

TEST_CASE("views are re-read at every step and validated before any change") {
  using Live = std::pair<std::span<float>*, std::span<const float>*>;
  std::vector<float> v(100), g(100, 0.25f), v2(50), g2(50, -0.5f);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = float(i) / 100;
  std::span<float> sv(v), sv2(v2);
  std::span<const float> sg(g), sg2(g2);
  std::vector<Live> params{{&sv, &sg}, {&sv2, &sg2}};
  CpuOptimizer opt(params, Adam{.lr = 0.1}, {.subgroup_elements = 64, .threads = 2});
  CHECK(opt.subgroups().size() == 3);  // parameter 0 is split: errors must not leave half a step
  opt.step();
  const std::vector<float> v_before = v, v2_before = v2;
  std::vector<float> m_before(100);
  opt.read_state(0, StateKind::exp_avg, m_before);

  const auto rejected = [&](const char* what) {
    CAPTURE(what);
    CHECK_THROWS_AS(opt.step(), std::invalid_argument);
    CHECK(v == v_before);
    CHECK(v2 == v2_before);  // parameter 1 is fine but must not move either
    // State access validates the views too, so read it through good views.
    const auto bad = std::tuple(sv, sg, sv2, sg2);
    sv = std::span<float>(v), sg = std::span<const float>(g), sv2 = std::span<float>(v2), sg2 = std::span<const float>(g2);
    std::vector<float> m(100);
    opt.read_state(0, StateKind::exp_avg, m);
    CHECK(m == m_before);
    std::tie(sv, sg, sv2, sg2) = bad;
    CHECK(opt.step_count() == 1);
  };
  sv = std::span<float>(v).first(99);
  sg = std::span<const float>(g).first(99);
  CHECK_THROWS_WITH(opt.step(), doctest::Contains("parameter 0: value has 99 elements, but had 100"));
  rejected("resized");
  sv = std::span<float>(v);
  sg = std::span<const float>(g).first(98);
  CHECK_THROWS_WITH(opt.step(), doctest::Contains("parameter 0: gradient has 98 elements, but the value has 100"));
  rejected("length mismatch");
  sg = std::span<const float>(g);
  sv2 = std::span<float>(static_cast<float*>(nullptr), 50);
  CHECK_THROWS_WITH(opt.step(), doctest::Contains("parameter 1: value pointer is null"));
  rejected("null value");
  std::vector<unsigned char> raw(4 * 50 + 4);
  sv2 = std::span<float>(reinterpret_cast<float*>(raw.data() + 2), 50);
  CHECK_THROWS_WITH(opt.step(), doctest::Contains("not aligned to 4 bytes"));
  rejected("misaligned value");
  // State access validates the live view too: no write past a shrunk buffer.
  std::vector<float> m99(100);
  sv2 = std::span<float>(v2);
  sv = std::span<float>(v).first(99);
  CHECK_THROWS_WITH(opt.read_state(0, StateKind::master, m99), doctest::Contains("value has 99 elements"));
  sv = std::span<float>(v);
  CHECK(opt.step().applied);  // recovers once the views are good again
  CHECK(opt.step_count() == 2);
  // An absent gradient (null, no elements: torch's None) is not refused: the
  // parameter is skipped, and its own step count stays.
  const std::vector<float> v_kept = v, v2_moving = v2;
  sg = std::span<const float>();
  CHECK(opt.step().applied);
  CHECK(v == v_kept);
  CHECK(v2 != v2_moving);
  CHECK(opt.step_count() == 3);
  CHECK(opt.step_count(0) == 2);
  CHECK(opt.step_count(1) == 3);
}

TEST_CASE("construction rejects empty lists, bad options and bad hyperparameters") {
  std::vector<HostParam<float>> none;
  CHECK_THROWS_WITH_AS(CpuOptimizer(none, AdamW{}), doctest::Contains("parameter list is empty"), std::invalid_argument);
  Fixture f;
  CHECK_THROWS_WITH_AS(CpuOptimizer(f.params, AdamW{.lr = -1}), doctest::Contains("lr must be finite and >= 0, got -1"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(CpuOptimizer(f.params, AdamW{}, {.subgroup_elements = 0}),
                       doctest::Contains("subgroup_elements"), std::invalid_argument);
  std::vector<ParamGroup<HostParam<float>>> groups{{f.params, AdamW{}}, {{}, Adam{.beta2 = 1.0}}};
  CHECK_THROWS_WITH_AS(CpuOptimizer(groups, Options{}), doctest::Contains("parameter group 1: beta2"), std::invalid_argument);
}

TEST_CASE("hyperparameter changes are validated and leave the group intact when rejected") {
  Fixture f;
  CpuOptimizer opt(f.params, AdamW{.lr = 1e-3}, {.threads = 1});
  CHECK_THROWS_WITH_AS(opt.set_lr(0, -0.5), doctest::Contains("lr must be finite and >= 0, got -0.5"),
                       std::invalid_argument);
  CHECK(opt.hyperparameters(0).lr == 1e-3);
  CHECK_THROWS_WITH_AS(opt.set_lr(1, 0.1), doctest::Contains("group 1 does not exist"), std::invalid_argument);
  AdamConfig c = opt.hyperparameters(0);
  c.amsgrad = true;
  CHECK_THROWS_WITH_AS(opt.set_hyperparameters(0, c), doctest::Contains("amsgrad cannot change"), std::invalid_argument);
  opt.set_lr(0, 5e-4);
  CHECK(opt.hyperparameters(0).lr == 5e-4);
}

TEST_CASE("skip_step: a non-finite gradient changes nothing and is reported") {
  Fixture f;
  CpuOptimizer opt(f.params, AdamW{}, {.subgroup_elements = 2000, .threads = 2, .nonfinite = NonFinitePolicy::skip_step});
  f.set_gradients(1);
  CHECK(opt.step().applied);
  f.set_gradients(2);
  f.grads[2][9000] = NAN;
  f.grads[3][5] = -INFINITY;
  const auto before = snapshot(opt, f);
  const StepReport r = opt.step();
  CHECK_FALSE(r.applied);
  CHECK(r.nonfinite_params == 2);
  CHECK(r.first_nonfinite_param == 2);
  CHECK(r.step == 1);
  CHECK(same_bits(snapshot(opt, f), before));
  // The next good step is step 2, as if the bad one never happened.
  f.set_gradients(2);
  CHECK(opt.step().step == 2);
}

TEST_CASE("propagate: a non-finite gradient flows into the state, as in torch") {
  Fixture f({16});
  CpuOptimizer opt(f.params, Adam{}, {.threads = 1});
  f.grads[0][3] = NAN;
  CHECK(opt.step().applied);
  CHECK(std::isnan(f.values[0][3]));
  CHECK_FALSE(std::isnan(f.values[0][4]));
}

TEST_CASE("results are bit-identical whatever the threads and subgroup sizes") {
  std::vector<float> reference;
  for (unsigned threads : {1u, 2u, 5u})
    for (std::size_t sub : {std::size_t{16}, std::size_t{1000}, std::size_t{100'000'000}}) {
      Fixture f;
      CpuOptimizer opt(f.params, AdamW{.amsgrad = true}, {.subgroup_elements = sub, .threads = threads});
      for (int t = 1; t <= 5; ++t) {
        f.set_gradients(t);
        opt.step();
      }
      auto s = snapshot(opt, f);
      const auto vmax = test::read_all(opt, StateKind::max_exp_avg_sq);
      s.insert(s.end(), vmax.begin(), vmax.end());
      if (reference.empty()) reference = s;
      CAPTURE(threads);
      CAPTURE(sub);
      CHECK(same_bits(s, reference));
    }
}

TEST_CASE("groups: no weight decay on the bias group, and per-group lr schedules") {
  std::vector<float> w(64, 1.0f), gw(64, 0.0f), b(8, 1.0f), gb(8, 0.0f);
  std::vector<ParamGroup<HostParam<float>>> groups{{{{w, gw}}, AdamW{.lr = 0.1, .weight_decay = 0.5}},
                                                   {{{b, gb}}, AdamW{.lr = 0.1, .weight_decay = 0.0}}};
  CpuOptimizer opt(groups, {.threads = 1});
  CHECK(opt.num_groups() == 2);
  opt.step();  // zero gradient: only decoupled decay moves anything
  CHECK(w[0] == doctest::Approx(1.0f - 0.1f * 0.5f));
  CHECK(b[0] == 1.0f);
  opt.set_lr(0, 0.0);
  opt.step();
  CHECK(w[0] == doctest::Approx(0.95f));  // lr 0: no change at all
  for (const auto& sg : opt.subgroups()) {
    // subgroups never mix groups
    const std::size_t first = sg.segments.front().tensor;
    for (const auto& seg : sg.segments) CHECK((seg.tensor == 0) == (first == 0));
  }
}

TEST_CASE("mixed fp32 and bf16 parameters in one optimizer") {
  using Any = std::variant<HostParam<float>, HostParam<bf16>>;
  // 0.5 and 0.125 are exact in bf16, so both parameters see identical inputs.
  std::vector<float> a(100, 0.5f), ga(100, 0.125f);
  std::vector<bf16> b(100, bf16(0.5f)), gb(100, bf16(0.125f));
  std::vector<Any> params{HostParam<float>{a, ga}, HostParam<bf16>{b, gb}};
  CpuOptimizer opt(params, Adam{.lr = 0.01}, {.subgroup_elements = 150, .threads = 2});
  for (int t = 0; t < 3; ++t) opt.step();
  std::vector<float> master(100);
  opt.read_state(1, StateKind::master, master);
  // Same inputs, so the bf16 master equals the fp32 value exactly, and the bf16
  // copy is that master rounded once.
  CHECK(master == a);
  CHECK(b[7] == bf16(a[7]));
}

TEST_CASE("write_state and read_state round-trip, for resuming from a checkpoint") {
  Fixture f({33, 7});
  CpuOptimizer opt(f.params, AdamW{.amsgrad = true}, {.subgroup_elements = 16, .threads = 1});
  std::vector<float> m(33), back(33);
  for (std::size_t i = 0; i < m.size(); ++i) m[i] = float(i);
  opt.write_state(0, StateKind::exp_avg, m);
  opt.read_state(0, StateKind::exp_avg, back);
  CHECK(back == m);
  opt.write_state(0, StateKind::master, m);  // fp32: the value is the master
  CHECK(f.values[0] == m);
  CHECK_THROWS_WITH_AS(opt.read_state(0, StateKind::exp_avg, std::span<float>(back).first(5)),
                       doctest::Contains("state buffer has 5 elements, the parameter has 33"), std::invalid_argument);
  CHECK_THROWS_AS(opt.read_state(9, StateKind::exp_avg, back), std::invalid_argument);
  opt.set_step_count(100);
  CHECK(opt.step_count() == 100);
  CHECK_THROWS_AS(opt.set_step_count(-1), std::invalid_argument);
  CHECK_THROWS_AS(opt.set_step_count(std::numeric_limits<std::int64_t>::max()), std::invalid_argument);
}

TEST_CASE("moments start at exactly zero (trap 5.4)") {
  Fixture f({1000});
  CpuOptimizer opt(f.params, AdamW{.amsgrad = true}, {.threads = 1});
  for (auto kind : {StateKind::exp_avg, StateKind::exp_avg_sq, StateKind::max_exp_avg_sq}) {
    const auto s = test::read_all(opt, kind);
    bool zero = true;
    for (float x : s) zero &= (x == 0.0f);
    CHECK(zero);
  }
}

TEST_CASE("training options: invalid clipping and loss scaling are rejected by name") {
  Fixture f;
  Options o;
  o.max_grad_norm = -1;
  CHECK_THROWS_WITH_AS(CpuOptimizer(f.params, AdamW{}, o), "dos: max_grad_norm must be finite and >= 0, got -1",
                       std::invalid_argument);
  o.max_grad_norm = 1;
  o.loss_scaling = LossScaling{.init_scale = 1000};
  CHECK_THROWS_WITH_AS(CpuOptimizer(f.params, AdamW{}, o), "dos: loss_scaling.init_scale must be a power of two, got 1000",
                       std::invalid_argument);
  o.loss_scaling = LossScaling{.backoff_factor = 1.5};
  CHECK_THROWS_WITH_AS(CpuOptimizer(f.params, AdamW{}, o), "dos: loss_scaling.backoff_factor must be in (0, 1), got 1.5",
                       std::invalid_argument);
}

TEST_CASE("clipping with a NaN gradient poisons every update, as torch's clip_grad_norm_ does") {
  Fixture f({8, 8});
  Options o{.threads = 1};
  o.max_grad_norm = 1.0;
  CpuOptimizer opt(f.params, AdamW{}, o);
  f.set_gradients(1);
  f.grads[0][3] = std::numeric_limits<float>::quiet_NaN();
  const StepReport r = opt.step();
  CHECK(std::isnan(r.clip_coef));
  CHECK(std::isnan(f.values[1][0]));  // a tensor with finite gradients, scaled by NaN
}

TEST_CASE("a throwing step forgets what grad_ready() gathered; the retry reads the gradients again") {
  Fixture f({64});
  Options o{.threads = 1};
  o.max_grad_norm = 1e6;
  CpuOptimizer opt(f.params, AdamW{}, o);
  opt.begin_backward();
  f.set_gradients(1);
  opt.grad_ready(0);
  opt.set_schedule(0, [](std::int64_t) { return -1.0; });  // makes the next step throw
  CHECK_THROWS_AS(opt.step(), std::invalid_argument);
  opt.set_schedule(0, {});
  for (float& g : f.grads[0]) g *= 100;
  double expect = 0;
  for (float g : f.grads[0]) expect += static_cast<double>(g) * g;
  const StepReport r = opt.step();
  CHECK(r.grad_norm == doctest::Approx(std::sqrt(expect)).epsilon(1e-6));
}

// Options::caller_huge_pages moves the caller's values and gradients onto huge pages at
// construction: the values keep every bit, and the steps after it are the same as on
// arrays left where they were.
TEST_CASE("moving the caller's arrays onto huge pages changes no bit") {
  const std::size_t n = (std::size_t{5} << 20) / sizeof(float) + 333;  // two whole 2 MiB pages inside, at least
  Fixture moved({n, 17}), kept({n, 17});
  const std::vector<float> before = moved.values[0];
  InterleavedOptimizer<CpuBackend> a(moved.params, AdamW{}, {.subgroup_elements = 1 << 20, .threads = 2});
  CHECK(same_bits(moved.values[0], before));
  InterleavedOptimizer<CpuBackend> b(kept.params, AdamW{},
                                     {.subgroup_elements = 1 << 20, .threads = 2, .caller_huge_pages = false});
  for (std::int64_t s = 0; s < 3; ++s) {
    moved.set_gradients(s);
    kept.set_gradients(s);
    a.step();
    b.step();
  }
  CHECK(same_bits(snapshot(a, moved), snapshot(b, kept)));
}

namespace {
// Ranks that are all on this node, with collectives that are never called here.
struct NodeOfFour {
  int rank() const { return 0; }
  int size() const { return 4; }
  int local_rank() const { return 0; }
  int local_size() const { return 4; }
  void all_reduce(std::span<double>, ReduceOp) {}
  void all_gather(std::span<const float>, std::span<float>, std::span<const std::size_t>) {}
  void reduce_scatter(std::span<const float>, std::span<float>, std::span<const std::size_t>) {}
  void barrier() {}
};
}  // namespace

TEST_CASE("threads = 0 shares the node's CPUs among the ranks on it; an explicit count is kept") {
  Options o;
  o.communicator = NodeOfFour{};
  CHECK(o.cpu().threads == threads_for_rank(4));
  CHECK(o.cpu().threads <= std::max(1u, available_threads()));
  o.threads = 3;
  CHECK(o.cpu().threads == 3);
  CHECK(Options{}.cpu().threads == available_threads());
}
