#!/usr/bin/env bash
# The CUDA backend's device check, for a machine with a GPU (one H200, 16 cores), in
# under 8 minutes with its default sizes, build included:
#  1. env: the GPU (nvidia-smi) and the CUDA toolkit (nvcc), each said plainly;
#  2. build: only the GPU tests and bench_cuda, for sm_90, with ninja where present,
#     against the folder tests/device/prepare.sh fills (fmt, doctest, Google Benchmark)
#     or, without it, the system's packages;
#  3. gpu_tests: the CUDA backend's tests (the kernel and the optimizer against the CPU
#     executor bit for bit, early fetch, clipping and loss scaling on device gradients),
#     and NcclCommunicator's (test_nccl, where NCCL was found);
#  4. bench: bench_cuda's figures, each against its reference (tests/device/summary.py
#     lists them);
#  5. train_gpt: examples/train_gpt built in its own tree against the libtorch of
#     python3's torch (torch.utils.cmake_prefix_path) and dos::cuda, then trained on the
#     GPU twice, same model, data and seed: with dos (CudaBackend) and with
#     torch::optim::AdamW; each run's final loss and time per step (first step left out).
#     Skipped, with the reason, without a GPU (so in a dry run) or without torch.
# After every part OUT/summary.json is rewritten, so a run cut at any point returns what
# it measured; every part has a time limit. Output is unbuffered.
#
#   bash tests/device/check.sh [--dry-run] [--out DIR] [--deps DIR] [--build DIR]
#                              [--train-gpt-only | --no-train-gpt]
#     --dry-run  for a machine without a GPU: build, run what can run, write every key
#                (GPU figures null, with the reason); exit 0 when that worked
#     --out DIR  where summary.json goes (default $OUT where set, else build/device)
#     --deps DIR prepare.sh's folder (default build/device-deps; used when it exists)
#     --build DIR the build tree (default build/device, build/device-dry for a dry run)
#     --train-gpt-only  parts 1 and 5 only, with the whole budget (a second call, so that
#                each call stays under 10 minutes); --no-train-gpt: parts 1 to 4
#   DOS_CHECK_PARAMS=5e8 for a smaller hybrid update (default 2e9 device parameters)
#   DOS_CHECK_GPT_STEPS=N train_gpt's steps per optimizer (default 200)
# Parts run in order within DOS_CHECK_BUDGET_S (default 470 s): train_gpt, last, gets
# what is left of it (its build alone can take a few minutes).
set -uo pipefail
cd "$(dirname "$0")/../.."
dry=0 out="${OUT:-build/device}" deps=build/device-deps build= parts_1_4=1 part_5=1
while (($#)); do
  case "$1" in
    --dry-run) dry=1 ;;
    --out) out="$2"; shift ;;
    --deps) deps="$2"; shift ;;
    --build) build="$2"; shift ;;
    --train-gpt-only) parts_1_4=0 ;;
    --no-train-gpt) part_5=0 ;;
    *) echo "usage: check.sh [--dry-run] [--out DIR] [--deps DIR] [--build DIR] [--train-gpt-only | --no-train-gpt]" >&2
       exit 2 ;;
  esac
  shift
