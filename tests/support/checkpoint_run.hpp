#pragma once
// A training run that checkpoints: a mixed-precision model (fp32, bf16, fp16; two
// groups, one with amsgrad), dynamic loss scaling with an overflowing step, and a
// warmup + cosine schedule, on the CPU backend or the emulated device. Shared by the
// checkpoint tests: an uninterrupted run is the reference for resumed ones.

#include "backend_compare.hpp"
#include "mixed_model.hpp"

#include <doctest/doctest.h>
#include <dos/checkpoint.hpp>
#include <dos/optimizer.hpp>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <unistd.h>

namespace dos::test {

/// A fresh directory under the system's temporary directory, removed afterwards.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag) {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           ("dos_ckpt_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

/// The scenario: which tensors, and how training is driven.
struct RunSpec {
  std::vector<TensorSpec> specs;
  std::size_t subgroup = 64;
  bool device = false;          // the emulated device with a static_fraction policy
  bool loss_scaling = true;
  bool schedule = true;
  std::int64_t overflow_call = 3;  // the step() call whose gradient holds an inf (0: none)
  unsigned threads = 1;
};

/// Tensor 0 is host fp32 (it receives the inf); the rest mix types and groups. With
/// `device`, some tensors live on the emulated device.
inline std::vector<TensorSpec> mixed_specs(bool device, std::size_t scale = 1) {
  std::vector<TensorSpec> s{{37 * scale, DType::f32, Device::host, 0},     {150 * scale, DType::bf16, Device::host, 0},
                            {90 * scale, DType::f16, Device::host, 1},     {64 * scale, DType::f32, Device::host, 1},
                            {201 * scale, DType::bf16, Device::device, 1}, {77 * scale, DType::f32, Device::device, 0},
                            {5 * scale, DType::f16, Device::device, 0}};
  if (!device)
    for (TensorSpec& t : s) t.device = Device::host;
  return s;
}

template <class Backend>
struct Run {
  MixedModel model;
  InterleavedOptimizer<Backend> opt;
  RunSpec spec;

  static Options options(const RunSpec& s) {
    Options o = s.device ? device_options(StaticFraction{0.5}, s.subgroup)
                         : Options{.subgroup_elements = s.subgroup, .threads = s.threads};
    o.threads = s.threads;
    if (s.loss_scaling) o.loss_scaling = LossScaling{.init_scale = 1024, .growth_interval = 3};
    return o;
  }

  /// @param values the parameter values to start from (the framework restores its
  ///        weights before it builds the optimizer); none: the initial ones.
  explicit Run(const RunSpec& s, const std::vector<std::byte>* values = nullptr)
      : model(make_model(s, values)), opt(model.groups(), options(s)), spec(s) {
    set_schedules();
  }

  static MixedModel make_model(const RunSpec& s, const std::vector<std::byte>* values) {
    MixedModel m(s.specs, two_groups, !s.device);
    if (values != nullptr) set_values(m, *values);
    return m;
  }

  /// Schedules are code: a resumed run sets them again, as a training script would.
  void set_schedules() {
    if (spec.schedule) opt.set_schedule(0, WarmupCosine{.peak = 1e-2, .warmup = 3, .total = 20, .floor = 1e-3});
  }

  /// step() until @p calls calls were made in all (the schedule index counts them).
  void run_to(std::int64_t calls) {
    while (opt.schedule_index() < calls) {
      const std::int64_t call = opt.schedule_index() + 1;
      model.set_gradients(call);
      if (call == spec.overflow_call) static_cast<float*>(model.grad(0))[1] = std::numeric_limits<float>::infinity();
      opt.step();
    }
  }

  /// What the framework saves itself: the parameter values.
  std::vector<std::byte> values() { return model.value_bytes(); }
  void set_values(const std::vector<std::byte>& bytes) { set_values(model, bytes); }
  static void set_values(MixedModel& model, const std::vector<std::byte>& bytes) {
    std::size_t at = 0;
    for (std::size_t t = 0; t < model.specs().size(); ++t) {
      const std::size_t n = model.specs()[t].numel * dtype_size(model.specs()[t].dtype);
      std::memcpy(model.value(t), bytes.data() + at, n);  // emulated device memory is host memory
      at += n;
    }
  }
};

/// Every state tensor (vmax where amsgrad), the counters (each parameter's too) and the loss scaler, as bits.
template <class Opt>
std::vector<float> full_state(Opt& opt) {
  std::vector<float> out = all_state(opt);
  for (std::size_t p = 0; p < opt.num_params(); ++p)
    if (opt.hyperparameters(opt.param_record(p).group).amsgrad) {
      std::vector<float> v(opt.param_numel(p));
      opt.read_state(p, StateKind::max_exp_avg_sq, v);
      out.insert(out.end(), v.begin(), v.end());
    }
  out.push_back(static_cast<float>(opt.step_count()));
  for (std::size_t p = 0; p < opt.num_params(); ++p) out.push_back(static_cast<float>(opt.step_count(p)));
  out.push_back(static_cast<float>(opt.schedule_index()));
  out.push_back(static_cast<float>(opt.loss_scale()));
  out.push_back(static_cast<float>(opt.loss_scale_growth_tracker()));
  for (std::size_t g = 0; g < opt.num_groups(); ++g) out.push_back(static_cast<float>(opt.hyperparameters(g).lr));
  return out;
}

}  // namespace dos::test
