// dos._core: the C++ engine over raw tensor views, for the Python layer in dos/torch.py.
//
// Nothing here includes or links a framework: Python hands over each tensor as
// (data pointer as an integer, element count, dtype code, device code), so one build
// serves every torch version (and could serve any framework). The views live in a
// table the engine owns; Python rewrites them before every step() and grad_ready()
// because torch may reallocate a gradient (or a user may rebind `p.data`) between
// steps, and dos re-reads `tensor_traits` every step.
//
// The C++ API used is listed in the README's Python section, so the optimizer's owner
// can keep it stable.

#include <dos/backend/cpu.hpp>
#include <dos/backend/emulated_device.hpp>
#include <dos/interleaved_optimizer.hpp>
#include <dos/version.hpp>
#ifdef DOS_WITH_CUDA_TOOLKIT
#include <dos/backend/cuda.hpp>
#endif

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace nb = nanobind;

namespace dos::python {

// The views of every parameter, rewritten by Python; the engine reads them through
// tensor_traits<PyParam>. Heap-allocated once so that its address never moves.
struct ViewTable {
  std::vector<TensorView> values;
  std::vector<ConstTensorView> grads;
};

// A parameter as the engine holds it: a row of the table.
struct PyParam {
  const ViewTable* table = nullptr;
  std::size_t index = 0;
};

}  // namespace dos::python

template <>
struct dos::tensor_traits<dos::python::PyParam> {
  static TensorView value(const dos::python::PyParam& p) { return p.table->values[p.index]; }
  static ConstTensorView grad(const dos::python::PyParam& p) { return p.table->grads[p.index]; }
};
static_assert(dos::Tensor<dos::python::PyParam>);

