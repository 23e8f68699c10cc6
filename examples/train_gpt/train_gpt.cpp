// A character-level GPT trained with libtorch, its optimizer step done by dos (or by
// torch::optim::AdamW, for comparison): loss and time per step, with a progress bar,
// optionally a CSV for plotting and a JSON summary (final loss, time per step).
//
//   train_gpt [--optimizer dos|torch] [--device cpu|cuda] [--steps N] [--csv path]
//             [--text path] [--summary path]
//
// --device cuda: the model, its gradients and values on the GPU; dos updates them with
// CudaBackend (optimizer state in pinned host memory, some subgroups on the GPU, the
// rest on the CPU), torch with AdamW on the GPU. Built where dos::cuda and a libtorch
// with CUDA are both found (DOS_TRAIN_GPT_CUDA); elsewhere, or without a usable GPU,
// --device cuda exits 77 and says why.

#include <dos/adapters/torch.hpp>
#ifdef DOS_TRAIN_GPT_CUDA
#include <dos/backend/cuda.hpp>
#include <torch/cuda.h>
#endif

#include "gpt.hpp"

#include <fmt/core.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#ifndef DOS_TRAIN_GPT_TEXT
#define DOS_TRAIN_GPT_TEXT "sonnets.txt"
#endif

namespace {

using namespace gpt;

// The optimizer dos builds over the parameters, on the CPU or on CUDA: the two differ
// only in the backend.
template <class Backend>
std::unique_ptr<dos::TorchOptimizer<Backend>> make_dos(const std::vector<torch::Tensor>& decay,
                                                       const std::vector<torch::Tensor>& no_decay,
                                                       const dos::WarmupCosine& schedule, double weight_decay,
                                                       double clip) {
  dos::Options o{.subgroup_elements = 65'536};
  o.max_grad_norm = clip;
  auto opt = std::make_unique<dos::TorchOptimizer<Backend>>(
      std::vector<dos::ParamGroup<at::Tensor>>{{decay, dos::AdamW{.weight_decay = weight_decay}},
                                               {no_decay, dos::AdamW{.weight_decay = 0.0}}},
      o);
  opt->engine().set_schedule(0, schedule);
  opt->engine().set_schedule(1, schedule);
  return opt;
}

// Why --device cuda cannot run here; empty when it can.
std::string cuda_unavailable() {
#ifdef DOS_TRAIN_GPT_CUDA
  if (!torch::cuda::is_available()) return "libtorch sees no CUDA device";
  return dos::cuda::unavailable_reason();
#else
  return "built without CUDA (needs dos::cuda and a libtorch built with CUDA)";
#endif
}

}  // namespace

int main(int argc, char** argv) {
  std::string optimizer = "dos", device_name = "cpu", csv, summary, text_path = DOS_TRAIN_GPT_TEXT;
  int steps = 300;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--optimizer") optimizer = value;
    else if (flag == "--device") device_name = value;
    else if (flag == "--steps") steps = std::stoi(value);
    else if (flag == "--csv") csv = value;
    else if (flag == "--summary") summary = value;
    else if (flag == "--text") text_path = value;
    else {
      std::fprintf(stderr, "usage: train_gpt [--optimizer dos|torch] [--device cpu|cuda] [--steps N] [--csv path] "
                           "[--text path] [--summary path]\n");
      return 2;
    }
  }
  if (optimizer != "dos" && optimizer != "torch") {
    std::fprintf(stderr, "train_gpt: --optimizer must be dos or torch, got %s\n", optimizer.c_str());
    return 2;
  }
  if (device_name != "cpu" && device_name != "cuda") {
    std::fprintf(stderr, "train_gpt: --device must be cpu or cuda, got %s\n", device_name.c_str());
    return 2;
  }
  const bool on_cuda = device_name == "cuda";
  if (const std::string why = on_cuda ? cuda_unavailable() : std::string(); !why.empty()) {
    std::printf("skipped: --device cuda: %s\n", why.c_str());
    return 77;
  }
  const torch::Device device = on_cuda ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  const std::string text = read_text(text_path);
  const Text encoded = encode(text);
  const std::string& chars = encoded.chars;
  const torch::Tensor& data = encoded.codes;

  // The same initial weights on either device: drawn on the CPU, then moved.
  torch::manual_seed(1234);
  Gpt model(static_cast<std::int64_t>(chars.size()));
  model->to(device);
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& p : model->parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  const dos::WarmupCosine schedule{.peak = 3e-3, .warmup = steps / 10, .total = steps, .floor = 3e-4};
  constexpr double kWeightDecay = 0.1, kClip = 1.0;

