#pragma once
/// @file
/// @brief `ShardedOptimizer<Backend, Components>`: ZeRO-1 and ZeRO-2, dos sharding the
///        optimizer over the ranks itself. Every rank passes every parameter; each
///        updates, and keeps state for, only its `ZeroShare` (an `InterleavedOptimizer`
///        over `SliceParam`s of the caller's tensors), then the ranks all-gather the
///        updated values. ZeRO-2 first averages the ranks' gradients with a
///        reduce-scatter into a buffer holding only this rank's share.

#include "dos/backend/cpu.hpp"
#include "dos/comm/gather_rows.hpp"
#include "dos/components.hpp"
#include "dos/core/tensor.hpp"
#include "dos/error.hpp"
#include "dos/interleaved_optimizer.hpp"
#include "dos/options.hpp"
#include "dos/shard/share.hpp"
#include "dos/shard/slice.hpp"
#include "dos/shard/whole_norm.hpp"

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
/// already averaged, in place; (3) the local optimizer steps its share, clipping by the
/// global norm and skipping overflowing steps on every rank alike. ZeRO-1 takes that
/// norm on every rank from every (host) gradient, as one process would
/// (`WholeGradNorm`), so clipped steps stay bit-identical to one process; ZeRO-2 sums
/// the ranks' shares as the framework mode does; (4) if the step was applied, per tensor, an all-gather gives every rank every
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
  ///         applied or overflowed are global (the same on every rank); `elements`
  ///         speaks of this rank's pieces, and so does `first_nonfinite_param`, except
  ///         in ZeRO-1 with host gradients, where it indexes the tensors every rank passed.
  StepReport step() {
    try {
      const bool host_grads = same_call(step_call, "step() changed nothing", [&] { return check_views(); });
      if (mode_ == Sharding::zero2) reduce_gradients();
      const auto whole = [&] { return whole_norm_->gather(local_->cpu_executor(), [&](std::size_t t) { return whole_->grad(t); }); };
      const StepReport r = whole_norm_ && host_grads ? local_->guarded_step(whole) : local_->step();
      if (r.applied) gather_values();
      forget();
      return r;
    } catch (...) {
      forget();  // what backward reported may not describe a retried step's gradients
      throw;
    }
  }

  // ---- During backward (optional) -------------------------------------------------

  /// @brief Backward is about to start: forgets what the last one reported, and lets a
  ///        device backend choose the coming update's plan (`InterleavedOptimizer::begin_backward`).
  void begin_backward() {
    forget();
    local_->begin_backward();
  }
  /// @brief Tensor @p t's gradient is final for this backward pass; it must stay
  ///        unchanged until `step()` returns. The step then reads less.
  ///  - ZeRO-1: local to this rank, and distinct tensors may be reported from several
  ///    threads at once. The gradient must already be the averaged one (after the
  ///    framework's all-reduce, not in a hook that runs before it): takes t's part of
  ///    the norm now (`WholeGradNorm`; an absent gradient is read again at the step),
  ///    and hands this rank's piece of t to the local optimizer
  ///    (`InterleavedOptimizer::grad_ready`: a device backend starts its copy).
  ///  - ZeRO-2: a collective, like `step()`: every rank reports the same tensors in the
  ///    same order, from one thread. The ranks first agree (one small all-reduce), then
  ///    t's gradients are reduce-scattered and averaged into this rank's share now, not
  ///    at the step, and its piece goes to the local optimizer as above.
  /// @throws std::invalid_argument for a bad index or view, with nothing changed; in
  ///         ZeRO-2 on every rank, naming the failing ranks, also when ranks reported
  ///         different tensors, or reported different tensors before (an uneven
  ///         `begin_backward`), or one called `step()` meanwhile. Then every rank forgets
  ///         what this backward reported (the step reduces every tensor).
  void grad_ready(std::size_t t) {
    const auto check = [&] {
      if (t >= sizes_.size()) throw_invalid_argument("grad_ready: tensor {} does not exist (there are {})", t, sizes_.size());
      check_view(t);
      return true;
    };
    if (mode_ == Sharding::zero1) {
      check();
      const ConstTensorView g = whole_->grad(t);
      if (whole_norm_ && (g.is_absent() || g.device == Device::host)) whole_norm_->record(t, g);
    } else {
      same_call(static_cast<double>(t), "grad_ready() changed nothing", check);
      reduce_gradient(t);
      reduced_[t] = 1;
    }
    if (piece_of_[t] != no_piece) local_->grad_ready(piece_of_[t]);
  }

  /// @brief This rank's part of the parameters.
  const ZeroShare& share() const noexcept { return share_; }
  /// @brief The optimizer of this rank's share: its parameters are `share().pieces()`, in
  ///        order (an empty share: one stand-in of no elements). Read its state, set its
  ///        learning rate or schedule there, the same on every rank. Step only through
  ///        this class, and report gradients through this class's `grad_ready`; the
  ///        local `accumulate` is not for ZeRO (ZeRO-2's gradients exist only once reduced).
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
    piece_of_.assign(sizes_.size(), no_piece);
    reduced_.assign(sizes_.size(), 0);
    for (std::size_t k = 0; k < share_.pieces().size(); ++k) piece_of_[share_.pieces()[k].tensor] = k;
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
    if (mode_ == Sharding::zero1)  // every rank holds every gradient: the norm as one process takes it
      whole_norm_.emplace(sizes_, make_partitioner<typename C::partitioner>(options.subgroup_elements).partition(sizes_));
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

  // Whether every gradient is absent or on the host.
  bool check_views() const {
    bool host = true;
    for (std::size_t t = 0; t < sizes_.size(); ++t) {
      check_view(t);
      const ConstTensorView g = whole_->grad(t);
      host = host && (g.is_absent() || g.device == Device::host);
    }
    return host;
  }
  void check_view(std::size_t t) const {
    const TensorView v = whole_->value(t);
    if (v.dtype != dtypes_[t] || v.device != Device::host || v.numel != sizes_[t] || (v.data == nullptr && v.numel > 0))
      throw_invalid_argument("parameter {}: the value is now {} elements of {} (built with {} of {} on the host)", t,
                             v.numel, dtype_name(v.dtype), sizes_[t], dtype_name(dtypes_[t]));
    const ConstTensorView g = whole_->grad(t);
    if (g.is_absent() && mode_ == Sharding::zero1) return;
    if (g.is_absent()) throw_invalid_argument("parameter {}: ZeRO-2 needs every gradient, this one is absent", t);
    if (g.numel != sizes_[t] || (g.data == nullptr && g.numel > 0))
      throw_invalid_argument("parameter {}: the gradient has {} elements, the value {}", t, g.numel, sizes_[t]);
    if (mode_ == Sharding::zero2 && (g.dtype != DType::f32 || g.device != Device::host))
      throw_invalid_argument("parameter {}: ZeRO-2 reduces float32 host gradients, this one is {}", t,
                             dtype_name(g.dtype));
  }

  // Runs @p local (which returns whether this rank's gradients are all on the host) on
  // every rank and agrees that all succeeded, all are in the same call (@p call is
  // `step_call` for step(), else the tensor grad_ready(t) reports) and all reduced the
  // same tensors before. A rank elsewhere fails every rank, named, instead of pairing
  // unlike collectives; every rank then forgets what this backward reported, so all
  // leave in the same state. Returns whether every rank's gradients are on the host.
  template <class F>
  bool same_call(double call, const char* what, F&& local) {
    if (comm_.size() == 1) return local();  // no collective: nothing to pair, nothing allocated
    constexpr std::size_t fields = 3;
    std::vector<double> rows;
    try {
      rows = gather_rows(comm_, fields, what, [&](std::span<double> row) {
        row[0] = call;
        row[1] = reported_digest();
        row[2] = local() ? 1 : 0;
      });
    } catch (...) {
      forget();
      throw;
    }
    std::string differ;
    bool host = true;
    const auto name = [](double c) { return c == step_call ? std::string("step()") : fmt::format("grad_ready({})", c); };
    for (std::size_t r = 0; r < rows.size() / fields; ++r) {
      const double* row = rows.data() + r * fields;
      host = host && row[2] != 0;
      if (row[0] != rows[0])
        differ += fmt::format("{}rank {} in {}", differ.empty() ? "" : ", ", r, name(row[0]));
      else if (row[1] != rows[1])
        differ += fmt::format("{}rank {} after other reports", differ.empty() ? "" : ", ", r);
    }
    if (!differ.empty()) {
      forget();
      throw_invalid_argument("{} on any of the {} ranks: rank 0 is in {}, but {}; ZeRO-2 ranks report the same "
                             "tensors in the same order (all of this backward's reports are forgotten)",
                             what, comm_.size(), name(rows[0]), differ);
    }
    return host;
  }
  // A 52-bit digest of the tensors reduced this backward (exact in a double).
  double reported_digest() const noexcept {
    std::uint64_t h = 14695981039346656037ull;
    for (std::size_t t = 0; t < reduced_.size(); ++t)
      if (reduced_[t] != 0) h = (h ^ t) * 1099511628211ull;
    return static_cast<double>(h >> 12);
  }
  void forget() {
    std::fill(reduced_.begin(), reduced_.end(), std::uint8_t{0});
    if (whole_norm_) whole_norm_->forget();
  }

  // Sum of every rank's gradients of this rank's share, then the mean: divided here, on
  // the share, by the rank count (a float division, the same on every rank's share).
  // Tensors grad_ready reduced already are not reduced again.
  void reduce_gradients() {
    for (std::size_t t = 0; t < sizes_.size(); ++t)
      if (reduced_[t] == 0) reduce_gradient(t);
  }
  void reduce_gradient(std::size_t t) {
    const std::size_t me = static_cast<std::size_t>(comm_.rank());
    const ConstTensorView g = whole_->grad(t);
    const std::span<const float> all(static_cast<const float*>(g.data), g.numel);
    const std::span<const std::size_t> counts = share_.counts(t);
    const std::span<float> mine = std::span<float>(grads_).subspan(at_[t], counts[me]);
    comm_.reduce_scatter(all, mine, counts);
    const auto ranks = static_cast<float>(comm_.size());
    for (float& x : mine) x /= ranks;
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

  static constexpr double step_call = -1;  // same_call's id of step(); grad_ready(t)'s is t
  static constexpr std::size_t no_piece = static_cast<std::size_t>(-1);

  AnyCommunicator comm_;
  Sharding mode_;
  std::vector<std::size_t> sizes_;  // per tensor, as built
  std::vector<DType> dtypes_;       // per tensor: its value's
  ZeroShare share_{std::span<const std::size_t>{}, 0, 1};
  std::vector<std::size_t> at_;  // per tensor: where this rank's piece starts in its share
  std::vector<std::size_t> piece_of_;  // per tensor: the index of this rank's piece, or no_piece
  std::vector<std::uint8_t> reduced_;  // ZeRO-2, per tensor: grad_ready reduced it this backward
  std::vector<float> grads_;     // ZeRO-2: the mean gradients of this rank's share
  std::vector<float> scratch_;   // this rank's widest piece, for the all-gather
  std::vector<float> gathered_;  // the widest 16-bit tensor, gathered as floats
  std::unique_ptr<Tensors> whole_;
  std::optional<WholeGradNorm> whole_norm_;  // ZeRO-1
  std::optional<Local> local_;
};

}  // namespace dos
