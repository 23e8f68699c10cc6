#pragma once
/// @file
/// @brief How any framework's parameter type drives dos: the `tensor_traits`
///        customization point, the `Tensor` concept, and the built-in `HostParam<T>`.
///
/// dos never copies a framework's tensors. At construction and at every `step()` it
/// asks the traits for raw views of the value and of the gradient, validates them,
/// and updates the value in place. Views are re-read at every step because
/// frameworks may reallocate gradients between steps.

#include "dos/config.hpp"
#include "dos/core/float16.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>
#include <variant>

namespace dos {

/// @brief Element types dos can update in place.
enum class DType : std::uint8_t { f32, bf16, f16 };

/// @brief Where a tensor's bytes live. The CPU backend accepts only `host`.
enum class Device : std::uint8_t { host, device };

/// @brief Size in bytes of one element of @p t.
constexpr std::size_t dtype_size(DType t) noexcept { return t == DType::f32 ? 4 : 2; }

/// @brief Whether @p t is one of the enumerators above. A `tensor_traits`
///        specialisation can hand dos any byte; views are checked with this first.
constexpr bool dtype_valid(DType t) noexcept { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

/// @brief Calls @p f with `std::type_identity<T>{}` for the element type `T` that @p t
///        names: the one place a run-time `DType` becomes a C++ type (CPU kernels, the
///        GPU kernel, value conversions). @p t must be valid (`dtype_valid`).
/// @code
/// float first(const dos::TensorView& v) {
///   return dos::visit_dtype(v.dtype, [&](auto type) {
///     using T = typename decltype(type)::type;
///     return static_cast<float>(static_cast<const T*>(v.data)[0]);
///   });
/// }
/// @endcode
template <class F>
DOS_HOST_DEVICE decltype(auto) visit_dtype(DType t, F&& f) {
  if (t == DType::bf16) return f(std::type_identity<bf16>{});
  if (t == DType::f16) return f(std::type_identity<fp16>{});
  return f(std::type_identity<float>{});
}

/// @brief Human-readable name, for error messages and reports.
constexpr std::string_view dtype_name(DType t) noexcept {
  switch (t) {
    case DType::f32: return "float32";
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
  }
  return "invalid dtype";
}

/// @brief The `DType` of a C++ element type.
template <class T>
inline constexpr DType dtype_of = [] {
  using U = std::remove_cv_t<T>;
  static_assert(std::is_same_v<U, float> || std::is_same_v<U, bf16> || std::is_same_v<U, fp16>,
                "dos: supported element types are float, dos::bf16 and dos::fp16");
  if constexpr (std::is_same_v<U, float>) return DType::f32;
  else if constexpr (std::is_same_v<U, bf16>) return DType::bf16;
  else return DType::f16;
}();

/// @brief A mutable, type-erased view of a parameter's values.
struct TensorView {
  void* data = nullptr;
  std::size_t numel = 0;
  DType dtype = DType::f32;
  Device device = Device::host;
};

/// @brief A read-only, type-erased view of a gradient.
///
/// A gradient view with a null `data` and no elements (`absent()`) means the
/// parameter has no gradient this step, as torch's `.grad is None`: the step skips
/// it (its value and state stay as they are, its step count does not advance, the
/// gradient norm leaves it out). A null `data` with elements is refused as before.
/// For a parameter with no elements, a null view also reads as absent.
struct ConstTensorView {
  const void* data = nullptr;
  std::size_t numel = 0;
  DType dtype = DType::f32;
  Device device = Device::host;

  /// @brief The view of a gradient that does not exist this step (`.grad is None`).
  static constexpr ConstTensorView absent() noexcept { return {}; }
  /// @brief Whether this view says "no gradient this step" (null data, no elements).
  constexpr bool is_absent() const noexcept { return data == nullptr && numel == 0; }
};

/// @brief Element @p i of host data of type @p dtype, as a float.
inline float load_element(const void* data, DType dtype, std::size_t i) noexcept {
  return visit_dtype(dtype, [&](auto type) {
    using T = typename decltype(type)::type;
    return static_cast<float>(static_cast<const T*>(data)[i]);
  });
}
/// @brief Stores @p x, rounded to @p dtype, as element @p i of host data.
inline void store_element(void* data, DType dtype, std::size_t i, float x) noexcept {
  visit_dtype(dtype, [&](auto type) {
    using T = typename decltype(type)::type;
    static_cast<T*>(data)[i] = T(x);
  });
}

/// @brief Customization point: specialise for a framework's parameter type.
///
/// A specialisation provides two static functions. `grad` returns
/// `ConstTensorView::absent()` for a parameter without a gradient this step (frozen,
/// unused): the optimizer then skips it, as torch's Adam skips `.grad is None`.
/// @code
/// template <> struct dos::tensor_traits<my::Parameter> {
///   static dos::TensorView value(const my::Parameter& p) {
///     return {p.data_ptr(), p.numel(), dos::DType::bf16, dos::Device::host};
///   }
///   static dos::ConstTensorView grad(const my::Parameter& p) {
///     return {p.grad_ptr(), p.numel(), dos::DType::bf16, dos::Device::host};
///   }
/// };
/// @endcode
template <class T>
struct tensor_traits;

/// @brief A type dos can optimise: `tensor_traits<T>` yields value and gradient views.
template <class T>
concept Tensor = requires(const T& t) {
  { tensor_traits<T>::value(t) } -> std::same_as<TensorView>;
  { tensor_traits<T>::grad(t) } -> std::same_as<ConstTensorView>;
};

/// @brief The default adapter: a host parameter given as two spans.
/// @tparam T `float`, `dos::bf16` or `dos::fp16`. Lower-precision values get an fp32
///         master copy inside the optimizer.
template <class T>
struct HostParam {
  std::span<T> value;
  std::span<const T> grad;
};

template <class T>
struct tensor_traits<HostParam<T>> {
  static TensorView value(const HostParam<T>& p) noexcept {
    return {static_cast<void*>(p.value.data()), p.value.size(), dtype_of<T>, Device::host};
  }
  /// An empty `grad` span with a null pointer reads as absent (the parameter is skipped).
  static ConstTensorView grad(const HostParam<T>& p) noexcept {
    return {static_cast<const void*>(p.grad.data()), p.grad.size(), dtype_of<T>, Device::host};
  }
};

/// @brief A variant of tensor types is a tensor: one optimizer can hold parameters of
///        several element types, for example fp32 norms beside bf16 matrices.
template <Tensor... Ts>
struct tensor_traits<std::variant<Ts...>> {
  static TensorView value(const std::variant<Ts...>& p) {
    return std::visit([](const auto& t) { return tensor_traits<std::remove_cvref_t<decltype(t)>>::value(t); }, p);
  }
  static ConstTensorView grad(const std::variant<Ts...>& p) {
    return std::visit([](const auto& t) { return tensor_traits<std::remove_cvref_t<decltype(t)>>::grad(t); }, p);
  }
};

static_assert(Tensor<HostParam<float>>);
static_assert(Tensor<HostParam<bf16>>);
static_assert(Tensor<std::variant<HostParam<float>, HostParam<bf16>>>);

}  // namespace dos
