#pragma once
// A small libtorch language model (embedding, MLP with LayerNorm) on a deterministic
// token stream, and the weight-decay grouping every LLM recipe uses.

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace dos::test {

inline constexpr std::int64_t vocab = 48, context = 8, dim = 16, hidden = 64;

struct TinyLmImpl : torch::nn::Module {
  torch::nn::Embedding emb{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  TinyLmImpl() {
    emb = register_module("emb", torch::nn::Embedding(vocab, dim));
    fc1 = register_module("fc1", torch::nn::Linear(dim * context, hidden));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden})));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, vocab));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc2(norm(torch::gelu(fc1(emb(x).flatten(1)))));
  }
};
TORCH_MODULE(TinyLm);

/// The same initial weights for every call with the same seed.
inline TinyLm make_model(std::uint64_t seed = 0) {
  torch::manual_seed(seed);
  return TinyLm();
}

/// Token i of an endless stream with structure to learn: a noisy cyclic pattern.
inline std::int64_t token(std::int64_t i) { return (i * 7 + (i / 5) % 3 + (i * i) % 11) % vocab; }

/// `rows` windows of `context` tokens and their next token, for step `step`.
inline std::pair<torch::Tensor, torch::Tensor> batch(std::int64_t step, std::int64_t rows, std::int64_t first_row = 0) {
  auto x = torch::empty({rows, context}, torch::kLong);
  auto y = torch::empty({rows}, torch::kLong);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t start = (step * 131 + (first_row + r) * 17) % 10'000;
    for (std::int64_t c = 0; c < context; ++c) x[r][c] = token(start + c);
    y[r] = token(start + context);
  }
  return {x, y};
}

inline torch::Tensor loss_of(TinyLm& m, const std::pair<torch::Tensor, torch::Tensor>& b) {
  return torch::nn::functional::cross_entropy(m->forward(b.first), b.second);
}

/// Matrices (and the embedding) decay; biases and norms do not.
inline std::pair<std::vector<torch::Tensor>, std::vector<torch::Tensor>> decay_groups(TinyLm& m) {
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& p : m->parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  return {decay, no_decay};
}

}  // namespace dos::test
