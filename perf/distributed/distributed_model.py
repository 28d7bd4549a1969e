#!/usr/bin/env python3
"""docs/distributed.md's model: one decode step and one causal prefill of a long sequence across
P hosts, from measured rates and a stated network. Prints the markdown tables of the doc.

  decode step   T = bytes_kv(N) / (P * mem_rate) + merge(P)
                bytes_kv(N) = 2 * kv_heads * dim * N * dtype_bytes        (per layer)
                merge(P)    = 2 * ceil(log2 P) * latency + (P - 1) * (a + m) / net_rate:
                              two allgathers, the ranks' agreement (a = 408 bytes a rank: its
                              checks, the shared arguments, its key ranges) and the rows
                              (m = heads * (dim + 1) * 8 bytes: output and lse, in double)
  ring prefill  T = P * max(step_compute, step_comm) + step_comm            (the first step's
                              shard is local; the last transfer is not hidden)
                step_compute = flops(N) / (P^2 * flop_rate),  flops(N) = 2 * heads * N^2 * dim (causal)
                step_comm    = latency + 2 * kv_heads * dim * (N / P) * dtype_bytes / net_rate

  python3 perf/distributed/distributed_model.py [--flop-rate GFLOPS] [--mem-rate GBPS] [--layers 32] ...
"""
import argparse
import math

NETWORKS = {  # stated, not measured: one-way latency (s), bandwidth (bytes/s)
    "25 GbE (TCP)": (25e-6, 25e9 / 8),
    "200 Gb InfiniBand (HDR)": (1.5e-6, 200e9 / 8),
}


def decode_step(n, p, a, latency, rate):
    kv = 2 * a.kv_heads * a.dim * n * a.dtype_bytes
    m = a.heads * (a.dim + 1) * 8
    agreement = 8 * (2 + 40 + 1 + 8)  # distributed/comm.cpp: flag, shared values, own values
    merge = (2 * math.ceil(math.log2(p)) * latency + (p - 1) * (agreement + m) / rate) if p > 1 else 0.0
    return kv / (p * a.mem_rate * 1e9) + merge


def prefill(n, p, a, latency, rate):
    flops = 2 * a.heads * n * n * a.dim
    compute = flops / (p * p * a.flop_rate * 1e9)
    comm = latency + 2 * a.kv_heads * a.dim * (n / p) * a.dtype_bytes / rate if p > 1 else 0.0
    return p * max(compute, comm) + comm


def fmt(seconds):
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.0f} min"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flop-rate", type=float, default=343.0, help="GFLOP/s of one host (causal prefill)")
    ap.add_argument("--mem-rate", type=float, default=40.3, help="GB/s one host reads K/V at (decode)")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--dtype-bytes", type=int, default=2)
    a = ap.parse_args()
    hosts = [2, 4, 8, 16, 32, 64]
    for name, (latency, rate) in NETWORKS.items():
        print(f"\n{name}: per layer (x{a.layers} layers in brackets)\n")
        print("| tokens | step | " + " | ".join(f"{p} hosts" for p in hosts) + " |")
        print("|---|---|" + "---|" * len(hosts))
        for n in (131072, 1048576):
            label = "128k" if n == 131072 else "1M"
            cells = [f"{fmt(decode_step(n, p, a, latency, rate))} ({fmt(a.layers * decode_step(n, p, a, latency, rate))})"
                     for p in hosts]
            print(f"| {label} | decode | " + " | ".join(cells) + " |")
            cells = [f"{fmt(prefill(n, p, a, latency, rate))} ({fmt(a.layers * prefill(n, p, a, latency, rate))})"
                     for p in hosts]
            print(f"| {label} | prefill | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
