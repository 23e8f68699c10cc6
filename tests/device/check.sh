#!/usr/bin/env bash
# The CUDA backend's device check, for a machine with a GPU (one H200, 16 cores):
#  1. builds the GPU tests and benchmark for sm_90;
#  2. runs the GPU test suite, which includes the GPU against the CPU executor over
#     50 steps on mixed precisions (bit for bit, so within torch's tolerance too);
#  3. runs bench_cuda: (a) GPU Adam against a d2d cudaMemcpy, (b) pinned copies
#     against cudaMemcpy, (c) a 2B-parameter update, all-CPU against the automatic
#     stride, and against the cost model's prediction, (d) the chosen k;
#  4. writes the JSON summary to $OUT (or build/device) and prints it.
# Usage: bash tests/device/check.sh        (DOS_CHECK_PARAMS=5e8 for a smaller (c))
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-build/device}"
mkdir -p "$out"
start=$(date +%s)
for header in /usr/include/fmt/core.h /usr/include/doctest/doctest.h; do
  [[ -e $header ]] || { echo "device check: $header is missing (Debian: libfmt-dev doctest-dev)" >&2; exit 2; }
done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
cmake -S . -B build/device -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DDOS_BUILD_EXAMPLES=OFF -DDOS_BUILD_BENCHMARKS=ON >/dev/null
cmake --build build/device -j "$(nproc)" --target test_cuda_backend test_cuda_fallback bench_cuda
echo "== build: $(( $(date +%s) - start )) s"
set +e
build/device/tests/test_cuda_fallback 2>&1 | tail -3
build/device/tests/test_cuda_backend 2>&1 | tee "$out/gpu_tests.txt" | tail -20
tests_rc=${PIPESTATUS[0]}
echo "== GPU tests: exit $tests_rc, $(( $(date +%s) - start )) s"
build/device/bench/bench_cuda "$out/dos_cuda_summary.json" "${DOS_CHECK_PARAMS:-2e9}" 2>&1 | tee "$out/bench.txt"
bench_rc=${PIPESTATUS[0]}
set -e
echo "== bench: exit $bench_rc, $(( $(date +%s) - start )) s"
[[ -e $out/dos_cuda_summary.json ]] && cat "$out/dos_cuda_summary.json"
exit $(( tests_rc != 0 ? tests_rc : bench_rc ))
