#pragma once
/// @file
/// @brief `FunctionRef<R(Args...)>`: a non-owning reference to a callable, so a hot
///        path can take "any function" through a concept or a virtual call without
///        allocating (std::function may allocate; C++26's std::function_ref is not here).

#include <functional>
#include <memory>
#include <type_traits>
#include <utility>

namespace dos {

template <class Signature>
class FunctionRef;

/// @brief Refers to a callable that outlives it; two words, trivially copyable.
template <class R, class... Args>
class FunctionRef<R(Args...)> {
 public:
  template <class F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, FunctionRef> && std::is_invocable_r_v<R, F&, Args...>)
  FunctionRef(F&& f) noexcept  // NOLINT(google-explicit-constructor): used like a function pointer
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* o, Args... args) -> R {
          return std::invoke(*static_cast<std::remove_reference_t<F>*>(o), std::forward<Args>(args)...);
        }) {}

  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

 private:
  void* object_;
  R (*call_)(void*, Args...);
};

}  // namespace dos
