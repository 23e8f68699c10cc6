#!/usr/bin/env python3
"""Converts between a dos optimizer checkpoint and a torch optimizer state_dict file.

  dos_checkpoint.py to-torch   CKPT_DIR OUT.pt [--params PARAMS.pt] [--no-verify]
  dos_checkpoint.py from-torch IN.pt CKPT_DIR

A dos checkpoint is a directory: index.json and one safetensors file per rank holding
state.<param>.exp_avg / exp_avg_sq / max_exp_avg_sq / master (float32). to-torch
writes {"state": {p: {"step", "exp_avg", ...}}, "param_groups": [...]} as
torch.optim.Adam/AdamW's state_dict() does (load it with optimizer.load_state_dict),
plus a "dos" entry (ignored by torch) with what torch has no place for, so from-torch
restores the same checkpoint. Each parameter keeps its own step count both ways (torch's
state[p]["step"]: a parameter whose .grad was None at a step did not advance); a format 1
index has one count for all. A torch parameter without state (never stepped) comes back
at step 0 with zero moments. dos stores tensors 1-D; --params (a torch.save'd list of
tensors, or a model's state_dict, in the optimizer's parameter order) gives their
shapes. Checksums (XXH64) are verified on reading and written on writing.

Uses the `safetensors` package where installed (set DOS_CHECKPOINT_NO_SAFETENSORS=1 to
force the built-in reader and writer of the format) and `xxhash` where installed.
"""

import argparse
import json
import os
import struct
import sys

FORMAT = "dos-optimizer-checkpoint"
FORMAT_VERSION = 2  # 2: each parameter's own step count (params[p].step); 1 still reads
DTYPE_SIZES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2,
               "I16": 2, "U16": 2, "I8": 1, "U8": 1, "BOOL": 1}
KINDS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "master")


class CheckpointError(Exception):
    pass


# ---- XXH64 (xxhash.com), the checksum of every tensor ----------------------------
M64 = (1 << 64) - 1
P1, P2, P3, P4, P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
                      0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5)


def _rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M64


def _round(acc, lane):
    return (_rotl((acc + lane * P2) & M64, 31) * P1) & M64


