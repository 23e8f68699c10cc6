#pragma once
/// @file
/// @brief `AnyCommunicator`: any `Communicator`, type-erased, so that `Options` can
///        carry one without a template parameter. Copies share the communicator.

#include "dos/comm/communicator.hpp"
#include "dos/comm/single_process.hpp"

#include <cstddef>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>

namespace dos {

/// @brief Holds a `Communicator` by shared ownership; default: `SingleProcess`.
/// @code
/// dos::Options o;
/// o.communicator = dos::AnyCommunicator(dos::MpiCommunicator(MPI_COMM_WORLD));
/// @endcode
class AnyCommunicator {
 public:
  /// @brief `SingleProcess`, without allocating (every `Options` holds one).
  AnyCommunicator() noexcept = default;
  /// @brief Takes @p c (moved in; communicators that own handles are move-only).
  template <Communicator C>
    requires(!std::is_same_v<std::remove_cvref_t<C>, AnyCommunicator>)
  AnyCommunicator(C&& c)  // NOLINT: implicit, as a value of the concept
      : self_(std::make_shared<Model<std::remove_cvref_t<C>>>(std::forward<C>(c))) {}

  int rank() const { return get().rank(); }
  int size() const { return get().size(); }
  int local_rank() const { return get().local_rank(); }
  int local_size() const { return get().local_size(); }
  /// @brief See `Communicator`.
  void all_reduce(std::span<double> buf, ReduceOp op) { get().all_reduce(buf, op); }
  /// @brief See `Communicator`.
  void all_gather(std::span<const float> mine, std::span<float> all, std::span<const std::size_t> counts) {
    get().all_gather(mine, all, counts);
  }
  /// @brief See `Communicator`.
  void reduce_scatter(std::span<const float> all, std::span<float> mine, std::span<const std::size_t> counts) {
    get().reduce_scatter(all, mine, counts);
  }
  void barrier() { get().barrier(); }

 private:
  struct Concept {
    virtual ~Concept() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    virtual int local_rank() const = 0;
    virtual int local_size() const = 0;
    virtual void all_reduce(std::span<double>, ReduceOp) = 0;
    virtual void all_gather(std::span<const float>, std::span<float>, std::span<const std::size_t>) = 0;
    virtual void reduce_scatter(std::span<const float>, std::span<float>, std::span<const std::size_t>) = 0;
    virtual void barrier() = 0;
  };
  template <class C>
  struct Model final : Concept {
    template <class A>
    explicit Model(A&& a) : c(std::forward<A>(a)) {}
    int rank() const override { return c.rank(); }
    int size() const override { return c.size(); }
    int local_rank() const override { return c.local_rank(); }
    int local_size() const override { return c.local_size(); }
    void all_reduce(std::span<double> b, ReduceOp op) override { c.all_reduce(b, op); }
    void all_gather(std::span<const float> m, std::span<float> a, std::span<const std::size_t> n) override {
      c.all_gather(m, a, n);
    }
    void reduce_scatter(std::span<const float> a, std::span<float> m, std::span<const std::size_t> n) override {
      c.reduce_scatter(a, m, n);
    }
    void barrier() override { c.barrier(); }
    C c;
  };
  Concept& get() const {
    static Model<SingleProcess> single{SingleProcess{}};  // stateless: one serves all
    return self_ ? *self_ : single;
  }
  std::shared_ptr<Concept> self_;  // null: SingleProcess
};
static_assert(Communicator<AnyCommunicator>);

}  // namespace dos
