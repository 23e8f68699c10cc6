#pragma once
// A host fp32 parameter whose gradient is absent (torch's None) while the flag it
// points to is set: how tests make parameters skip steps.

#include <dos/core/tensor.hpp>

#include <cstdint>

namespace dos::test {

struct SwitchedParam {
  HostParam<float> param;
  const std::uint8_t* absent = nullptr;  ///< non-zero: no gradient this step
};

}  // namespace dos::test

template <>
struct dos::tensor_traits<dos::test::SwitchedParam> {
  static TensorView value(const test::SwitchedParam& s) { return tensor_traits<HostParam<float>>::value(s.param); }
  static ConstTensorView grad(const test::SwitchedParam& s) {
    if (s.absent != nullptr && *s.absent != 0) return ConstTensorView::absent();
    return tensor_traits<HostParam<float>>::grad(s.param);
  }
};
