#!/usr/bin/env python3
"""Decode shapes against their roofline, and the paged key source against the dense one, from one run
of simdattn_perf (perf/suite/bench_decode.cpp's rows; docs/performance.md, "Decode shapes"):

    build/perf/simdattn_perf --benchmark_filter='^(attention/native/.*-decode.*/t(1|2)|attention/native/chunk512-.*/t2|attention/native/(paged-)?decode(\\.bf16|\\.int8)?/t2|peak/fma/t2)$' \\
        --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true --benchmark_format=json > run.json
    python3 perf/suite/decode_roofline.py run.json

A decode shape's roofline is max(its K/V bytes / the GB/s the plain H = Hkv decode of the same
dtype reaches in the same run, its FLOPs 2 H L (D + Dv) / (0.4 x peak/fma/t2)): grouped heads
multiply the FLOPs per byte, so each shape is held to whichever bound applies. Printed: each
shape's best time, its roofline and their ratio (>= 0.8 is the target); the single-sequence MQA
step's speed-up from 1 to 2 threads; a 512-token chunk over blocks of 16 against the same keys
dense; the paged decode step against the dense one. Of several repetitions the best is kept.
"""
import json
import sys

# name: (H, Hkv, keys, D, Dv, the plain decode of the same bytes)
SHAPES = {
    "gqa4": (32, 8, 16384, 128, 128, "mha8"),
    "gqa8": (64, 8, 16384, 128, 128, "mha8"),
    "mqa": (32, 1, 131072, 128, 128, "mha1"),
    "mla16": (16, 1, 8192, 576, 512, "mla1"),
    "mla128": (128, 1, 8192, 576, 512, "mla1"),
    "mla128k4": (128, 1, 4096, 576, 512, "mla1k4"),
}
DTYPES = {"f32": "", "bf16": ".bf16", "int8": ".int8"}
TARGET = 0.8


def load(path):
    with open(path) as f:
        doc = json.load(f)
    best = {}  # name -> (wall ms, counters)
    for b in doc["benchmarks"]:
        if b.get("run_type") == "aggregate":
            continue
        name = b["name"]
        ms = b.get("wall_ms", b["real_time"])
        if name not in best or ms < best[name][0]:
            best[name] = (ms, b)
    return best


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    best = load(argv[1])
    ms = lambda name: best[name][0] if name in best else None
    peak = best.get("peak/fma/t2")
    if peak is None:
        print("no peak/fma/t2 in the run", file=sys.stderr)
        return 2
    flops_rate = 0.4 * peak[1]["GFLOP/s"] * 1e9  # FLOP/s
    print(f"peak/fma/t2 {peak[1]['GFLOP/s']:.1f} GFLOP/s; compute bound at 0.4 x that = {flops_rate / 1e9:.1f} GFLOP/s")
    print(f"{'shape':<18} {'ms':>8} {'bytes ms':>9} {'flops ms':>9} {'roofline':>9} {'share':>6}")
    failed = 0
    for shape, (H, Hkv, L, D, Dv, plain) in SHAPES.items():
        for dtype, suffix in DTYPES.items():
            name = f"attention/native/{shape}-decode{suffix}/t2"
            ref = f"attention/native/{plain}-decode{suffix}/t2"
            if ms(name) is None or ms(ref) is None:
                continue
            # the same K/V bytes as the plain decode: its time is the bytes' time at its rate
            t_bytes = ms(ref)
            t_flops = 2.0 * H * L * (D + Dv) / flops_rate * 1e3
            roof = max(t_bytes, t_flops)
            share = roof / ms(name)
            failed += share < TARGET
            print(f"{shape + '.' + dtype:<18} {ms(name):8.3f} {t_bytes:9.3f} {t_flops:9.3f} {roof:9.3f} {share:6.2f}"
                  f"{'' if share >= TARGET else '  < ' + str(TARGET)}")
    for shape in ("mqa32k", "mla128k4"):
        for suffix in ("", ".bf16"):
            t1, t2 = ms(f"attention/native/{shape}-decode{suffix}/t1"), ms(f"attention/native/{shape}-decode{suffix}/t2")
            if t1 and t2:
                print(f"{shape}-decode{suffix}: 2 threads {t1 / t2:.2f}x the speed of 1 (target >= 1.8)")
    for suffix in ("", ".bf16"):
        d, p = ms(f"attention/native/chunk512-dense{suffix}/t2"), ms(f"attention/native/chunk512-paged16{suffix}/t2")
        if d and p:
            print(f"chunk512{suffix}: paged in blocks of 16 {d / p:.2f}x the speed of dense (target >= 0.9; bf16 on tiles >= 0.85)")
    for suffix in ("", ".bf16", ".int8"):
        d, p = ms(f"attention/native/decode{suffix}/t2"), ms(f"attention/native/paged-decode{suffix}/t2")
        if d and p:
            print(f"paged-decode{suffix}: {p / d:.3f}x the time of decode (target <= 1.05)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
