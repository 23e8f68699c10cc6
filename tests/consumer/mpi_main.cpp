// A consumer of dos::mpi: one rank (a singleton MPI process, or under mpiexec) steps an
// optimizer whose communicator is MPI's, so the MPI headers, library and dos's
// MpiCommunicator all come from the installed package.
#include <dos/comm/mpi.hpp>
#include <dos/optimizer.hpp>

#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  bool ok = false;
  {
    std::vector<float> value(1000, 1.0f), grad(1000, 0.5f);
    std::vector<dos::HostParam<float>> params{{value, grad}};
    dos::Options o{.threads = 1, .max_grad_norm = 1.0};
    o.communicator = dos::MpiCommunicator(MPI_COMM_WORLD);
    dos::CpuOptimizer opt(params, dos::AdamW{}, o);
    const dos::StepReport r = opt.step();
    ok = r.applied && value[0] < 1.0f;
    std::printf("consumer_mpi: step %lld, grad_norm %.3f, %s\n", static_cast<long long>(r.step), r.grad_norm, ok ? "ok" : "WRONG");
  }
  MPI_Finalize();
  return ok ? 0 : 1;
}
