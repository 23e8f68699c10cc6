#!/usr/bin/python3
"""Generate PyTorch reference trajectories for the dos Adam/AdamW optimizer tests.

What it produces (written into this script's own folder):

  manifest.txt    plain-text description of every scenario (optimizer kind,
                  hyper-parameters per parameter group, tensor sizes, number of
                  steps, lr schedule, snapshot steps).  Lines starting with '#'
                  are comments.  Floats are written with Python repr(), so
                  strtod() reads back exactly the double used here.
  <scenario>.bin  raw little-endian float32 values, in this order:
                    * for each snapshot step s (1, 12, 25): every parameter
                      after step s, tensor by tensor in global order;
                    * final exp_avg of all tensors, concatenated;
                    * final exp_avg_sq of all tensors, concatenated;
                    * only if some group of the scenario uses amsgrad: final
                      max_exp_avg_sq of all tensors (zeros for tensors whose
                      group does not use amsgrad).

Inputs are fully deterministic and defined by a splitmix64 finaliser
(all arithmetic mod 2**64):

  mix(x): x += 0x9E3779B97F4A7C15; z = x
          z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
          z = (z ^ (z >> 27)) * 0x94D049BB133111EB
          return z ^ (z >> 31)
  h(stream, tensor, step, i) = mix(stream*2**56 + tensor*2**48 + step*2**32 + i)
  byte_value(...)            = ((h >> 56) - 128) / 128.0     # k/128, k in [-128, 127]

  initial parameter i of tensor j : byte_value(0, j, 0, i)
  gradient at step t (t >= 1)     : byte_value(1, j, t, i) * 2**(-2*(j % 4))

`j` is the global tensor index across all groups of a scenario.  These values
are exact in fp32, bf16 and fp16.  The optimizers run in float32 on the CPU
with foreach=False (single-tensor code path).  Every scenario runs 25 steps;
before step lr_drop_step (13) every group's lr is multiplied by
lr_drop_factor (0.25, product computed in Python double).

Rerun (from the repository root; needs Debian's python3-torch, i.e. the
system interpreter, not whatever `python3` is first on PATH):

  /usr/bin/python3 tests/reference/generate_torch_reference.py
"""

import hashlib
import os
import sys

import numpy as np
import torch

STEPS = 25
LR_DROP_STEP = 13
LR_DROP_FACTOR = 0.25
SNAPSHOTS = (1, 12, 25)
SINGLE_SIZES = (1, 7, 10007, 1031)

MASK64 = (1 << 64) - 1


# ---------------------------------------------------------------- inputs ---
def mix_int(x):
    """splitmix64 finaliser on Python ints (reference implementation)."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    z = x
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def byte_value_int(stream, tensor, step, i):
    h = mix_int((stream << 56) + (tensor << 48) + (step << 32) + i)
    return ((h >> 56) - 128) / 128.0


def mix_np(x):
    """splitmix64 finaliser on a numpy uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        z = x
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def byte_values_np(stream, tensor, step, n):
    """byte_value(stream, tensor, step, i) for i in [0, n), as float32."""
    assert 0 <= stream < 256 and 0 <= tensor < 256 and 0 <= step < 65536
    assert 0 <= n <= (1 << 32)
    base = (stream << 56) + (tensor << 48) + (step << 32)
    x = np.uint64(base) + np.arange(n, dtype=np.uint64)
    k = (mix_np(x) >> np.uint64(56)).astype(np.int64) - 128
    return (k.astype(np.float64) / 128.0).astype(np.float32)


def initial_param(j, n):
    return torch.from_numpy(byte_values_np(0, j, 0, n))


def gradient(j, t, n):
    scale = 2.0 ** (-2 * (j % 4))
    g = byte_values_np(1, j, t, n).astype(np.float64) * scale
    g32 = g.astype(np.float32)
    assert np.array_equal(g32.astype(np.float64), g)  # exact in fp32
    return torch.from_numpy(g32)


