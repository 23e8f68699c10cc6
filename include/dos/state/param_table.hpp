#pragma once
/// @file
/// @brief `ParamTable`: the framework's parameters as dos sees them. It erases the
///        tensor type, records what each parameter was at construction (size, type,
///        place, group), and reads and validates every view. A view that no longer
///        matches throws `std::invalid_argument` naming the parameter, before anything
///        the optimizer holds has changed.

#include "dos/core/tensor.hpp"
#include "dos/error.hpp"
#include "dos/memory/host_resource.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

namespace dos {

namespace detail {

/// Type-erased access to the framework's parameters, re-read at every step.
class ParamSource {
 public:
  virtual ~ParamSource() = default;
  virtual std::size_t size() const = 0;
  virtual TensorView value(std::size_t i) const = 0;
  virtual ConstTensorView grad(std::size_t i) const = 0;
};

template <Tensor P>
class ParamList final : public ParamSource {
 public:
  explicit ParamList(std::vector<P> params) : params_(std::move(params)) {}
  std::size_t size() const override { return params_.size(); }
  TensorView value(std::size_t i) const override { return tensor_traits<P>::value(params_[i]); }
  ConstTensorView grad(std::size_t i) const override { return tensor_traits<P>::grad(params_[i]); }

 private:
  std::vector<P> params_;
};

inline bool misaligned(const void* p, DType t) { return reinterpret_cast<std::uintptr_t>(p) % dtype_size(t) != 0; }
inline std::string_view place_name(Device d) { return d == Device::host ? "host" : "device"; }

}  // namespace detail

/// @brief What a parameter was when the optimizer was built.
struct ParamRecord {
  std::size_t numel = 0;
  DType dtype = DType::f32;
  Device device = Device::host;
  std::uint32_t group = 0;
};

/// @brief The parameters, their records and their views of the current step.
class ParamTable {
 public:
  /// @param params the framework's parameters.
  /// @param groups the group of each parameter.
  /// @param device_ok whether device-resident views are accepted (a backend with a
  ///        usable device).
  /// @param device_backend whether the backend is a device backend at all (for the
  ///        message when it has no usable device).
  /// @param collapse_pages whether to move the host values and gradients onto huge
  ///        pages now (`collapse_host_pages`), before a device backend registers them.
  /// @throws std::invalid_argument for an empty list or a bad value view.
  template <Tensor P>
  ParamTable(std::vector<P> params, const std::vector<std::uint32_t>& groups, bool device_ok, bool device_backend,
             bool collapse_pages = false)
      : device_ok_(device_ok), device_backend_(device_backend) {
    if (params.empty()) throw_invalid_argument("the parameter list is empty");
    source_ = std::make_unique<detail::ParamList<P>>(std::move(params));
    const std::size_t n = source_->size();
    records_.resize(n);
    values_.resize(n);
    grads_.resize(n);
    next_values_.resize(n);  // the views being checked: swapped in once all passed
    next_grads_.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      const TensorView v = source_->value(i);
      check_value(i, v);
      records_[i] = {v.numel, v.dtype, v.device, groups[i]};
      values_[i] = v;
      total_elements_ += v.numel;
    }
    order_.resize(n);
    for (std::size_t i = 0; i < n; ++i) order_[i] = static_cast<std::uint32_t>(i);
    check_overlaps(values_);
    if (collapse_pages) collapse_host_pages();
  }

  /// @brief Moves the host values and gradients the framework passed at construction
  ///        onto huge pages (`collapse_to_huge_pages`); device views and absent gradients
  ///        are left alone. @return the bytes moved.
  std::size_t collapse_host_pages() const {
    // All at once: views of one flat buffer are collapsed as the one range they form.
    std::vector<HostRange> ranges;
    for (std::size_t i = 0; i < size(); ++i) {
      if (on_device(i)) continue;
      const TensorView v = source_->value(i);
      ranges.push_back({v.data, v.numel * dtype_size(v.dtype)});
      const ConstTensorView g = source_->grad(i);
      if (g.device == Device::host && !g.is_absent()) ranges.push_back({g.data, g.numel * dtype_size(g.dtype)});
    }
    return collapse_to_huge_pages(std::move(ranges));
  }

