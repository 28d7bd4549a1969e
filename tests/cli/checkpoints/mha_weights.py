#!/usr/bin/env python3
"""Writes multi-head attention weights as safetensors with NumPy only, and computes the layer in
float64 from first principles (torch.nn.MultiheadAttention semantics, batch_first).

    python3 mha_weights.py OUT.safetensors D_MODEL HEADS [--kv-heads N] [--hf] [--prefix P]

Also the float64 definitions both CLI suites share: RoPE, T5's relative position bucket and
ALiBi's slopes. Used by tests/cli/test_cli.py, test_cli_commands.py and model_families.py; also runnable by hand to make a
weights file for `simdattn mha`.
"""
import json
import struct
import sys

import numpy as np


def write_safetensors(path, tensors, metadata=None):
    """tensors: {name: np.ndarray (float16, float32 or float64), or ("BF16", uint16 bits)}; C order,
    little-endian."""
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, a in tensors.items():
        if isinstance(a, tuple):
            dtype, a = a[0], np.ascontiguousarray(a[1])
        else:
            a = np.ascontiguousarray(a)
            dtype = {np.dtype("<f2"): "F16", np.dtype("<f4"): "F32", np.dtype("<f8"): "F64"}[a.dtype.newbyteorder("<")]
        raw = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def make_weights(rng, d, heads, kv_heads=None, hf=False, kdim=None, vdim=None, prefix="", dtype=np.float32):
    """Random weights under one naming convention; returns (tensors, w) where w holds the four
    matrices and biases for mha_reference."""
    kv_heads = kv_heads or heads
    hd = d // heads
    kdim, vdim = kdim or d, vdim or d
    s = 1.0 / np.sqrt(d)
    w = {
        "wq": rng.normal(0, s, (heads * hd, d)), "wk": rng.normal(0, s, (kv_heads * hd, kdim)),
        "wv": rng.normal(0, s, (kv_heads * hd, vdim)), "wo": rng.normal(0, s, (d, heads * hd)),
        "bq": rng.normal(0, 0.1, heads * hd), "bk": rng.normal(0, 0.1, kv_heads * hd),
        "bv": rng.normal(0, 0.1, kv_heads * hd), "bo": rng.normal(0, 0.1, d),
    }
    w = {k: v.astype(dtype) for k, v in w.items()}
    p = prefix
    if hf:
        t = {p + "q_proj.weight": w["wq"], p + "q_proj.bias": w["bq"], p + "k_proj.weight": w["wk"],
             p + "k_proj.bias": w["bk"], p + "v_proj.weight": w["wv"], p + "v_proj.bias": w["bv"],
             p + "o_proj.weight": w["wo"], p + "o_proj.bias": w["bo"]}
    elif kdim == d and vdim == d:
        t = {p + "in_proj_weight": np.concatenate([w["wq"], w["wk"], w["wv"]]),
             p + "in_proj_bias": np.concatenate([w["bq"], w["bk"], w["bv"]]),
             p + "out_proj.weight": w["wo"], p + "out_proj.bias": w["bo"]}
    else:
        t = {p + "q_proj_weight": w["wq"], p + "k_proj_weight": w["wk"], p + "v_proj_weight": w["wv"],
             p + "in_proj_bias": np.concatenate([w["bq"], w["bk"], w["bv"]]),
             p + "out_proj.weight": w["wo"], p + "out_proj.bias": w["bo"]}
    return t, {k: v.astype(np.float64) for k, v in w.items()}


