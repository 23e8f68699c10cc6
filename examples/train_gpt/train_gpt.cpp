// A character-level GPT trained with libtorch on the CPU, its optimizer step done by
// dos (or by torch::optim::AdamW, for comparison): loss and time per step, with a
// progress bar, and optionally a CSV for plotting.
//
//   train_gpt [--optimizer dos|torch] [--steps N] [--csv path] [--text path]

#include <dos/adapters/torch.hpp>

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

constexpr std::int64_t kContext = 64, kDim = 96, kHeads = 4, kLayers = 2, kBatch = 16;

struct BlockImpl : torch::nn::Module {
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, up{nullptr}, down{nullptr};
  BlockImpl() {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})));
    qkv = register_module("qkv", torch::nn::Linear(kDim, 3 * kDim));
    proj = register_module("proj", torch::nn::Linear(kDim, kDim));
    up = register_module("up", torch::nn::Linear(kDim, 4 * kDim));
    down = register_module("down", torch::nn::Linear(4 * kDim, kDim));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& causal) {
    const auto b = x.size(0), t = x.size(1);
    auto parts = qkv(ln1(x)).view({b, t, 3, kHeads, kDim / kHeads}).permute({2, 0, 3, 1, 4});
    auto att = torch::matmul(parts[0], parts[1].transpose(-2, -1)) / std::sqrt(static_cast<double>(kDim / kHeads));
    att = torch::softmax(att.masked_fill(causal.slice(0, 0, t).slice(1, 0, t), -1e9), -1);
    auto y = torch::matmul(att, parts[2]).transpose(1, 2).reshape({b, t, kDim});
    auto h = x + proj(y);
    return h + down(torch::gelu(up(ln2(h))));
  }
};
TORCH_MODULE(Block);

struct GptImpl : torch::nn::Module {
  torch::nn::Embedding tok{nullptr}, pos{nullptr};
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm ln{nullptr};
  torch::nn::Linear head{nullptr};
  torch::Tensor causal;
  explicit GptImpl(std::int64_t vocab) {
    tok = register_module("tok", torch::nn::Embedding(vocab, kDim));
    pos = register_module("pos", torch::nn::Embedding(kContext, kDim));
    for (int i = 0; i < kLayers; ++i) blocks->push_back(Block());
    register_module("blocks", blocks);
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})));
    head = register_module("head", torch::nn::Linear(kDim, vocab));
    causal = torch::ones({kContext, kContext}, torch::kBool).triu(1);
  }
  torch::Tensor forward(const torch::Tensor& idx) {
    auto x = tok(idx) + pos(torch::arange(idx.size(1), torch::kLong));
    for (auto& m : *blocks) x = m->as<BlockImpl>()->forward(x, causal);
    return head(ln(x));
  }
};
TORCH_MODULE(Gpt);

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string bar(int done, int total, int width = 24) {
  const int filled = total > 0 ? done * width / total : width;
  return std::string(static_cast<std::size_t>(filled), '#') + std::string(static_cast<std::size_t>(width - filled), '.');
}

}  // namespace

