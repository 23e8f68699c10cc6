// The C++ side of tools/test_dos_checkpoint.py:
//   checkpoint_fixture save WORK     trains K calls, saves WORK/ckpt, and writes
//                                    WORK/trajectory.safetensors: the values at K
//                                    (value.<p>.start), the gradients of calls K+1..N
//                                    (grad.<p>.<t>) and dos's values at N (value.<p>.end)
//   checkpoint_fixture resume CKPT   resumes from CKPT at K and requires dos's values
//                                    and state at N bit for bit; exit 0, else 1 (2 on error)

#include "support/inputs.hpp"
#include "support/switched_param.hpp"

#include <dos/checkpoint.hpp>
#include <dos/optimizer.hpp>

#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <string>
#include <vector>

using namespace dos;

namespace {

constexpr std::int64_t kSaved = 4, kEnd = 9;
const std::vector<std::size_t> kSizes{37, 150, 64, 201};
// Parameter 1 has no gradient (torch's None) at every third call: its own step count
// lags the others', in the checkpoint and on both sides of the conversion.
bool absent_at(std::size_t p, std::int64_t call) { return p == 1 && call % 3 == 0; }

struct Model {
  std::vector<std::vector<float>> values, grads;
  std::vector<std::uint8_t> absent = std::vector<std::uint8_t>(kSizes.size(), 0);  // sized once: parameters point into it
  std::unique_ptr<CpuOptimizer> opt;
  explicit Model(std::int64_t start_values_at = 0) {
    for (std::size_t t = 0; t < kSizes.size(); ++t) {
      values.emplace_back(kSizes[t]);
      grads.emplace_back(kSizes[t]);
      for (std::size_t i = 0; i < kSizes[t]; ++i) values[t][i] = test::initial_param(t, i);
    }
    if (start_values_at > 0) {  // the framework's weights at that call, from a run of its own
      Model m;
      m.run_to(start_values_at);
      values = m.values;
    }
    std::vector<ParamGroup<test::SwitchedParam>> groups(2);
    groups[0].hyper = AdamW{.lr = 1e-2, .weight_decay = 0.1};
    groups[1].hyper = AdamW{.lr = 5e-3, .weight_decay = 0.0, .amsgrad = true};
    for (std::size_t t = 0; t < kSizes.size(); ++t) groups[t / 2].params.push_back({{values[t], grads[t]}, &absent[t]});
    opt = std::make_unique<CpuOptimizer>(std::move(groups), Options{.subgroup_elements = 100, .threads = 1});
  }
  void set_gradients(std::int64_t call) {
    for (std::size_t t = 0; t < kSizes.size(); ++t) {
      absent[t] = absent_at(t, call) ? 1 : 0;
      for (std::size_t i = 0; i < kSizes[t]; ++i) grads[t][i] = test::gradient(t, call, i);
    }
  }
  void run_to(std::int64_t calls) {
    while (opt->schedule_index() < calls) {
      set_gradients(opt->schedule_index() + 1);
      opt->step();
    }
  }
  std::vector<float> state() const {
    std::vector<float> out;
    for (std::size_t p = 0; p < kSizes.size(); ++p) {
      std::vector<float> tmp(kSizes[p]);
      for (auto k : {StateKind::master, StateKind::exp_avg, StateKind::exp_avg_sq}) {
        opt->read_state(p, k, tmp);
        out.insert(out.end(), tmp.begin(), tmp.end());
      }
      if (p >= 2) {
        opt->read_state(p, StateKind::max_exp_avg_sq, tmp);
        out.insert(out.end(), tmp.begin(), tmp.end());
      }
    }
    return out;
  }
};

int save_mode(const std::filesystem::path& work) {
  Model m;
  m.run_to(kSaved);
  save(*m.opt, work / "ckpt");
  std::vector<std::vector<float>> keep;
  std::vector<checkpoint::TensorEntry> entries;
  std::uint64_t offset = 0;
  const auto add = [&](std::string name, std::vector<float> data) {
    entries.push_back({std::move(name), "F32", {data.size()}, offset, offset + data.size() * 4});
    offset += data.size() * 4;
    keep.push_back(std::move(data));
  };
  for (std::size_t p = 0; p < kSizes.size(); ++p) add("value." + std::to_string(p) + ".start", m.values[p]);
  for (std::int64_t call = kSaved + 1; call <= kEnd; ++call) {
    m.set_gradients(call);
    for (std::size_t p = 0; p < kSizes.size(); ++p)
      if (!absent_at(p, call)) add("grad." + std::to_string(p) + "." + std::to_string(call), m.grads[p]);  // none: None
  }
  m.run_to(kEnd);
  for (std::size_t p = 0; p < kSizes.size(); ++p) add("value." + std::to_string(p) + ".end", m.values[p]);
  const std::string header = checkpoint::make_safetensors_header(entries, {{"k", std::to_string(kSaved)}, {"n", std::to_string(kEnd)}});
  checkpoint::detail::Fd f(work / "trajectory.safetensors", O_WRONLY | O_CREAT | O_TRUNC);
  f.write_all(header.data(), header.size());
  for (const auto& d : keep) f.write_all(d.data(), d.size() * 4);
  f.close();
  return 0;
}

int resume_mode(const std::filesystem::path& ckpt) {
  Model reference;
  reference.run_to(kEnd);
  Model fresh(kSaved);
  load(*fresh.opt, ckpt);
  if (fresh.opt->step_count() != kSaved || fresh.opt->step_count(1) != kSaved - 1) return 1;
  fresh.run_to(kEnd);
  const bool same = fresh.values == reference.values && fresh.state() == reference.state();
  std::printf("resumed from %s: %s\n", ckpt.c_str(), same ? "bit-identical" : "DIFFERENT");
  return same ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: checkpoint_fixture save WORK | resume CKPT\n");
    return 2;
  }
  try {
    const std::string mode = argv[1];
    if (mode == "save") return save_mode(argv[2]);
    if (mode == "resume") return resume_mode(argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  return 2;
}