def self_check():
    # Known splitmix64 value: first output for seed 0.
    assert mix_int(0) == 0xE220A8397B1DCDAF
    assert int(mix_np(np.array([0], dtype=np.uint64))[0]) == 0xE220A8397B1DCDAF
    cases = [(0, 0, 0, 5000), (0, 3, 0, 1031), (1, 0, 1, 10007), (1, 4, 25, 40),
             (1, 255, 65535, 17), (0, 7, 0, 3)]
    for stream, tensor, step, n in cases:
        vec = byte_values_np(stream, tensor, step, n)
        idx = sorted(set([0, 1, 2, n // 2, n - 2, n - 1] + list(range(0, n, max(1, n // 97)))))
        for i in idx:
            if 0 <= i < n:
                ref = byte_value_int(stream, tensor, step, i)
                assert float(vec[i]) == ref, (stream, tensor, step, i, vec[i], ref)
    # The whole table also hits every byte value (sanity of the >> 56).
    v = byte_values_np(0, 0, 0, 100000)
    assert v.min() == -1.0 and v.max() == 127.0 / 128.0
    g = gradient(5, 3, 100)  # j % 4 == 1 -> scale 1/4
    for i in range(100):
        assert float(g[i]) == byte_value_int(1, 5, 3, i) * 0.25


# ------------------------------------------------------------- scenarios ---
def group(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, wd=0.0, amsgrad=False,
          maximize=False, sizes=SINGLE_SIZES):
    return dict(lr=float(lr), betas=(float(betas[0]), float(betas[1])),
                eps=float(eps), weight_decay=float(wd), amsgrad=bool(amsgrad),
                maximize=bool(maximize), sizes=tuple(sizes))


SCENARIOS = [
    ("adamw", "AdamW", [group(wd=1e-2)]),
    ("adam", "Adam", [group(wd=0.0)]),
    ("adam_l2", "Adam", [group(wd=0.1)]),
    ("amsgrad", "AdamW", [group(wd=0.05, amsgrad=True)]),
    ("maximize", "Adam", [group(wd=0.05, maximize=True)]),
    ("adamw_custom", "AdamW", [group(lr=3e-3, betas=(0.8, 0.99), eps=1e-6, wd=0.1,
                                     amsgrad=True, maximize=True)]),
    ("groups", "AdamW", [group(lr=2e-3, wd=0.1, sizes=(1031, 7)),
                         group(lr=1e-3, wd=0.0, sizes=(1, 10007, 33))]),
]


def f32_bytes(t):
    return t.detach().numpy().astype("<f4", copy=False).tobytes()


def run_scenario(kind, groups):
    cls = {"Adam": torch.optim.Adam, "AdamW": torch.optim.AdamW}[kind]
    params_by_group = []
    all_params = []
    j = 0
    for g in groups:
        ps = []
        for n in g["sizes"]:
            p = torch.nn.Parameter(initial_param(j, n).clone())
            ps.append(p)
            all_params.append(p)
            j += 1
        params_by_group.append(ps)

    param_groups = []
    for g, ps in zip(groups, params_by_group):
        param_groups.append(dict(params=ps, lr=g["lr"], betas=g["betas"], eps=g["eps"],
                                 weight_decay=g["weight_decay"], amsgrad=g["amsgrad"],
                                 maximize=g["maximize"]))
    opt = cls(param_groups, foreach=False)
    for pg in opt.param_groups:
        assert pg["foreach"] is False

    out = bytearray()
    for t in range(1, STEPS + 1):
        if t == LR_DROP_STEP:
            for pg, g in zip(opt.param_groups, groups):
                pg["lr"] = g["lr"] * LR_DROP_FACTOR
        for jj, p in enumerate(all_params):
            p.grad = gradient(jj, t, p.numel())
        opt.step()
        if t in SNAPSHOTS:
            for p in all_params:
                out += f32_bytes(p)

    for key in ("exp_avg", "exp_avg_sq"):
        for p in all_params:
            out += f32_bytes(opt.state[p][key])
    if any(g["amsgrad"] for g in groups):
        for g, ps in zip(groups, params_by_group):
            for p in ps:
                if g["amsgrad"]:
                    out += f32_bytes(opt.state[p]["max_exp_avg_sq"])
                else:
                    out += f32_bytes(torch.zeros_like(p))

    for p in all_params:
        st = opt.state[p]
        assert float(st["step"]) == STEPS
        assert torch.isfinite(p).all()
    n_total = sum(p.numel() for p in all_params)
    n_blocks = len(SNAPSHOTS) + 2 + (1 if any(g["amsgrad"] for g in groups) else 0)
    assert len(out) == 4 * n_total * n_blocks
    return bytes(out)


def manifest_text():
    lines = [
        "# dos reference trajectories generated by generate_torch_reference.py with torch "
        + torch.__version__ + " (CPU, float32, foreach=False)",
        "# format: whitespace-separated tokens; per scenario:",
        "#   scenario <name> steps <N> lr_drop_step <s> lr_drop_factor <f> snapshots <k> <step...> groups <G>",
        "#   group <Adam|AdamW> lr <x> beta1 <x> beta2 <x> eps <x> wd <x> amsgrad <0|1> maximize <0|1> tensors <n> <size...>   (G lines)",
        "#   end",
        "# <name>.bin: little-endian float32: params after each snapshot step (all tensors, global order),",
        "#   then final exp_avg, exp_avg_sq, and max_exp_avg_sq only if any group has amsgrad 1",
        "# inputs: param(j,i)=byte_value(0,j,0,i); grad(t,j,i)=byte_value(1,j,t,i)*2^(-2*(j%4)); see the script",
    ]
    for name, kind, groups in SCENARIOS:
        lines.append("scenario %s steps %d lr_drop_step %d lr_drop_factor %r snapshots %d %s groups %d"
                     % (name, STEPS, LR_DROP_STEP, LR_DROP_FACTOR, len(SNAPSHOTS),
                        " ".join(str(s) for s in SNAPSHOTS), len(groups)))
        for g in groups:
            lines.append("group %s lr %r beta1 %r beta2 %r eps %r wd %r amsgrad %d maximize %d tensors %d %s"
                         % (kind, g["lr"], g["betas"][0], g["betas"][1], g["eps"],
                            g["weight_decay"], int(g["amsgrad"]), int(g["maximize"]),
                            len(g["sizes"]), " ".join(str(n) for n in g["sizes"])))
        lines.append("end")
    return "\n".join(lines) + "\n"


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    self_check()
    out_dir = os.path.dirname(os.path.abspath(__file__))
    for name, kind, groups in SCENARIOS:
        data = run_scenario(kind, groups)
        path = os.path.join(out_dir, name + ".bin")
        with open(path, "wb") as f:
            f.write(data)
        print("%-14s %8d bytes  sha256 %s" % (name + ".bin", len(data),
                                              hashlib.sha256(data).hexdigest()))
    with open(os.path.join(out_dir, "manifest.txt"), "w") as f:
        f.write(manifest_text())
    print("torch", torch.__version__, "numpy", np.__version__, "python", sys.version.split()[0])


if __name__ == "__main__":
    main()
