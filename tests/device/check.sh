#!/usr/bin/env bash
# The CUDA backend's device check, for a machine with a GPU (one H200, 16 cores), in
# under 8 minutes with its default sizes, build included:
#  1. env: the GPU (nvidia-smi) and the CUDA toolkit (nvcc), each said plainly;
#  2. build: only the GPU tests and bench_cuda, for sm_90, with ninja where present,
#     against the folder tests/device/prepare.sh fills (fmt, doctest, Google Benchmark)
#     or, without it, the system's packages;
#  3. gpu_tests: the CUDA backend's tests (the kernel and the optimizer against the CPU
#     executor bit for bit, early fetch, clipping and loss scaling on device gradients);
#  4. bench: bench_cuda's figures, each against its reference (tests/device/summary.py
#     lists them);
#  5. train_gpt: not built by this script yet (its figures are null, with that reason).
# After every part OUT/summary.json is rewritten, so a run cut at any point returns what
# it measured; every part has a time limit. Output is unbuffered.
#
#   bash tests/device/check.sh [--dry-run] [--out DIR] [--deps DIR]
#     --dry-run  for a machine without a GPU: build, run what can run, write every key
#                (GPU figures null, with the reason); exit 0 when that worked
#     --out DIR  where summary.json goes (default $OUT where set, else build/device)
#     --deps DIR prepare.sh's folder (default build/device-deps; used when it exists)
#     --build DIR the build tree (default build/device, build/device-dry for a dry run)
#   DOS_CHECK_PARAMS=5e8 for a smaller hybrid update (default 2e9 device parameters)
set -uo pipefail
cd "$(dirname "$0")/../.."
dry=0 out="${OUT:-build/device}" deps=build/device-deps build=
while (($#)); do
  case "$1" in
    --dry-run) dry=1 ;;
    --out) out="$2"; shift ;;
    --deps) deps="$2"; shift ;;
    --build) build="$2"; shift ;;
    *) echo "usage: check.sh [--dry-run] [--out DIR] [--deps DIR] [--build DIR]" >&2; exit 2 ;;
  esac
  shift
done
# A dry run never disturbs a real run's build.
[[ -n $build ]] || build=$( ((dry)) && echo build/device-dry || echo build/device)
mkdir -p "$out/parts"
rm -f "$out"/parts/*.json "$out/bench.json" "$out/train_gpt.json" "$out/summary.json"
start=$(date +%s)
total_budget=${DOS_CHECK_BUDGET_S:-470}  # the whole check, under 8 minutes
elapsed() { echo $(( $(date +%s) - start )); }
# The time a part may take: its own budget, or what is left of the whole, if less.
limit() { local left=$(( total_budget - $(elapsed) )); echo $(( $1 < left ? $1 : (left > 5 ? left : 5) )); }
json_str() { python3 -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$1"; }
# part NAME STATUS SECONDS EXIT [REASON]: record a part and rewrite summary.json.
part() {
  local reason=null
  [[ -n ${5:-} ]] && reason=$(json_str "$5")
  printf '{"status": "%s", "seconds": %s, "exit": %s, "reason": %s}\n' "$1" "$3" "$4" "$reason" >"$out/parts/$2.json.tmp"
  mv "$out/parts/$2.json.tmp" "$out/parts/$2.json"
  python3 tests/device/summary.py "$out" || echo "check: summary.py failed" >&2
  echo "== $2: $1 ($3 s${5:+; $5}), $(elapsed) s so far"
}
# run NAME SECONDS CMD...: time-boxed, unbuffered, logged to OUT/NAME.log; sets rc.
run() {
  local name=$1 secs; secs=$(limit "$2"); shift 2
  echo "== $name (limit $secs s): $*"
  local t0; t0=$(date +%s)
  timeout -k 10 "$secs" "${unbuffered[@]}" "$@" 2>&1 | tee "$out/$name.log"
  rc=${PIPESTATUS[0]}
  took=$(( $(date +%s) - t0 ))
}
# Line-buffered children: their output reaches the terminal (and a cut run) as it comes.
unbuffered=()
command -v stdbuf >/dev/null && unbuffered=(stdbuf -oL -eL)
status_of() {  # exit status -> part status
  case "$1" in 0) echo ok ;; 77) echo skipped ;; 124|137) echo timeout ;; *) echo failed ;; esac
}

# 1. env
gpu=null gpu_reason=null toolkit=null toolkit_reason=null
if ! command -v nvidia-smi >/dev/null; then
  name="nvidia-smi not found"; false
elif name=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1) && [[ -n $name ]]; then
  gpu=$(json_str "$name"); echo "check: GPU: $name"
else
  gpu_reason=$(json_str "no GPU: ${name:-nvidia-smi found none}"); echo "check: NO GPU: ${name:-nvidia-smi found none}"
fi
nvcc=$(command -v nvcc || { [[ -x /usr/local/cuda/bin/nvcc ]] && echo /usr/local/cuda/bin/nvcc; } || true)
if [[ -n $nvcc ]]; then
  v=$("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
  toolkit=$(json_str "$v ($nvcc)"); echo "check: CUDA toolkit $v at $nvcc"
else
  toolkit_reason='"no CUDA toolkit: nvcc is neither on PATH nor at /usr/local/cuda/bin"'
  echo "check: NO CUDA TOOLKIT: nvcc is neither on PATH nor at /usr/local/cuda/bin" >&2
fi
deps_used=system
cmake_deps=()
if [[ -e $deps/READY ]]; then
  deps_abs=$(cd "$deps" && pwd)
  # Named one by one, so the folder is used even where CMake's own search would not
  # look under lib/<arch> (no CMAKE_LIBRARY_ARCHITECTURE); the system's fmt is not.
  cmake_deps=(-DCMAKE_PREFIX_PATH="$deps_abs/root/usr" -Dfmt_DIR="$deps_abs/fmt-header-only"
              -Ddoctest_DIR="$(dirname "$(ls "$deps_abs"/root/usr/lib/cmake/doctest/doctestConfig.cmake)")"
              -Dbenchmark_DIR="$(dirname "$(ls "$deps_abs"/root/usr/lib/*/cmake/benchmark/benchmarkConfig.cmake)")")
  deps_used=$deps
  echo "check: fmt, doctest and Google Benchmark from $deps"
