#pragma once
/// @file
/// @brief `ShardedOptimizer<Backend, Components>`: ZeRO-1 and ZeRO-2, dos sharding the
///        optimizer over the ranks itself. Every rank passes every parameter; each
///        updates, and keeps state for, only its `ZeroShare` (an `InterleavedOptimizer`
///        over `SliceParam`s of the caller's tensors), then the ranks all-gather the
///        updated values. ZeRO-2 first averages the ranks' gradients with a
///        reduce-scatter into a buffer holding only this rank's share.

#include "dos/backend/cpu.hpp"
#include "dos/components.hpp"
#include "dos/core/tensor.hpp"
#include "dos/error.hpp"
#include "dos/interleaved_optimizer.hpp"
#include "dos/options.hpp"
#include "dos/shard/share.hpp"
#include "dos/shard/slice.hpp"
#include "dos/train/rank_agreement.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace dos {

/// @brief Adam/AdamW with its state sharded over the ranks of `Options::communicator`
///        by dos (`Options::sharding`: `Sharding::zero1` or `Sharding::zero2`).
///
/// Every rank passes the same tensors in the same order (host values: float32, or 16-bit
/// ones, for which the local optimizer keeps float32 masters of its share). Rank r
/// owns a contiguous, balanced part of their concatenation (`share()`); its optimizer
/// (`local()`) holds m, v (and masters where the backend keeps them) for that part only.
/// A step, in order: (1) every rank checks every tensor's views, and the ranks agree
/// (one small all-reduce: bad input anywhere fails every rank, naming it, before any
/// change); (2) ZeRO-2 only: per tensor, a reduce-scatter sums the ranks' float32
/// gradients into this rank's share buffer, which is then divided by the rank count
/// (the mean, as data parallelism averages); ZeRO-1 reads the caller's gradients,
/// already averaged, in place; (3) the local optimizer steps its share: clipping by the
/// global norm and skipping overflowing steps agree across ranks as in the framework
/// mode; (4) if the step was applied, per tensor, an all-gather gives every rank every
/// owner's new values, so all ranks end the step with the same parameters.
/// @code
/// dos::Options o{.max_grad_norm = 1.0, .sharding = dos::Sharding::zero2};
/// o.communicator = dos::MpiCommunicator(MPI_COMM_WORLD);
/// dos::ShardedOptimizer<> opt(all_params, dos::AdamW{.lr = 3e-4}, o);  // the same list on every rank
/// for (...) { /* forward, backward: each rank's own gradients */ opt.step(); }
/// @endcode
template <class Backend = CpuBackend, Components C = DefaultComponents>
class ShardedOptimizer {
 public:
  /// @brief The optimizer of this rank's share.
  using Local = InterleavedOptimizer<Backend, C>;

  /// @brief Shards @p params (every rank: the same tensors, in the same order).
  /// @throws std::invalid_argument on every rank when any rank's input is bad (not zero1
  ///         or zero2, an empty list, a value not on the host, options or
  ///         hyperparameters the local optimizer refuses), or when the ranks' tensor
  ///         counts, sizes, dtypes or sharding modes differ; the message names the
  ///         failing rank(s).
  template <std::ranges::input_range R>
    requires Tensor<std::ranges::range_value_t<R>>
  ShardedOptimizer(R&& params, AdamConfig hyper, Options options = {}, typename Local::BackendConfig backend = {})
      : comm_(options.communicator), mode_(options.sharding) {
    using P = std::ranges::range_value_t<R>;
    auto owned = std::make_unique<Whole<P>>();
    Whole<P>& whole = *owned;
    whole_ = std::move(owned);  // before local_, which reads it, and destroyed after it
    for (auto&& p : params) whole.params.push_back(p);
    const std::vector<double> rows =
        gather_rows(comm_, 3, "ShardedOptimizer: construction failed", [&](std::span<double> row) {
          if (mode_ == Sharding::framework)
            throw_invalid_argument(
                "ShardedOptimizer needs Options::sharding zero1 or zero2; with Sharding::framework each "
                "rank passes its own shard to an InterleavedOptimizer");
          if (whole.params.empty()) throw_invalid_argument("the parameter list is empty");
          // FNV-1a over the mode, the sizes and the dtypes.
          std::uint64_t hash = (14695981039346656037ull ^ static_cast<std::uint64_t>(mode_)) * 1099511628211ull;
          std::size_t widest_16 = 0;
          for (std::size_t t = 0; t < whole.params.size(); ++t) {
            const TensorView v = whole.value(t);
            if (v.device != Device::host)
              throw_invalid_argument("parameter {}: ShardedOptimizer gathers host values, this one is on a device", t);
            if (!dtype_valid(v.dtype) || (v.data == nullptr && v.numel > 0))
              throw_invalid_argument("parameter {}: the value has an invalid dtype ({}) or no data", t,
                                     static_cast<int>(v.dtype));
            sizes_.push_back(v.numel);
            dtypes_.push_back(v.dtype);
            if (v.dtype != DType::f32) widest_16 = std::max(widest_16, v.numel);
            hash = (hash ^ v.numel) * 1099511628211ull;
            hash = (hash ^ static_cast<std::uint64_t>(v.dtype)) * 1099511628211ull;
          }
          row[0] = static_cast<double>(sizes_.size());
          for (const std::size_t n : sizes_) row[1] += static_cast<double>(n);
          row[2] = static_cast<double>(hash >> 12);  // 52 bits: exact in a double
          gathered_.assign(widest_16, 0.0f);
          build(whole, hyper, std::move(options), backend);
        });
    check_same_shapes(rows);
  }

