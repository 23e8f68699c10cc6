#pragma once
// Runs a reference scenario through an optimizer, with the deterministic inputs, for
// any parameter element type. Shared by the torch comparison and the backend tests.

#include "inputs.hpp"
#include "reference.hpp"

#include <dos/optimizer.hpp>

#include <cstddef>
#include <vector>

namespace dos::test {

template <class T>
struct Model {
  std::vector<std::vector<T>> values;
  std::vector<std::vector<T>> grads;
  std::vector<ParamGroup<HostParam<T>>> groups;

  explicit Model(const Scenario& s) {
    std::size_t tensor = 0;
    for (const auto& g : s.groups)
      for (std::size_t n : g.sizes) {
        std::vector<T> v(n);
        for (std::size_t i = 0; i < n; ++i) v[i] = T(initial_param(tensor, i));
        values.push_back(std::move(v));
        grads.emplace_back(n);
        ++tensor;
      }
    tensor = 0;
    for (const auto& g : s.groups) {
      ParamGroup<HostParam<T>> group;
      group.hyper = g.hyper;
      for (std::size_t k = 0; k < g.sizes.size(); ++k, ++tensor)
        group.params.push_back({values[tensor], grads[tensor]});
      groups.push_back(std::move(group));
    }
  }

  void set_gradients(std::int64_t step) {
    for (std::size_t t = 0; t < grads.size(); ++t)
      for (std::size_t i = 0; i < grads[t].size(); ++i) grads[t][i] = T(gradient(t, step, i));
  }
};

/// Everything the optimizer holds, flattened in tensor order.
template <class Optimizer>
std::vector<float> read_all(Optimizer& opt, StateKind kind) {
  std::vector<float> out;
  for (std::size_t p = 0; p < opt.num_params(); ++p) {
    std::vector<float> tmp(opt.param_numel(p));
    opt.read_state(p, kind, tmp);
    out.insert(out.end(), tmp.begin(), tmp.end());
  }
  return out;
}

/// Steps the scenario's schedule: lr of every group scaled at lr_drop_step.
template <class Optimizer, class T>
void advance(Optimizer& opt, Model<T>& model, const Scenario& s, std::int64_t step) {
  if (step == s.lr_drop_step)
    for (std::size_t g = 0; g < s.groups.size(); ++g) opt.set_lr(g, s.groups[g].hyper.lr * s.lr_drop_factor);
  model.set_gradients(step);
  opt.step();
}

}  // namespace dos::test
