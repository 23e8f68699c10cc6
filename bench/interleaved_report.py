#!/usr/bin/env python3
"""Runs bench_interleaved and prints its figures as ratios: measured against
predicted per policy, the automatic stride against the best of all-CPU and the fixed
strides, and against all-CPU, resident_then_stride against the best of those and
static_fraction, and against all-CPU, and the best interleaved policy against all-CPU.

Each policy runs `repetitions` times (each a fresh optimizer that settles in its
warm-up steps), the repetitions of all policies in a random order
(`--benchmark_enable_random_interleaving`), and each figure is the median over a
policy's repetitions: on a shared 2-vCPU VM whose memory bandwidth moves between two
levels from minute to minute, one stretch per policy compares phases of the machine,
not policies. `all_cpu_again`, a second all-CPU policy, is the control: its ratio to
all_cpu is what the machine alone moves a figure by.

    /usr/bin/python3 bench/interleaved_report.py build/release/bench/bench_interleaved [min_time] [repetitions]
"""
import json
import statistics
import subprocess
import sys


def main() -> int:
    binary = sys.argv[1]
    min_time = sys.argv[2] if len(sys.argv) > 2 else "1"
    repetitions = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    if repetitions < 1:
        sys.stderr.write(f"interleaved_report: repetitions must be >= 1, got {repetitions}\n")
        return 2
    out = subprocess.run([binary, "--benchmark_format=json", f"--benchmark_min_time={min_time}",
                          f"--benchmark_repetitions={repetitions}", "--benchmark_enable_random_interleaving=true"],
                         check=True, capture_output=True, text=True)
    sys.stderr.write(out.stderr)
    reps = {}
    for b in json.loads(out.stdout)["benchmarks"]:
        if b.get("run_type", "iteration") != "iteration":
            continue  # Google Benchmark's own aggregates: the medians are taken here, per counter
        reps.setdefault(b["name"].split("/")[1], []).append(b)
    counters = ("measured_s", "predicted_s", "first_order_s", "k", "explored", "step_s", "residents")
    # In the order they were registered (the JSON lists them in the order they ran).
    order = {name: i for i, name in enumerate(b["name"].split("/")[1] for b in sorted(
        (rs[0] for rs in reps.values()), key=lambda b: b.get("family_index", 0)))}
    runs = {name: {c: statistics.median(r[c] for r in reps[name]) for c in counters} for name in sorted(reps, key=order.get)}
    cpu = runs["all_cpu"]["measured_s"]
    print(f"medians of {repetitions} repetition(s) per policy, in a random order")
    print(f"{'policy':<21} {'measured ms':>12} {'predicted ms':>13} {'pred/meas':>10} {'1st-order/meas':>15}"
          f" {'vs all-CPU':>11} {'k':>5}")
    for name, b in runs.items():
        m, p, f = b["measured_s"], b["predicted_s"], b["first_order_s"]
        print(f"{name:<21} {m * 1e3:>12.2f} {p * 1e3:>13.2f} {p / m:>10.2f} {f / m:>15.2f}"
              f" {cpu / m:>10.2f}x {b['k']:>5.1f}")
    control = runs["all_cpu_again"]["measured_s"] / cpu
    spread = [r["measured_s"] for r in reps["all_cpu"]]
    print()
    print(f"control: all_cpu_again / all_cpu {control:.3f}; all_cpu's repetitions ran"
          f" {min(spread) * 1e3:.2f}-{max(spread) * 1e3:.2f} ms")
    fixed = {n: b["measured_s"] for n, b in runs.items() if n.startswith("stride_")}
    auto = runs["automatic"]["measured_s"]
    interleaved = {n: b["measured_s"] for n, b in runs.items() if not n.startswith("all_cpu")}
    best = min(interleaved, key=interleaved.get)
    worst_error = max(abs(b["predicted_s"] / b["measured_s"] - 1) for b in runs.values())
    worst_first = max(abs(b["first_order_s"] / b["measured_s"] - 1) for b in runs.values())
    auto_error = abs(runs["automatic"]["predicted_s"] / auto - 1)
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
