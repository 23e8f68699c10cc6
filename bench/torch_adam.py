#!/usr/bin/python3
"""Measures torch.optim.Adam (Debian's PyTorch 1.13) on 16M fp32 parameters and dos's
BM_CpuAdam/fp32 on the same machine, in one run, and prints the ratio.

Run after building: /usr/bin/python3 bench/torch_adam.py build/release/bench/bench_cpu_adam
(Debian's python3-torch is needed; the python3 first on PATH may not import torch.)
"""
import json
import os
import subprocess
import sys
import time

import torch

N = 16_777_216
threads = len(os.sched_getaffinity(0))
torch.set_num_threads(threads)

p = torch.nn.Parameter(torch.full((N,), 0.5))
p.grad = torch.full((N,), 1e-3)
opt = torch.optim.Adam([p], lr=1e-3)  # the default single-tensor path of 1.13
opt.step()
times = []
for _ in range(10):
    t = time.perf_counter()
    opt.step()
    times.append(time.perf_counter() - t)
torch_rate = N / min(times)

binary = sys.argv[1] if len(sys.argv) > 1 else "build/release/bench/bench_cpu_adam"
out = subprocess.run(
    [binary, f"--benchmark_filter=BM_CpuAdam/fp32/{N}/threads:{threads}/", "--benchmark_format=json",
     "--benchmark_min_time=1"], check=True, capture_output=True, text=True).stdout
dos_rate = json.loads(out)["benchmarks"][0]["items_per_second"]
print(f"threads {threads}: torch.optim.Adam {torch_rate / 1e6:.0f}M params/s (best of 10), "
      f"dos BM_CpuAdam/fp32 {dos_rate / 1e6:.0f}M params/s, ratio {dos_rate / torch_rate:.2f}x")
