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
/// tensors; CUDA tensors count as device-resident.

#include "dos/interleaved_optimizer.hpp"

#include <ATen/ATen.h>

#include <cstddef>
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
///        undefined gradient reads as empty, which `step()` rejects by name).
template <>
struct tensor_traits<at::Tensor> {
  static TensorView value(const at::Tensor& t) {
    detail::require_contiguous(t, "parameter");
    return {t.data_ptr(), static_cast<std::size_t>(t.numel()), detail::torch_dtype(t), detail::torch_device(t)};
  }
  static ConstTensorView grad(const at::Tensor& t) {
    const at::Tensor& g = t.grad();
    if (!g.defined()) return {nullptr, 0, detail::torch_dtype(t), detail::torch_device(t)};
    detail::require_contiguous(g, "gradient");
    return {g.data_ptr(), static_cast<std::size_t>(g.numel()), detail::torch_dtype(g), detail::torch_device(g)};
  }
};
static_assert(Tensor<at::Tensor>);

/// @brief A drop-in for `torch::optim::Adam`/`AdamW` over libtorch parameters, with
///        everything `InterleavedOptimizer` adds (clipping, loss scaling, schedules,
///        accumulation, the CPU/device split) through `engine()`.
template <class Backend = CpuBackend>
class TorchOptimizer {
 public:
  using Engine = InterleavedOptimizer<Backend>;

  TorchOptimizer(std::vector<at::Tensor> params, AdamConfig hyper, Options options = {},
                 typename Engine::BackendConfig backend = {})
      : params_(params), engine_(std::move(params), hyper, options, backend) {}
  explicit TorchOptimizer(std::vector<ParamGroup<at::Tensor>> groups, Options options = {},
                          typename Engine::BackendConfig backend = {})
      : params_(flatten(groups)), engine_(std::move(groups), options, backend) {}

  /// @brief Clears every gradient: drops it (`set_to_none`, torch's default) or zeroes it.
  void zero_grad(bool set_to_none = true) {
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
  std::vector<at::Tensor> params_;
  Engine engine_;
};

}  // namespace dos
