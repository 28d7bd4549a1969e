#!/usr/bin/env python3
"""Calling overhead of the Python module: simdattn.attention() from Python against the same
attention() call made from C++ (simdattn._time_attention_cpp), on the same arrays, in one process.

  PYTHONPATH=build/python /usr/bin/python3 perf/hosts/python_overhead.py [--workload bert] [--rounds 40]
                                             [--kind numpy|torch]

--kind torch passes torch tensors (read and written through DLPack) to the Python call; the C++
baseline reads the same memory.

Both loops run in alternating rounds (each round: `calls` Python calls, then `calls` C++ calls, the
order swapped every round), so drifts of the machine's speed fall on both alike. Prints each side's
median per call and the difference; the module's bound is max(5% of the C++ median, 20 us).
Exit status 0 when within it, 1 otherwise.
"""
import argparse
import statistics
import sys
import time

import numpy as np

import simdattn

# The perf suite's standard workloads (engine/src/bench.cpp): B, H, Hkv, Sq, Sk, D, causal.
WORKLOADS = {
    "bert": (1, 12, 12, 128, 128, 64, None),
    "gpt": (1, 12, 12, 1024, 1024, 64, "top_left"),
    "decode": (1, 32, 32, 1, 4096, 128, None),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="bert", choices=sorted(WORKLOADS))
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--calls", type=int, default=25)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--kind", default="numpy", choices=["numpy", "torch"])
    a = ap.parse_args()
    B, H, Hkv, Sq, Sk, D, causal = WORKLOADS[a.workload]
    if causal is not None:
        sys.exit("python_overhead.py: the C++ baseline runs without options; pick a non-causal workload")
    rng = np.random.default_rng(0)
    q = rng.standard_normal((B, H, Sq, D), dtype=np.float32)
    k = rng.standard_normal((B, Hkv, Sk, D), dtype=np.float32)
    v = rng.standard_normal((B, Hkv, Sk, D), dtype=np.float32)
    out = np.empty((B, H, Sq, D), dtype=np.float32)
    attention, threads = simdattn.attention, a.threads
    args = (q, k, v, out)
    if a.kind == "torch":
        import torch
        args = tuple(torch.from_numpy(x) for x in args)  # the same memory

    py, cpp = [], []
    for r in range(a.rounds + 1):
        def python_round():
            times = []
            for _ in range(a.calls):
                t0 = time.perf_counter()
                attention(args[0], args[1], args[2], out=args[3], threads=threads)
                times.append(time.perf_counter() - t0)
            return times

        def cpp_round():
            return simdattn._time_attention_cpp(q, k, v, out, a.calls, threads)

        first, second = (python_round, cpp_round) if r % 2 == 0 else (cpp_round, python_round)
        x, y = first(), second()
        if r == 0:
            continue  # warm-up: buffers, thread team
        pt, ct = (x, y) if r % 2 == 0 else (y, x)
        py += pt
        cpp += ct
    mp, mc = statistics.median(py), statistics.median(cpp)
    bound = max(0.05 * mc, 20e-6)
    ok = mp - mc <= bound
    print(f"workload {a.workload} [B={B}, H={H}, S={Sq}, D={D}] f32, threads {threads or 'default'}, "
          f"{a.rounds} rounds x {a.calls} calls each side, {a.kind} arguments")
    print(f"  C++ call    median {mc * 1e6:9.1f} us")
    print(f"  Python call median {mp * 1e6:9.1f} us")
    print(f"  difference         {(mp - mc) * 1e6:+9.1f} us ({(mp / mc - 1) * 100:+.1f}%); "
          f"bound {bound * 1e6:.1f} us: {'within' if ok else 'OVER'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
