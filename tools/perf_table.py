#!/usr/bin/env python3
"""Summarise a simdattn_perf JSON run (Google Benchmark --benchmark_format=json).

    build/perf/simdattn_perf --benchmark_repetitions=5 --benchmark_format=json > run.json
    python3 tools/perf_table.py run.json

For each benchmark it keeps the best repetition (highest GFLOP/s or GB/s: on a shared VM the
slower ones measure the neighbours), and prints time, throughput, % of the same run's
peak/fma/t<N> (GFLOP/s rows) or bandwidth/read/t<N> (GB/s rows), and native / onednn.
"""
import json
import sys


def main(path):
    with open(path) as f:
        data = json.load(f)
    best = {}
    for b in data["benchmarks"]:
        if b.get("run_type") != "iteration":
            continue
        name = b["run_name"]
        unit = "GFLOP/s" if "GFLOP/s" in b else "GB/s"
        value = b[unit]
        if name not in best or value > best[name][1]:
            best[name] = (b["wall_ms"], value, unit)

    def limit(name, unit):
        t = name.rsplit("/", 1)[-1]
        key = ("peak/fma/" if unit == "GFLOP/s" else "bandwidth/read/") + t
        return best.get(key, (None, None))[1]

    print(f"{'benchmark':42s} {'ms':>10s} {'throughput':>16s} {'% limit':>8s} {'vs onednn':>9s}")
    for name, (ms, value, unit) in best.items():
        lim = limit(name, unit)
        pct = f"{100 * value / lim:7.1f}%" if lim and not name.startswith(("peak/", "bandwidth/")) else ""
        ratio = ""
        parts = name.split("/")
        if len(parts) == 4 and parts[1] == "native":
            other = best.get("/".join([parts[0], "onednn", parts[2], parts[3]]))
            if other:
                ratio = f"{value / other[1]:8.2f}x"
        print(f"{name:42s} {ms:10.3f} {value:10.1f} {unit:5s} {pct:>8s} {ratio:>9s}")


if __name__ == "__main__":
    main(sys.argv[1])