namespace dos::python {

// (pointer, elements, dtype code, device code), as dos/torch.py builds them.
using RawView = std::tuple<std::uintptr_t, std::size_t, int, int>;

DType to_dtype(int code) {
  switch (code) {
    case 0: return DType::f32;
    case 1: return DType::bf16;
    case 2: return DType::f16;
  }
  throw_invalid_argument("unknown dtype code {}", code);
}
Device to_device(int code) { return code == 0 ? Device::host : Device::device; }

TensorView value_view(const RawView& r) {
  const auto& [ptr, numel, dtype, device] = r;
  return {reinterpret_cast<void*>(ptr), numel, to_dtype(dtype), to_device(device)};
}
ConstTensorView grad_view(const RawView& r) {
  const auto& [ptr, numel, dtype, device] = r;
  return {reinterpret_cast<const void*>(ptr), numel, to_dtype(dtype), to_device(device)};
}

// The one place where Python's policy names become C++ policies. `arg` is the
// policy's parameter: k for fixed_stride, the largest k for automatic_stride and
// resident_then_stride, the resident share for static_fraction; `arg2`, for
// resident_then_stride alone, the fixed share whose count it compares too. Adapt here
// when the C++ policy type changes.
AnyPolicy to_policy(std::string_view name, std::optional<double> arg, std::optional<double> arg2) {
  const auto whole = [&](double x) {  // checked before the cast: a float out of range is UB to convert
    if (!(x >= 1 && x <= 1e6 && x == std::floor(x)))
      throw_invalid_argument("policy {} needs a whole number in [1, 1e6], got {}", name, x);
    return static_cast<std::uint32_t>(x);
  };
  if (name == "resident_then_stride") {
    ResidentThenStride p;
    if (arg) p.max_stride = whole(*arg);
    if (arg2 && !(*arg2 >= 0 && *arg2 <= 1))
      throw_invalid_argument("policy resident_then_stride's fixed share must be in [0, 1], got {}", *arg2);
    if (arg2) p.fixed_share = StaticFraction{*arg2};
    return p;
  }
  const auto one = [&](AnyPolicy p) {  // the others take one argument at most
    if (arg2) throw_invalid_argument("policy {} takes at most one argument, got a second ({})", name, *arg2);
    return p;
  };
  if (name == "all_cpu") return one(AllCpu{});
  if (name == "static_fraction") return one(StaticFraction{arg ? *arg : StaticFraction{}.fraction});
  if (name == "fixed_stride") return one(FixedStride{arg ? whole(*arg) : FixedStride{}.stride});
  if (name == "automatic_stride") return one(AutomaticStride{arg ? whole(*arg) : AutomaticStride{}.max_stride});
  if (name == "balanced") return one(Balanced{});
  throw_invalid_argument("unknown policy '{}' (all_cpu, static_fraction, fixed_stride, automatic_stride, balanced, "
                         "resident_then_stride)", name);
}

// What Python chooses beside the hyperparameters.
struct EngineOptions {
  std::string backend = "cpu";
  unsigned threads = 0;
  std::size_t subgroup_elements = 100'000'000;
  double max_grad_norm = 0;
  bool skip_nonfinite = false;
  std::optional<std::tuple<double, double, double, std::int64_t>> loss_scaling;  // init, growth, backoff, interval
  std::string policy = "automatic_stride";
  std::optional<double> policy_arg;
  std::optional<double> policy_arg2;
  std::size_t staging_budget = 0;
  std::uintptr_t stream = 0;  // the framework's CUDA stream (cuda backend)
};

Options to_options(const EngineOptions& e) {
  Options o;
  o.threads = e.threads;
  o.subgroup_elements = e.subgroup_elements;
  o.max_grad_norm = e.max_grad_norm;
  if (e.skip_nonfinite) o.nonfinite = NonFinitePolicy::skip_step;
  if (e.loss_scaling) {
    const auto& [init, growth, backoff, interval] = *e.loss_scaling;
    o.loss_scaling = LossScaling{init, growth, backoff, interval};
  }
  o.interleave.policy = to_policy(e.policy, e.policy_arg, e.policy_arg2);
  o.interleave.staging_budget = e.staging_budget;
  return o;
}

nb::dict to_dict(const StepReport& r) {
  nb::dict d;
  d["applied"] = r.applied;
  d["step"] = r.step;
  d["elements"] = r.elements;
  d["seconds"] = r.seconds;
  d["overflow"] = r.overflow;
  d["nonfinite_params"] = r.nonfinite_params;
  d["grad_norm"] = r.grad_norm;
  d["clip_coef"] = r.clip_coef;
  d["loss_scale"] = r.loss_scale;
  d["policy"] = std::string(r.policy);
  d["stride"] = r.stride;
  d["device_subgroups"] = r.device_subgroups;
  d["resident_subgroups"] = r.resident_subgroups;
  d["bytes_moved"] = r.bytes_moved;
  d["predicted_seconds"] = r.predicted_seconds;
  d["update_seconds"] = r.update_seconds;
  d["fallback"] = std::string(r.fallback);
  d["explored"] = r.explored;
  return d;
}

// The backend-independent face of InterleavedOptimizer<Backend>.
class Engine {
 public:
  virtual ~Engine() = default;
  virtual StepReport step() = 0;
  virtual void begin_backward() = 0;
  virtual void grad_ready(std::size_t param) = 0;
  virtual double loss_scale() const = 0;
  virtual std::int64_t step_count() const = 0;
  virtual void set_step_count(std::int64_t t) = 0;
  virtual std::int64_t param_step_count(std::size_t param) const = 0;
  virtual void set_param_step_count(std::size_t param, std::int64_t t) = 0;
  virtual std::int64_t loss_scale_growth_tracker() const = 0;
  virtual void set_loss_scaler_state(double scale, std::int64_t tracker) = 0;
  virtual void set_lr(std::size_t group, double lr) = 0;
  virtual void set_hyperparameters(std::size_t group, const AdamConfig& c) = 0;
  virtual AdamConfig hyperparameters(std::size_t group) const = 0;
  virtual void read_state(std::size_t param, StateKind kind, std::span<float> out) = 0;
  virtual void write_state(std::size_t param, StateKind kind, std::span<const float> in) = 0;
  virtual unsigned threads() const = 0;
  virtual std::size_t num_params() const = 0;
  virtual bool device_available() const = 0;
  virtual void set_staging_budget(std::size_t bytes) = 0;
};

template <class Backend>
class EngineOf final : public Engine {
 public:
  EngineOf(std::vector<ParamGroup<PyParam>> groups, const Options& o, typename Backend::Config config)
      : opt_(std::move(groups), o, config) {}
  StepReport step() override { return opt_.step(); }
  void begin_backward() override { opt_.begin_backward(); }
  void grad_ready(std::size_t param) override { opt_.grad_ready(param); }
  double loss_scale() const override { return opt_.loss_scale(); }
  std::int64_t step_count() const override { return opt_.step_count(); }
  void set_step_count(std::int64_t t) override { opt_.set_step_count(t); }
  std::int64_t param_step_count(std::size_t param) const override { return opt_.step_count(param); }
  void set_param_step_count(std::size_t param, std::int64_t t) override { opt_.set_step_count(param, t); }
  std::int64_t loss_scale_growth_tracker() const override { return opt_.loss_scale_growth_tracker(); }
  void set_loss_scaler_state(double scale, std::int64_t tracker) override { opt_.set_loss_scaler_state(scale, tracker); }
  void set_lr(std::size_t group, double lr) override { opt_.set_lr(group, lr); }
  void set_hyperparameters(std::size_t group, const AdamConfig& c) override { opt_.set_hyperparameters(group, c); }
  AdamConfig hyperparameters(std::size_t group) const override { return opt_.hyperparameters(group); }
  void read_state(std::size_t param, StateKind kind, std::span<float> out) override {
    opt_.read_state(param, kind, out);
  }
  void write_state(std::size_t param, StateKind kind, std::span<const float> in) override {
    opt_.write_state(param, kind, in);
  }
  unsigned threads() const override { return opt_.threads(); }
  std::size_t num_params() const override { return opt_.num_params(); }
  bool device_available() const override { return opt_.device_available(); }
  void set_staging_budget(std::size_t bytes) override {
    if constexpr (InterleavedOptimizer<Backend>::interleaved) opt_.set_staging_budget(bytes);
    else throw_invalid_argument("set_staging_budget needs a device backend (emulated or cuda), not cpu");
  }

