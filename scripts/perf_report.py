#!/usr/bin/env python3
"""Read simdattn_perf's Google Benchmark JSON: tables, before/after ratios, a chart.

    build/perf/simdattn_perf --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true \
        --benchmark_format=json > run.json
    python3 scripts/perf_report.py table run.json
    python3 scripts/perf_report.py diff before.json after.json
    python3 scripts/perf_report.py plot run.json --out docs/perf-attention.png [--threads 2] [--op attention]

Benchmark names are <op>/<backend>/<workload>/t<threads>; every run also holds peak/fma/t<N> and
bandwidth/read/t<N>, the machine's limits measured in the same process. Of several repetitions
the best (highest GFLOP/s or GB/s) is kept: on a shared VM the slower ones measure the
neighbours. The spread of the repetitions is kept too, as the noise estimate for `diff`.

table  one block per (op, workload, threads): each backend's time, throughput, % of the run's
       limit (peak/fma for GFLOP/s, bandwidth/read for GB/s) and its ratio to the best other
       backend (> 1: faster than every other backend).
diff   per benchmark: after / before throughput (> 1: faster now), marked as noise when within
       the larger of the two runs' repetition spreads and the machine limits' drift.
plot   a PNG: GFLOP/s per workload per backend at one thread count, with the run's FMA peak as
       a horizontal line (needs python3-matplotlib).
"""
import argparse
import json
import statistics
import sys

LIMITS = ("peak", "bandwidth")
DEFAULT_NOISE = 0.10  # assumed when a run has one repetition per benchmark


class Bench:
    def __init__(self, name):
        self.name = name
        parts = name.split("/")
        self.op = parts[0]
        self.backend = parts[1] if len(parts) == 4 else ""
        self.workload = parts[2] if len(parts) == 4 else parts[1] if len(parts) == 3 else ""
        self.threads = parts[-1]
        self.values = []  # throughput of each repetition
        self.times = []   # wall ms of each repetition
        self.unit = None

    @property
    def best(self):
        return max(self.values)

    @property
    def best_ms(self):
        return self.times[self.values.index(self.best)]

    @property
    def spread(self):
        """Relative spread of the repetitions ((max - min) / median), None for one repetition."""
        if len(self.values) < 2:
            return None
        return (max(self.values) - min(self.values)) / statistics.median(self.values)


def load(path):
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"perf_report: {path}: cannot read Google Benchmark JSON: {e}")
    if not isinstance(data, dict) or "benchmarks" not in data:
        sys.exit(f"perf_report: {path}: not Google Benchmark JSON (no 'benchmarks' list)")
    benches = {}
    for b in data["benchmarks"]:
        if b.get("run_type", "iteration") != "iteration":
            continue  # aggregates (mean, median, stddev) are recomputed here
        unit = "GFLOP/s" if "GFLOP/s" in b else "GB/s" if "GB/s" in b else None
        if unit is None or "wall_ms" not in b:
            continue
        name = b.get("run_name", b["name"])
        bench = benches.setdefault(name, Bench(name))
        bench.unit = unit
        bench.values.append(float(b[unit]))
        bench.times.append(float(b["wall_ms"]))
    if not benches:
        sys.exit(f"perf_report: {path}: no simdattn benchmarks with a GFLOP/s or GB/s counter")
    return benches


def limit_of(benches, bench):
    key = ("peak/fma/" if bench.unit == "GFLOP/s" else "bandwidth/read/") + bench.threads
    lim = benches.get(key)
    return lim.best if lim else None


def cmd_table(args):
    benches = load(args.run)
    print("machine limits (same run):")
    for name in sorted(n for n in benches if n.startswith(LIMITS)):
        b = benches[name]
        print(f"  {name:24s} {b.best:10.1f} {b.unit}")
    groups = {}
    for b in benches.values():
        if b.op in LIMITS:
            continue
        groups.setdefault((b.op, b.workload, b.threads), []).append(b)
    for (op, workload, threads), members in groups.items():
        print(f"\n{op} {workload} {threads}")
        print(f"  {'backend':10s} {'ms':>10s} {'throughput':>16s} {'% limit':>8s} {'vs best other':>14s}")
        for b in members:
            lim = limit_of(benches, b)
            pct = f"{100 * b.best / lim:7.1f}%" if lim else "       -"
            others = [o.best for o in members if o is not b]
            ratio = f"{b.best / max(others):13.2f}x" if others else "             -"
            print(f"  {b.backend:10s} {b.best_ms:10.3f} {b.best:10.1f} {b.unit:5s} {pct:>8s} {ratio}")


