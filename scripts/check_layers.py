#!/usr/bin/env python3
"""Checks that every #include in the engine points down the layer order (docs/architecture.md).

engine/src is one folder per layer; an include is written from engine/src ("runtime/team.hpp")
and so names its layer. A file may include its own layer, the layers of a lower rank and the
public headers (simdattn/...), never a layer of its own rank or above. Subfolders are layers of
their own (attention/native) unless LAYERS says otherwise; a file in a subfolder that LAYERS does
not name belongs to the nearest folder it does name (layer/cache is part of layer).

tests/, perf/, python/ and tools/ use the public headers, their own headers, and only the
named internal set INTERNAL_FOR_TESTS of engine/src.

  python3 scripts/check_layers.py [--root DIR]   # exit 0: clean; 1: each bad include printed
  python3 scripts/check_layers.py --self-test     # plants upward includes in a scratch tree
"""
import argparse
import os
import re
import sys
import tempfile

# Rank of each layer: lower ranks are below. Layers of one rank are siblings and do not include
# each other.
LAYERS = {
    "core": 0,                 # the problem, its checks, the position rule, score modifiers, errors
    "runtime": 1,              # threads, the thread budget, scratch memory, prefetch
    "linalg": 2,               # GEMM (f32/f64 and 16-bit), packed panels, bulk conversions
    "attention/reference": 3,  # the backends: the float64-summing oracle,
    "attention/native": 3,     #   the SIMD paths,
    "attention/onednn": 3,     #   oneDNN's graph
    "io": 3,                   # file formats only: npy, safetensors, gguf, json, file writing
    "attention": 4,            # attention(): checks, the backend choice, scores, runtime info
    "linear_attention": 4,     # linear attention (its own kernels on linalg)
    "layer": 5,                # the multi-head attention layer and its KV cache
    "distributed": 5,          # simdattn::mpi: attention sharded across MPI processes
    "serving": 6,              # the decode scheduler over the layer
    "loaders": 6,              # a layer from safetensors and published checkpoints
    "c_api": 7,                # the C API over everything
    "bench": 7,                # the perf suite's aids
}

# engine/src headers that tests/ and perf/ may include (the internals they test or time).
INTERNAL_FOR_TESTS = {
    "attention/native/native.hpp",  # the native path table
    "core/backends.hpp",            # the backends' entry points (oneDNN primitive counts)
    "core/element.hpp",             # scalar conversions of the oracle helpers
    "core/validate/validate.hpp",   # make_problem (the path table's input)
    "io/gguf.hpp",                  # the GGUF reader (its doctest and fuzz target)
    "io/json.hpp",
    "layer/mla/mla.hpp",            # the MLA forms' threshold (its tests)
    "layer/cache/pool_core.hpp",    # the cascade's mode, rule and count (its tests, the soak)
    "linalg/gemm.hpp",
    "linalg/gemm16.hpp",
    "linear_attention/gated_delta.hpp",  # the rule's product choice (its tests, the perf rows)
    "runtime/team.hpp",
    "runtime/threading.hpp",
}

OUTSIDE = ["tests", "perf", "python", "tools"]
SOURCE = re.compile(r"\.(c|cc|cpp|h|hpp|in)$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of(rel):
    """The layer of a path under engine/src (a file or an include), or None."""
    parts = rel.split("/")[:-1]
    while parts:
        name = "/".join(parts)
        if name in LAYERS:
            return name
        parts.pop()
    return None


def sources(root):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("build", ".git"))
        for f in sorted(filenames):
            if SOURCE.search(f):
                yield os.path.join(dirpath, f)


def includes(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    for m in INCLUDE.finditer(text):
        yield text.count("\n", 0, m.start()) + 1, m.group(1)


def check(root):
    src = os.path.join(root, "engine", "src")
    problems = []
    for path in sources(src):
        rel = os.path.relpath(path, src).replace(os.sep, "/")
        mine = layer_of(rel)
        if mine is None:
            if "/" in rel:
                problems.append(f"engine/src/{rel}: folder not in the layer table (scripts/check_layers.py)")
            continue
        for line, inc in includes(path):
            if inc.startswith("simdattn/"):
                continue
            theirs = layer_of(inc)
            if theirs is None:
                problems.append(f"engine/src/{rel}:{line}: #include \"{inc}\" names no layer "
                                "(write engine/src includes from engine/src)")
            elif theirs != mine and LAYERS[theirs] >= LAYERS[mine]:
                how = "a sibling" if LAYERS[theirs] == LAYERS[mine] else "above"
                problems.append(f"engine/src/{rel}:{line}: #include \"{inc}\" points up: {mine} "
                                f"(rank {LAYERS[mine]}) includes {theirs} (rank {LAYERS[theirs]}, {how})")
    for top in OUTSIDE:
        base = os.path.join(root, top)
        for path in sources(base) if os.path.isdir(base) else []:
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            for line, inc in includes(path):
                if inc.startswith("simdattn/") or inc in INTERNAL_FOR_TESTS:
                    continue
                if os.path.exists(os.path.join(os.path.dirname(path), inc)) or \
                   os.path.exists(os.path.join(base, inc)):
                    continue  # its own header
                if os.path.exists(os.path.join(src, inc)):
                    problems.append(f"{rel}:{line}: #include \"{inc}\" reaches into engine/src outside "
                                    "the named internal set (scripts/check_layers.py INTERNAL_FOR_TESTS)")
    return problems


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def self_test():
    with tempfile.TemporaryDirectory() as root:
        s = os.path.join(root, "engine", "src")
        write(os.path.join(s, "core", "problem.hpp"), '#include "simdattn/attention.hpp"\n')
        write(os.path.join(s, "runtime", "team.hpp"), '#include "core/problem.hpp"\n')
        write(os.path.join(s, "layer", "cache", "kv.hpp"), '#include "layer/storage.hpp"\n#include "runtime/team.hpp"\n')
        write(os.path.join(s, "layer", "storage.hpp"), "\n")
        write(os.path.join(s, "linalg", "panels.hpp"), "\n")
        write(os.path.join(root, "tests", "util.hpp"), "\n")
        write(os.path.join(root, "tests", "t.cpp"), '#include "util.hpp"\n#include "runtime/team.hpp"\n')
        if check(root):
            print("self-test: a clean tree reported:", *check(root), sep="\n  ")
            return 1
        # plant: core includes a layer above it, attention/native a sibling, a test an internal
        write(os.path.join(s, "core", "problem.hpp"), '#include "simdattn/attention.hpp"\n#include "layer/storage.hpp"\n')
        write(os.path.join(s, "attention", "native", "n.cpp"), '#include "attention/onednn/o.hpp"\n')
        write(os.path.join(s, "attention", "onednn", "o.hpp"), "\n")
        write(os.path.join(root, "tests", "u.cpp"), '#include "linalg/panels.hpp"\n')
        got = check(root)
        want = ["engine/src/attention/native/n.cpp:1:", "engine/src/core/problem.hpp:2:", "tests/u.cpp:1:"]
        if sorted(p.split(" ")[0] for p in got) != want:
            print("self-test: expected three bad includes", want, "got:", *got, sep="\n  ")
            return 1
    print("self-test: a clean tree passes; the three planted includes are each reported")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    problems = check(os.path.abspath(a.root))
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} include(s) against the layer order", file=sys.stderr)
        return 1
    print("check_layers: every include points down the layer order")
    return 0


if __name__ == "__main__":
    sys.exit(main())