 private:
  InterleavedOptimizer<Backend> opt_;
};

// The optimizer Python holds: the view table and the engine reading it.
class PyOptimizer {
 public:
  PyOptimizer(const std::vector<RawView>& values, const std::vector<std::size_t>& group_sizes,
              const std::vector<AdamConfig>& hypers, const EngineOptions& e)
      : table_(std::make_unique<ViewTable>()) {
    if (group_sizes.size() != hypers.size())
      throw_invalid_argument("{} group sizes for {} hyperparameter sets", group_sizes.size(), hypers.size());
    std::size_t total = 0;
    for (std::size_t n : group_sizes) total += n;
    if (total != values.size())
      throw_invalid_argument("the groups hold {} parameters, but {} views were given", total, values.size());
    for (const RawView& v : values) {
      table_->values.push_back(value_view(v));
      table_->grads.push_back(ConstTensorView::absent());  // no gradient yet (.grad is None)
    }
    std::vector<ParamGroup<PyParam>> groups;
    std::size_t next = 0;
    for (std::size_t g = 0; g < group_sizes.size(); ++g) {
      ParamGroup<PyParam> group;
      group.hyper = hypers[g];
      for (std::size_t i = 0; i < group_sizes[g]; ++i) group.params.push_back({table_.get(), next++});
      groups.push_back(std::move(group));
    }
    const Options o = to_options(e);
    if (e.backend == "cpu") {
      engine_ = std::make_unique<EngineOf<CpuBackend>>(std::move(groups), o, CpuBackend::Config{});
    } else if (e.backend == "emulated") {
      engine_ = std::make_unique<EngineOf<EmulatedDeviceBackend>>(std::move(groups), o, EmulatedDeviceConfig{});
    } else if (e.backend == "cuda") {
#ifdef DOS_WITH_CUDA_TOOLKIT
      CudaConfig c;
      // 0: the legacy default stream, named as such (a null stream would be the
      // per-thread one in code built with --default-stream per-thread).
      if (e.stream != 0) c.framework_stream = reinterpret_cast<cudaStream_t>(e.stream);
      engine_ = std::make_unique<EngineOf<CudaBackend>>(std::move(groups), o, c);
#else
      throw_invalid_argument("backend 'cuda' is not available: this build of dos found no CUDA toolkit "
                             "(reinstall with nvcc on PATH), use 'cpu' or 'emulated'");
#endif
    } else {
      throw_invalid_argument("unknown backend '{}' (cpu, emulated, cuda)", e.backend);
    }
  }