  ShardedOptimizer(const ShardedOptimizer&) = delete;
  ShardedOptimizer& operator=(const ShardedOptimizer&) = delete;

  /// @brief One step of every rank together (see the class); call it on every rank.
  /// @throws std::invalid_argument on every rank, with nothing changed anywhere, when a
  ///         rank's tensors no longer match what it was built with (or, ZeRO-2, a
  ///         gradient is absent or not float32 on the host), or its local step refuses.
  /// @return the local optimizer's report: the norm, the loss scale, whether the step was
  ///         applied or overflowed are global (the same on every rank); `elements` and
  ///         `first_nonfinite_param` speak of this rank's pieces.
  StepReport step() {
    gather_rows(comm_, 0, "step() changed nothing", [&](std::span<double>) { check_views(); });
    if (mode_ == Sharding::zero2) reduce_gradients();
    const StepReport r = local_->step();
    if (r.applied) gather_values();
    return r;
  }

  /// @brief This rank's part of the parameters.
  const ZeroShare& share() const noexcept { return share_; }
  /// @brief The optimizer of this rank's share: its parameters are `share().pieces()`, in
  ///        order (an empty share: one stand-in of no elements). Read its state, set its
  ///        learning rate or schedule there, the same on every rank. Step only through
  ///        this class; its `grad_ready` and `accumulate` are not for ZeRO (ZeRO-2's
  ///        gradients exist only inside `step()`).
  Local& local() noexcept { return *local_; }
  const Local& local() const noexcept { return *local_; }
  Sharding sharding() const noexcept { return mode_; }
  /// @brief The tensors every rank passed.
  std::size_t num_params() const noexcept { return sizes_.size(); }
  double loss_scale() const noexcept { return local_->loss_scale(); }
  std::int64_t step_count() const noexcept { return local_->step_count(); }

 private:
  // The caller's tensors, whatever their type, for the slices and the checks.
  struct Tensors {
    virtual ~Tensors() = default;
    virtual TensorView value(std::size_t t) const = 0;
    virtual ConstTensorView grad(std::size_t t) const = 0;
  };
  template <Tensor P>
  struct Whole final : Tensors {
    std::vector<P> params;
    TensorView value(std::size_t t) const override { return tensor_traits<P>::value(params[t]); }
    ConstTensorView grad(std::size_t t) const override { return tensor_traits<P>::grad(params[t]); }
  };

  template <Tensor P>
  void build(const Whole<P>& whole, const AdamConfig& hyper, Options options, typename Local::BackendConfig backend) {
    share_ = ZeroShare(sizes_, comm_.rank(), comm_.size());
    at_.assign(sizes_.size(), 0);
    std::size_t widest = 0;
    if (mode_ == Sharding::zero2) grads_.assign(share_.numel(), 0.0f);
    std::vector<SliceParam<P>> slices;
    for (const ZeroShare::Piece& p : share_.pieces()) {
      at_[p.tensor] = p.at;
      widest = std::max(widest, p.numel);
      slices.push_back(
          {&whole.params[p.tensor], p.offset, p.numel, mode_ == Sharding::zero2 ? grads_.data() + p.at : nullptr});
    }
    if (slices.empty()) slices.emplace_back();  // no element here: the local optimizer still takes part in every step
    scratch_.assign(widest, 0.0f);
    options.sharding = Sharding::framework;  // the local optimizer holds this rank's shard
    local_.emplace(slices, hyper, std::move(options), backend);
  }

