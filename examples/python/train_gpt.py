#!/usr/bin/env python3
"""A character-level GPT (two transformer blocks, plain PyTorch) trained on the Sonnets
of examples/train_gpt/sonnets.txt, once with torch.optim.AdamW and once with
dos.torch.AdamW, from the same initial weights and batches. Prints each run's loss
curve as CSV and its step times. The Python twin of examples/train_gpt/train_gpt.cpp.

    build/venv/bin/python examples/python/train_gpt.py --steps 300 --csv curves.csv

Runs on the CPU, or on CUDA where torch sees a GPU (dos then uses its "cuda" backend,
which needs a build of dos with a CUDA toolkit).
"""

import argparse
import csv
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import dos.torch

CONTEXT, DIM, HEADS, LAYERS, BATCH = 64, 96, 4, 2, 16
PEAK_LR, FLOOR_LR, WEIGHT_DECAY, CLIP = 3e-3, 3e-4, 0.1, 1.0
TEXT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train_gpt", "sonnets.txt")


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.up, self.down = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x, causal):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(DIM // HEADS)
        att = att.masked_fill(causal[:t, :t], -1e9).softmax(-1)
        h = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, DIM))
        return h + self.down(F.gelu(self.up(self.ln2(h))))


class Gpt(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, DIM), nn.Embedding(CONTEXT, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, vocab)
        self.register_buffer("causal", torch.ones(CONTEXT, CONTEXT, dtype=torch.bool).triu(1))

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x, self.causal)
        return self.head(self.ln(x))


def warmup_cosine(steps):
    warmup = max(1, steps // 10)

    def factor(i):  # multiplies PEAK_LR, as LambdaLR wants
        if i < warmup:
            return (i + 1) / warmup
        done = min(1.0, (i - warmup) / max(1, steps - warmup))
        return (FLOOR_LR + (PEAK_LR - FLOOR_LR) * 0.5 * (1 + math.cos(math.pi * done))) / PEAK_LR

    return factor


def train(name, steps, data, vocab, device, threads):
    torch.manual_seed(1234)
    model = Gpt(vocab).to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}]
    # The swap: the only lines that differ between the two runs. dos clips inside its
    # own pass (max_grad_norm) from norms taken while backward runs.
    if name == "dos":
        opt = dos.torch.AdamW(groups, lr=PEAK_LR, max_grad_norm=CLIP, threads=threads,
                              backend="cuda" if device.type == "cuda" else "cpu")
    else:
        opt = torch.optim.AdamW(groups, lr=PEAK_LR)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(steps))

    gen = torch.Generator().manual_seed(42)
    rows = []
    for step in range(steps):
        t0 = time.perf_counter()
        starts = torch.randint(len(data) - CONTEXT - 1, (BATCH,), generator=gen)
        x = torch.stack([data[s:s + CONTEXT] for s in starts.tolist()]).to(device)
        y = torch.stack([data[s + 1:s + CONTEXT + 1] for s in starts.tolist()]).to(device)
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))
        loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        if name != "dos":
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        sched.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        rows.append((name, step, loss.item(), (t2 - t0) * 1e3, (t2 - t1) * 1e3))
    return rows, sum(p.numel() for p in model.parameters())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--optimizer", choices=["torch", "dos", "both"], default="both")
    ap.add_argument("--csv", help="write the loss curves here (default: stdout)")
    ap.add_argument("--threads", type=int, default=0, help="dos's threads (0: every allowed CPU)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()

    text = open(TEXT, encoding="utf-8").read()
    chars = sorted(set(text))
    code = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([code[c] for c in text], dtype=torch.long)
    device = torch.device(a.device)

    names = ["torch", "dos"] if a.optimizer == "both" else [a.optimizer]
    rows, summary = [], []
    for name in names:
        r, n = train(name, a.steps, data, len(chars), device, a.threads)
        rows += r
        summary.append(f"{name:5s}: final loss {r[-1][2]:.4f}, {sum(x[3] for x in r) / len(r):.1f} ms per step, "
                       f"{sum(x[4] for x in r) / len(r):.2f} ms of it in clipping + optimizer")
    print(f"train_gpt.py: {n} parameters, {len(text)} characters ({len(chars)} distinct), device {device}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} torch threads", file=sys.stderr)
    out = open(a.csv, "w", newline="") if a.csv else sys.stdout
    w = csv.writer(out)
    w.writerow(["optimizer", "step", "loss", "step_ms", "optimizer_ms"])
    w.writerows((o, s, f"{l:.5f}", f"{ms:.2f}", f"{oms:.3f}") for o, s, l, ms, oms in rows)
    if a.csv:
        out.close()
    for line in summary:
        print(line, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