  std::size_t size() const noexcept { return records_.size(); }
  const ParamRecord& record(std::size_t i) const noexcept { return records_[i]; }
  bool on_device(std::size_t i) const noexcept { return records_[i].device == Device::device; }
  std::size_t total_elements() const noexcept { return total_elements_; }
  /// @brief Views of the last successful `refresh` (or construction).
  const TensorView& value(std::size_t i) const noexcept { return values_[i]; }
  const ConstTensorView& grad(std::size_t i) const noexcept { return grads_[i]; }
  /// @brief Whether parameter @p i has a gradient in the last `refresh` (else the step skips it).
  bool present(std::size_t i) const noexcept { return !grads_[i].is_absent(); }

  /// @throws std::invalid_argument when @p i is not a parameter.
  std::size_t checked(std::size_t i) const {
    if (i >= size()) throw_invalid_argument("parameter {} does not exist (there are {})", i, size());
    return i;
  }

  /// @brief Parameter @p i's value view as the framework gives it now, validated
  ///        against its record.
  TensorView read_value(std::size_t i) const {
    const TensorView v = source_->value(i);
    check_unchanged(i, v);
    return v;
  }
  /// @brief Parameter @p i's gradient view now, validated against its value @p v
  ///        (`ConstTensorView::absent()` passes: the parameter has no gradient).
  ConstTensorView read_grad(std::size_t i, const TensorView& v) const {
    const ConstTensorView g = source_->grad(i);
    check_grad(i, v, g);
    return g;
  }

  /// @brief Reads and validates every view; only when all passed are they kept.
  /// @param grad_of called as `grad_of(i, framework_grad)`: the gradient to use for
  ///        parameter i (the framework's, or an accumulated sum in its place).
  template <class GradOf>
  void refresh(GradOf&& grad_of) {
    for (std::size_t i = 0; i < size(); ++i) {
      next_values_[i] = read_value(i);
      next_grads_[i] = grad_of(i, source_->grad(i));
      check_grad(i, next_values_[i], next_grads_[i]);
    }
    check_overlaps(next_values_);
    values_.swap(next_values_);
    grads_.swap(next_grads_);
  }
  /// @brief Reads and validates every value view (gradients untouched), then keeps them.
  void refresh_values() {
    for (std::size_t i = 0; i < size(); ++i) next_values_[i] = read_value(i);
    check_overlaps(next_values_);
    values_.swap(next_values_);
  }

 private:
  // Two parameters whose values share bytes would get two m/v pairs and two updates
  // per step, with threads racing on them (torch rejects duplicate parameters). The
  // order by address is kept between calls and re-sorted only when views moved, so a
  // step costs one linear pass and allocates nothing.
  void check_overlaps(const std::vector<TensorView>& views) {
    const auto begin = [&](std::uint32_t i) { return reinterpret_cast<std::uintptr_t>(views[i].data); };
    const auto end = [&](std::uint32_t i) { return begin(i) + views[i].numel * dtype_size(views[i].dtype); };
    const auto before = [&](std::uint32_t a, std::uint32_t b) {
      return views[a].device != views[b].device ? views[a].device < views[b].device : begin(a) < begin(b);
    };
    if (!std::is_sorted(order_.begin(), order_.end(), before)) std::sort(order_.begin(), order_.end(), before);
    constexpr std::uint32_t none = ~std::uint32_t{0};
    std::uint32_t furthest = none;  // the non-empty view reaching furthest so far, on this place
    for (const std::uint32_t b : order_) {
      if (views[b].numel == 0) continue;
      if (furthest != none && views[furthest].device == views[b].device && begin(b) < end(furthest))
        throw_invalid_argument("parameters {} and {} overlap in memory (the same storage passed twice?); every "
                               "parameter needs storage of its own", std::min(furthest, b), std::max(furthest, b));
      if (furthest == none || views[furthest].device != views[b].device || end(b) > end(furthest)) furthest = b;
    }
  }

