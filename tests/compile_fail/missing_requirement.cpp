// Must NOT compile: a backend that declares itself a device backend but misses one
// requirement of dos::DeviceBackend (grad_stats). Built with -DDOS_CONTROL it has
// every requirement and must compile, so the test fails for the right reason only.

#include "support/wrapped_device.hpp"

#include <dos/optimizer.hpp>

#include <vector>

#ifdef DOS_CONTROL
using AlmostADevice = dos::test::WrappedDevice<true>;
#else
using AlmostADevice = dos::test::WrappedDevice<false>;
#endif

int main() {
  std::vector<float> v(8, 1.0f), g(8, 0.0f);
  std::vector<dos::HostParam<float>> params{{v, g}};
  dos::InterleavedOptimizer<AlmostADevice> opt(params, dos::AdamW{});
  return opt.step().applied ? 0 : 1;
}
