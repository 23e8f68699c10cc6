#!/usr/bin/env python3
"""Assembles the device check's summary.json from what its parts left in OUT.

Every figure the check reports is listed here, once, with what it is measured against.
A figure no part measured is null, with the reason: the part's own (bench.json's
"reasons", or why the bench was skipped), else the part's status. So a run cut at its
time limit, or a dry run on a machine without a GPU, still gives every key.

    summary.py OUT              rewrite OUT/summary.json from OUT/parts/*.json and OUT/bench.json
    summary.py OUT --keys       print the figure keys (one a line)
"""
import json
import os
import sys

FIGURES = {
    "adam_fp32_gbps": "GPU Adam, fp32 values and state, 28 B moved per parameter",
    "adam_bf16_master_gbps": "GPU Adam, bf16 values and gradients with an fp32 master, 28 B per parameter",
    "d2d_copy_gbps": "cudaMemcpyAsync device to device (read + write), the reference for both Adams",
    "adam_fp32_vs_d2d": "adam_fp32_gbps / d2d_copy_gbps",
    "adam_bf16_master_vs_d2d": "adam_bf16_master_gbps / d2d_copy_gbps",
    "h2d_pinned_gbps": "the backend's h2d copy from pinned memory",
    "h2d_pageable_gbps": "the same copy from pageable memory",
    "d2h_pinned_gbps": "the backend's d2h copy to pinned memory",
    "d2h_pageable_gbps": "the same copy to pageable memory",
    "h2d_d2h_at_once_gbps": "pinned h2d and d2h on two streams at once, bytes of both over the wall time",
    "many_1mb_h2d_gbps": "1 MiB pinned h2d copies issued back to back, same total",
    "one_large_h2d_gbps": "one pinned h2d copy of the same total",
}
for tensors in ("device", "host_pinned", "host_pageable"):
    pre = f"hybrid_{tensors}_"
    what = {"device": "bf16 tensors on the GPU", "host_pinned": "fp32 host tensors, pinned",
            "host_pageable": "fp32 host tensors, pageable (dos registers them)"}[tensors]
    FIGURES.update({
        pre + "params": f"parameters updated ({what})",
        pre + "all_cpu_s": "update time, every subgroup on the CPU",
        pre + "automatic_s": "update time, the automatic policy (last step)",
        pre + "automatic_k": "the stride the automatic policy chose",
        pre + "automatic_first_predicted_s": "first step after calibration (not refined): predicted",
        pre + "automatic_first_measured_s": "first step after calibration (not refined): measured",
        pre + "automatic_last_predicted_s": "last step: predicted",
        pre + "automatic_last_measured_s": "last step: measured",
        pre + "resident_then_stride_s": "update time, resident_then_stride (last step)",
        pre + "resident_then_stride_k": "its stride",
        pre + "cpu_params_per_s": "R_cpu, measured from the all-CPU step",
        pre + "physical_limit_s": "N / (R_cpu + min(B_h2d, B_d2h) / 12), from the measured rates",
    })
FIGURES.update({
    "train_gpt_dos_final_loss": "examples/train_gpt on CUDA with CudaBackend",
    "train_gpt_dos_step_s": "its time per step",
    "train_gpt_torch_final_loss": "the same model with torch::optim::AdamW on the GPU",
    "train_gpt_torch_step_s": "its time per step",
})
# Which part measures which figure (to name a reason when it did not run).
def part_of(key):
    return "train_gpt" if key.startswith("train_gpt") else "bench"


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def main():
    out = sys.argv[1]
    if "--keys" in sys.argv[2:]:
        print("\n".join(FIGURES))
        return
    parts = {}
    pdir = os.path.join(out, "parts")
    if os.path.isdir(pdir):
        for name in sorted(os.listdir(pdir)):
            if name.endswith(".json"):
                parts[name[:-5]] = load(os.path.join(pdir, name)) or {"status": "unreadable"}
    check = load(os.path.join(out, "check.json")) or {}
    measured = {}
    for part in ("bench", "train_gpt"):
        measured[part] = load(os.path.join(out, part + ".json")) or {}
    figures, reasons = {}, {}
    for key in FIGURES:
        got = measured[part_of(key)]
        value = (got.get("figures") or {}).get(key)
        figures[key] = value
        if value is None:
            p = parts.get(part_of(key))
            reasons[key] = ((got.get("reasons") or {}).get(key) or got.get("skipped")
                            or (f"{part_of(key)}: {p.get('status')}" + (f" ({p['reason']})" if p.get("reason") else "")
                                if p else f"{part_of(key)}: not run"))
    summary = {"check": check, "parts": parts, "figures": figures, "null_reasons": reasons,
               "references": FIGURES, "notes": {p: m.get("notes") for p, m in measured.items() if m.get("notes")}}
    tmp = os.path.join(out, "summary.json.tmp")
    with open(tmp, "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    os.replace(tmp, os.path.join(out, "summary.json"))  # a reader never sees half a file


if __name__ == "__main__":
    main()
