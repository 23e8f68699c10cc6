// The tensor customization point: built-in adapters, variants, and a user type.

#include <doctest/doctest.h>
#include <dos/optimizer.hpp>

#include <variant>
#include <vector>

namespace my {
// A framework-like parameter: a cheap handle to storage it does not own by value, as
// torch::Tensor is. The optimizer keeps a copy of each handle.
struct Storage {
  std::vector<dos::bf16> data, grad_data;
};
struct Param {
  Storage* storage;
};
}  // namespace my

template <>
struct dos::tensor_traits<my::Param> {
  static dos::TensorView value(const my::Param& p) {
    return {p.storage->data.data(), p.storage->data.size(), dos::DType::bf16, dos::Device::host};
  }
  static dos::ConstTensorView grad(const my::Param& p) {
    return {p.storage->grad_data.data(), p.storage->grad_data.size(), dos::DType::bf16, dos::Device::host};
  }
};

static_assert(dos::Tensor<my::Param>);
static_assert(!dos::Tensor<int>);
static_assert(!dos::Tensor<std::vector<float>>);

TEST_CASE("HostParam reports its element type, size and pointers without copying") {
  std::vector<dos::fp16> v(5), g(5);
  dos::HostParam<dos::fp16> p{v, g};
  const auto tv = dos::tensor_traits<decltype(p)>::value(p);
  const auto tg = dos::tensor_traits<decltype(p)>::grad(p);
  CHECK(tv.data == v.data());
  CHECK(tg.data == g.data());
  CHECK(tv.numel == 5);
  CHECK(tv.dtype == dos::DType::f16);
  CHECK(tv.device == dos::Device::host);
  CHECK(dos::dtype_size(tv.dtype) == 2);
}

TEST_CASE("a variant of tensors is a tensor of the active alternative") {
  std::vector<float> v(3), g(3);
  std::vector<dos::bf16> vb(4), gb(4);
  using Any = std::variant<dos::HostParam<float>, dos::HostParam<dos::bf16>>;
  Any a = dos::HostParam<float>{v, g}, b = dos::HostParam<dos::bf16>{vb, gb};
  CHECK(dos::tensor_traits<Any>::value(a).dtype == dos::DType::f32);
  CHECK(dos::tensor_traits<Any>::value(b).dtype == dos::DType::bf16);
  CHECK(dos::tensor_traits<Any>::grad(b).numel == 4);
}

TEST_CASE("a user-defined parameter type drives the optimizer") {
  my::Storage a{std::vector<dos::bf16>(10, dos::bf16(1.0f)), std::vector<dos::bf16>(10, dos::bf16(0.5f))};
  my::Storage b{std::vector<dos::bf16>(3, dos::bf16(-1.0f)), std::vector<dos::bf16>(3, dos::bf16(-0.5f))};
  std::vector<my::Param> params{{&a}, {&b}};
  dos::InterleavedOptimizer<> opt(params, dos::Adam{.lr = 0.1}, {.threads = 1});
  opt.step();
  // One Adam step moves every element by about lr against its gradient's sign.
  CHECK(static_cast<float>(a.data[0]) == doctest::Approx(0.9f).epsilon(0.01));
  CHECK(static_cast<float>(b.data[2]) == doctest::Approx(-0.9f).epsilon(0.01));
}
