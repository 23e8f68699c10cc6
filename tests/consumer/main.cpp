#include <dos/optimizer.hpp>

#include <cstdio>
#include <vector>

int main() {
  std::vector<float> value(1000, 1.0f), grad(1000, 0.5f);
  std::vector<dos::HostParam<float>> params{{value, grad}};
  dos::InterleavedOptimizer<dos::CpuBackend> opt(params, dos::AdamW{}, {.threads = 1});
  const dos::StepReport r = opt.step();
  // One AdamW step from p = 1 with a constant gradient moves p by about -lr.
  const bool ok = r.applied && value[0] < 1.0f && value[0] > 0.998f;
  std::printf("consumer: step %lld, p[0] = %.6f, %s\n", static_cast<long long>(r.step), value[0], ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
