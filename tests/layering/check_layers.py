#!/usr/bin/env python3
"""Fails when a header under include/dos/ includes one from a higher layer.

The layers, lowest first (docs/design.md, "Layers"): a header may include headers of
its own layer or of lower ones, never of a higher one, so each folder can be read,
tested and reused with only what lies beneath it.
"""
import pathlib
import re
import sys

LAYERS = [
    ("core", ["core/", "config.hpp", "error.hpp", "version.hpp"]),
    ("comm", ["comm/"]),
    ("optim, partition, memory", ["optim/", "partition/", "memory/"]),
    ("cpu", ["cpu/"]),
    ("state", ["state/"]),
    ("schedule", ["schedule/"]),
    ("backend", ["backend/", "cuda/"]),
    ("engine", ["engine/"]),
    ("optimizer", ["train/", "options.hpp", "components.hpp", "interleaved_optimizer.hpp", "shard/", "optimizer.hpp"]),
    ("adapters", ["adapters/", "checkpoint/", "checkpoint.hpp", "python/"]),
]


def layer_of(path):
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(path == p or (p.endswith("/") and path.startswith(p)) for p in prefixes):
            return index
    return None


def main(root):
    include = pathlib.Path(root) / "include" / "dos"
    pattern = re.compile(r'^\s*#\s*include\s*[<"]dos/([^">]+)[">]')
    problems, checked = [], 0
    for header in sorted(include.rglob("*")):
        if header.suffix not in (".hpp", ".cuh", ".inl", ".cu", ".h"):
            continue
        rel = header.relative_to(include).as_posix()
        own = layer_of(rel)
        if own is None:
            problems.append(f"{rel}: in no layer; add its folder to tests/layering/check_layers.py and docs/design.md")
            continue
        for number, line in enumerate(header.read_text().splitlines(), 1):
            m = pattern.match(line)
            if not m:
                continue
            checked += 1
            target = layer_of(m.group(1))
            if target is None:
                problems.append(f"{rel}:{number}: includes dos/{m.group(1)}, which is in no layer")
            elif target > own:
                problems.append(f"{rel}:{number}: layer '{LAYERS[own][0]}' includes dos/{m.group(1)} "
                                f"from the higher layer '{LAYERS[target][0]}'")
    for p in problems:
        print(p)
    print(f"{checked} includes checked: {len(problems)} violation(s)")
    return 1 if problems or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
