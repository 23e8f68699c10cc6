// dos checkpoints and torch::optim::AdamW, both ways: a dos checkpoint's state put
// into torch's AdamW continues dos's trajectory, and torch's AdamW state written as a
// dos checkpoint and loaded continues torch's (losses within 1e-4 relative at every
// step, the tolerance of test_torch_training).

#include "support/checkpoint_run.hpp"
#include "tiny_model.hpp"

#include <c10/util/string_utils.h>
#include <doctest/doctest.h>
#include <dos/adapters/torch.hpp>
#include <dos/checkpoint.hpp>

#include <cmath>
#include <memory>
#include <vector>

using namespace dos;
using test::TempDir;
using test::TinyLm;

namespace {

constexpr double kLr = 3e-3, kWeightDecay = 0.1;
constexpr int kBefore = 15, kAfter = 25;

std::unique_ptr<TorchOptimizer<CpuBackend>> make_dos(TinyLm& m) {
  auto [decay, no_decay] = test::decay_groups(m);
  std::vector<ParamGroup<at::Tensor>> groups{{decay, AdamW{.lr = kLr, .weight_decay = kWeightDecay}},
                                             {no_decay, AdamW{.lr = kLr, .weight_decay = 0.0}}};
  return std::make_unique<TorchOptimizer<CpuBackend>>(std::move(groups), Options{.subgroup_elements = 1000, .threads = 1});
}

std::unique_ptr<torch::optim::AdamW> make_torch(TinyLm& m) {
  auto [decay, no_decay] = test::decay_groups(m);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(kLr).weight_decay(kWeightDecay)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(kLr).weight_decay(0.0)));
  return std::make_unique<torch::optim::AdamW>(std::move(groups), torch::optim::AdamWOptions(kLr));
}

std::vector<at::Tensor> ordered_params(torch::optim::AdamW& opt) {
  std::vector<at::Tensor> out;
  for (auto& g : opt.param_groups())
    for (auto& p : g.params()) out.push_back(p);
  return out;
}

double train_step(TinyLm& m, int s, auto& opt) {
  opt.zero_grad();
  auto loss = test::loss_of(m, test::batch(s, 16));
  loss.backward();
  opt.step();
  return loss.item<double>();
}

void copy_weights(TinyLm& from, TinyLm& to) {
  torch::NoGradGuard g;
  auto a = from->parameters(), b = to->parameters();
  for (std::size_t i = 0; i < a.size(); ++i) b[i].copy_(a[i]);
}

// Runs both from step kBefore on, the same batches; the worst relative loss difference.
double run_both(TinyLm& a, auto& opt_a, TinyLm& b, auto& opt_b) {
  double worst = 0;
  for (int s = kBefore; s < kBefore + kAfter; ++s) {
    const double x = train_step(a, s, opt_a), y = train_step(b, s, opt_b);
    worst = std::max(worst, std::abs(x - y) / std::abs(x));
  }
  return worst;
}
void continue_both(TinyLm& a, auto& opt_a, TinyLm& b, auto& opt_b) {
  const double worst = run_both(a, opt_a, b, opt_b);
  MESSAGE("worst relative loss difference after the hand-over: " << worst);
  CHECK(worst <= 1e-4);
}

}  // namespace

