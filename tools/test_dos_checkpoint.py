#!/usr/bin/env python3
"""Tests tools/dos_checkpoint.py against dos (run by CTest as `checkpoint_tool`):
  test_dos_checkpoint.py FIXTURE WORKDIR
FIXTURE is tests/checkpoint_fixture. A dos checkpoint goes to torch and continues there
within torch.testing's float32 tolerance of dos's own continuation; the state_dict
comes back as a dos checkpoint with the same bits (parameter 1 skips every third call:
per-parameter step counts both ways), which dos loads and resumes
bit for bit; a corrupted file is refused by both. Exits 77 (skipped) without torch."""

import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dos_checkpoint as tool  # noqa: E402


def main():
    fixture, work = sys.argv[1], sys.argv[2]
    try:
        import torch
    except ImportError:
        print("SKIPPED: torch is not importable by %s (Debian: apt install python3-torch)" % sys.executable)
        return 77
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    print("safetensors package:", "used" if tool._use_package() else "absent or disabled; the built-in reader and writer")

    # XXH64 in Python against the published vectors (the C++ side checks the same).
    assert tool.xxh64_python(b"") == 0xEF46DB3751D8E999
    assert tool.xxh64_python(b"abc") == 0x44BC2CF5AD770999
    assert tool.xxh64_python(b"Nobody inspects the spammish repetition") == 0xFBCEA83C8A378BF1

    subprocess.run([fixture, "save", work], check=True)
    ckpt = os.path.join(work, "ckpt")
    traj = tool.read_safetensors(os.path.join(work, "trajectory.safetensors"))
    f32 = lambda name: torch.frombuffer(bytearray(traj[name][2]), dtype=torch.float32)  # noqa: E731

    # dos -> torch: the checksums dos wrote verify in Python, and torch continues.
    assert tool.main(["to-torch", ckpt, os.path.join(work, "sd.pt")]) == 0
    sd = torch.load(os.path.join(work, "sd.pt"))
    params = [f32("value.%d.start" % p).clone().requires_grad_() for p in range(4)]
    opt = torch.optim.AdamW([{"params": params[:2]}, {"params": params[2:]}], lr=1.0)
    opt.load_state_dict(sd)
    assert [float(opt.state[p]["step"]) for p in params] == [4.0, 3.0, 4.0, 4.0]  # parameter 1 skipped call 3
    assert opt.param_groups[1]["amsgrad"] and opt.param_groups[0]["weight_decay"] == 0.1
    for call in range(5, 10):
        for p in range(4):
            name = "grad.%d.%d" % (p, call)
            params[p].grad = f32(name) if name in traj else None  # None: skipped, its own step stays
        opt.step()
    for p in range(4):
        torch.testing.assert_close(params[p].detach(), f32("value.%d.end" % p), rtol=1.3e-6, atol=1e-5)
    print("torch continued dos's trajectory: 5 steps within torch.testing's float32 tolerance")

    # torch -> dos: the same bits and fields, and dos resumes from it exactly.
    back = os.path.join(work, "back")
    assert tool.main(["from-torch", os.path.join(work, "sd.pt"), back]) == 0
    index_a, tensors_a = tool.read_checkpoint(ckpt)
    index_b, tensors_b = tool.read_checkpoint(back)
    assert tensors_a.keys() == tensors_b.keys()
    assert all(tensors_a[n][2] == tensors_b[n][2] for n in tensors_a)
    for key in ("step_count", "schedule_index", "param_groups", "params", "loss_scaler"):
        assert index_a[key] == index_b[key], key
    subprocess.run([fixture, "resume", back], check=True)

    # A parameter torch never stepped has no state: it comes back at step 0, zero moments.
    sd_missing = dict(sd, state={k: v for k, v in sd["state"].items() if k != 1})
    torch.save(sd_missing, os.path.join(work, "sd_missing.pt"))
    missing = os.path.join(work, "missing")
    assert tool.main(["from-torch", os.path.join(work, "sd_missing.pt"), missing]) == 0
    index_m, tensors_m = tool.read_checkpoint(missing)
    assert index_m["params"][1]["step"] == 0 and index_m["params"][0]["step"] == 4
    assert not any(tensors_m["state.1.exp_avg"][2]) and not any(tensors_m["state.1.exp_avg_sq"][2])

    # A flipped byte: the tool and dos both refuse it, naming the tensor.
    rank = os.path.join(back, index_b["ranks"][0]["file"])
    with open(rank, "r+b") as f:
        f.seek(-3, os.SEEK_END)
        b = f.read(1)
        f.seek(-3, os.SEEK_END)
        f.write(bytes([b[0] ^ 0x40]))
    try:
        tool.read_checkpoint(back)
        raise AssertionError("a corrupted tensor was accepted")
    except tool.CheckpointError as e:
        assert "checksum" in str(e) and "state.3." in str(e), e
    r = subprocess.run([fixture, "resume", back], capture_output=True, text=True)
    assert r.returncode == 2 and "checksum" in r.stderr and "state.3." in r.stderr, r.stderr
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