int main(int argc, char** argv) {
  std::string optimizer = "dos", csv, text_path = DOS_TRAIN_GPT_TEXT;
  int steps = 300;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--optimizer") optimizer = value;
    else if (flag == "--steps") steps = std::stoi(value);
    else if (flag == "--csv") csv = value;
    else if (flag == "--text") text_path = value;
    else {
      std::fprintf(stderr, "usage: train_gpt [--optimizer dos|torch] [--steps N] [--csv path] [--text path]\n");
      return 2;
    }
  }
  if (optimizer != "dos" && optimizer != "torch") {
    std::fprintf(stderr, "train_gpt: --optimizer must be dos or torch, got %s\n", optimizer.c_str());
    return 2;
  }
  const std::string text = read_text(text_path);
  std::vector<int> code(256, -1);
  std::string chars;
  for (unsigned char c : text)
    if (code[c] < 0) code[c] = static_cast<int>(chars.size()), chars.push_back(static_cast<char>(c));
  auto data = torch::empty({static_cast<std::int64_t>(text.size())}, torch::kLong);
  for (std::size_t i = 0; i < text.size(); ++i) data[static_cast<std::int64_t>(i)] = code[static_cast<unsigned char>(text[i])];

  torch::manual_seed(1234);
  Gpt model(static_cast<std::int64_t>(chars.size()));
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& p : model->parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  const dos::WarmupCosine schedule{.peak = 3e-3, .warmup = steps / 10, .total = steps, .floor = 3e-4};
  constexpr double kWeightDecay = 0.1, kClip = 1.0;

  // The swap: two lines differ between the two optimizers.
  std::unique_ptr<dos::TorchOptimizer<>> dos_opt;
  std::unique_ptr<torch::optim::AdamW> torch_opt;
  if (optimizer == "dos") {
    dos::Options o{.subgroup_elements = 65'536};
    o.max_grad_norm = kClip;
    dos_opt = std::make_unique<dos::TorchOptimizer<>>(
        std::vector<dos::ParamGroup<at::Tensor>>{{decay, dos::AdamW{.weight_decay = kWeightDecay}},
                                                 {no_decay, dos::AdamW{.weight_decay = 0.0}}},
        o);
    dos_opt->engine().set_schedule(0, schedule);
    dos_opt->engine().set_schedule(1, schedule);
  } else {
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(
                                   torch::optim::AdamWOptions(3e-3).weight_decay(kWeightDecay)));
    groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(3e-3).weight_decay(0.0)));
    torch_opt = std::make_unique<torch::optim::AdamW>(std::move(groups), torch::optim::AdamWOptions(3e-3));
  }
  std::size_t parameters = 0;
  for (auto& p : model->parameters()) parameters += static_cast<std::size_t>(p.numel());
  fmt::print("train_gpt: {} parameters, {} characters of text ({} distinct), optimizer {}, {} torch threads\n",
             parameters, text.size(), chars.size(), optimizer, torch::get_num_threads());

  std::ofstream out;
  if (!csv.empty()) {
    out.open(csv);
    out << "step,loss,step_ms,optimizer_ms\n";
  }
  torch::manual_seed(42);
  double total_ms = 0, total_opt_ms = 0;
  for (int step = 0; step < steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    auto starts = torch::randint(static_cast<std::int64_t>(text.size()) - kContext - 1, {kBatch}, torch::kLong);
    std::vector<torch::Tensor> xs, ys;
    for (std::int64_t b = 0; b < kBatch; ++b) {
      const auto s = starts[b].item<std::int64_t>();
      xs.push_back(data.slice(0, s, s + kContext));
      ys.push_back(data.slice(0, s + 1, s + kContext + 1));
    }
    auto x = torch::stack(xs), y = torch::stack(ys);
    auto logits = model->forward(x);
    auto loss = torch::nn::functional::cross_entropy(logits.view({-1, logits.size(-1)}), y.view({-1}));
    if (dos_opt) dos_opt->zero_grad();
    else torch_opt->zero_grad();
    loss.backward();
    const auto t1 = std::chrono::steady_clock::now();
    if (dos_opt) {
      dos_opt->step();
    } else {
      torch::nn::utils::clip_grad_norm_(model->parameters(), kClip);
      for (auto& g : torch_opt->param_groups())
        static_cast<torch::optim::AdamWOptions&>(g.options()).lr(schedule(step));
      torch_opt->step();
    }
    const auto t2 = std::chrono::steady_clock::now();
    const double ms = std::chrono::duration<double, std::milli>(t2 - t0).count();
    const double opt_ms = std::chrono::duration<double, std::milli>(t2 - t1).count();
    total_ms += ms;
    total_opt_ms += opt_ms;
    const double l = loss.item<double>();
    fmt::print("step {:>4}/{} [{}] loss {:.4f}  {:.1f} ms (optimizer {:.2f} ms)\n", step + 1, steps, bar(step + 1, steps), l,
               ms, opt_ms);
    if (out) out << step << ',' << l << ',' << ms << ',' << opt_ms << '\n';
  }
  fmt::print("done: {:.1f} ms per step on average, {:.2f} ms of it in the optimizer\n", total_ms / steps,
             total_opt_ms / steps);
  return 0;
}
