// Under mpiexec with 2 ranks: a rank that stops calling collectives makes the other's
// collective fail with an error after MpiCommunicator's timeout, instead of hanging,
// both for a bare all_reduce and for step(), which changes nothing on the rank that
// timed out. The late rank then joins the abandoned operation, so the job ends
// cleanly. Exit code: 0 when every check passed on every rank.

#include <dos/comm/mpi.hpp>
#include <dos/optimizer.hpp>

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

int failures = 0;
void expect(bool ok, int rank, const std::string& what) {
  if (ok) return;
  ++failures;
  std::fprintf(stderr, "FAILED rank %d: %s\n", rank, what.c_str());
}

// Generous against a loaded CI machine: the late rank arrives long after the timeout.
constexpr auto timeout = std::chrono::milliseconds(800);
constexpr auto late = std::chrono::milliseconds(3000);
const std::string timeout_text = std::to_string(timeout.count()) + " ms";

// Rank 1 arrives late to an all_reduce: rank 0 gets the error, and every later call
// on its communicator is refused.
void bare_collective(int rank) {
  dos::MpiCommunicator c(MPI_COMM_WORLD, timeout);
  std::vector<double> x{1.0};
  if (rank == 1) {
    std::this_thread::sleep_for(late);
    c.all_reduce(x, dos::ReduceOp::sum);  // completes with rank 0's abandoned operation
    expect(x[0] == 2.0, rank, "the late all_reduce gave " + std::to_string(x[0]));
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    c.all_reduce(x, dos::ReduceOp::sum);
    expect(false, rank, "all_reduce returned though rank 1 had not joined");
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    expect(what.find("all_reduce on rank 0 of 2") != std::string::npos && what.find(timeout_text) != std::string::npos,
           rank, "the timeout message: " + what);
  }
  expect(std::chrono::steady_clock::now() - start < late, rank, "the timeout came after the late rank");
  try {
    c.barrier();
    expect(false, rank, "a timed-out communicator took another call");
  } catch (const std::runtime_error& e) {
    expect(std::string(e.what()).find("timed out in all_reduce before") != std::string::npos, rank,
           std::string("the refusal: ") + e.what());
  }
}

// The same inside step(): the agreement that opens every step times out on rank 0,
// whose parameters and state keep every bit.
void step_with_a_hung_rank(int rank) {
  std::vector<float> value(1000, 0.5f), grad(1000, 0.25f);
  std::vector<dos::HostParam<float>> params{{value, grad}};
  dos::Options o{.threads = 1};
  o.communicator = dos::MpiCommunicator(MPI_COMM_WORLD, timeout);
  dos::CpuOptimizer opt(params, dos::AdamW{}, o);
  MPI_Barrier(MPI_COMM_WORLD);  // both constructed: the first step's agreement cannot time out on a slow start
  opt.step();                   // both ranks: the collective works
  if (rank == 1) {
    std::this_thread::sleep_for(late);
    // Join the abandoned agreement with a buffer of its shape (3 fields per rank) so
    // rank 0's operation completes; this rank does not step again.
    // (Copies of an AnyCommunicator share it: o's is the optimizer's.)
    std::vector<double> rows(6, 0.0);
    o.communicator.all_reduce(rows, dos::ReduceOp::sum);
    return;
  }
  const std::vector<float> before = value;
  try {
    opt.step();
    expect(false, rank, "step() returned though rank 1 had stopped stepping");
  } catch (const std::runtime_error& e) {
    expect(std::string(e.what()).find("not every rank joined within " + timeout_text) != std::string::npos, rank,
           std::string("step()'s error: ") + e.what());
  }
  expect(value == before && opt.step_count() == 1, rank, "the timed-out step changed the parameters or the count");
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 2) {
    if (rank == 0) std::fprintf(stderr, "run with 2 ranks, not %d\n", size);
    MPI_Finalize();
    return 2;
  }
  bare_collective(rank);
  step_with_a_hung_rank(rank);
  int all = 0;
  MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) std::printf("timeouts: %d failure(s)\n", all);
  MPI_Finalize();
  return all == 0 ? 0 : 1;
}