else
  echo "check: no $deps (bash tests/device/prepare.sh makes it): fmt and doctest must be installed"
fi
cat >"$out/check.json" <<JSON
{"dry_run": $( ((dry)) && echo true || echo false ), "gpu": $gpu, "gpu_reason": $gpu_reason,
 "cuda_toolkit": $toolkit, "cuda_toolkit_reason": $toolkit_reason, "deps": "$deps_used", "cores": $(nproc),
 "commit": "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)", "started": "$(date -u +%FT%TZ)"}
JSON
part ok env 0 0

# 2. build
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
[[ -e $build/CMakeCache.txt ]] && generator=()  # keep the generator it was made with
cuda_args=(-DDOS_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
targets=(test_cuda_fallback test_cuda_backend bench_cuda)
if [[ -z $nvcc ]]; then
  # Nothing of the CUDA path can build: build a host test, which proves fmt and doctest.
  cuda_args=(-DDOS_WITH_CUDA=OFF)
  targets=(test_tensor)
else
  cuda_args+=(-DCMAKE_CUDA_COMPILER="$nvcc")
fi
run configure 120 cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DDOS_BUILD_EXAMPLES=OFF \
  -DDOS_BUILD_BENCHMARKS=ON -DDOS_WITH_TORCH=OFF -DDOS_INSTALL=OFF "${cuda_args[@]}" "${cmake_deps[@]}"
if ((rc == 0)); then
  t_conf=$took
  run build 300 cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"
  took=$((took + t_conf))
fi
build_rc=$rc
part "$(status_of $rc)" build "$took" "$rc" "$( ((rc)) && echo "see $out/configure.log, $out/build.log" ||
  { [[ -z $nvcc ]] && echo "no CUDA toolkit: built only the host test ${targets[*]}"; })"

# 3. gpu_tests
if ((build_rc != 0)); then
  part skipped gpu_tests 0 null "the build failed"
elif [[ -z $nvcc ]]; then
  run host_test 60 "$build/tests/test_tensor"
  part skipped gpu_tests 0 null "no CUDA toolkit (the host test ${targets[*]} exited $rc)"
  ((rc == 0)) || build_rc=$rc
else
  run fallback_test 60 "$build/tests/test_cuda_fallback"
  fallback_rc=$rc fallback_took=$took
  run gpu_tests 150 "$build/tests/test_cuda_backend"
  why=""
  ((rc == 77)) && why=$(grep -m1 -i "no usable\|skipped" "$out/gpu_tests.log" || echo "no GPU")
  ((fallback_rc != 0)) && why="test_cuda_fallback exited $fallback_rc; $why"
  part "$(status_of $((fallback_rc ? fallback_rc : rc)))" gpu_tests $((took + fallback_took)) "$rc" "$why"
  tests_rc=$((fallback_rc ? fallback_rc : rc))
fi

# 4. bench
if ((build_rc != 0)) || [[ -z $nvcc ]]; then
  part skipped bench 0 null "$([[ -z $nvcc ]] && echo "no CUDA toolkit" || echo "the build failed")"
  bench_rc=0
else
  run bench 200 "$build/bench/bench_cuda" "$out/bench.json" "${DOS_CHECK_PARAMS:-2e9}"
  bench_rc=$rc
  part "$(status_of $rc)" bench "$took" "$rc" "$( ((rc == 77)) && echo "no GPU")"
fi

# 5. train_gpt
part not_done train_gpt 0 null "check.sh does not build examples/train_gpt against libtorch yet"

echo "== summary ($out/summary.json), $(elapsed) s"
cat "$out/summary.json"
# A dry run passes when everything that can run here ran; a real run needs the GPU parts.
if ((dry)); then
  ((build_rc == 0)) && { ((${tests_rc:-0} == 0 || ${tests_rc:-0} == 77)); } && ((bench_rc == 0 || bench_rc == 77))
  exit $?
fi
[[ -n $nvcc ]] || exit 2
((build_rc == 0 && ${tests_rc:-1} == 0 && bench_rc == 0))
