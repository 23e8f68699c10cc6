#pragma once
// The model and data of the train_gpt examples (train_gpt.cpp on one process,
// train_gpt_ranks.cpp data-parallel over MPI): a character-level GPT of two
// transformer blocks, the text as character codes, a progress bar.

#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace gpt {

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
    // A buffer, so that model->to(device) moves it with the parameters.
    causal = register_buffer("causal", torch::ones({kContext, kContext}, torch::kBool).triu(1));
  }
  torch::Tensor forward(const torch::Tensor& idx) {
    auto x = tok(idx) + pos(torch::arange(idx.size(1), idx.options()));
    for (auto& m : *blocks) x = m->as<BlockImpl>()->forward(x, causal);
    return head(ln(x));
  }
};
TORCH_MODULE(Gpt);

inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline std::string bar(int done, int total, int width = 24) {
  const int filled = total > 0 ? done * width / total : width;
  return std::string(static_cast<std::size_t>(filled), '#') + std::string(static_cast<std::size_t>(width - filled), '.');
}

// The text as character codes (in order of first appearance) and the characters.
struct Text {
  torch::Tensor codes;
  std::string chars;
};
inline Text encode(const std::string& text) {
  std::vector<int> code(256, -1);
  Text t;
  for (unsigned char c : text)
    if (code[c] < 0) code[c] = static_cast<int>(t.chars.size()), t.chars.push_back(static_cast<char>(c));
  t.codes = torch::empty({static_cast<std::int64_t>(text.size())}, torch::kLong);
  for (std::size_t i = 0; i < text.size(); ++i) t.codes[static_cast<std::int64_t>(i)] = code[static_cast<unsigned char>(text[i])];
  return t;
}

// A batch of kBatch windows at random starts: inputs and next-character targets.
inline std::pair<torch::Tensor, torch::Tensor> draw_batch(const torch::Tensor& codes) {
  const auto n = codes.size(0);
  auto starts = torch::randint(n - kContext - 1, {kBatch}, torch::kLong);
  std::vector<torch::Tensor> xs, ys;
  for (std::int64_t b = 0; b < kBatch; ++b) {
    const auto s = starts[b].item<std::int64_t>();
    xs.push_back(codes.slice(0, s, s + kContext));
    ys.push_back(codes.slice(0, s + 1, s + kContext + 1));
  }
  return {torch::stack(xs), torch::stack(ys)};
}

}  // namespace gpt