def cmd_diff(args):
    before, after = load(args.before), load(args.after)
    common = [n for n in after if n in before]
    if not common:
        sys.exit("perf_report: the two runs share no benchmark names")
    spreads = [b.spread for run in (before, after) for b in run.values() if b.spread is not None]
    rep_noise = statistics.median(spreads) if spreads else DEFAULT_NOISE
    drift = [abs(after[n].best / before[n].best - 1) for n in common if n.startswith(LIMITS)]
    noise = max([rep_noise] + drift)
    print(f"{'benchmark':42s} {'before':>10s} {'after':>10s} {'after/before':>13s}")
    for n in common:
        b, a = before[n], after[n]
        ratio = a.best / b.best
        own = max([s for s in (a.spread, b.spread) if s is not None] + [noise])
        mark = "  (noise)" if abs(ratio - 1) <= own else ("  faster" if ratio > 1 else "  slower")
        print(f"{n:42s} {b.best:10.1f} {a.best:10.1f} {ratio:12.3f}x{mark}")
    only = sorted(set(before) ^ set(after))
    if only:
        print(f"\nin one run only: {', '.join(only)}")
    print(f"\nnoise: ratios within +-{100 * noise:.0f}% are marked (noise): the median spread of "
          f"repetitions ({100 * rep_noise:.0f}%{'' if spreads else ', assumed: one repetition each'})"
          f" or the drift of the machine limits between the runs, whichever is larger, and a "
          f"benchmark's own spread if larger still. Throughputs: best repetition.")


def cmd_plot(args):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("perf_report: plot needs matplotlib (Debian: apt-get install python3-matplotlib)")
    benches = load(args.run)
    t = f"t{args.threads}"
    chosen = [b for b in benches.values() if b.op == args.op and b.threads == t and b.unit == "GFLOP/s"]
    if not chosen:
        sys.exit(f"perf_report: no {args.op}/<backend>/<workload>/{t} benchmarks with GFLOP/s in {args.run}")
    workloads = list(dict.fromkeys(b.workload for b in chosen))
    backends = list(dict.fromkeys(b.backend for b in chosen))
    peak = benches.get(f"peak/fma/{t}")
    width = 0.8 / len(backends)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(workloads) + 2), 4.5))
    for i, be in enumerate(backends):
        xs, ys = [], []
        for x, w in enumerate(workloads):
            b = benches.get(f"{args.op}/{be}/{w}/{t}")
            if b:
                xs.append(x + (i - (len(backends) - 1) / 2) * width)
                ys.append(b.best)
        bars = ax.bar(xs, ys, width, label=be)
        ax.bar_label(bars, fmt="%.0f", fontsize=7, padding=1)
    if peak:
        ax.axhline(peak.best, color="black", linestyle="--", linewidth=1)
        ax.text(len(workloads) - 0.5, peak.best, f"FMA peak {peak.best:.0f} GFLOP/s (peak/fma/{t})",
                ha="right", va="bottom", fontsize=8)
    ax.set_xticks(range(len(workloads)))
    ax.set_xticklabels(workloads)
    ax.set_ylabel("GFLOP/s (causal: visible pairs only)")
    ax.set_title(args.title or f"simdattn {args.op}, fp32, {args.threads} thread(s), best of repetitions")
    ax.legend(loc="upper left", ncol=len(backends))
    ax.set_ylim(0, max([b.best for b in chosen] + ([peak.best] if peak else [])) * 1.25)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"perf_report: wrote {args.out}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("table", help="per-workload table of one run")
    t.add_argument("run")
    d = sub.add_parser("diff", help="after / before ratios of two runs")
    d.add_argument("before")
    d.add_argument("after")
    g = sub.add_parser("plot", help="PNG chart of GFLOP/s per workload and backend")
    g.add_argument("run")
    g.add_argument("--out", required=True)
    g.add_argument("--threads", type=int, default=2)
    g.add_argument("--op", default="attention")
    g.add_argument("--title")
    args = p.parse_args()
    {"table": cmd_table, "diff": cmd_diff, "plot": cmd_plot}[args.cmd](args)


if __name__ == "__main__":
    main()
