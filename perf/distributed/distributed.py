#!/usr/bin/env python3
"""simdattn::mpi on one host: ring prefill and sharded decode against one rank, interleaved.

Runs build/perf/simdattn_mpi_bench under mpirun, alternating the configurations round by round
(A B A B ...), and prints each configuration's best time and, per round, the ratio of the one-rank
baseline (one rank x T threads, attention() directly) to the sharded run (N ranks x 1 thread):
a ratio >= 1 means the sharded run is as fast. Also MPI's one-way latency and bandwidth on this
host (pingpong), the inputs of docs/distributed.md's model.

  python3 perf/distributed/distributed.py [--build build] [--rounds 3] [--ring-tokens 16384]
                              [--decode-tokens 262144] [--ranks 2,4] [--json FILE]
"""
import argparse
import json
import os
import subprocess
import sys

MPIRUN = ["mpirun", "--oversubscribe", "--allow-run-as-root", "--bind-to", "none"]


def run(bench, ranks, args):
    cmd = MPIRUN + ["-np", str(ranks), bench] + args
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ring-tokens", type=int, default=16384)
    ap.add_argument("--decode-tokens", type=int, default=262144)
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--json")
    a = ap.parse_args()
    bench = os.path.join(a.build, "perf", "simdattn_mpi_bench")
    if not os.path.exists(bench):
        sys.exit(f"distributed.py: {bench} not found (build with SIMDATTN_WITH_MPI=ON)")
    results = {"pingpong": run(bench, 2, ["pingpong"])}
    for line in results["pingpong"]:
        print(f"pingpong {line['bytes']:>9} B  one-way {line['one_way_us']:9.2f} us  {line['gbytes_per_s']:7.2f} GB/s")
    cores = os.cpu_count() or 1
    for mode, tokens in (("ring", a.ring_tokens), ("decode", a.decode_tokens)):
        configs = [("1 rank x %d threads" % min(2, cores), 1, ["--direct", "--threads", str(min(2, cores))])]
        for n in [int(x) for x in a.ranks.split(",")]:
            configs.append(("%d ranks x 1 thread" % n, n, ["--threads", "1"]))
        times = {name: [] for name, _, _ in configs}
        for _ in range(a.rounds):
            for name, n, extra in configs:
                r = run(bench, n, [mode, "--tokens", str(tokens)] + extra)[0]
                times[name].append(r["best_ms"])
        base = configs[0][0]
        print(f"\n{mode}: tokens {tokens}, 8 heads, d128, f32" + (" causal" if mode == "ring" else ", one query"))
        for name, _, _ in configs:
            ratios = [b / t for b, t in zip(times[base], times[name])]
            print(f"  {name:22s} best {min(times[name]):10.2f} ms   speed vs {base}: "
                  + " ".join(f"{x:.3f}" for x in ratios) + f"  (best {max(ratios):.3f})")
        results[mode] = times
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
