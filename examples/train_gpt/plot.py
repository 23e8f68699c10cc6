#!/usr/bin/env python3
"""Plots train_gpt's loss curves (CSV files from --csv) into one PNG.

    /usr/bin/python3 examples/train_gpt/plot.py dos.csv torch.csv loss.png
    python3 examples/train_gpt/plot.py --title "..." dos.csv torch.csv loss.png
The CSVs of examples/train_gpt (C++) and examples/python/train_gpt.py both work.
Needs matplotlib (from PyPI: python3 -m venv env && env/bin/pip install matplotlib).
"""
import csv
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    return [int(r["step"]) for r in rows], [float(r["loss"]) for r in rows], [float(r["step_ms"]) for r in rows]


def main() -> int:
    args = sys.argv[1:]
    title = "train_gpt: character-level GPT on the Sonnets, dos vs torch::optim::AdamW"
    if args[:1] == ["--title"]:
        title, args = args[1], args[2:]
    *inputs, output = args
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, path in enumerate(inputs):
        steps, loss, ms = read(path)
        label = path.rsplit("/", 1)[-1].removesuffix(".csv")
        # Dashed over solid: identical curves stay visible as two.
        # The median: one slow step (another process, a page fault) moves a mean.
        ax.plot(steps, loss, label=f"{label} (median {statistics.median(ms):.0f} ms/step)", linewidth=1.5 if i else 1,
                linestyle="--" if i else "-")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (cross-entropy)")
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(output, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
