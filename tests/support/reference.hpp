#pragma once
// Reader for the committed PyTorch trajectories (tests/reference/manifest.txt and
// <scenario>.bin), written by tests/reference/generate_torch_reference.py.

#include <dos/optim/adam.hpp>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace dos::test {

struct RefGroup {
  AdamConfig hyper;
  std::vector<std::size_t> sizes;
};

struct Scenario {
  std::string name;
  int steps = 0;
  int lr_drop_step = 0;
  double lr_drop_factor = 1;
  std::vector<int> snapshots;
  std::vector<RefGroup> groups;
  bool amsgrad = false;
  std::vector<float> data;  // the .bin file

  std::size_t total() const {
    std::size_t n = 0;
    for (const auto& g : groups)
      for (auto s : g.sizes) n += s;
    return n;
  }
  // Parameters after snapshot k, all tensors concatenated.
  const float* params_at(std::size_t k) const { return data.data() + k * total(); }
  const float* exp_avg() const { return data.data() + snapshots.size() * total(); }
  const float* exp_avg_sq() const { return exp_avg() + total(); }
  const float* max_exp_avg_sq() const { return exp_avg_sq() + total(); }
};

inline std::vector<Scenario> load_scenarios(const std::string& dir) {
  std::ifstream in(dir + "/manifest.txt");
  if (!in) throw std::runtime_error("cannot open " + dir + "/manifest.txt");
  std::vector<Scenario> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string word;
    ls >> word;
    if (word == "scenario") {
      Scenario s;
      std::string key;
      int ngroups = 0, nsnap = 0;
      ls >> s.name >> key >> s.steps >> key >> s.lr_drop_step >> key >> s.lr_drop_factor >> key >> nsnap;
      s.snapshots.resize(static_cast<std::size_t>(nsnap));
      for (auto& v : s.snapshots) ls >> v;
      ls >> key >> ngroups;
      out.push_back(std::move(s));
    } else if (word == "group") {
      std::string kind, key;
      double lr, b1, b2, eps, wd;
      int ams, maxi;
      std::size_t n;
      ls >> kind >> key >> lr >> key >> b1 >> key >> b2 >> key >> eps >> key >> wd >> key >> ams >> key >> maxi >> key >> n;
      RefGroup g;
      const auto fill = [&](auto h) {
        h.lr = lr, h.beta1 = b1, h.beta2 = b2, h.eps = eps, h.weight_decay = wd, h.amsgrad = ams != 0,
        h.maximize = maxi != 0;
        return AdamConfig(h);
      };
      g.hyper = kind == "AdamW" ? fill(AdamW{}) : fill(Adam{});
      g.sizes.resize(n);
      for (auto& v : g.sizes) ls >> v;
      out.back().amsgrad |= g.hyper.amsgrad;
      out.back().groups.push_back(std::move(g));
    } else if (word == "end") {
      Scenario& s = out.back();
      std::ifstream bin(dir + "/" + s.name + ".bin", std::ios::binary);
      const std::size_t blocks = s.snapshots.size() + 2 + (s.amsgrad ? 1 : 0);
      s.data.resize(blocks * s.total());
      bin.read(reinterpret_cast<char*>(s.data.data()), static_cast<std::streamsize>(s.data.size() * sizeof(float)));
      if (!bin) throw std::runtime_error("short or missing " + s.name + ".bin");
    }
  }
  return out;
}

}  // namespace dos::test
