#pragma once
/// @file
/// @brief `HostRegistration`: keeps the framework's host tensors registered with a
///        device backend (pinned in place, `cudaHostRegister`), so that the device's
///        copies from and to them are asynchronous.
///
/// A copy from or to pageable memory is synchronous with the host: CUDA stages it,
/// and the thread that issues it waits. The plan executor issues every device
/// operation before the CPU updates, so one such copy makes the CPU lane wait for the
/// device's work and the hybrid step costs T_gpu + T_cpu. Each host view is registered
/// once per address (a framework that moves a gradient gets the new one registered,
/// and the old one released). `refused()` says whether the backend refused one (or
/// cannot register at all); the engine then stages those copies through pinned
/// buffers of its own (`SubgroupIo::staging`) and stops registering, so no copy is
/// synchronous (the engine warns once about a refusal after that choice, when staging
/// can no longer be allocated).

#include "dos/state/param_table.hpp"

#include <concepts>
#include <cstddef>
#include <vector>

namespace dos::engine {

/// @brief Whether backend @p B can register host memory for asynchronous copies:
///        `bool register_host(const void*, std::size_t)` (true when copies from and to
///        that range are asynchronous) and `void unregister_host(const void*)`.
template <class B>
concept RegistersHost = requires(B& b, const void* p, std::size_t n) {
  { b.register_host(p, n) } -> std::convertible_to<bool>;
  b.unregister_host(p);
};

/// @brief The registrations of one optimizer's host views, two per parameter.
template <class B>
class HostRegistration {
 public:
  HostRegistration(B& backend, std::size_t params) : b_(backend), held_(2 * params) {}
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;
  ~HostRegistration() {
    if constexpr (RegistersHost<B>)
      for (const Held& h : held_)
        if (h.registered) b_.unregister_host(h.data);
  }

  /// @brief Registers every host value and gradient view of @p params not yet
  ///        registered at its current address. Allocates nothing.
  void update(const ParamTable& params) {
    if constexpr (RegistersHost<B>) {
      for (std::size_t i = 0; i < params.size(); ++i) {
        if (params.on_device(i)) continue;
        const std::size_t bytes = params.record(i).numel * dtype_size(params.record(i).dtype);
        hold(held_[2 * i], params.value(i).data, bytes);
        hold(held_[2 * i + 1], params.grad(i).data, bytes);
      }
    }
  }

  /// @brief Whether a copy from or to a host view could be synchronous: the backend
  ///        refused to register one, or cannot register at all.
  bool refused() const noexcept { return refused_ > 0 || !RegistersHost<B>; }

 private:
  struct Held {
    const void* data = nullptr;
    bool registered = false;
  };
  void hold(Held& h, const void* data, std::size_t bytes) {
    if (data == h.data || data == nullptr || bytes == 0) return;
    if (h.registered) b_.unregister_host(h.data);
    h.data = data;
    h.registered = b_.register_host(data, bytes);
    if (!h.registered) ++refused_;
  }

  B& b_;
  std::vector<Held> held_;
  std::size_t refused_ = 0;
};

}  // namespace dos::engine
