#pragma once
// A model whose tensors mix element types (fp32, bf16, fp16) and places (host memory,
// or the emulated device's memory), as a framework would hold them. The same
// description builds an all-host twin for the CPU backend, so the two trajectories
// can be compared bit for bit.

#include "inputs.hpp"

#include <dos/backend/emulated_device.hpp>
#include <dos/core/tensor.hpp>
#include <dos/memory/device_buffer.hpp>
#include <dos/optim/param_group.hpp>

#include <cstddef>
#include <cstring>
#include <vector>

namespace dos::test {

struct TensorSpec {
  std::size_t numel = 0;
  DType dtype = DType::f32;
  Device device = Device::host;
  std::size_t group = 0;
};

/// A framework tensor: value and gradient buffers of one type, in one place.
struct MixedParam {
  void* value = nullptr;
  void* grad = nullptr;
  std::size_t numel = 0;
  DType dtype = DType::f32;
  Device device = Device::host;
  const std::uint8_t* absent = nullptr;  ///< when set and non-zero: no gradient this step
};

}  // namespace dos::test

template <>
struct dos::tensor_traits<dos::test::MixedParam> {
  static TensorView value(const test::MixedParam& p) { return {p.value, p.numel, p.dtype, p.device}; }
  static ConstTensorView grad(const test::MixedParam& p) {
    if (p.absent != nullptr && *p.absent != 0) return ConstTensorView::absent();
    return {p.grad, p.numel, p.dtype, p.device};
  }
};

namespace dos::test {

inline void store_as(void* data, DType t, std::size_t i, float x) {
  switch (t) {
    case DType::f32: static_cast<float*>(data)[i] = x; break;
    case DType::bf16: static_cast<bf16*>(data)[i] = bf16(x); break;
    case DType::f16: static_cast<fp16*>(data)[i] = fp16(x); break;
  }
}
inline float load_as(const void* data, DType t, std::size_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(data)[i];
    case DType::bf16: return static_cast<float>(static_cast<const bf16*>(data)[i]);
    case DType::f16: return static_cast<float>(static_cast<const fp16*>(data)[i]);
  }
  return 0;
}

/// Device memory of the emulated backend: host memory the test may also touch directly.
struct EmulatedAccess {
  using Memory = emulated::DeviceMemory;
  static Memory memory() { return Memory(std::size_t{1} << 34); }
  static void write(void* device, const void* host, std::size_t bytes) { std::memcpy(device, host, bytes); }
  static void read(void* host, const void* device, std::size_t bytes) { std::memcpy(host, device, bytes); }
};

/// @tparam Access how the test reaches device memory (EmulatedAccess, or CUDA's).
template <class Access>
class BasicMixedModel {
 public:
  /// @param on_host_only ignore the specs' devices (the CPU backend's twin).
  BasicMixedModel(std::vector<TensorSpec> specs, std::vector<AdamConfig> hyper, bool on_host_only = false)
      : specs_(std::move(specs)), hyper_(std::move(hyper)), device_(Access::memory()) {
    for (TensorSpec& s : specs_) {
      if (on_host_only) s.device = Device::host;
      const std::size_t bytes = s.numel * dtype_size(s.dtype);
      Storage st;
      if (s.device == Device::host) {
        st.host_value = HostBuffer<std::byte>(bytes);
        st.host_grad = HostBuffer<std::byte>(bytes);
      } else {
        st.dev_value = DeviceBuffer<typename Access::Memory>(bytes, device_);
        st.dev_grad = DeviceBuffer<typename Access::Memory>(bytes, device_);
      }
      storage_.push_back(std::move(st));
    }
    for (std::size_t t = 0; t < specs_.size(); ++t) fill(t, value(t), [&](std::size_t i) { return initial_param(t, i); });
    absent_.assign(specs_.size(), 0);
  }
  BasicMixedModel(BasicMixedModel&&) = default;

  void* value(std::size_t t) {
    return specs_[t].device == Device::host ? static_cast<void*>(storage_[t].host_value.data())
                                            : static_cast<void*>(storage_[t].dev_value.data());
  }
  void* grad(std::size_t t) {
    return specs_[t].device == Device::host ? static_cast<void*>(storage_[t].host_grad.data())
                                            : static_cast<void*>(storage_[t].dev_grad.data());
  }
  const std::vector<TensorSpec>& specs() const { return specs_; }
  /// Tensor @p t has no gradient (torch's None) until set back; views see it at once.
  void set_absent(std::size_t t, bool absent) { absent_[t] = absent ? 1 : 0; }
  bool absent(std::size_t t) const { return absent_[t] != 0; }

