#!/usr/bin/env python3
"""dos.torch.AdamW against its peers, in one process, on the same parameters and
gradients, timed in alternating blocks so that machine noise hits every contender.

Contenders: dos.torch.AdamW; torch.optim.AdamW(foreach=True); torch.optim.AdamW(fused=True)
where the installed torch has a CPU fused AdamW; deepspeed.ops.adam.DeepSpeedCPUAdam
where DeepSpeed is importable (each skipped, with the reason, otherwise).

Workloads:
  bare  the AdamW step alone.
  fp16  the step as users run it under fp16 loss scaling: GradScaler-style unscale
        (gradients / scale, with the inf check), clip_grad_norm_(1.0), then AdamW.
        dos does all of it in its own pass (loss_scaling + max_grad_norm).

Prints params/s (from each contender's median step time) and the median over blocks
of the paired ratio (contender time / dos time in the same block; > 1: dos faster),
then the largest difference from torch foreach after 5 identical steps.

    build/venv/bin/python bench/peers.py --params 16M --threads 1,all --blocks 15
    build/venv/bin/python bench/peers.py --params 16M,128M --workload fp16
"""

import argparse
import inspect
import os
import statistics
import sys
import time

import torch

import dos.torch

LR, WD, SCALE, CLIP = 1e-3, 0.01, 1024.0, 1.0


def parse_size(s):
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1], 1)
    return int(float(s[:-1] if s[-1] in "KMG" else s) * mult)


def shapes_for(n, tensors):
    # A model's worth of tensors: equal slices, the last one taking the remainder.
    base = n // tensors
    return [base] * (tensors - 1) + [n - base * (tensors - 1)]


class Contender:
    def __init__(self, name, make, init, grads, workload):
        self.name = name
        self.params = [torch.nn.Parameter(t.clone()) for t in init]
        self.workload = workload
        self.pristine = grads
        # bare: the gradients are only read, so every contender shares them; fp16: they
        # are unscaled and clipped in place, so each has its own, restored between steps.
        for p, g in zip(self.params, grads):
            p.grad = g if workload == "bare" or name == "dos" else g.clone()
        self.opt = make(self.params)
        self.times = []

    def restore(self):
        if self.workload == "fp16" and self.name != "dos":
            for p, g in zip(self.params, self.pristine):
                p.grad.copy_(g)

    def step(self):
        if self.workload == "fp16" and self.name != "dos":
            grads = [p.grad for p in self.params]
            found_inf = torch.zeros(1)
            # GradScaler.unscale_'s kernel where this torch has it on the CPU.
            try:
                torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, torch.full((1,), 1.0 / SCALE))
            except (RuntimeError, AttributeError):
                torch._foreach_mul_(grads, 1.0 / SCALE)
                found_inf = torch.stack([~torch.isfinite(g).all() for g in grads]).any().float()
            if found_inf.item() == 0:  # GradScaler skips the step on overflow
                torch.nn.utils.clip_grad_norm_(self.params, CLIP)
                self.opt.step()
        else:
            self.opt.step()


def contenders(threads, workload):
    fp16 = workload == "fp16"
    dos_kw = dict(max_grad_norm=CLIP, loss_scaling=dict(init_scale=SCALE, growth_interval=1 << 30)) if fp16 else {}
    out = [("dos", lambda ps: dos.torch.AdamW(ps, lr=LR, weight_decay=WD, threads=threads, **dos_kw)),
           ("torch foreach", lambda ps: torch.optim.AdamW(ps, lr=LR, weight_decay=WD, foreach=True))]
    skipped = []
    if "fused" in inspect.signature(torch.optim.AdamW.__init__).parameters:
        try:  # CPU fused AdamW came in torch 2.4
            probe = torch.nn.Parameter(torch.zeros(4))
            probe.grad = torch.zeros(4)
            torch.optim.AdamW([probe], fused=True).step()
            out.append(("torch fused", lambda ps: torch.optim.AdamW(ps, lr=LR, weight_decay=WD, fused=True)))
        except (RuntimeError, ValueError, TypeError) as e:
            skipped.append(f"torch fused ({str(e).splitlines()[0][:80]})")
    else:
        skipped.append(f"torch fused (torch {torch.__version__} has no fused AdamW)")
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        out.append(("DeepSpeedCPUAdam",
                    lambda ps: DeepSpeedCPUAdam(ps, lr=LR, weight_decay=WD, adamw_mode=True, fp32_optimizer_states=True)))
    except Exception as e:  # ImportError, or a DeepSpeed whose CPU op cannot build
        skipped.append(f"DeepSpeedCPUAdam ({type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''})")
    return out, skipped


