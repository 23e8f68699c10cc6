#!/usr/bin/env python3
"""Runs bench_interleaved once and prints its figures as ratios from that one run:
measured against predicted per policy, the automatic stride against the best of
all-CPU and the fixed strides, and against all-CPU, resident_then_stride against the
best of those and static_fraction, and against all-CPU,
and the best interleaved policy against all-CPU.

    /usr/bin/python3 bench/interleaved_report.py build/release/bench/bench_interleaved [min_time]
"""
import json
import subprocess
import sys


def main() -> int:
    binary = sys.argv[1]
    min_time = sys.argv[2] if len(sys.argv) > 2 else "1"
    out = subprocess.run([binary, "--benchmark_format=json", f"--benchmark_min_time={min_time}"],
                         check=True, capture_output=True, text=True)
    sys.stderr.write(out.stderr)
    runs = {b["name"].split("/")[1]: b for b in json.loads(out.stdout)["benchmarks"]}
    cpu = runs["all_cpu"]["measured_s"]
    print(f"{'policy':<16} {'measured ms':>12} {'predicted ms':>13} {'pred/meas':>10} {'1st-order/meas':>15}"
          f" {'vs all-CPU':>11} {'k':>5}")
    for name, b in runs.items():
        m, p, f = b["measured_s"], b["predicted_s"], b["first_order_s"]
        print(f"{name:<16} {m * 1e3:>12.2f} {p * 1e3:>13.2f} {p / m:>10.2f} {f / m:>15.2f}"
              f" {cpu / m:>10.2f}x {b['k']:>5.1f}")
    fixed = {n: b["measured_s"] for n, b in runs.items() if n.startswith("stride_")}
    best_k = min(fixed, key=fixed.get)
    auto = runs["automatic"]["measured_s"]
    interleaved = {n: b["measured_s"] for n, b in runs.items() if n != "all_cpu"}
    best = min(interleaved, key=interleaved.get)
    worst_error = max(abs(b["predicted_s"] / b["measured_s"] - 1) for b in runs.values())
    worst_first = max(abs(b["first_order_s"] / b["measured_s"] - 1) for b in runs.values())
    auto_error = abs(runs["automatic"]["predicted_s"] / auto - 1)
    print()
    print(f"prediction error: automatic {auto_error:.1%}, worst policy {worst_error:.1%} (target <= 15%);"
          f" first-order part alone, worst {worst_first:.1%}")
    contenders = dict(fixed, all_cpu=cpu)
    best_fixed = min(contenders, key=contenders.get)
    print(f"automatic / best of all-CPU and the fixed strides ({best_fixed}): {auto / contenders[best_fixed]:.3f}"
          f" (target <= 1.05); automatic / all-CPU: {auto / cpu:.3f} (target <= 1.02);"
          f" automatic explored {runs['automatic']['explored']:.1%} of its measured steps")
    # resident_then_stride may keep subgroups resident and moves them between steps as
    # it compares counts: it is measured by the whole step() call, against the best of
    # all-CPU, the fixed strides and static_fraction timed the same way.
    whole = {n: b["step_s"] for n, b in runs.items()}
    rivals = {n: t for n, t in whole.items() if n.startswith("stride_") or n in ("all_cpu", "static_fraction")}
    best_rival = min(rivals, key=rivals.get)
    rts = whole["resident_then_stride"]
    print(f"resident_then_stride / best of all-CPU, the fixed strides and static_fraction ({best_rival}), whole steps:"
          f" {rts / rivals[best_rival]:.3f} (target <= 1.05); / all-CPU: {rts / whole['all_cpu']:.3f} (target <= 1.02);"
          f" {runs['resident_then_stride']['residents']:.1f} resident on average,"
          f" explored {runs['resident_then_stride']['explored']:.1%} of its measured steps")
    print(f"best interleaved ({best}) speed-up over all-CPU: {cpu / interleaved[best]:.2f}x (target > 1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
