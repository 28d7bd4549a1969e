#!/usr/bin/env python3
"""simdattn inside an OpenMP host, under each thread runtime and each OMP_WAIT_POLICY.

  perf/host_openmp.py cpp   BUILD/perf/simdattn_host_bench [--rounds 3] [--workload bert]
  PYTHONPATH=build/python perf/host_openmp.py torch [--rounds 3]

cpp: runs simdattn_host_bench (an OpenMP-parallel matmul, then an attention call, in a loop; the
call alone in alternating phases) under --runtime team|openmp x OMP_WAIT_POLICY unset|active|passive.
torch: the same with PyTorch as the host (its intra-op pool is libgomp's, as simdattn's OpenMP
regions): torch.matmul of two 256x256 float32 matrices, then simdattn.torch's
scaled_dot_product_attention on the bert shape (1x12x128x64), each configuration in a child
process (libgomp reads OMP_WAIT_POLICY at start).

The configurations run in rounds, in a rotated order each round (drifts of the machine fall on all
alike); for each the best (lowest) median over rounds is kept. Prints a table: the call's median
alone (quiet) and right after the host's region (host), host/quiet, and the host loop's median.
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


def torch_child(runtime, rounds, calls):
    """One configuration with torch as the host, in this process; prints one JSON line."""
    import statistics

    import torch

    import simdattn
    import simdattn.torch as st

    torch.set_num_threads(os.cpu_count() or 1)
    simdattn.set_thread_runtime(runtime)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(256, 256, generator=g), torch.randn(256, 256, generator=g)
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
            for _ in range(calls):
                t0 = time.perf_counter()
                torch.matmul(a, b)
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
                      "workload": "bert", "host": "torch.matmul 256", "omp_threads": torch.get_num_threads(),
                      "quiet_us": stat(quiet), "host_us": stat(host), "loop_us": stat(loop)}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("host", choices=["cpp", "torch", "_torch_child"])
    ap.add_argument("binary", nargs="?", help="simdattn_host_bench (cpp)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds over every configuration")
    ap.add_argument("--workload", default="bert")
    ap.add_argument("--runtime", default="team", help=argparse.SUPPRESS)
    ap.add_argument("--inner-rounds", type=int, default=20, help="alternations of the phases in one process")
    ap.add_argument("--calls", type=int, default=20, help="calls per phase")
    a = ap.parse_args()
    if a.host == "_torch_child":
        torch_child(a.runtime, a.inner_rounds, a.calls)
        return 0
    if a.host == "cpp" and not a.binary:
        ap.error("cpp needs the path of simdattn_host_bench")
    configs = list(itertools.product(RUNTIMES, POLICIES))
    best = {}
    for r in range(a.rounds):
        order = configs[r % len(configs):] + configs[:r % len(configs)]
        for runtime, policy in order:
            if a.host == "cpp":
                cmd = [a.binary, "--runtime", runtime, "--workload", a.workload, "--rounds", str(a.inner_rounds),
                       "--calls", str(a.calls), "--json"]
            else:
                cmd = [sys.executable, os.path.abspath(__file__), "_torch_child", "--runtime", runtime,
                       "--inner-rounds", str(a.inner_rounds), "--calls", str(a.calls)]
            res = json.loads(subprocess.run(cmd, env=env_for(policy), check=True, capture_output=True,
                                            text=True).stdout.strip().splitlines()[-1])
            key = (runtime, policy)
            if key not in best or res["host_us"][0] < best[key]["host_us"][0]:
                best[key] = res
    print(f"host {a.host}, workload {a.workload}, best of {a.rounds} rounds (median / p90 us)")
    print("| runtime | OMP_WAIT_POLICY | quiet call | call after the host's region | host / quiet | host loop |")
    print("|---|---|---|---|---|---|")
    for runtime, policy in configs:
        b = best[(runtime, policy)]
        print(f"| {runtime} | {policy} | {b['quiet_us'][0]:.1f} / {b['quiet_us'][1]:.1f} | "
              f"{b['host_us'][0]:.1f} / {b['host_us'][1]:.1f} | {b['host_us'][0] / b['quiet_us'][0]:.2f}x | "
              f"{b['loop_us'][0]:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
