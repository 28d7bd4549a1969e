#!/usr/bin/env python3
"""Latency against load from `simdattn_serve_bench load --json` files: one panel per file, p50
and p99 of each server (the library, the scheduler, the stand-in) against the offered load.

  python3 scripts/figures/serve_chart.py OUT.png RUN.json [RUN.json ...]
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, files = sys.argv[1], sys.argv[2:]
    runs = []
    for f in files:
        with open(f) as fh:
            r = json.load(fh)
        if r.get("mode") != "load":
            sys.exit(f"serve_chart.py: {f} is not a serve_bench load run")
        runs.append(r)
    fig, axes = plt.subplots(1, len(runs), figsize=(5.5 * len(runs), 4), squeeze=False)
    for ax, r in zip(axes[0], runs):
        for s in r["servers"]:
            loads = [p["load_percent"] for p in s["points"]]
            style = "--" if s["name"] == "stand-in" else "-"
            ax.plot(loads, [p["p50_ms"] for p in s["points"]], style, marker="o", label=f'{s["name"]} p50')
            ax.plot(loads, [p["p99_ms"] for p in s["points"]], style, marker="^", label=f'{s["name"]} p99')
        title = r["workload"] + (f' (kv {r["kv"]})' if r["workload"] == "decode" else "")
        ax.set_title(f'{title}, {r["clients"]} clients')
        ax.set_xlabel("offered load, % of the stand-in's saturation")
        ax.set_ylabel("latency from arrival, ms")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"serve_chart.py: wrote {out}")


if __name__ == "__main__":
    main()