  /// A missing gradient (None: `.grad is None`, or a frozen parameter) is absent: skipped.
  void set_views(std::size_t i, const RawView& value, const std::optional<RawView>& grad) {
    check(i);
    table_->values[i] = value_view(value);
    table_->grads[i] = grad ? grad_view(*grad) : ConstTensorView::absent();
  }
  void set_value(std::size_t i, const RawView& value) {
    check(i);
    table_->values[i] = value_view(value);
  }
  Engine& engine() { return *engine_; }
  const Engine& engine() const { return *engine_; }
  void check(std::size_t i) const {
    if (i >= table_->values.size())
      throw_invalid_argument("parameter {} does not exist (there are {})", i, table_->values.size());
  }

 private:
  std::unique_ptr<ViewTable> table_;
  std::unique_ptr<Engine> engine_;
};

StateKind to_kind(std::string_view name) {
  if (name == "master") return StateKind::master;
  if (name == "exp_avg") return StateKind::exp_avg;
  if (name == "exp_avg_sq") return StateKind::exp_avg_sq;
  if (name == "max_exp_avg_sq") return StateKind::max_exp_avg_sq;
  throw_invalid_argument("unknown state '{}' (master, exp_avg, exp_avg_sq, max_exp_avg_sq)", name);
}

}  // namespace dos::python

