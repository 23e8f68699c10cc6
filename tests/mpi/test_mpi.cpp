// Under mpiexec (CTest runs it with 1 to 4 ranks): MpiCommunicator keeps the
// Communicator contract, and the sharded mode on every rank agrees with one process
// stepping every shard, on the CPU and on the emulated device, and so do ZeRO-1 and ZeRO-2
// (tests/support/collectives.hpp, tests/support/sharded.hpp, tests/support/zero.hpp). Every rank prints what
// failed; the exit code is the same on every rank.

#include "support/collectives.hpp"
#include "support/sharded.hpp"
#include "support/zero.hpp"

#include <dos/comm/mpi.hpp>

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  double failures = 0;
  {
    dos::AnyCommunicator comm{dos::MpiCommunicator(MPI_COMM_WORLD)};
    std::vector<std::string> fail;
    try {
      fail = dos::test::check_collectives(comm);
      for (auto& f : dos::test::check_sharded<dos::CpuBackend>(comm)) fail.push_back("cpu: " + f);
      for (auto& f : dos::test::check_sharded<dos::EmulatedDeviceBackend>(comm)) fail.push_back("emulated device: " + f);
      for (auto& f : dos::test::check_zero<dos::CpuBackend>(comm)) fail.push_back("zero, cpu: " + f);
      for (auto& f : dos::test::check_zero<dos::EmulatedDeviceBackend>(comm)) fail.push_back("zero, emulated device: " + f);
    } catch (const std::exception& e) {
      // The scenario throws only where it did not expect to; the other ranks may then
      // wait in a collective: abort the job rather than hang.
      std::fprintf(stderr, "rank %d: unexpected exception: %s\n", comm.rank(), e.what());
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    for (const auto& f : fail) std::fprintf(stderr, "FAILED %s\n", f.c_str());
    std::vector<double> count{static_cast<double>(fail.size())};
    comm.all_reduce(count, dos::ReduceOp::sum);
    failures = count[0];
    if (comm.rank() == 0) std::printf("%d ranks: %g failure(s)\n", comm.size(), failures);
  }
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