done
# A dry run never disturbs a real run's build.
[[ -n $build ]] || build=$( ((dry)) && echo build/device-dry || echo build/device)
mkdir -p "$out/parts"
rm -f "$out"/parts/*.json "$out/bench.json" "$out/train_gpt.json" "$out"/train_gpt_*.summary.json "$out/summary.json"
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
gpu=null gpu_reason=null toolkit=null toolkit_reason=null no_gpu=""
if ! command -v nvidia-smi >/dev/null; then
  no_gpu="no GPU: nvidia-smi not found"
  gpu_reason=$(json_str "$no_gpu"); echo "check: NO GPU: nvidia-smi not found"
elif name=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1) && [[ -n $name ]]; then
  gpu=$(json_str "$name"); echo "check: GPU: $name"
else
  no_gpu="no GPU: ${name:-nvidia-smi found none}"
  gpu_reason=$(json_str "$no_gpu"); echo "check: NO GPU: ${name:-nvidia-smi found none}"
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
cmake_deps=() deps_prefix=""
if [[ -e $deps/READY ]]; then
  deps_abs=$(cd "$deps" && pwd)
  # Named one by one, so the folder is used even where CMake's own search would not
  # look under lib/<arch> (no CMAKE_LIBRARY_ARCHITECTURE); the system's fmt is not.
  deps_prefix="$deps_abs/root/usr"
  cmake_deps=(-Dfmt_DIR="$deps_abs/fmt-header-only"
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
# NCCL: the toolkit's, else the one torch's wheels bring (nvidia/nccl).
nccl_args=()
if [[ -n $nvcc && ! -e $(dirname "$(dirname "$nvcc")")/include/nccl.h ]]; then
  nccl_root=$(python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null) &&
    [[ -e $nccl_root/include/nccl.h ]] && nccl_args=(-DNCCL_ROOT="$nccl_root") && echo "check: NCCL from $nccl_root"
fi
if ((parts_1_4)); then
run configure 120 cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DDOS_BUILD_EXAMPLES=OFF \
  -DDOS_BUILD_BENCHMARKS=ON -DDOS_WITH_TORCH=OFF -DDOS_INSTALL=OFF "${cuda_args[@]}" "${nccl_args[@]}" "${cmake_deps[@]}" \
  -DCMAKE_PREFIX_PATH="$deps_prefix"
if ((rc == 0)); then
  t_conf=$took
  # NcclCommunicator's test, where the configuration found NCCL.
  cmake --build "$build" --target help 2>/dev/null | grep -q "test_nccl" && targets+=(test_nccl)
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
  nccl_rc=0 nccl_took=0
  if [[ -x $build/tests/test_nccl ]]; then
    run nccl_test 60 "$build/tests/test_nccl"
    nccl_rc=$rc nccl_took=$took
    ((nccl_rc == 77)) && nccl_rc=0  # no GPU: gpu_tests says so below
  fi
  run gpu_tests 150 "$build/tests/test_cuda_backend"
  why=""
  ((rc == 77)) && why=$(grep -m1 -i "no usable\|skipped" "$out/gpu_tests.log" || echo "no GPU")
  ((fallback_rc != 0)) && why="test_cuda_fallback exited $fallback_rc; $why"
  ((nccl_rc != 0)) && { why="test_nccl exited $nccl_rc (see $out/nccl_test.log); $why"; fallback_rc=$nccl_rc; }
  fallback_took=$((fallback_took + nccl_took))
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
else
  build_rc=0 tests_rc=0 bench_rc=0
  for p in build gpu_tests bench; do part skipped "$p" 0 null "not asked (--train-gpt-only)"; done
fi

# 5. train_gpt
gpt_rc=0
torch_prefix=""
((part_5)) && [[ -z $no_gpu && -n $nvcc ]] &&
  torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>"$out/torch_import.log")
if ((!part_5)); then
  part skipped train_gpt 0 null "not asked (--no-train-gpt)"
elif [[ -n $no_gpu ]]; then
  part skipped train_gpt 0 null "$no_gpu: train_gpt is neither built nor run"
elif [[ -z $nvcc ]]; then
  part skipped train_gpt 0 null "no CUDA toolkit: train_gpt is neither built nor run"
elif [[ -z $torch_prefix ]]; then
  gpt_rc=1
  part failed train_gpt 0 null "python3 cannot import torch, so there is no libtorch to build against: $(tail -1 "$out/torch_import.log")"
else
  echo "check: libtorch from $torch_prefix"
  gpt_build="$build-gpt" gpt_gen=()
  command -v ninja >/dev/null && gpt_gen=(-G Ninja)
  [[ -e $gpt_build/CMakeCache.txt ]] && gpt_gen=()
  # Its own tree: torch's CMake package must not change the GPU tests' build.
  run gpt_configure 180 cmake -S . -B "$gpt_build" "${gpt_gen[@]}" -DCMAKE_BUILD_TYPE=Release -DDOS_BUILD_EXAMPLES=ON \
    -DDOS_BUILD_TESTS=OFF -DDOS_BUILD_BENCHMARKS=OFF -DDOS_WITH_TORCH=ON -DDOS_INSTALL=OFF "${cuda_args[@]}" \
    -DTORCH_CUDA_ARCH_LIST=9.0 "${cmake_deps[@]}" -DCMAKE_PREFIX_PATH="${deps_prefix:+$deps_prefix;}$torch_prefix"
  gpt_took=$took
  if ((rc == 0)) && ! grep -q "train_gpt can train on CUDA" "$out/gpt_configure.log"; then
    rc=1; gpt_why="configured without --device cuda (see $out/gpt_configure.log)"
  fi
  if ((rc == 0)); then
    run gpt_build 300 cmake --build "$gpt_build" -j "$(nproc)" --target train_gpt
    gpt_took=$((gpt_took + took))
    ((rc == 0)) || gpt_why="the build failed (see $out/gpt_build.log)"
  else
    gpt_why=${gpt_why:-"the configuration failed (see $out/gpt_configure.log)"}
  fi
  gpt_rcs=()
  if ((rc == 0)); then
    for opt in dos torch; do
      run "train_gpt_$opt" 90 "$gpt_build/examples/train_gpt" --optimizer "$opt" --device cuda \
        --steps "${DOS_CHECK_GPT_STEPS:-200}" --summary "$out/train_gpt_$opt.summary.json"
      gpt_took=$((gpt_took + took)) gpt_rcs+=("$rc")
      ((rc == 0)) || gpt_why+="${gpt_why:+; }--optimizer $opt exited $rc"
    done
    rc=0
    for r in "${gpt_rcs[@]}"; do ((r != 0 && rc == 0)) && rc=$r; done
  fi
  gpt_rc=$rc
  # The figures, or for each one missing the reason its run gave.
  python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
figures, reasons = {}, {}
for opt in ("dos", "torch"):
    keys = (f"train_gpt_{opt}_final_loss", f"train_gpt_{opt}_step_s")
    try:
        with open(os.path.join(out, f"train_gpt_{opt}.summary.json")) as f:
            s = json.load(f)
        figures[keys[0]], figures[keys[1]] = s["final_loss"], s["step_s"]
    except (OSError, ValueError, KeyError):
        why = f"train_gpt --optimizer {opt} did not run to the end"
        try:
            with open(os.path.join(out, f"train_gpt_{opt}.log")) as f:
                why = next((l.strip() for l in f if l.startswith("skipped:")), why + f" (see {out}/train_gpt_{opt}.log)")
        except OSError:
            why = f"train_gpt --optimizer {opt} did not run (the build did not finish)"
        for k in keys:
            reasons[k] = why
notes = ("time per step: the mean over every step but the first, forward, backward and optimizer, "
         "the device synchronised before each clock reading; the same model, batches and seed for both")
with open(os.path.join(out, "train_gpt.json.tmp"), "w") as f:
    json.dump({"figures": figures, "reasons": reasons, "notes": notes}, f, indent=1)
os.replace(os.path.join(out, "train_gpt.json.tmp"), os.path.join(out, "train_gpt.json"))
PY
  part "$(status_of $gpt_rc)" train_gpt "$gpt_took" "$gpt_rc" "${gpt_why:-}"
fi

echo "== summary ($out/summary.json), $(elapsed) s"
cat "$out/summary.json"
# A dry run passes when everything that can run here ran; a real run needs the GPU parts.
if ((dry)); then
  ((build_rc == 0)) && { ((${tests_rc:-0} == 0 || ${tests_rc:-0} == 77)); } && ((bench_rc == 0 || bench_rc == 77))
  exit $?
fi
[[ -n $nvcc ]] || exit 2
((build_rc == 0 && ${tests_rc:-1} == 0 && bench_rc == 0 && gpt_rc == 0))
