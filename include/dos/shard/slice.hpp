#pragma once
/// @file
/// @brief `SliceParam<P>`: a contiguous part of a framework tensor, as a `Tensor` of its
///        own, so that an `InterleavedOptimizer` can hold only this rank's share
///        (`ShardedOptimizer`). Its views follow the whole tensor's views at every read
///        (frameworks may reallocate gradients); its gradient can instead come from a
///        buffer dos owns (ZeRO-2's reduced gradients). A slice without a tensor is the
///        empty stand-in of a rank that owns no element.

#include "dos/core/tensor.hpp"

#include <cstddef>
#include <type_traits>

namespace dos {

/// @brief Elements [offset, offset + numel) of @p whole.
template <Tensor P>
struct SliceParam {
  const P* whole = nullptr;  ///< null: the empty stand-in (no elements)
  std::size_t offset = 0;
  std::size_t numel = 0;
  const float* grad = nullptr;  ///< when set, the float32 gradient of the slice (host)
};

namespace detail {
inline float empty_slice_storage[1] = {0};  // never written: the stand-in has no elements
template <class View>
View sliced(View v, std::size_t offset, std::size_t numel) noexcept {
  using Byte = std::conditional_t<std::is_const_v<std::remove_pointer_t<decltype(v.data)>>, const char, char>;
  v.data = static_cast<Byte*>(v.data) + offset * dtype_size(v.dtype);
  v.numel = numel;
  return v;
}
}  // namespace detail

template <Tensor P>
struct tensor_traits<SliceParam<P>> {
  /// The slice of the whole value; the caller checked the whole view first.
  static TensorView value(const SliceParam<P>& s) {
    if (s.whole == nullptr) return {detail::empty_slice_storage, 0, DType::f32, Device::host};
    return detail::sliced(tensor_traits<P>::value(*s.whole), s.offset, s.numel);
  }
  /// The owned buffer's part, else the slice of the whole gradient; absent stays absent.
  static ConstTensorView grad(const SliceParam<P>& s) {
    if (s.whole == nullptr) return {detail::empty_slice_storage, 0, DType::f32, Device::host};
    if (s.grad != nullptr) return {s.grad, s.numel, DType::f32, Device::host};
    const ConstTensorView g = tensor_traits<P>::grad(*s.whole);
    return g.is_absent() ? g : detail::sliced(g, s.offset, s.numel);
  }
};

}  // namespace dos
