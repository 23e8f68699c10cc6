// Conan's test of the dos package: the headers are found, {fmt} and threads link, and
// one AdamW step moves a parameter by about -lr.
#include <dos/optimizer.hpp>
#include <dos/version.hpp>

#include <cstdio>
#include <vector>

int main() {
  std::vector<float> value(64, 1.0f), grad(64, 0.25f);
  std::vector<dos::HostParam<float>> params{{value, grad}};
  dos::InterleavedOptimizer<dos::CpuBackend> opt(params, dos::AdamW{.lr = 1e-3}, {.threads = 1});
  const bool ok = opt.step().applied && value[0] < 1.0f && value[0] > 0.998f;
  std::printf("dos %d.%d.%d from Conan: p[0] = %.6f, %s\n", DOS_VERSION_MAJOR, DOS_VERSION_MINOR, DOS_VERSION_PATCH,
              value[0], ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
