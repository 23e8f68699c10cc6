// Quickstart: the optimizer step of GPT-2 small (124M parameters) on the CPU, as
// ZeRO-Offload runs it, with dos; then the method itself, the same kind of update
// split between the CPU and a device.
//
// The parameters have GPT-2 small's tensor shapes, in two groups (weight decay on
// the matrices, none on biases and norms); gradients are synthetic. Ten steps with a
// warmup + cosine learning rate, then the update rate against this machine's memory
// bandwidth limit for an Adam-shaped loop (28 bytes per parameter): the fastest of the
// probe's variants.
//
// Then 16M parameters in 16 subgroups, updated all on the CPU and interleaved with
// a device by the automatic policy, in alternating steps. On a GPU (a build with
// dos::cuda, on a machine with one) the device is the GPU; elsewhere it is the
// emulated device, its link throttled to 0.6x the CPU's parameter rate, as PCIe is
// next to a node's CPUs.

#include <dos/cpu/bandwidth_probe.hpp>
#include <dos/optimizer.hpp>
#ifdef DOS_QUICKSTART_CUDA
#include <dos/backend/cuda.hpp>
#endif

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace {

struct TensorShape {
  std::string name;
  std::size_t rows, cols;
  std::size_t numel() const { return rows * cols; }
  bool decays() const { return cols > 1; }  // matrices decay; biases and norms do not
};

std::vector<TensorShape> gpt2_small() {
  constexpr std::size_t vocab = 50257, context = 1024, d = 768, layers = 12;
  std::vector<TensorShape> shapes{{"wte", vocab, d}, {"wpe", context, d}};
  for (std::size_t l = 0; l < layers; ++l) {
    const std::string h = fmt::format("h.{}.", l);
    shapes.insert(shapes.end(), {{h + "ln_1.weight", d, 1},
                                 {h + "ln_1.bias", d, 1},
                                 {h + "attn.c_attn.weight", d, 3 * d},
                                 {h + "attn.c_attn.bias", 3 * d, 1},
                                 {h + "attn.c_proj.weight", d, d},
                                 {h + "attn.c_proj.bias", d, 1},
                                 {h + "ln_2.weight", d, 1},
                                 {h + "ln_2.bias", d, 1},
                                 {h + "mlp.c_fc.weight", d, 4 * d},
                                 {h + "mlp.c_fc.bias", 4 * d, 1},
                                 {h + "mlp.c_proj.weight", 4 * d, d},
                                 {h + "mlp.c_proj.bias", d, 1}});
  }
  shapes.insert(shapes.end(), {{"ln_f.weight", d, 1}, {"ln_f.bias", d, 1}});
  return shapes;
}

// Synthetic values: a cheap deterministic hash, scaled like an initialised network.
void fill(std::vector<float>& v, std::uint64_t seed, float scale) {
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::uint64_t z = (seed << 40) + i + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    v[i] = scale * (static_cast<float>((z >> 40) & 0xFFFF) / 32768.0f - 1.0f);
  }
}

// The fastest variant of the fp32 Adam-shaped probe (cpu/bandwidth_probe.hpp), best of
// five each, in elements per second, over arrays as long as the model: shorter ones
// may sit in a large last-level cache, which the model's state does not.
dos::ProbeLimit bandwidth_limit(dos::ThreadPool& pool, std::size_t elements) {
  dos::ProbeArrays arrays(elements, false);
  return dos::measure_probe_limit(pool, arrays);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// All-CPU against the automatic policy on @p Backend, in alternating steps; prints the
// steps' update times, the k chosen and the speed-up.
template <class Backend>
void interleave(const std::string& device, dos::Options options, const typename Backend::Config& config) {
  constexpr std::size_t n = std::size_t{16} << 20, subgroup = std::size_t{1} << 20;
  constexpr int steps = 30;
  const std::vector<float> grad(n, 1e-3f);
  std::vector<float> a(n, 0.5f), b(n, 0.5f);
  const auto params = [&](std::vector<float>& values) {
    std::vector<dos::HostParam<float>> out;
    for (std::size_t off = 0; off < n; off += subgroup)
      out.push_back({std::span(values).subspan(off, subgroup), std::span(grad).subspan(off, subgroup)});
    return out;
  };
  options.subgroup_elements = subgroup;
  options.interleave.policy = dos::AllCpu{};
  dos::InterleavedOptimizer<Backend> all_cpu(params(a), dos::AdamW{}, options, config);
  options.interleave.policy = dos::AutomaticStride{};
  dos::InterleavedOptimizer<Backend> automatic(params(b), dos::AdamW{}, options, config);
  fmt::print("\ninterleaving with {}: 16M parameters in 16 subgroups, {} steps each, alternating\n", device, steps);
  std::vector<double> cpu_times, auto_times;
  std::string ks;
  for (int step = 0; step < steps; ++step) {
    cpu_times.push_back(all_cpu.step().update_seconds);
    const dos::StepReport r = automatic.step();
    auto_times.push_back(r.update_seconds);
    ks += fmt::format(" {}{}", r.stride, r.explored ? "?" : "");
  }
  // The last third: the automatic policy has tried its candidates by then.
  cpu_times.erase(cpu_times.begin(), cpu_times.begin() + 2 * steps / 3);
  auto_times.erase(auto_times.begin(), auto_times.begin() + 2 * steps / 3);
  fmt::print("k chosen step by step (0: all-CPU; ?: the policy tried it to measure it):{}\n", ks);
  fmt::print("all-CPU {:.1f} ms, interleaved {:.1f} ms (medians of the last {} steps): {:.2f}x\n",
             median(cpu_times) * 1e3, median(auto_times) * 1e3, cpu_times.size(),
             median(cpu_times) / median(auto_times));
  fmt::print("last step: {}\n", dos::summary(automatic.timeline()));
}

}  // namespace