def run(n, threads, workload, blocks, steps, tensors, untimed=()):
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    sizes = shapes_for(n, tensors)
    init = [torch.randn(s, generator=gen) * 0.02 for s in sizes]
    scale = SCALE if workload == "fp16" else 1.0
    grads = [torch.randn(s, generator=gen) * 1e-3 * scale for s in sizes]
    makers, skipped = contenders(threads, workload)
    cs = [Contender(name, make, init, grads, workload) for name, make in makers]
    del init

    # Five identical steps first (also the warm-up): how far apart are the results?
    for c in cs:
        for _ in range(5):
            c.restore()
            c.step()
    ref = next(c for c in cs if c.name == "torch foreach")
    diffs = {c.name: max((a - b).abs().max().item() for a, b in zip(c.params, ref.params)) for c in cs}

    cs = [c for c in cs if c.name not in untimed]  # kept for the differences above only
    for b in range(blocks):
        order = cs[b % len(cs):] + cs[:b % len(cs)]  # rotate who goes first
        for c in order:
            total = 0.0
            for _ in range(steps):
                c.restore()  # outside the clock: torch users' gradients come fresh from backward
                t0 = time.perf_counter()
                c.step()
                total += time.perf_counter() - t0
            c.times.append(total / steps)

    dos_c = cs[0]
    print(f"\n{n / 2**20:g}Mi params in {tensors} tensors, {threads} thread(s), workload {workload}, "
          f"{blocks} blocks x {steps} steps (torch {torch.__version__})")
    for c in cs:
        ratios = [t / d for t, d in zip(c.times, dos_c.times)]
        med = statistics.median(c.times)
        print(f"  {c.name:18s} {n / med / 1e6:9.1f}M params/s   time/dos median {statistics.median(ratios):5.2f}x "
              f"[{min(ratios):.2f}-{max(ratios):.2f}]   max |diff| vs torch foreach after 5 steps {diffs[c.name]:.2e}")
    for name in untimed:
        if name in diffs:
            print(f"  {name:18s} not timed (--untimed)        max |diff| vs torch foreach after 5 steps {diffs[name]:.2e}")
    for s in skipped:
        print(f"  skipped: {s}")
    del cs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="16M", help="comma-separated sizes, e.g. 16M,128M")
    ap.add_argument("--threads", default="1,all", help="comma-separated thread counts; 'all' = every allowed CPU")
    ap.add_argument("--workload", default="bare,fp16", help="bare, fp16 or both")
    ap.add_argument("--blocks", type=int, default=15)
    ap.add_argument("--steps", type=int, default=3, help="steps per block")
    ap.add_argument("--tensors", type=int, default=8)
    ap.add_argument("--untimed", default="", help="comma-separated contenders to leave out of the timing, e.g. "
                    "'torch foreach' (the slowest; still the reference of the differences)")
    a = ap.parse_args()
    if "dos" in [u.strip() for u in a.untimed.split(",")]:
        ap.error("--untimed: dos is what the others are timed against")
    cpus = len(os.sched_getaffinity(0))
    threads = sorted({cpus if t == "all" else int(t) for t in a.threads.split(",")})
    for n in (parse_size(s) for s in a.params.split(",")):
        for w in a.workload.split(","):
            for t in threads:
                run(n, t, w, a.blocks, a.steps, a.tensors, [u.strip() for u in a.untimed.split(",") if u.strip()])
    return 0


if __name__ == "__main__":
    sys.exit(main())
