#!/usr/bin/env python3
"""The error 8-bit K/V caches add to the attention output (docs/design.md, "8-bit K and V").

Decode-shaped attention (B=1, 8 kv heads, 32 query heads, 4096 keys, D=128, one query per head),
native backend, K/V quantized with simdattn.quantize_kv, against the same call on the f32 K/V:
max and mean |out - out_f32| / max|out_f32| over 4 seeds. Two K/V distributions: standard normal,
and normal with outlier channels (8 of the 128 channels of K and V scaled by 20, as LLM keys have).
With --per-channel-k, also int8 keys quantized per channel (one scale per channel of a kv head
over all its keys, KIVI's granularity for K), simulated in NumPy, for comparison.

  PYTHONPATH=build/python python3 scripts/figures/kv_codes_error.py [--per-channel-k]
"""
import sys

import numpy as np

import simdattn

H, HKV, SK, D = 32, 8, 4096, 128


def inputs(rng, outliers):
    q = rng.standard_normal((1, H, 1, D)).astype(np.float32)
    k = rng.standard_normal((1, HKV, SK, D)).astype(np.float32)
    v = rng.standard_normal((1, HKV, SK, D)).astype(np.float32)
    if outliers:
        ch = rng.choice(D, 8, replace=False)
        k[..., ch] *= 20.0
        v[..., ch] *= 20.0
    return q, k, v


def per_channel_int8(k):
    s = (np.abs(k).max(axis=2, keepdims=True) / np.float32(127)).astype(np.float32)
    return (np.clip(np.rint(k / np.where(s == 0, 1, s)), -127, 127) * s).astype(np.float32)


def main():
    per_channel = "--per-channel-k" in sys.argv
    print("| K/V | dtype | max rel. error | mean rel. error |")
    print("|---|---|---|---|")
    for outliers in (False, True):
        rows = {}
        for seed in range(4):
            rng = np.random.default_rng(100 + seed)
            q, k, v = inputs(rng, outliers)
            ref = simdattn.attention(q, k, v)
            scale = np.abs(ref).max()
            for fmt in ("int8", "fp8_e4m3", "fp8_e5m2"):
                kc, ks = simdattn.quantize_kv(k, fmt)
                vc, vs = simdattn.quantize_kv(v, fmt)
                out = simdattn.attention(q, kc, vc, k_scale=ks, v_scale=vs, kv_dtype=fmt)
                rows.setdefault(fmt, []).append(np.abs(out - ref) / scale)
            if per_channel:
                vc, vs = simdattn.quantize_kv(v, "int8")
                vh = simdattn.dequantize_kv(vc, vs, "int8")
                out = simdattn.attention(q, per_channel_int8(k), vh)
                rows.setdefault("int8, K per channel", []).append(np.abs(out - ref) / scale)
        for fmt, errs in rows.items():
            e = np.concatenate([x.ravel() for x in errs])
            print(f"| {'outlier channels' if outliers else 'standard normal'} | {fmt} | {e.max():.2e} | {e.mean():.2e} |")


if __name__ == "__main__":
    main()