int main() {
  const auto shapes = gpt2_small();
  std::vector<std::vector<float>> values, grads;
  std::vector<dos::ParamGroup<dos::HostParam<float>>> groups{{{}, dos::AdamW{.lr = 6e-4, .weight_decay = 0.1}},
                                                             {{}, dos::AdamW{.lr = 6e-4, .weight_decay = 0.0}}};
  values.reserve(shapes.size());
  grads.reserve(shapes.size());
  std::size_t total = 0;
  for (std::size_t t = 0; t < shapes.size(); ++t) {
    values.emplace_back(shapes[t].numel());
    grads.emplace_back(shapes[t].numel());
    fill(values.back(), 2 * t, 0.02f);
    fill(grads.back(), 2 * t + 1, 1e-3f);
    groups[shapes[t].decays() ? 0 : 1].params.push_back({values.back(), grads.back()});
    total += shapes[t].numel();
  }

  dos::CpuOptimizer opt(std::move(groups), dos::Options{});
  fmt::print("dos quickstart: GPT-2 small, {} tensors, {:.1f}M parameters, {} subgroups\n", shapes.size(),
             static_cast<double>(total) / 1e6, opt.subgroups().size());
  fmt::print("CPU update: {} threads, {} kernels, fp32 state {:.2f} GB\n", opt.threads(),
             dos::simd_name(opt.simd_level()), static_cast<double>(total) * 8 / 1e9);

  constexpr int steps = 10, warmup = 3;
  double best = 1e30;
  for (int step = 1; step <= steps; ++step) {
    // Warmup + cosine to 10% of the peak, per group.
    const double peak = 6e-4;
    const double lr = step <= warmup ? peak * step / warmup
                                     : peak * (0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * (step - warmup) / (steps - warmup))));
    for (std::size_t g = 0; g < opt.num_groups(); ++g) opt.set_lr(g, lr);
    const dos::StepReport r = opt.step();
    best = std::min(best, r.seconds);
    fmt::print("step {:2}/{}  lr {:.2e}  {:6.1f} ms  {:7.1f}M params/s\n", r.step, steps, lr, r.seconds * 1e3,
               static_cast<double>(r.elements) / r.seconds / 1e6);
  }

  const double rate = static_cast<double>(total) / best;
  dos::ThreadPool pool(opt.threads());
  const dos::ProbeLimit limit = bandwidth_limit(pool, total);
  fmt::print("\nbest step: {:.1f}M params/s ({:.1f} GB/s at 28 B/param)\n", rate / 1e6,
             rate * dos::adam_bytes_per_element / 1e9);
  fmt::print("memory-bandwidth limit (best Adam-shaped probe: {}, {} threads): {:.1f}M params/s\n",
             dos::probe_name(limit.variant), pool.size(), limit.elements_per_second / 1e6);
  fmt::print("ratio to the best probe: {:.2f}\n", rate / limit.elements_per_second);

  // The interleaved update: the CPU lane on one thread, the device beside it.
  dos::Options one_thread{.threads = 1};
#ifdef DOS_QUICKSTART_CUDA
  if (dos::cuda::unavailable_reason().empty()) {
    interleave<dos::CudaBackend>("the GPU", one_thread, {});
    return 0;
  }
  fmt::print("\nno usable GPU ({}); the emulated device stands in\n", dos::cuda::unavailable_reason());
#endif
  const dos::EmulatedLink link = dos::emulated_link(0.6);
  one_thread.interleave.profile = link.profile;
  interleave<dos::EmulatedDeviceBackend>("the emulated device (link at 0.6x the CPU's rate)", one_thread, link.device);
  return 0;
}