TEST_CASE("a dos checkpoint loaded into torch::optim::AdamW continues dos's trajectory") {
  torch::set_num_threads(1);
  TinyLm a = test::make_model(), b = test::make_model(7);
  auto dos_opt = make_dos(a);
  for (int s = 0; s < kBefore; ++s) train_step(a, s, *dos_opt);
  TempDir dir("to_torch");
  save(dos_opt->engine(), dir.path);

  // The framework's own weights, then the optimizer state from the checkpoint.
  copy_weights(a, b);
  auto torch_opt = make_torch(b);
  const checkpoint::CheckpointReader r(dir.path);
  const auto params = ordered_params(*torch_opt);
  REQUIRE(params.size() == r.index().params.size());
  for (std::size_t p = 0; p < params.size(); ++p) {
    const auto n = static_cast<std::size_t>(params[p].numel());
    auto from = [&](const char* kind) {
      const std::span<const float> d = r.tensor(fmt::format("state.{}.{}", p, kind), n);
      return torch::from_blob(const_cast<float*>(d.data()), params[p].sizes(), torch::kFloat32).clone();
    };
    auto st = std::make_unique<torch::optim::AdamWParamState>();
    st->step(r.index().step_count);
    st->exp_avg(from("exp_avg"));
    st->exp_avg_sq(from("exp_avg_sq"));
    torch_opt->state()[c10::guts::to_string(params[p].unsafeGetTensorImpl())] = std::move(st);
  }
  for (std::size_t g = 0; g < torch_opt->param_groups().size(); ++g)
    static_cast<torch::optim::AdamWOptions&>(torch_opt->param_groups()[g].options()).lr(r.index().groups[g].lr);
  CHECK(r.index().step_count == kBefore);
  // The control: the same weights with a fresh AdamW (no state) leave the trajectory,
  // so agreement above is the transferred state's doing.
  TinyLm a2 = test::make_model(), c = test::make_model(9);
  auto dos_again = make_dos(a2);
  for (int s = 0; s < kBefore; ++s) train_step(a2, s, *dos_again);
  copy_weights(a2, c);
  auto stateless = make_torch(c);
  const double control = run_both(a2, *dos_again, c, *stateless);
  MESSAGE("without the state: " << control);
  CHECK(control > 1e-3);
  continue_both(a, *dos_opt, b, *torch_opt);
}

TEST_CASE("torch::optim::AdamW's state written as a dos checkpoint continues torch's trajectory in dos") {
  torch::set_num_threads(1);
  TinyLm a = test::make_model(), b = test::make_model(7);
  auto torch_opt = make_torch(a);
  for (int s = 0; s < kBefore; ++s) train_step(a, s, *torch_opt);

  // torch's state as a checkpoint: hyperparameters, step, and m, v per parameter.
  checkpoint::CheckpointIndex index;
  index.dos_version = checkpoint::dos_version_string();
  std::vector<checkpoint::TensorData> tensors;
  std::vector<at::Tensor> keep;
  std::size_t p = 0;
  for (std::size_t g = 0; g < torch_opt->param_groups().size(); ++g) {
    auto& group = torch_opt->param_groups()[g];
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    index.groups.push_back(AdamW{.lr = o.lr(), .beta1 = std::get<0>(o.betas()), .beta2 = std::get<1>(o.betas()),
                                 .eps = o.eps(), .weight_decay = o.weight_decay(), .amsgrad = o.amsgrad()});
    for (auto& param : group.params()) {
      const auto& st = static_cast<const torch::optim::AdamWParamState&>(
          *torch_opt->state().at(c10::guts::to_string(param.unsafeGetTensorImpl())));
      index.step_count = index.schedule_index = st.step();
      index.params.push_back({static_cast<std::uint64_t>(param.numel()), DType::f32, g, st.step()});
      for (const auto& [kind, t] : {std::pair{"exp_avg", st.exp_avg()}, std::pair{"exp_avg_sq", st.exp_avg_sq()}}) {
        keep.push_back(t.contiguous());
        std::vector<std::uint64_t> shape(t.sizes().begin(), t.sizes().end());
        tensors.push_back({fmt::format("state.{}.{}", p, kind), {keep.back().data_ptr<float>(), static_cast<std::size_t>(t.numel())}, shape});
      }
      ++p;
    }
  }
  TempDir dir("from_torch");
  checkpoint::write_checkpoint(dir.path, index, tensors);

  copy_weights(a, b);
  auto dos_opt = make_dos(b);
  load(dos_opt->engine(), dir.path);
  CHECK(dos_opt->engine().step_count() == kBefore);
  continue_both(a, *torch_opt, b, *dos_opt);
}
