"""Compares two train_gpt loss curves (CSV: step,loss,...) step by step.

    python3 compare.py one_process.csv two_ranks.csv [--tolerance 1e-4]

Prints the largest relative difference and where it was; exits 1 when any step's
relative difference exceeds the tolerance, or the curves differ in length.
"""
import argparse
import csv
import sys


def losses(path):
    with open(path, newline="") as f:
        return [float(row["loss"]) for row in csv.DictReader(f)]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("reference")
    p.add_argument("other")
    p.add_argument("--tolerance", type=float, default=1e-4)
    a = p.parse_args()
    ref, other = losses(a.reference), losses(a.other)
    if len(ref) != len(other) or not ref:
        print(f"compare: {len(ref)} steps in {a.reference}, {len(other)} in {a.other}")
        return 1
    rel = [abs(x - y) / abs(x) for x, y in zip(ref, other)]
    worst = max(range(len(rel)), key=rel.__getitem__)
    print(f"compare: {len(rel)} steps, largest relative difference {rel[worst]:.3g} at step {worst + 1} "
          f"({ref[worst]:.9g} against {other[worst]:.9g}); tolerance {a.tolerance:g}")
    return 0 if rel[worst] <= a.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
