#!/usr/bin/env python3
"""simdattn inside an OpenMP host, under each thread runtime and each OMP_WAIT_POLICY.

  perf/hosts/host_openmp.py cpp   BUILD/perf/simdattn_host_bench [--rounds 3] [--workload bert]
  PYTHONPATH=build/python perf/hosts/host_openmp.py torch [--rounds 3]

cpp: runs simdattn_host_bench (an OpenMP-parallel matmul, then an attention call, in a loop; the
call alone in alternating phases) under --runtime team|openmp x OMP_WAIT_POLICY unset|active|passive.
torch: the same with PyTorch as the host: torch.tanh over 2^20 floats (ATen's OpenMP-parallel
loop: torch's intra-op pool is libgomp's, as simdattn's OpenMP regions), or with --torch-op
matmul+tanh first torch.matmul of two 256x256 float32 matrices (Debian's torch runs matmul on the
reference BLAS, on one thread: the pool sleeps meanwhile), then simdattn.torch's
scaled_dot_product_attention on the bert shape (1x12x128x64). Each configuration runs in a child
process (libgomp reads OMP_WAIT_POLICY at start).

For each runtime a process without host work gives the quiet host's call (the baseline). The
configurations run in rounds, in a rotated order each round (drifts of the machine fall on all
alike); for each the best (lowest) median over rounds is kept. Prints a table: the call's median
on a quiet host, right after the host's region, their ratio, and the host loop's median.
"""
import argparse
import itertools
import json
import os
import subprocess
import sys
import time

POLICIES = ["default", "active", "passive"]
RUNTIMES = ["team", "openmp"]


def env_for(policy):
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    if policy != "default":
        env["OMP_WAIT_POLICY"] = policy
    return env


def torch_child(runtime, rounds, calls, with_host, op):
    """One configuration with torch as the host, in this process; prints one JSON line."""
    import statistics

    import torch

    import simdattn
    import simdattn.torch as st

    torch.set_num_threads(os.cpu_count() or 1)
    simdattn.set_thread_runtime(runtime)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(256, 256, generator=g), torch.randn(256, 256, generator=g)
    big, big_out = torch.randn(1 << 20, generator=g), torch.empty(1 << 20)
    q, k, v = (torch.randn(1, 12, 128, 64, generator=g) for _ in range(3))
    quiet, host, loop = [], [], []
    for r in range(rounds + 1):
        def quiet_phase():
            for _ in range(calls):
                t0 = time.perf_counter()
                st.scaled_dot_product_attention(q, k, v)
                if r:
                    quiet.append(time.perf_counter() - t0)

        def host_phase():
            for _ in range(calls if with_host else 0):
                t0 = time.perf_counter()
                if op == "matmul+tanh":
                    torch.matmul(a, b)
                torch.tanh(big, out=big_out)
                t1 = time.perf_counter()
                st.scaled_dot_product_attention(q, k, v)
                if r:
                    t2 = time.perf_counter()
                    host.append(t2 - t1)
                    loop.append(t2 - t0)

        phases = (quiet_phase, host_phase) if r % 2 == 0 else (host_phase, quiet_phase)
        for p in phases:
            p()

    def stat(x):
        x = sorted(x)
        return [statistics.median(x) * 1e6, x[int(0.9 * (len(x) - 1))] * 1e6]

    print(json.dumps({"runtime": runtime, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
                      "workload": "bert", "host": op, "omp_threads": torch.get_num_threads(),
                      "quiet_us": stat(quiet), "host_us": stat(host) if with_host else [0, 0],
                      "loop_us": stat(loop) if with_host else [0, 0]}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("host", choices=["cpp", "torch", "_torch_child"])
    ap.add_argument("binary", nargs="?", help="simdattn_host_bench (cpp)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds over every configuration")
    ap.add_argument("--workload", default="bert")
    ap.add_argument("--runtime", default="team", help=argparse.SUPPRESS)
    ap.add_argument("--no-host", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--torch-op", default="tanh", choices=["tanh", "matmul+tanh"], help="the torch host's work")
    ap.add_argument("--inner-rounds", type=int, default=20, help="alternations of the phases in one process")
    ap.add_argument("--calls", type=int, default=20, help="calls per phase")
    a = ap.parse_args()
    if a.host == "_torch_child":
        torch_child(a.runtime, a.inner_rounds, a.calls, not a.no_host, a.torch_op)
        return 0
    if a.host == "cpp" and not a.binary:
        ap.error("cpp needs the path of simdattn_host_bench")
    configs = [(r, "quiet") for r in RUNTIMES] + list(itertools.product(RUNTIMES, POLICIES))
    best = {}
    for r in range(a.rounds):
        order = configs[r % len(configs):] + configs[:r % len(configs)]
        for runtime, policy in order:
            quiet = policy == "quiet"
            if a.host == "cpp":
                cmd = [a.binary, "--runtime", runtime, "--workload", a.workload, "--rounds", str(a.inner_rounds),
                       "--calls", str(a.calls), "--json"] + (["--host-n", "0"] if quiet else [])
            else:
                cmd = [sys.executable, os.path.abspath(__file__), "_torch_child", "--runtime", runtime,
                       "--inner-rounds", str(a.inner_rounds), "--calls", str(a.calls), "--torch-op", a.torch_op] + \
                      (["--no-host"] if quiet else [])
            res = json.loads(subprocess.run(cmd, env=env_for("default" if quiet else policy), check=True,
                                            capture_output=True, text=True).stdout.strip().splitlines()[-1])
            key = (runtime, policy)
            metric = "quiet_us" if quiet else "host_us"
            if key not in best or res[metric][0] < best[key][metric][0]:
                best[key] = res
    what = a.torch_op if a.host == "torch" else "OpenMP matmul 256"
    print(f"host {a.host} ({what}), workload {a.workload}, best of {a.rounds} rounds (median / p90 us)")
    print("| runtime | OMP_WAIT_POLICY | call on a quiet host | call after the host's region | ratio | "
          "host loop |")
    print("|---|---|---|---|---|---|")
    for runtime, policy in configs:
        if policy == "quiet":
            continue
        b, q = best[(runtime, policy)], best[(runtime, "quiet")]["quiet_us"]
        print(f"| {runtime} | {policy} | {q[0]:.1f} / {q[1]:.1f} | {b['host_us'][0]:.1f} / {b['host_us'][1]:.1f} | "
              f"{b['host_us'][0] / q[0]:.2f}x | {b['loop_us'][0]:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
