#pragma once
/// @file
/// @brief libtorch integration: `torch::Tensor` parameters drive dos through
///        `tensor_traits`, and `dos::TorchOptimizer` replaces `torch::optim::AdamW`:
/// @code
/// // torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-4));
/// dos::TorchOptimizer opt(model->parameters(), dos::AdamW{.lr = 3e-4});
/// for (...) { opt.zero_grad(); loss.backward(); opt.step(); }
/// @endcode
/// Only for programs that link libtorch (CMake: `find_package(Torch)`); the rest of
/// dos never includes it. Parameters must be contiguous float32, bfloat16 or float16
/// tensors; CUDA tensors count as device-resident. A parameter whose gradient is
/// undefined at a step (an unused branch, a frozen layer) is skipped as torch skips
/// it, with its own step count. `TorchOptimizer` registers a backward hook on every
/// parameter that calls `grad_ready` when its gradient is final, so the gradient
/// statistics (and device copies) overlap backward without any call by hand.

#include "dos/interleaved_optimizer.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace dos {

namespace detail {

inline DType torch_dtype(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::f32;
    case at::kBFloat16: return DType::bf16;
    case at::kHalf: return DType::f16;
    default:
      throw_invalid_argument("a torch tensor of type {} cannot be optimised (float32, bfloat16 and float16 can)",
                             c10::toString(t.scalar_type()));
  }
}
inline Device torch_device(const at::Tensor& t) { return t.is_cuda() ? Device::device : Device::host; }
inline void require_contiguous(const at::Tensor& t, std::string_view what) {
  if (!t.is_contiguous()) throw_invalid_argument("a torch {} is not contiguous; dos updates flat storage", what);
}

}  // namespace detail

/// @brief `torch::Tensor` as a dos `Tensor`: its storage, and its `.grad()` (an
///        undefined gradient reads as `ConstTensorView::absent()`: the parameter is
///        skipped at that step, as torch's Adam skips `.grad is None`).
template <>
struct tensor_traits<at::Tensor> {
  static TensorView value(const at::Tensor& t) {
    detail::require_contiguous(t, "parameter");
    return {t.data_ptr(), static_cast<std::size_t>(t.numel()), detail::torch_dtype(t), detail::torch_device(t)};
  }
  static ConstTensorView grad(const at::Tensor& t) {
    const at::Tensor& g = t.grad();
    if (!g.defined()) return ConstTensorView::absent();
    detail::require_contiguous(g, "gradient");
    return {g.data_ptr(), static_cast<std::size_t>(g.numel()), detail::torch_dtype(g), detail::torch_device(g)};
  }
};
static_assert(Tensor<at::Tensor>);

namespace detail {

/// The post hook of a parameter's AccumulateGrad node: autograd runs it once per
/// backward pass, after the parameter's `.grad` received every contribution.
template <class Engine>
class GradReadyHook final : public torch::autograd::FunctionPostHook {
 public:
  GradReadyHook(Engine& engine, std::size_t param, std::atomic<std::int64_t>& fired) noexcept
      : engine_(engine), param_(param), fired_(fired) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    fired_.fetch_add(1, std::memory_order_relaxed);
    engine_.grad_ready(param_);
    return outputs;
  }

 private:
  Engine& engine_;
  std::size_t param_;
  std::atomic<std::int64_t>& fired_;
};

}  // namespace detail

/// @brief A drop-in for `torch::optim::Adam`/`AdamW` over libtorch parameters, with
///        everything `InterleavedOptimizer` adds (clipping, loss scaling, schedules,
///        accumulation, the CPU/device split) through `engine()`.
///
/// Parameters with an undefined gradient at a step are skipped (their values and
/// state stay, their step counts do not advance), and frozen parameters
/// (`requires_grad` false) simply never step, as with torch. At construction every
/// parameter that requires a gradient gets a post hook on its gradient accumulator
/// that calls `engine().grad_ready(i)` when backward has finished its gradient;
/// `zero_grad` calls `engine().begin_backward()`. Gradients must then stay as
/// backward left them until `step()` (scale the loss, not the gradients); to change
/// them in between, call `remove_hooks()` first. The hooks go with the optimizer.
template <class Backend = CpuBackend>
class TorchOptimizer {
 public:
  using Engine = InterleavedOptimizer<Backend>;

  TorchOptimizer(std::vector<at::Tensor> params, AdamConfig hyper, Options options = {},
                 typename Engine::BackendConfig backend = {})
      : params_(params), engine_(std::move(params), hyper, options, backend) {
    add_hooks();
  }
  explicit TorchOptimizer(std::vector<ParamGroup<at::Tensor>> groups, Options options = {},
                          typename Engine::BackendConfig backend = {})
      : params_(flatten(groups)), engine_(std::move(groups), options, backend) {
    add_hooks();
  }
  TorchOptimizer(const TorchOptimizer&) = delete;
  TorchOptimizer& operator=(const TorchOptimizer&) = delete;
  ~TorchOptimizer() { remove_hooks(); }

  /// @brief Removes the backward hooks: `grad_ready` is then the caller's (or `step()`
  ///        reads every gradient itself, as without hooks).
  void remove_hooks() noexcept {
    for (auto& [node, key] : hooks_) node->del_post_hook(key);
    hooks_.clear();
  }
  /// @brief How many times a backward hook reported a gradient final (diagnostics:
  ///        once per parameter that received a gradient, per backward pass).
  std::int64_t hooks_fired() const noexcept { return fired_.load(std::memory_order_relaxed); }

  /// @brief Clears every gradient: drops it (`set_to_none`, torch's default) or zeroes
  ///        it; a new backward pass begins (`engine().begin_backward()`).
  void zero_grad(bool set_to_none = true) {
    engine_.begin_backward();
    for (at::Tensor& p : params_) {
      at::Tensor& g = p.mutable_grad();
      if (!g.defined()) continue;
      if (set_to_none) {
        g.reset();
      } else {
        g.detach_();
        g.zero_();
      }
    }
  }
  StepReport step() { return engine_.step(); }
  Engine& engine() noexcept { return engine_; }
  const Engine& engine() const noexcept { return engine_; }

 private:
  static std::vector<at::Tensor> flatten(const std::vector<ParamGroup<at::Tensor>>& groups) {
    std::vector<at::Tensor> out;
    for (const auto& g : groups) out.insert(out.end(), g.params.begin(), g.params.end());
    return out;
  }
  // A post hook on each parameter's gradient accumulator. The accumulator is held, so
  // autograd reuses it (and its hook) in every graph instead of making a new one.
  void add_hooks() {
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (!params_[i].requires_grad()) continue;  // frozen: never a gradient
      std::shared_ptr<torch::autograd::Node> node = torch::autograd::impl::grad_accumulator(params_[i]);
      if (!node) continue;  // not a leaf: no accumulator to watch
      const std::uintptr_t key = node->add_post_hook(std::make_unique<detail::GradReadyHook<Engine>>(engine_, i, fired_));
      hooks_.emplace_back(std::move(node), key);
    }
  }

  std::vector<at::Tensor> params_;
  Engine engine_;
  std::atomic<std::int64_t> fired_{0};
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, std::uintptr_t>> hooks_;
};

}  // namespace dos