  // Every rank built; now the shapes: each rank against rank 0's, so all name the same ranks.
  void check_same_shapes(const std::vector<double>& rows) {
    std::string differ;
    for (std::size_t r = 1; r < rows.size() / 3; ++r)
      if (!std::equal(rows.begin() + 3 * r, rows.begin() + 3 * r + 3, rows.begin()))
        differ += fmt::format("{}rank {} ({} tensors, {} elements)", differ.empty() ? "" : ", ", r, rows[3 * r],
                              rows[3 * r + 1]);
    if (!differ.empty())
      throw_invalid_argument(
          "ShardedOptimizer: every rank must pass the same tensors (sizes, dtypes) in the same order, with "
          "the same Options::sharding; rank 0 has {} tensors of "
          "{} elements, and these differ: {}",
          rows[0], rows[1], differ);
  }

  void check_views() const {
    for (std::size_t t = 0; t < sizes_.size(); ++t) {
      const TensorView v = whole_->value(t);
      if (v.dtype != dtypes_[t] || v.device != Device::host || v.numel != sizes_[t] ||
          (v.data == nullptr && v.numel > 0))
        throw_invalid_argument("parameter {}: the value is now {} elements of {} (built with {} of {} on the host)", t,
                               v.numel, dtype_name(v.dtype), sizes_[t], dtype_name(dtypes_[t]));
      const ConstTensorView g = whole_->grad(t);
      if (g.is_absent() && mode_ == Sharding::zero1) continue;
      if (g.is_absent()) throw_invalid_argument("parameter {}: ZeRO-2 needs every gradient, this one is absent", t);
      if (g.numel != sizes_[t] || (g.data == nullptr && g.numel > 0))
        throw_invalid_argument("parameter {}: the gradient has {} elements, the value {}", t, g.numel, sizes_[t]);
      if (mode_ == Sharding::zero2 && (g.dtype != DType::f32 || g.device != Device::host))
        throw_invalid_argument("parameter {}: ZeRO-2 reduces float32 host gradients, this one is {}", t,
                               dtype_name(g.dtype));
    }
  }

  // Sum of every rank's gradients of this rank's share, then the mean: divided here, on
  // the share, by the rank count (a float division, the same on every rank's share).
  void reduce_gradients() {
    const std::size_t me = static_cast<std::size_t>(comm_.rank());
    for (std::size_t t = 0; t < sizes_.size(); ++t) {
      const ConstTensorView g = whole_->grad(t);
      const std::span<const float> all(static_cast<const float*>(g.data), g.numel);
      const std::span<const std::size_t> counts = share_.counts(t);
      comm_.reduce_scatter(all, std::span<float>(grads_).subspan(at_[t], counts[me]), counts);
    }
    const auto ranks = static_cast<float>(comm_.size());
    for (float& x : grads_) x /= ranks;
  }

  // Every owner's new values to every rank, tensor by tensor, through a float copy of
  // this rank's piece (a collective's input must not alias its output). A 16-bit tensor
  // is gathered as floats and rounded back: exact, its values being 16-bit already.
  void gather_values() {
    const std::size_t me = static_cast<std::size_t>(comm_.rank());
    for (std::size_t t = 0; t < sizes_.size(); ++t) {
      const std::span<const std::size_t> counts = share_.counts(t);
      const std::size_t n = counts[me];
      const TensorView v = whole_->value(t);
      std::size_t offset = 0;  // where this rank's piece starts within the tensor
      for (std::size_t r = 0; r < me; ++r) offset += counts[r];
      visit_dtype(v.dtype, [&](auto type) {
        using T = typename decltype(type)::type;
        T* const data = static_cast<T*>(v.data);
        std::transform(data + offset, data + offset + n, scratch_.begin(), [](T x) { return static_cast<float>(x); });
        const std::span<float> all = std::is_same_v<T, float>
                                         ? std::span<float>(reinterpret_cast<float*>(data), v.numel)
                                         : std::span<float>(gathered_).first(v.numel);
        comm_.all_gather(std::span<const float>(scratch_).first(n), all, counts);
        if constexpr (!std::is_same_v<T, float>)
          std::transform(all.begin(), all.end(), data, [](float x) { return T(x); });
      });
    }
  }

  AnyCommunicator comm_;
  Sharding mode_;
  std::vector<std::size_t> sizes_;  // per tensor, as built
  std::vector<DType> dtypes_;       // per tensor: its value's
  ZeroShare share_{std::span<const std::size_t>{}, 0, 1};
  std::vector<std::size_t> at_;  // per tensor: where this rank's piece starts in its share
  std::vector<float> grads_;     // ZeRO-2: the mean gradients of this rank's share
  std::vector<float> scratch_;   // this rank's widest piece, for the all-gather
  std::vector<float> gathered_;  // the widest 16-bit tensor, gathered as floats
  std::unique_ptr<Tensors> whole_;
  std::optional<Local> local_;
};

}  // namespace dos