def bf16_bits(x):
    """float array -> the bits of its bf16 rounding (nearest even), by bit manipulation."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF).astype(np.uint16)


def to_bf16(x):
    """float array -> its bf16 rounding, as float64 (through f32, as NumPy's f32 values are)."""
    return (bf16_bits(x).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def rope_reference(x, positions, theta=10000.0, rotary_dim=None, style="half", scaling="none", factor=1.0,
                   low=1.0, high=4.0, original=8192, beta_fast=32.0, beta_slow=1.0, truncate=True,
                   attention_factor=None):
    """Rotary embeddings of x [B, H, S, hd] at positions [B, S], in float64, from their definition
    (Su et al.; Hugging Face's rotate_half and linear / llama3 / yarn frequency scaling; YaRN from
    Peng et al. as Hugging Face's _compute_yarn_parameters states it: the ramp between the
    correction dimensions of beta_fast and beta_slow, cos and sin times the attention factor)."""
    x = np.array(x, dtype=np.float64)
    hd = x.shape[-1]
    r = hd if not rotary_dim else rotary_dim
    inv = theta ** (-np.arange(0, r, 2, dtype=np.float64) / r)
    mult = 1.0
    if scaling == "linear":
        inv = inv / factor
    elif scaling == "llama3":
        wave = 2 * np.pi / inv
        smooth = (original / wave - low) / (high - low)
        blended = (1 - smooth) * inv / factor + smooth * inv
        inv = np.where(wave > original / low, inv / factor, np.where(wave < original / high, inv, blended))
    elif scaling == "yarn":
        corr = lambda b: r * np.log(original / (b * 2 * np.pi)) / (2 * np.log(theta))  # noqa: E731
        lo, hi = corr(beta_fast), corr(beta_slow)
        if truncate:
            lo, hi = np.floor(lo), np.ceil(hi)
        lo, hi = max(lo, 0), min(hi, r - 1)
        if lo == hi:
            hi += 0.001
        keep = 1 - np.clip((np.arange(r // 2) - lo) / (hi - lo), 0, 1)  # the extrapolation's share
        inv = inv / factor * (1 - keep) + inv * keep
        mult = attention_factor if attention_factor else (1.0 if factor <= 1 else 0.1 * np.log(factor) + 1)
    a = np.asarray(positions, dtype=np.float64)[:, None, :, None] * inv  # [B, 1, S, r/2]
    c, s = np.cos(a) * mult, np.sin(a) * mult
    if style == "half":
        i0, i1 = np.arange(r // 2), np.arange(r // 2) + r // 2
    else:
        i0, i1 = np.arange(0, r, 2), np.arange(1, r, 2)
    x0, x1 = x[..., i0].copy(), x[..., i1].copy()
    x[..., i0] = x0 * c - x1 * s
    x[..., i1] = x1 * c + x0 * s
    return x


def t5_bucket(rel, bidirectional, num_buckets, max_distance):
    """T5's relative position bucket, from Hugging Face's definition (float32 log, truncated)."""
    rel = np.asarray(rel, dtype=np.int64)
    bucket = np.zeros_like(rel)
    n = num_buckets
    if bidirectional:
        n //= 2
        bucket += (rel > 0).astype(np.int64) * n
        rel = np.abs(rel)
    else:
        rel = -np.minimum(rel, 0)
    max_exact = n // 2
    with np.errstate(divide="ignore"):
        large = max_exact + (np.log(np.maximum(rel, 1).astype(np.float32) / np.float32(max_exact))
                             / np.float32(np.log(max_distance / max_exact))
                             * np.float32(n - max_exact)).astype(np.int64)
    large = np.minimum(large, n - 1)
    return bucket + np.where(rel < max_exact, rel, large)


def alibi_slopes(H):
    """Press et al.'s slopes as BLOOM builds them (float32 bases and powers)."""
    n = 2 ** int(np.floor(np.log2(H)))
    base = np.float32(2.0 ** (-8.0 / n))
    slopes = [np.float32(base ** np.float32(k)) for k in range(1, n + 1)]
    extra = np.float32(2.0 ** (-4.0 / n))
    k = 1
    while len(slopes) < H:
        slopes.append(np.float32(extra ** np.float32(k)))
        k += 2
    return np.array(slopes, dtype=np.float32)


def mha_reference(w, heads, xq, xk=None, xv=None, causal="none", key_padding_mask=None, rnd=None, rope=None):
    """float64: projections, heads, stable softmax with -inf masking, output projection. rnd: a
    bf16/f16 layer's rounding of its activations (the projections and the attention output)."""
    rnd = rnd or (lambda a: a)
    xq = np.asarray(xq, np.float64)
    xk = xq if xk is None else np.asarray(xk, np.float64)
    xv = xq if xv is None else np.asarray(xv, np.float64)
    B, Sq, _ = xq.shape
    Sk = xk.shape[1]
    q = rnd(xq @ w["wq"].T + w["bq"])
    k = rnd(xk @ w["wk"].T + w["bk"])
    v = rnd(xv @ w["wv"].T + w["bv"])
    hd = q.shape[-1] // heads
    kv_heads = k.shape[-1] // hd
    q = q.reshape(B, Sq, heads, hd).transpose(0, 2, 1, 3)
    k = k.reshape(B, Sk, kv_heads, hd).transpose(0, 2, 1, 3)
    if rope is not None:  # {positions: [B, S], and rope_reference's keywords}
        kw = dict(rope)
        pos = kw.pop("positions", np.broadcast_to(np.arange(Sq), (B, Sq)))
        q, k = rope_reference(q, pos, **kw), rope_reference(k, pos, **kw)
    k = np.repeat(k, heads // kv_heads, axis=1)
    v = np.repeat(v.reshape(B, Sk, kv_heads, hd).transpose(0, 2, 1, 3), heads // kv_heads, axis=1)
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd)
    visible = np.ones((B, heads, Sq, Sk), dtype=bool)
    if causal != "none":
        off = 0 if causal == "top-left" else Sk - Sq
        visible &= np.arange(Sk)[None, :] <= np.arange(Sq)[:, None] + off
    if key_padding_mask is not None:
        visible &= ~np.asarray(key_padding_mask, dtype=bool)[:, None, None, :]
    s = np.where(visible, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.where(visible, np.exp(s - np.where(np.isfinite(m), m, 0.0)), 0.0)
    l = e.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        o = np.where(l > 0, (e @ v) / l, 0.0)
    o = rnd(o.transpose(0, 2, 1, 3).reshape(B, Sq, heads * hd))
    return rnd(o @ w["wo"].T + w["bo"])


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("d_model", type=int)
    ap.add_argument("heads", type=int)
    ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--hf", action="store_true")
    ap.add_argument("--prefix", default="")
    a = ap.parse_args()
    tensors, _ = make_weights(np.random.default_rng(0), a.d_model, a.heads, a.kv_heads, a.hf, prefix=a.prefix)
    write_safetensors(a.out, tensors)