  // The swap: dos or torch::optim::AdamW, the same hyperparameters.
  std::unique_ptr<dos::TorchOptimizer<>> dos_cpu;
#ifdef DOS_TRAIN_GPT_CUDA
  std::unique_ptr<dos::TorchOptimizer<dos::CudaBackend>> dos_cuda;
#endif
  std::unique_ptr<torch::optim::AdamW> torch_opt;
  if (optimizer == "dos" && !on_cuda) {
    dos_cpu = make_dos<dos::CpuBackend>(decay, no_decay, schedule, kWeightDecay, kClip);
  } else if (optimizer == "dos") {
#ifdef DOS_TRAIN_GPT_CUDA
    dos_cuda = make_dos<dos::CudaBackend>(decay, no_decay, schedule, kWeightDecay, kClip);
#endif
  } else {
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(
                                   torch::optim::AdamWOptions(3e-3).weight_decay(kWeightDecay)));
    groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(3e-3).weight_decay(0.0)));
    torch_opt = std::make_unique<torch::optim::AdamW>(std::move(groups), torch::optim::AdamWOptions(3e-3));
  }
  const auto zero_grad = [&] {
    if (dos_cpu) dos_cpu->zero_grad();
#ifdef DOS_TRAIN_GPT_CUDA
    if (dos_cuda) dos_cuda->zero_grad();
#endif
    if (torch_opt) torch_opt->zero_grad();
  };
  const auto step_dos = [&] {
    if (dos_cpu) dos_cpu->step();
#ifdef DOS_TRAIN_GPT_CUDA
    if (dos_cuda) dos_cuda->step();
#endif
  };
  // GPU work is asynchronous: a step's time is taken once the device has finished it.
  const auto now = [&] {
#ifdef DOS_TRAIN_GPT_CUDA
    if (on_cuda) torch::cuda::synchronize();
#endif
    return std::chrono::steady_clock::now();
  };
  std::size_t parameters = 0;
  for (auto& p : model->parameters()) parameters += static_cast<std::size_t>(p.numel());
  fmt::print("train_gpt: {} parameters, {} characters of text ({} distinct), optimizer {}, device {}, {} torch threads\n",
             parameters, text.size(), chars.size(), optimizer, device_name, torch::get_num_threads());

  std::ofstream out;
  if (!csv.empty()) {
    out.open(csv);
    out << "step,loss,step_ms,optimizer_ms\n";
  }
  // Batches are drawn on the CPU, so both devices see the same ones.
  torch::manual_seed(42);
  double total_ms = 0, total_opt_ms = 0, first_ms = 0, last_loss = 0;
  for (int step = 0; step < steps; ++step) {
    const auto t0 = now();
    auto [xb, yb] = draw_batch(data);
    auto x = xb.to(device), y = yb.to(device);
    auto logits = model->forward(x);
    auto loss = torch::nn::functional::cross_entropy(logits.view({-1, logits.size(-1)}), y.view({-1}));
    zero_grad();
    loss.backward();
    const auto t1 = now();
    if (torch_opt) {
      torch::nn::utils::clip_grad_norm_(model->parameters(), kClip);
      for (auto& g : torch_opt->param_groups())
        static_cast<torch::optim::AdamWOptions&>(g.options()).lr(schedule(step));
      torch_opt->step();
    } else {
      step_dos();
    }
    const auto t2 = now();
    const double ms = std::chrono::duration<double, std::milli>(t2 - t0).count();
    const double opt_ms = std::chrono::duration<double, std::milli>(t2 - t1).count();
    if (step == 0) first_ms = ms;
    total_ms += ms;
    total_opt_ms += opt_ms;
    last_loss = loss.item<double>();
    fmt::print("step {:>4}/{} [{}] loss {:.4f}  {:.1f} ms (optimizer {:.2f} ms)\n", step + 1, steps, bar(step + 1, steps),
               last_loss, ms, opt_ms);
    if (out) out << step << ',' << last_loss << ',' << ms << ',' << opt_ms << '\n';
  }
  fmt::print("done: {:.1f} ms per step on average, {:.2f} ms of it in the optimizer\n", total_ms / steps,
             total_opt_ms / steps);
  if (!summary.empty()) {
    // The first step (allocations, kernel loading, dos's calibration) is left out of
    // the time per step where there are others.
    const double step_s = steps > 1 ? (total_ms - first_ms) / (steps - 1) * 1e-3 : total_ms * 1e-3;
    std::ofstream js(summary);
    js << fmt::format(R"({{"optimizer": "{}", "device": "{}", "steps": {}, "final_loss": {}, "step_s": {}, )"
                      R"("first_step_s": {}, "optimizer_s": {}}})"
                      "\n",
                      optimizer, device_name, steps, last_loss, step_s, first_ms * 1e-3, total_opt_ms / steps * 1e-3);
    if (!js) {
      std::fprintf(stderr, "train_gpt: cannot write %s\n", summary.c_str());
      return 1;
    }
  }
  return 0;
}
