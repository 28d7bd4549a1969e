#!/usr/bin/env python3
"""The KV pool's serving runs as one chart, from `simdattn_serve_bench pool|prefill|memory --json`
files (or one file whose "runs" lists them): decode tokens/s of the streams alone, as one pool step and through the PoolScheduler (one
group per pool run), the streams' p99 step latency without and with a prompt joining (one group
per prefill run), and the bytes of the memory run against its tokens and 4096-token slabs.

  python3 scripts/figures/pool_chart.py OUT.png RUN.json [RUN.json ...]
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def bars(ax, groups, names, title, ylabel):
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        xs = [g + (i - (len(names) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [values[i] for _, values in groups], width, label=name)
    ax.set_xticks(range(len(groups)), [label for label, _ in groups], fontsize=8)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, files = sys.argv[1], sys.argv[2:]
    runs = {"pool": [], "prefill": [], "memory": []}
    for f in files:
        with open(f) as fh:
            r = json.load(fh)
        for one in r["runs"] if "runs" in r else [r]:  # a run, or a file collecting runs
            if one.get("mode") not in runs:
                sys.exit(f"pool_chart.py: {f} holds a run that is not a serve_bench pool, prefill or memory run")
            runs[one["mode"]].append(one)
    panels = [m for m in runs if runs[m]]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, mode in zip(axes[0], panels):
        if mode == "pool":
            groups = [(f'{r["streams"]} x kv {r["kv"]}', (r["alone_best"], r["pool_best"], r["scheduler_best"]))
                      for r in sorted(runs[mode], key=lambda r: (r["streams"], r["kv"]))]
            bars(ax, groups, ["each alone", "one pool step", "PoolScheduler"], "decode streams", "tokens/s (best)")
        elif mode == "prefill":
            groups = [(f'run {i + 1}: prompt at {100 * r["prompt_alone"] / r["prompt_beside"]:.0f}%',
                       (1e3 * r["p99_without"], 1e3 * r["p99_with"])) for i, r in enumerate(runs[mode])]
            bars(ax, groups, ["without the prompt", f'a {runs[mode][0]["prompt"]}-token prompt joining'],
                 f'{runs[mode][0]["streams"]} streams\' p99 step', "ms")
        else:
            groups = [(f'{r["sequences"]} seqs, {r["tokens"]} tokens',
                       (r["token_bytes"] / 2**20, r["pool_bytes"] / 2**20, r["slab_bytes"] / 2**20))
                      for r in runs[mode]]
            bars(ax, groups, ["their tokens", "KV pool", "4096-token slabs"], "K/V memory", "MiB")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