def xxh64_python(data, seed=0):
    """The reference algorithm in plain Python (slow: for small tensors and tests)."""
    data = memoryview(data).cast("B")
    n, p = len(data), 0
    if n >= 32:
        v = [(seed + P1 + P2) & M64, (seed + P2) & M64, seed, (seed - P1) & M64]
        lanes = struct.unpack_from("<%dQ" % (n // 32 * 4), data)
        for i in range(0, len(lanes), 4):
            v = [_round(v[0], lanes[i]), _round(v[1], lanes[i + 1]), _round(v[2], lanes[i + 2]),
                 _round(v[3], lanes[i + 3])]
        p = n // 32 * 32
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & M64
        for x in v:
            h = ((h ^ _round(0, x)) * P1 + P4) & M64
    else:
        h = (seed + P5) & M64
    h = (h + n) & M64
    while p + 8 <= n:
        h = (_rotl(h ^ _round(0, struct.unpack_from("<Q", data, p)[0]), 27) * P1 + P4) & M64
        p += 8
    if p + 4 <= n:
        h = (_rotl(h ^ ((struct.unpack_from("<I", data, p)[0] * P1) & M64), 23) * P2 + P3) & M64
        p += 4
    while p < n:
        h = (_rotl(h ^ ((data[p] * P5) & M64), 11) * P1) & M64
        p += 1
    h ^= h >> 33
    h = (h * P2) & M64
    h ^= h >> 29
    h = (h * P3) & M64
    return h ^ (h >> 32)


def xxh64(data):
    try:
        import xxhash  # fast, where installed
        return xxhash.xxh64_intdigest(bytes(data))
    except ImportError:
        return xxh64_python(data)


def checksum(data):
    return "xxh64:%016x" % xxh64(data)


# ---- safetensors: the package where installed, else a small reader and writer -----
def _use_package():
    if os.environ.get("DOS_CHECKPOINT_NO_SAFETENSORS"):
        return False
    try:
        import safetensors.numpy  # noqa: F401
        return True
    except ImportError:
        return False


def read_safetensors(path):
    """Returns {name: (dtype, shape, raw little-endian bytes)}, checking the header."""
    with open(path, "rb") as f:
        blob = f.read()
    if _use_package():
        import numpy as np
        import safetensors.numpy
        out = {}
        for name, array in safetensors.numpy.load(blob).items():
            if array.dtype != np.float32:
                raise CheckpointError("%s: tensor %s is %s; dos state is F32" % (path, name, array.dtype))
            out[name] = ("F32", list(array.shape), np.ascontiguousarray(array, "<f4").tobytes())
        return out
    if len(blob) < 8:
        raise CheckpointError("%s: truncated: %d bytes" % (path, len(blob)))
    (n,) = struct.unpack_from("<Q", blob, 0)
    if n > len(blob) - 8:
        raise CheckpointError("%s: truncated: the header claims %d bytes" % (path, n))
    try:
        header = json.loads(blob[8:8 + n])
    except ValueError as e:
        raise CheckpointError("%s: the safetensors header is not valid JSON (%s)" % (path, e))
    data = memoryview(blob)[8 + n:]
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
        count = 1
        for d in shape:
            count *= d
        if dtype not in DTYPE_SIZES or not 0 <= begin <= end <= len(data) or count * DTYPE_SIZES[dtype] != end - begin:
            raise CheckpointError("%s: tensor %s: dtype %s, shape %s and data_offsets [%d, %d] do not fit %d data bytes"
                                  % (path, name, dtype, shape, begin, end, len(data)))
        out[name] = (dtype, shape, bytes(data[begin:end]))
    return out


def write_safetensors(path, tensors, metadata):
    """tensors: [(name, shape, float32 little-endian bytes)], in file order."""
    if _use_package():
        import numpy as np
        import safetensors.numpy
        arrays = {name: np.frombuffer(raw, "<f4").reshape(shape) for name, shape, raw in tensors}
        blob = safetensors.numpy.save(arrays, metadata=metadata)
    else:
        header, offset = {"__metadata__": metadata}, 0
        for name, shape, raw in tensors:
            header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
            offset += len(raw)
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as the reference writer does
        blob = struct.pack("<Q", len(text)) + text + b"".join(raw for _, _, raw in tensors)
    return blob


def write_durably(path, blob):
    """Temporary name, fsync, rename: a crash leaves the old file or the new one."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(blob)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---- dos checkpoint <-> torch state_dict ----------------------------------------
def read_checkpoint(directory, verify=True):
    index_path = os.path.join(directory, "index.json")
    try:
        with open(index_path) as f:
            index = json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointError("%s: cannot read the index (%s)" % (index_path, e))
    if index.get("format") != FORMAT:
        raise CheckpointError("%s: not a dos checkpoint index" % index_path)
    if index.get("format_version", 0) > FORMAT_VERSION:
        raise CheckpointError("%s: format version %s is newer than this tool reads (%d)"
                              % (index_path, index["format_version"], FORMAT_VERSION))
    tensors = {}
    for rank in index["ranks"]:
        path = os.path.join(directory, rank["file"])
        if os.path.getsize(path) != rank["bytes"]:
            raise CheckpointError("%s: %d bytes, the index says %d" % (path, os.path.getsize(path), rank["bytes"]))
        found = read_safetensors(path)
        for name, expected in rank["tensors"].items():
            if name not in found:
                raise CheckpointError("%s: tensor %s is missing" % (path, name))
            if verify and checksum(found[name][2]) != expected:
                raise CheckpointError("%s: tensor %s: checksum %s does not match the index's %s; the file is corrupted"
                                      % (path, name, checksum(found[name][2]), expected))
            tensors[name] = found[name]
    return index, tensors


def to_torch(args):
    import torch
    index, tensors = read_checkpoint(args.ckpt, verify=not args.no_verify)
    shapes = None
    if args.params:
        loaded = torch.load(args.params)
        shapes = [t.shape for t in (loaded.values() if isinstance(loaded, dict) else loaded)]
    state = {}
    for p, info in enumerate(index["params"]):
        entry = {"step": torch.tensor(float(info.get("step", index["step_count"])))}
        for kind in KINDS:
            name = "state.%d.%s" % (p, kind)
            if name in tensors:
                t = torch.frombuffer(bytearray(tensors[name][2]), dtype=torch.float32)
                if shapes is not None and kind != "master":
                    t = t.reshape(shapes[p])
                entry[kind] = t
        state[p] = entry
    groups = []
    for g in index["param_groups"]:
        groups.append({"lr": g["lr"], "betas": tuple(g["betas"]), "eps": g["eps"], "weight_decay": g["weight_decay"],
                       "amsgrad": g["amsgrad"], "maximize": g["maximize"], "foreach": None, "capturable": False,
                       "decoupled_weight_decay": g["decoupled_weight_decay"], "params": list(g["params"])})
    dos = {k: index[k] for k in ("dos_version", "step_count", "schedule_index", "loss_scaler", "subgroup_elements",
                                 "params")}
    torch.save({"state": state, "param_groups": groups, "dos": dos}, args.out)


def from_torch(args):
    import torch
    sd = torch.load(args.sd)
    dos = sd.get("dos", {})
    order = [p for g in sd["param_groups"] for p in g["params"]]
    remap = {old: new for new, old in enumerate(order)}  # dos numbers parameters group by group
    amsgrad = {p: bool(g.get("amsgrad", False)) for g in sd["param_groups"] for p in g["params"]}
    params, tensors = [], []
    for new, old in enumerate(order):
        st = sd["state"].get(old)
        dtype = dos["params"][new]["dtype"] if "params" in dos else "float32"
        if st is None:
            # Never stepped (torch keeps no state for it): step 0 and zero moments, when
            # the size is known and no master is needed (dos reads it from the value).
            if "params" not in dos or dtype != "float32":
                raise CheckpointError("%s: parameter %s has no state (never stepped?) and the state_dict does not "
                                      "say its size and type" % (args.sd, old))
            numel = dos["params"][new]["numel"]
            st = {"step": 0, "exp_avg": torch.zeros(numel), "exp_avg_sq": torch.zeros(numel)}
            if amsgrad[old]:
                st["max_exp_avg_sq"] = torch.zeros(numel)
        numel = st["exp_avg"].numel()
        params.append({"numel": numel, "dtype": dtype, "step": int(float(st["step"]))})
        for kind in KINDS:
            if kind in st:
                t = st[kind].detach().to(torch.float32).contiguous().reshape(-1)
                tensors.append(("state.%d.%s" % (new, kind), [numel], t.numpy().astype("<f4").tobytes()))
    # The optimizer's own count (applied step() calls); torch has none: the largest.
    step = dos.get("step_count", max((p["step"] for p in params), default=0))
    groups = []
    for g in sd["param_groups"]:
        groups.append({"lr": g["lr"], "betas": list(g["betas"]), "eps": g["eps"], "weight_decay": g["weight_decay"],
                       "amsgrad": bool(g.get("amsgrad", False)), "maximize": bool(g.get("maximize", False)),
                       "decoupled_weight_decay": bool(g.get("decoupled_weight_decay", True)),
                       "params": [remap[p] for p in g["params"]]})
    os.makedirs(args.ckpt, exist_ok=True)
    rank_file = "rank00000-step%d-%016x.safetensors" % (step, int.from_bytes(os.urandom(8), "little"))
    meta = {"format": "dos", "dos.format_version": str(FORMAT_VERSION), "dos.step_count": str(step), "dos.rank": "0"}
    blob = write_safetensors(os.path.join(args.ckpt, rank_file), tensors, meta)
    write_durably(os.path.join(args.ckpt, rank_file), blob)
    index = {"format": FORMAT, "format_version": FORMAT_VERSION, "dos_version": dos.get("dos_version", "torch"),
             "checksum": "xxh64", "step_count": step, "schedule_index": dos.get("schedule_index", step),
             "loss_scaler": dos.get("loss_scaler"), "subgroup_elements": dos.get("subgroup_elements", 0),
             "param_groups": groups, "params": params,
             "ranks": [{"rank": 0, "file": rank_file, "bytes": len(blob),
                        "tensors": {name: checksum(raw) for name, _, raw in tensors}}]}
    write_durably(os.path.join(args.ckpt, "index.json"), json.dumps(index, indent=1).encode())
    for name in os.listdir(args.ckpt):  # what an earlier checkpoint there left behind
        if name.startswith("rank") and name != rank_file and (name.endswith(".safetensors") or name.endswith(".tmp")):
            os.remove(os.path.join(args.ckpt, name))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    a = sub.add_parser("to-torch", help="dos checkpoint directory -> torch state_dict file")
    a.add_argument("ckpt")
    a.add_argument("out")
    a.add_argument("--params", help="torch.save'd parameters (list or state_dict) giving the shapes")
    a.add_argument("--no-verify", action="store_true", help="skip the checksums (pure-Python XXH64 is slow)")
    b = sub.add_parser("from-torch", help="torch state_dict file -> dos checkpoint directory")
    b.add_argument("sd")
    b.add_argument("ckpt")
    args = parser.parse_args(argv)
    try:
        (to_torch if args.command == "to-torch" else from_torch)(args)
    except CheckpointError as e:
        print("dos_checkpoint: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
