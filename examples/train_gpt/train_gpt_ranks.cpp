// train_gpt data-parallel over MPI ranks, with dos's ZeRO-2: every rank holds the whole
// model, draws the same batch (the same seed) and runs forward and backward on its own
// slice of it; dos averages the ranks' gradients with a reduce-scatter, each rank
// updates (and keeps Adam's state for) its share of the parameters, and an all-gather
// gives every rank every updated value. With one rank it is one process on the whole
// batch: the run the distributed one is compared with.
//
//   mpiexec -n 2 train_gpt_ranks [--steps N] [--csv path] [--summary path] [--text path]
//
// Rank 0 prints the loss of the whole batch (the mean of the ranks' slice losses, each
// slice the same size) and writes the CSV and the JSON summary.

#include "gpt.hpp"

#include <dos/adapters/torch.hpp>
#include <dos/comm/mpi.hpp>
#include <dos/shard/sharded_optimizer.hpp>

#include <fmt/core.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <string>
#include <vector>

#ifndef DOS_TRAIN_GPT_TEXT
#define DOS_TRAIN_GPT_TEXT "sonnets.txt"
#endif

namespace {

int train(dos::AnyCommunicator comm, int argc, char** argv) {
  using namespace gpt;
  const int rank = comm.rank(), ranks = comm.size();
  std::string csv, summary, text_path = DOS_TRAIN_GPT_TEXT;
  int steps = 300;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--steps") steps = std::stoi(value);
    else if (flag == "--csv") csv = value;
    else if (flag == "--summary") summary = value;
    else if (flag == "--text") text_path = value;
    else {
      if (rank == 0) std::fprintf(stderr, "usage: train_gpt_ranks [--steps N] [--csv path] [--summary path] [--text path]\n");
      return 2;
    }
  }
  if (kBatch % ranks != 0) {
    if (rank == 0) std::fprintf(stderr, "train_gpt_ranks: the batch of %lld does not split over %d ranks\n",
                                static_cast<long long>(kBatch), ranks);
    return 2;
  }
  torch::set_num_threads(1);  // the ranks share the host's cores
  const Text text = encode(read_text(text_path));
  torch::manual_seed(1234);  // the same initial weights on every rank
  Gpt model(static_cast<std::int64_t>(text.chars.size()));
  const std::vector<torch::Tensor> params = model->parameters();
  const dos::WarmupCosine schedule{.peak = 3e-3, .warmup = steps / 10, .total = steps, .floor = 3e-4};
  dos::Options o{.subgroup_elements = 65'536, .threads = 1, .max_grad_norm = 1.0, .sharding = dos::Sharding::zero2};
  o.communicator = comm;
  dos::ShardedOptimizer<> opt(params, dos::AdamW{.weight_decay = 0.1}, o);
  opt.local().set_schedule(0, schedule);

  std::size_t parameters = 0;
  for (const auto& p : params) parameters += static_cast<std::size_t>(p.numel());
  if (rank == 0)
    fmt::print("train_gpt_ranks: {} parameters, {} ranks, {} of the batch of {} each, ZeRO-2 (this rank updates {})\n",
               parameters, ranks, kBatch / ranks, kBatch, opt.share().numel());
  std::ofstream out;
  if (rank == 0 && !csv.empty()) {
    out.open(csv);
    out << "step,loss,step_ms,optimizer_ms\n";
  }
  torch::manual_seed(42);  // the same batches on every rank
  const std::int64_t per = kBatch / ranks;
  double total_ms = 0, total_opt_ms = 0, first_ms = 0, last_loss = 0;
  for (int step = 0; step < steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    auto [x, y] = draw_batch(text.codes);
    x = x.slice(0, rank * per, (rank + 1) * per);
    y = y.slice(0, rank * per, (rank + 1) * per);
    auto logits = model->forward(x);
    auto loss = torch::nn::functional::cross_entropy(logits.view({-1, logits.size(-1)}), y.view({-1}));
    model->zero_grad();
    loss.backward();
    const auto t1 = std::chrono::steady_clock::now();
    opt.step();
    const auto t2 = std::chrono::steady_clock::now();
    std::vector<double> whole{loss.item<double>()};
    comm.all_reduce(whole, dos::ReduceOp::sum);
    last_loss = whole[0] / ranks;
    const double ms = std::chrono::duration<double, std::milli>(t2 - t0).count();
    const double opt_ms = std::chrono::duration<double, std::milli>(t2 - t1).count();
    if (step == 0) first_ms = ms;
    total_ms += ms;
    total_opt_ms += opt_ms;
    if (rank != 0) continue;
    fmt::print("step {:>4}/{} [{}] loss {:.6f}  {:.1f} ms (optimizer {:.2f} ms)\n", step + 1, steps, bar(step + 1, steps),
               last_loss, ms, opt_ms);
    if (out) out << step << ',' << fmt::format("{:.9g}", last_loss) << ',' << ms << ',' << opt_ms << '\n';
  }
  if (rank == 0 && !summary.empty()) {
    const double step_s = steps > 1 ? (total_ms - first_ms) / (steps - 1) * 1e-3 : total_ms * 1e-3;
    std::ofstream js(summary);
    js << fmt::format(R"({{"ranks": {}, "steps": {}, "final_loss": {:.9g}, "step_s": {}, "optimizer_s": {}}})" "\n", ranks,
                      steps, last_loss, step_s, total_opt_ms / steps * 1e-3);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int code = 0;
  try {
    code = train(dos::AnyCommunicator(dos::MpiCommunicator(MPI_COMM_WORLD)), argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_gpt_ranks: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);  // the other ranks may wait in a collective
  }
  MPI_Finalize();
  return code;
}