  void check_value(std::size_t i, const TensorView& v) const {
    if (!dtype_valid(v.dtype))
      throw_invalid_argument("parameter {}: value has an invalid dtype ({})", i, static_cast<int>(v.dtype));
    if (!device_ok_ && v.device != Device::host)
      throw_invalid_argument("parameter {}: its value lives on a device, but {} updates host memory only", i,
                             device_backend_ ? "this backend, which has no usable device," : "this backend");
    if (v.numel > 0 && v.data == nullptr) throw_invalid_argument("parameter {}: value pointer is null", i);
    if (detail::misaligned(v.data, v.dtype))
      throw_invalid_argument("parameter {}: value pointer {} is not aligned to {} bytes for {}", i, v.data,
                             dtype_size(v.dtype), dtype_name(v.dtype));
  }
  void check_unchanged(std::size_t i, const TensorView& v) const {
    check_value(i, v);
    const ParamRecord& r = records_[i];
    if (v.numel != r.numel)
      throw_invalid_argument("parameter {}: value has {} elements, but had {} when the optimizer was built", i,
                             v.numel, r.numel);
    if (v.dtype != r.dtype)
      throw_invalid_argument("parameter {}: value is {}, but was {} when the optimizer was built", i,
                             dtype_name(v.dtype), dtype_name(r.dtype));
    if (v.device != r.device)
      throw_invalid_argument("parameter {}: value moved to the {}, but was on the {} when the optimizer was built", i,
                             detail::place_name(v.device), detail::place_name(r.device));
  }
  void check_grad(std::size_t i, const TensorView& v, const ConstTensorView& g) const {
    if (g.is_absent()) return;  // no gradient this step: the parameter is skipped
    if (!dtype_valid(g.dtype))
      throw_invalid_argument("parameter {}: gradient has an invalid dtype ({})", i, static_cast<int>(g.dtype));
    if (g.numel != v.numel)
      throw_invalid_argument("parameter {}: gradient has {} elements, but the value has {}", i, g.numel, v.numel);
    if (!device_ok_ && g.device != Device::host)
      throw_invalid_argument("parameter {}: its gradient lives on a device, but this backend reads host memory", i);
    if (g.device != v.device)
      throw_invalid_argument("parameter {}: its gradient is on the {} but its value on the {}; dos needs both in "
                             "one place", i, detail::place_name(g.device), detail::place_name(v.device));
    // A device parameter updated on the CPU is fetched into a pinned mirror sized for
    // its value's type (half the pinned memory for a 16-bit model); torch gives a
    // parameter a gradient of its own type, so a wider one is refused, not catered for.
    if (g.device == Device::device && dtype_size(g.dtype) > dtype_size(v.dtype))
      throw_invalid_argument("parameter {}: its gradient on the device is {}, wider than its {} value; a device "
                             "parameter's gradient may be no wider than its value", i, dtype_name(g.dtype),
                             dtype_name(v.dtype));
    if (g.numel > 0 && g.data == nullptr) throw_invalid_argument("parameter {}: gradient pointer is null", i);
    if (detail::misaligned(g.data, g.dtype))
      throw_invalid_argument("parameter {}: gradient pointer {} is not aligned to {} bytes for {}", i, g.data,
                             dtype_size(g.dtype), dtype_name(g.dtype));
  }

  bool device_ok_;
  bool device_backend_;
  std::unique_ptr<detail::ParamSource> source_;
  std::vector<ParamRecord> records_;
  std::vector<TensorView> values_;
  std::vector<ConstTensorView> grads_;
  std::vector<TensorView> next_values_;
  std::vector<ConstTensorView> next_grads_;
  std::vector<std::uint32_t> order_;  // parameters by (place, address)
  std::size_t total_elements_ = 0;
};

}  // namespace dos