  std::vector<ParamGroup<MixedParam>> groups() {
    std::vector<ParamGroup<MixedParam>> out(hyper_.size());
    for (std::size_t g = 0; g < hyper_.size(); ++g) out[g].hyper = hyper_[g];
    for (std::size_t t = 0; t < specs_.size(); ++t)
      out[specs_[t].group].params.push_back(
          {value(t), grad(t), specs_[t].numel, specs_[t].dtype, specs_[t].device, &absent_[t]});
    return out;
  }

  /// Tensor indices in the optimizer's parameter order (group by group).
  std::vector<std::size_t> optimizer_order() const {
    std::vector<std::size_t> out;
    for (std::size_t g = 0; g < hyper_.size(); ++g)
      for (std::size_t t = 0; t < specs_.size(); ++t)
        if (specs_[t].group == g) out.push_back(t);
    return out;
  }

  void set_gradients(std::int64_t step) {
    for (std::size_t t = 0; t < specs_.size(); ++t) fill(t, grad(t), [&](std::size_t i) { return gradient(t, step, i); });
  }

  /// Every value's bits, in tensor order.
  std::vector<std::byte> value_bytes() {
    std::vector<std::byte> out;
    for (std::size_t t = 0; t < specs_.size(); ++t) {
      std::vector<std::byte> tmp(specs_[t].numel * dtype_size(specs_[t].dtype));
      if (tmp.empty()) continue;  // an empty tensor has no storage to read
      if (specs_[t].device == Device::host) std::memcpy(tmp.data(), value(t), tmp.size());
      else Access::read(tmp.data(), value(t), tmp.size());
      out.insert(out.end(), tmp.begin(), tmp.end());
    }
    return out;
  }

 private:
  // Writes f(i), as the tensor's type, into its buffer @p dst wherever it lives.
  template <class F>
  void fill(std::size_t t, void* dst, F&& f) {
    const TensorSpec& s = specs_[t];
    std::vector<std::byte> tmp(s.numel * dtype_size(s.dtype));
    for (std::size_t i = 0; i < s.numel; ++i) store_as(tmp.data(), s.dtype, i, f(i));
    if (tmp.empty()) return;
    if (s.device == Device::host) std::memcpy(dst, tmp.data(), tmp.size());
    else Access::write(dst, tmp.data(), tmp.size());
  }

  struct Storage {
    HostBuffer<std::byte> host_value, host_grad;
    DeviceBuffer<typename Access::Memory> dev_value, dev_grad;
  };
  std::vector<TensorSpec> specs_;
  std::vector<AdamConfig> hyper_;
  typename Access::Memory device_;
  std::vector<Storage> storage_;
  std::vector<std::uint8_t> absent_;  // sized once: parameters point into it
};

using MixedModel = BasicMixedModel<EmulatedAccess>;

/// A tensor of @p numel elements with a random type, place and group.
inline TensorSpec random_spec(Rng& rng, std::size_t numel, std::size_t groups) {
  TensorSpec t;
  t.numel = numel;
  t.dtype = static_cast<DType>(rng.below(3));
  t.device = rng.below(2) == 0 ? Device::host : Device::device;
  t.group = rng.below(groups);
  return t;
}

/// Tensors that pack one per subgroup of `subgroup` elements (each more than half of
/// it), with random types, places and groups.
inline std::vector<TensorSpec> one_per_subgroup(std::size_t subgroups, std::size_t subgroup, std::uint64_t seed,
                                                std::size_t groups = 2) {
  Rng rng(seed);
  std::vector<TensorSpec> out;
  for (std::size_t s = 0; s < subgroups; ++s) out.push_back(random_spec(rng, subgroup / 2 + 1 + rng.below(subgroup / 2), groups));
  return out;
}

/// Tensors of any size (several per subgroup, or split across several).
inline std::vector<TensorSpec> any_sizes(std::size_t tensors, std::size_t max_numel, std::uint64_t seed,
                                         std::size_t groups = 2) {
  Rng rng(seed);
  std::vector<TensorSpec> out;
  for (std::size_t i = 0; i < tensors; ++i) out.push_back(random_spec(rng, 1 + rng.below(max_numel), groups));
  return out;
}

}  // namespace dos::test
