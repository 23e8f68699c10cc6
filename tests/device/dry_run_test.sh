#!/usr/bin/env bash
# CTest's device_check_dry_run: prepare.sh, then check.sh --dry-run against the folder
# it filled, then every figure of tests/device/summary.py must be in summary.json, a
# number or null with a reason. Exit 77 (skipped) only when prepare.sh cannot reach
# Debian's registry.
#   dry_run_test.sh WORKDIR
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="$1"
mkdir -p "$work"
bash "$here/prepare.sh" "$work/deps"
rc=$?
if ((rc == 77)); then
  echo "SKIPPED: prepare.sh could not fetch the Debian packages (no registry); the dry run needs them"
  exit 77
fi
((rc == 0)) || exit "$rc"
bash "$here/check.sh" --dry-run --deps "$work/deps" --out "$work/out" --build "$work/build" || exit 1
python3 - "$work/out/summary.json" "$here" <<'PY'
import json, subprocess, sys
s = json.load(open(sys.argv[1]))
keys = subprocess.run([sys.executable, sys.argv[2] + "/summary.py", "-", "--keys"], capture_output=True,
                      text=True, check=True).stdout.split()
bad = [k for k in keys if k not in s["figures"] or (s["figures"][k] is None and not s["null_reasons"].get(k))]
assert keys and not bad, f"figures missing or null without a reason: {bad}"
assert s["check"]["deps"] != "system", "the dry run did not use prepare.sh's folder"
for part in ("env", "build", "gpu_tests", "bench", "train_gpt"):
    assert part in s["parts"], f"part {part} missing"
print(f"dry run: {len(keys)} figures, {sum(v is None for v in s['figures'].values())} null with a reason; "
      f"GPU: {s['check']['gpu'] or s['check']['gpu_reason']}; toolkit: {s['check']['cuda_toolkit'] or s['check']['cuda_toolkit_reason']}")
PY