NB_MODULE(_core, m) {
  using namespace dos;
  using namespace dos::python;
  m.doc() = "dos's C++ engine over raw tensor views (no framework linked)";
  m.attr("version") = dos::version;
#ifdef DOS_WITH_CUDA_TOOLKIT
  m.attr("has_cuda") = true;
#else
  m.attr("has_cuda") = false;
#endif

  nb::class_<AdamConfig>(m, "AdamConfig")
      .def(nb::init<>())
      .def_rw("lr", &AdamConfig::lr)
      .def_rw("beta1", &AdamConfig::beta1)
      .def_rw("beta2", &AdamConfig::beta2)
      .def_rw("eps", &AdamConfig::eps)
      .def_rw("weight_decay", &AdamConfig::weight_decay)
      .def_rw("amsgrad", &AdamConfig::amsgrad)
      .def_rw("maximize", &AdamConfig::maximize)
      .def_rw("decoupled_weight_decay", &AdamConfig::decoupled_weight_decay);

  // Checks hyperparameters with dos's own rules and messages, without an optimizer.
  m.def("validate", [](const AdamConfig& c, std::optional<std::size_t> group) { validate(c, group); }, nb::arg("config"),
        nb::arg("group") = nb::none());

  nb::class_<EngineOptions>(m, "EngineOptions")
      .def(nb::init<>())
      .def_rw("backend", &EngineOptions::backend)
      .def_rw("threads", &EngineOptions::threads)
      .def_rw("subgroup_elements", &EngineOptions::subgroup_elements)
      .def_rw("max_grad_norm", &EngineOptions::max_grad_norm)
      .def_rw("skip_nonfinite", &EngineOptions::skip_nonfinite)
      .def_rw("loss_scaling", &EngineOptions::loss_scaling)
      .def_rw("policy", &EngineOptions::policy)
      .def_rw("policy_arg", &EngineOptions::policy_arg)
      .def_rw("policy_arg2", &EngineOptions::policy_arg2)
      .def_rw("staging_budget", &EngineOptions::staging_budget)
      .def_rw("stream", &EngineOptions::stream);

  nb::class_<PyOptimizer>(m, "Optimizer")
      .def(nb::init<const std::vector<RawView>&, const std::vector<std::size_t>&, const std::vector<AdamConfig>&,
                    const EngineOptions&>(),
           nb::arg("values"), nb::arg("group_sizes"), nb::arg("hypers"), nb::arg("options"))
      .def("set_views", &PyOptimizer::set_views, nb::arg("param"), nb::arg("value"), nb::arg("grad").none())
      .def("set_value", &PyOptimizer::set_value, nb::arg("param"), nb::arg("value"))
      // The update runs without the GIL: other Python threads (data loaders) go on.
      .def("step",
           [](PyOptimizer& o) {
             StepReport r;
             {
               nb::gil_scoped_release release;
               r = o.engine().step();
             }
             return to_dict(r);
           })
      .def("begin_backward", [](PyOptimizer& o) { o.engine().begin_backward(); })
      // Called from autograd hooks; the GIL stays held, which serialises hooks that
      // several autograd threads may fire.
      .def("grad_ready", [](PyOptimizer& o, std::size_t i, const RawView& value, const RawView& grad) {
             o.set_views(i, value, grad);
             o.engine().grad_ready(i);
           })
      .def("loss_scale", [](const PyOptimizer& o) { return o.engine().loss_scale(); })
      .def("step_count", [](const PyOptimizer& o) { return o.engine().step_count(); })
      .def("set_step_count", [](PyOptimizer& o, std::int64_t t) { o.engine().set_step_count(t); })
      // Each parameter's own count: torch's state[p]["step"] (skipped steps not counted).
      .def("param_step_count", [](PyOptimizer& o, std::size_t i) { o.check(i); return o.engine().param_step_count(i); })
      .def("set_param_step_count",
           [](PyOptimizer& o, std::size_t i, std::int64_t t) { o.engine().set_param_step_count(i, t); })
      .def("loss_scale_growth_tracker", [](const PyOptimizer& o) { return o.engine().loss_scale_growth_tracker(); })
      .def("set_loss_scaler_state",
           [](PyOptimizer& o, double scale, std::int64_t tracker) { o.engine().set_loss_scaler_state(scale, tracker); })
      .def("set_lr", [](PyOptimizer& o, std::size_t g, double lr) { o.engine().set_lr(g, lr); })
      .def("set_hyperparameters",
           [](PyOptimizer& o, std::size_t g, const AdamConfig& c) { o.engine().set_hyperparameters(g, c); })
      .def("hyperparameters", [](const PyOptimizer& o, std::size_t g) { return o.engine().hyperparameters(g); })
      // State moves through raw fp32 buffers Python allocates (contiguous tensors).
      .def("read_state",
           [](PyOptimizer& o, std::size_t i, const std::string& kind, std::uintptr_t out, std::size_t n) {
             o.engine().read_state(i, to_kind(kind), {reinterpret_cast<float*>(out), n});
           })
      .def("write_state",
           [](PyOptimizer& o, std::size_t i, const std::string& kind, std::uintptr_t in, std::size_t n) {
             o.engine().write_state(i, to_kind(kind), {reinterpret_cast<const float*>(in), n});
           })
      .def("threads", [](const PyOptimizer& o) { return o.engine().threads(); })
      .def("num_params", [](const PyOptimizer& o) { return o.engine().num_params(); })
      .def("device_available", [](const PyOptimizer& o) { return o.engine().device_available(); })
      .def("set_staging_budget", [](PyOptimizer& o, std::size_t b) { o.engine().set_staging_budget(b); });
}
