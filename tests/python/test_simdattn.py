"""The Python module `simdattn` against independent float64 oracles (torch and NumPy).

Run:  PYTHONPATH=build/python /usr/bin/python3 -m pytest -q tests/python
(ctest registers it as the test `python`). Needs numpy, torch (1.13: no
F.scaled_dot_product_attention, so the oracle is written with plain torch ops) and pytest.
"""
import math
import sys
import os
import threading
import time

import numpy as np
import pytest
import torch

import simdattn

torch.set_num_threads(1)  # the suite runs on small problems; keep torch from fighting OpenMP

DTYPES = ["float32", "float64", "float16", "bf16"]
BACKENDS = ["native", "reference"]
# (rtol, atol) of each dtype's output against the float64 oracle on the same (rounded) inputs.
TOL = {"float32": (2e-5, 2e-5), "float64": (1e-12, 1e-12), "float16": (2e-3, 2e-3), "bf16": (2e-2, 2e-2)}


# ---- oracles ---------------------------------------------------------------------------------

def t5_bucket(relative_position, bidirectional, num_buckets, max_distance):
    """Hugging Face transformers' T5Attention._relative_position_bucket (relative = key - query)."""
    relative_buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        relative_buckets += (relative_position > 0).to(torch.long) * num_buckets
        relative_position = torch.abs(relative_position)
    else:
        relative_position = -torch.min(relative_position, torch.zeros_like(relative_position))
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    relative_position_if_large = max_exact + (
        torch.log(relative_position.float() / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).to(torch.long)
    relative_position_if_large = torch.min(
        relative_position_if_large, torch.full_like(relative_position_if_large, num_buckets - 1))
    relative_buckets += torch.where(is_small, relative_position, relative_position_if_large)
    return relative_buckets


def torch_oracle(q, k, v, *, mask=None, causal=None, scale=None, window=None, key_lengths=None, softcap=None,
                 alibi_slopes=None, relative_bias=None, relative_bias_bidirectional=True,
                 relative_bias_max_distance=128, sinks=None, query_offsets=None):
    """Attention in float64 with torch ops, following attention.hpp's header.

    Returns a dict: out [B,H,Sq,Dv], lse [B,H,Sq,1], and the score stages scaled, capped,
    biased (-inf at hidden keys) and softmax (the weights; the sink's share left out).
    """
    q = torch.from_numpy(np.array(q, dtype=np.float64))  # copies (inputs may be read-only views)
    k = torch.from_numpy(np.array(k, dtype=np.float64))
    v = torch.from_numpy(np.array(v, dtype=np.float64))
    B, H, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    group = H // Hkv
    k = k.repeat_interleave(group, dim=1)  # query head h reads kv head h // group
    v = v.repeat_interleave(group, dim=1)
    sc = 1.0 / math.sqrt(D) if scale is None else float(scale)
    scaled = torch.matmul(q, k.transpose(-1, -2)) * sc
    s = scaled
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    capped = s
    L = torch.tensor(list(key_lengths) if key_lengths is not None else [Sk] * B, dtype=torch.long)
    mode = causal if isinstance(causal, str) else ("top_left" if causal else "none")
    if query_offsets is not None:
        offset = torch.tensor(list(query_offsets), dtype=torch.long)
    elif mode == "top_left":
        offset = torch.zeros(B, dtype=torch.long)
    else:
        offset = L - Sq
    pos = torch.arange(Sq).view(1, 1, Sq, 1) + offset.view(B, 1, 1, 1)  # p = i + offset
    j = torch.arange(Sk).view(1, 1, 1, Sk)
    rel = j - pos  # [B, 1, Sq, Sk]
    if alibi_slopes is not None:
        slopes = torch.tensor(np.asarray(alibi_slopes, dtype=np.float32).astype(np.float64))
        s = s + slopes.view(1, H, 1, 1) * rel
    if relative_bias is not None:
        table = torch.from_numpy(np.asarray(relative_bias, dtype=np.float64).reshape(-1, H))
        bucket = t5_bucket(rel, relative_bias_bidirectional, table.shape[0], relative_bias_max_distance)
        s = s + table[bucket.squeeze(1)].permute(0, 3, 1, 2)  # [B, Sq, Sk, H] -> [B, H, Sq, Sk]
    visible = (j < L.view(B, 1, 1, 1)).expand(B, 1, Sq, Sk)
    if mode in ("top_left", "bottom_right"):
        visible = visible & (j <= pos)
    if window is not None:
        left, right = window
        if left >= 0:
            visible = visible & (j >= pos - left)
        if right >= 0:
            visible = visible & (j <= pos + right)
    if mask is not None:
        m = np.asarray(mask)
        mt = torch.from_numpy(m.astype(np.float64))
        while mt.dim() < 4:
            mt = mt.unsqueeze(0)
        if m.dtype in (np.bool_, np.uint8):
            visible = visible & (mt != 0)
        else:
            s = s + mt
    visible = visible.expand(B, H, Sq, Sk)
    biased = torch.where(visible, s, torch.tensor(-math.inf, dtype=torch.float64))
    logits = biased
    if sinks is not None:
        sink = torch.tensor(np.asarray(sinks, dtype=np.float32).astype(np.float64)).view(1, H, 1, 1)
        logits = torch.cat([biased, sink.expand(B, H, Sq, 1)], dim=-1)
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)
    empty = torch.isneginf(lse)
    w = torch.where(empty, torch.zeros_like(biased), torch.exp(biased - torch.where(empty, 0.0, lse)))
    out = torch.matmul(w, v)
    return {"out": out.numpy(), "lse": lse.numpy(), "scaled": scaled.numpy(), "capped": capped.numpy(),
            "biased": biased.numpy(), "softmax": w.numpy()}


def numpy_oracle(q, k, v, *, causal=None, mask=None, key_lengths=None, alibi_slopes=None, sinks=None, scale=None):
    """A second, loop-per-(batch, head, row) oracle in NumPy float64 (a subset of the options)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    B, H, Sq, D = q.shape
    Hkv, Sk, Dv = k.shape[1], k.shape[2], v.shape[3]
    sc = 1.0 / np.sqrt(D) if scale is None else scale
    m = None if mask is None else np.broadcast_to(np.asarray(mask).reshape((1,) * (4 - np.ndim(mask)) +
                                                                         np.shape(mask)), (B, H, Sq, Sk))
    out = np.zeros((B, H, Sq, Dv))
    for b in range(B):
        Lb = Sk if key_lengths is None else key_lengths[b]
        off = 0 if causal in (True, "top_left") else Lb - Sq
        for h in range(H):
            kh = h // (H // Hkv)
            for i in range(Sq):
                p = i + off
                logits, vals = [], []
                for jj in range(Lb):
                    if causal in (True, "top_left", "bottom_right") and jj > p:
                        continue
                    x = sc * float(np.dot(q[b, h, i], k[b, kh, jj]))
                    if alibi_slopes is not None:
                        x += float(np.float32(alibi_slopes[h])) * (jj - p)
                    if m is not None:
                        if m.dtype == np.bool_:
                            if not m[b, h, i, jj]:
                                continue
                        else:
                            x += float(m[b, h, i, jj])
                    logits.append(x)
                    vals.append(v[b, kh, jj])
                if not logits or max(logits) == -np.inf:
                    continue
                all_logits = logits + ([float(np.float32(sinks[h]))] if sinks is not None else [])
                mx = max(all_logits)
                e = np.exp(np.array(all_logits) - mx)
                wts = e[:len(logits)] / e.sum()
                out[b, h, i] = wts @ np.array(vals)
    return out


def bf16_round(x):
    """float32 -> bfloat16 (nearest even) -> float64, as the module rounds dtype='bf16' inputs."""
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(torch.bfloat16).to(torch.float64).numpy()


def as_dtype(x, dtype):
    """(array to pass, float64 array the oracle sees) for a float64 array `x` and a test dtype."""
    if dtype == "bf16":
        x32 = x.astype(np.float32)
        return x32, bf16_round(x32)
    a = x.astype(dtype)
    return a, a.astype(np.float64)


def call_kwargs(dtype):
    return {"dtype": "bf16"} if dtype == "bf16" else {}


def out_dtype(dtype):
    return np.float32 if dtype == "bf16" else np.dtype(dtype)


# ---- random cases ----------------------------------------------------------------------------

FEATURES = [
    "plain", "gqa", "mqa", "scale", "causal_true", "causal_top_left", "causal_bottom_right", "window",
    "window_causal", "key_lengths", "key_lengths_bottom_right", "query_offsets", "bool_mask", "uint8_mask",
    "additive_mask", "softcap", "alibi", "alibi_causal", "t5_bidirectional", "t5_unidirectional_causal", "sinks",
    "sinks_fully_masked", "everything",
]


def random_shape(rng, feature):
    B = int(rng.integers(1, 4))
    Hkv = int(rng.integers(1, 3))
    group = int(rng.integers(1, 4))
    if feature == "gqa":
        Hkv, group = 2, int(rng.integers(2, 4))
    if feature == "mqa":
        Hkv, group = 1, int(rng.integers(2, 5))
    H = Hkv * group
    Sq = int(rng.integers(1, 40))
    Sk = int(rng.integers(1, 48))
    D = int(rng.choice([1, 3, 8, 16, 24, 33, 64, 80]))
    Dv = int(rng.choice([D, 1, 5, 16, 40]))
    return B, H, Hkv, Sq, Sk, D, Dv


def random_mask_shape(rng, B, H, Sq, Sk):
    shapes = [(Sq, Sk), (B, 1, Sq, Sk), (B, H, Sq, Sk), (B, 1, 1, Sk), (1, H, Sq, Sk), (H, Sq, Sk), (1, 1, Sq, 1)]
    return shapes[int(rng.integers(len(shapes)))]


def make_case(seed, features):
    """Random float64 q, k, v and the keyword arguments of attention() for a feature or a set of them."""
    rng = np.random.default_rng(seed)
    feats = {features} if isinstance(features, str) else set(features)
    if "everything" in feats:
        feats = set(FEATURES) - {"plain", "everything", "causal_true", "mqa", "gqa", "uint8_mask", "additive_mask"}
    B, H, Hkv, Sq, Sk, D, Dv = random_shape(rng, "gqa" if "gqa" in feats else "mqa" if "mqa" in feats else "")
    q = rng.standard_normal((B, H, Sq, D))
    k = rng.standard_normal((B, Hkv, Sk, D))
    v = rng.standard_normal((B, Hkv, Sk, Dv))
    kw = {}
    want = feats.__contains__
    if want("scale"):
        kw["scale"] = float(rng.uniform(0.05, 0.6))
    if want("causal_true"):
        kw["causal"] = True
    if want("causal_top_left") or want("window_causal") or want("t5_unidirectional_causal"):
        kw["causal"] = "top_left"
    if want("causal_bottom_right") or want("key_lengths_bottom_right") or want("alibi_causal"):
        kw["causal"] = "bottom_right"
    if want("window") or want("window_causal"):
        kw["window"] = (int(rng.integers(-1, 6)), int(rng.integers(-1, 6)))
    if want("key_lengths") or want("key_lengths_bottom_right"):
        kl = [int(x) for x in rng.integers(0, Sk + 1, size=B)]
        if B > 1:
            kl[0] = 0  # a batch whose every row sees no key
        kw["key_lengths"] = kl
    if want("bool_mask") or want("uint8_mask"):
        m = rng.random(random_mask_shape(rng, B, H, Sq, Sk)) < 0.7
        m[..., 0, :] = False  # fully-masked rows
        kw["mask"] = m.astype(np.uint8) if want("uint8_mask") else m
    elif want("additive_mask"):
        m = rng.standard_normal(random_mask_shape(rng, B, H, Sq, Sk)).astype(np.float32)
        m[rng.random(m.shape) < 0.2] = -np.inf
        m[..., -1, :] = -np.inf  # a fully -inf row
        kw["mask"] = m
    if want("softcap"):
        kw["softcap"] = float(rng.uniform(0.5, 3.0))
    if want("alibi") or want("alibi_causal"):
        kw["alibi_slopes"] = simdattn.standard_alibi_slopes(H) if rng.random() < 0.5 else \
            rng.uniform(0.0, 0.7, size=H).astype(np.float32)
    if want("query_offsets"):
        kw["query_offsets"] = [int(x) for x in rng.integers(-4, Sk + 4, size=B)]
        kw["causal"] = True  # the offsets replace top_left's 0
        kw["alibi_slopes"] = rng.uniform(0.0, 0.5, size=H).astype(np.float32)
    if want("t5_bidirectional") or want("t5_unidirectional_causal"):
        nb = int(rng.choice([8, 16, 32]))
        bidirectional = want("t5_bidirectional")
        kw["relative_bias"] = rng.standard_normal((nb, H)).astype(np.float32)
        kw["relative_bias_bidirectional"] = bidirectional
        exact = nb // 4 if bidirectional else nb // 2
        kw["relative_bias_max_distance"] = int(rng.integers(exact + 1, 40))
    if want("sinks") or want("sinks_fully_masked"):
        kw["sinks"] = rng.uniform(-2.0, 2.0, size=H).astype(np.float32)
    if want("sinks_fully_masked"):
        kw["key_lengths"] = [0] + [int(x) for x in rng.integers(0, Sk + 1, size=B - 1)]
        kw["causal"] = True
    return q, k, v, kw


def check_attention(q64, k64, v64, kw, dtype, backend, *, check_lse=False):
    q, qo = as_dtype(q64, dtype)
    k, ko = as_dtype(k64, dtype)
    v, vo = as_dtype(v64, dtype)
    want = torch_oracle(qo, ko, vo, **kw)
    rtol, atol = TOL[dtype]
    res = simdattn.attention(q, k, v, backend=backend, return_lse=check_lse, **kw, **call_kwargs(dtype))
    out, lse = res if check_lse else (res, None)
    assert out.dtype == out_dtype(dtype)
    assert out.shape == want["out"].shape
    np.testing.assert_allclose(out.astype(np.float64), want["out"], rtol=rtol, atol=atol)
    if check_lse:
        assert lse.dtype == np.float32 and lse.shape == want["lse"].shape
        lse_tol = max(rtol, 2e-6)
        np.testing.assert_allclose(lse.astype(np.float64), want["lse"], rtol=lse_tol, atol=lse_tol)
    return want


# ---- attention vs the torch oracle -----------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("feature", FEATURES)
def test_attention_feature_vs_torch_oracle(feature, dtype, backend):
    seed = 1000 + FEATURES.index(feature) * 7 + DTYPES.index(dtype)
    q, k, v, kw = make_case(seed, feature)
    check_attention(q, k, v, kw, dtype, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(8))
def test_attention_random_combinations_vs_torch_oracle(seed, dtype, backend):
    rng = np.random.default_rng(seed + 77)
    features = [str(f) for f in rng.choice(FEATURES, size=int(rng.integers(2, 6)), replace=False)]
    q, k, v, kw = make_case(seed + 500, features)
    check_attention(q, k, v, kw, dtype, backend, check_lse=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 4, 2, 1, 300, 64, 64), (1, 4, 1, 70, 97, 128, 40), (1, 2, 2, 130, 130, 64, 64)],
                         ids=["decode", "gqa_tiles", "square"])
def test_attention_larger_shapes_vs_torch_oracle(shape, dtype, backend):
    """Shapes past the kernels' tile sizes (decode rows, several key/query blocks), on two threads."""
    B, H, Hkv, Sq, Sk, D, Dv = shape
    rng = np.random.default_rng(Sq + Sk)
    q = rng.standard_normal((B, H, Sq, D))
    k = rng.standard_normal((B, Hkv, Sk, D))
    v = rng.standard_normal((B, Hkv, Sk, Dv))
    kl = [int(x) for x in rng.integers(Sk // 2, Sk + 1, size=B)]
    for kw in ({}, {"causal": True, "key_lengths": kl, "alibi_slopes": simdattn.standard_alibi_slopes(H)},
               {"mask": np.where(rng.random((B, 1, Sq, Sk)) < 0.1, -np.inf, rng.standard_normal((B, 1, Sq, Sk))),
                "sinks": rng.standard_normal(H).astype(np.float32), "softcap": 2.0}):
        q_, qo = as_dtype(q, dtype)
        k_, ko = as_dtype(k, dtype)
        v_, vo = as_dtype(v, dtype)
        want = torch_oracle(qo, ko, vo, **kw)
        out, lse = simdattn.attention(q_, k_, v_, backend=backend, threads=2, return_lse=True, **kw,
                                      **call_kwargs(dtype))
        rtol, atol = TOL[dtype]
        np.testing.assert_allclose(out.astype(np.float64), want["out"], rtol=rtol, atol=atol)
        np.testing.assert_allclose(lse.astype(np.float64), want["lse"], rtol=max(rtol, 2e-6), atol=max(atol, 2e-6))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ["plain_gqa", "causal_bool_mask_key_lengths", "bottom_right_alibi_sinks",
                                  "additive_mask_scale"])
def test_attention_vs_numpy_oracle(case, backend):
    rng = np.random.default_rng(len(case) * 31)
    B, H, Hkv, Sq, Sk, D, Dv = 2, 6, 2, 9, 13, 16, 12
    q = rng.standard_normal((B, H, Sq, D))
    k = rng.standard_normal((B, Hkv, Sk, D))
    v = rng.standard_normal((B, Hkv, Sk, Dv))
    kw = {}
    if case == "causal_bool_mask_key_lengths":
        kw = {"causal": True, "mask": rng.random((B, 1, Sq, Sk)) < 0.6, "key_lengths": [13, 4]}
    elif case == "bottom_right_alibi_sinks":
        kw = {"causal": "bottom_right", "alibi_slopes": simdattn.standard_alibi_slopes(H),
              "sinks": rng.standard_normal(H).astype(np.float32), "key_lengths": [5, 13]}
    elif case == "additive_mask_scale":
        m = rng.standard_normal((Sq, Sk))
        m[2] = -np.inf
        kw = {"mask": m, "scale": 0.3}
    want = numpy_oracle(q, k, v, **kw)
    np.testing.assert_allclose(simdattn.attention(q, k, v, backend=backend, **kw), want, rtol=1e-12, atol=1e-12)
    q32, k32, v32 = (x.astype(np.float32) for x in (q, k, v))
    want32 = numpy_oracle(q32, k32, v32, **kw)
    np.testing.assert_allclose(simdattn.attention(q32, k32, v32, backend=backend, **kw), want32,
                               rtol=2e-5, atol=2e-5)
    # the two oracles agree with each other
    np.testing.assert_allclose(torch_oracle(q, k, v, **kw)["out"], want, rtol=1e-12, atol=1e-12)


def test_fully_masked_rows_are_zero():
    rng = np.random.default_rng(5)
    q = rng.standard_normal((2, 2, 6, 8)).astype(np.float32)
    k = rng.standard_normal((2, 2, 4, 8)).astype(np.float32)
    v = rng.standard_normal((2, 2, 4, 8)).astype(np.float32) + 3.0
    for backend in BACKENDS:
        # key length 0 for batch 1; with sinks lse is the sink
        sinks = np.array([0.5, -1.0], np.float32)
        out, lse = simdattn.attention(q, k, v, key_lengths=[4, 0], sinks=sinks, backend=backend, return_lse=True)
        assert np.all(out[1] == 0) and np.all(np.abs(out[0]) > 0)
        np.testing.assert_allclose(lse[1, :, :, 0], np.broadcast_to(sinks[:, None], (2, 6)), rtol=1e-6)
        # an additive mask of -inf everywhere
        out = simdattn.attention(q, k, v, mask=np.full((6, 4), -np.inf, np.float32), backend=backend)
        assert np.all(out == 0)
        # a window without causal is aligned bottom-right: (0, 0) shows query i key i + Sk - Sq
        out = simdattn.attention(q, k, v, window=(0, 0), backend=backend)
        assert np.all(out[:, :, :2] == 0)
        np.testing.assert_array_equal(out[:, :, 2:], v)
        # bottom_right with Sq > Sk: the first Sq - Sk rows see no key
        out, lse = simdattn.attention(q, k, v, causal="bottom_right", backend=backend, return_lse=True)
        assert np.all(out[:, :, :2] == 0) and np.all(np.abs(out[:, :, 2:]) > 0)
        assert np.all(np.isneginf(lse[:, :, :2]))


def test_causal_argument_forms():
    """causal takes None/False, True, 'none', 'top_left' and 'bottom_right' (the documented spellings)."""
    rng = np.random.default_rng(12)
    q = rng.standard_normal((1, 2, 4, 8))
    k = rng.standard_normal((1, 2, 6, 8))
    v = rng.standard_normal((1, 2, 6, 8))
    top_left = torch_oracle(q, k, v, causal="top_left")["out"]
    bottom_right = torch_oracle(q, k, v, causal="bottom_right")["out"]
    plain = torch_oracle(q, k, v)["out"]
    assert not np.allclose(top_left, bottom_right)
    np.testing.assert_allclose(simdattn.attention(q, k, v, causal=True), top_left, rtol=1e-12, atol=1e-12)
    for form in (None, False, "none"):
        np.testing.assert_allclose(simdattn.attention(q, k, v, causal=form), plain, rtol=1e-12, atol=1e-12)
    failures = []
    for form, want in (("top_left", top_left), ("bottom_right", bottom_right)):
        try:
            np.testing.assert_allclose(simdattn.attention(q, k, v, causal=form), want, rtol=1e-12, atol=1e-12)
        except simdattn.Error as e:
            failures.append(f"causal={form!r} raised {e}")
    assert not failures, "\n".join(failures)


def test_t5_bucket_oracle_matches_known_values():
    # spot values of Hugging Face's function (32 buckets, max distance 128, bidirectional), so the
    # oracle's bucket function is itself checked
    rel = torch.tensor([-200, -128, -20, -8, -7, -1, 0, 1, 7, 8, 20, 128, 200])
    got = t5_bucket(rel, True, 32, 128).tolist()
    assert got == [15, 15, 10, 8, 7, 1, 0, 17, 23, 24, 26, 31, 31]
    got = t5_bucket(rel, False, 32, 128).tolist()
    assert got == [31, 31, 17, 8, 7, 1, 0, 0, 0, 0, 0, 0, 0]


# ---- lse and scores outputs --------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_lse_return_and_given(dtype, backend):
    q64, k64, v64, kw = make_case(31 + DTYPES.index(dtype), "everything")
    want = check_attention(q64, k64, v64, kw, dtype, backend, check_lse=True)
    # lse= given (a non-contiguous float32 view): filled in place, out returned alone
    q, _ = as_dtype(q64, dtype)
    k, _ = as_dtype(k64, dtype)
    v, _ = as_dtype(v64, dtype)
    B, H, Sq, _ = q.shape
    buf = np.full((B, Sq, H, 3), 7.0, np.float32)
    lse = buf[..., 1:2].transpose(0, 2, 1, 3)
    res = simdattn.attention(q, k, v, backend=backend, lse=lse, **kw, **call_kwargs(dtype))
    assert isinstance(res, np.ndarray)
    tol = max(TOL[dtype][0], 2e-6)
    np.testing.assert_allclose(lse.astype(np.float64), want["lse"], rtol=tol, atol=tol)
    assert np.all(buf[..., 0] == 7.0) and np.all(buf[..., 2] == 7.0)
    # lse= and return_lse=True: the given array comes back
    lse2 = np.zeros((B, H, Sq, 1), np.float32)
    out2, got = simdattn.attention(q, k, v, backend=backend, lse=lse2, return_lse=True, **kw, **call_kwargs(dtype))
    assert got is lse2
    np.testing.assert_array_equal(lse2, lse)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("stage", ["scaled", "capped", "biased", "softmax"])
def test_scores_output(stage, dtype, backend):
    q64, k64, v64, kw = make_case(55, "everything")
    q, k, v = (x.astype(dtype) for x in (q64, k64, v64))
    want = torch_oracle(q, k, v, **kw)
    B, H, Sq, _ = q.shape
    Sk = k.shape[2]
    scores = np.full((B, H, Sq, Sk), 123.0, dtype)
    out = simdattn.attention(q, k, v, scores=scores, scores_stage=stage, backend=backend, **kw)
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(out, want["out"], rtol=rtol, atol=atol)
    np.testing.assert_allclose(scores.astype(np.float64), want[stage], rtol=rtol, atol=atol)
    if stage == "softmax":
        # rows sum to at most 1 (sinks take a share), rows with no visible key are zero
        assert np.all(scores.sum(-1) <= 1 + 1e-5)
        hidden = np.isneginf(want["biased"])
        assert np.all(scores[hidden] == 0)


def test_scores_default_stage_is_softmax_and_scaled_holds_every_key():
    rng = np.random.default_rng(8)
    q, k, v = (rng.standard_normal((1, 2, 5, 8)) for _ in range(3))
    s1 = np.zeros((1, 2, 5, 5))
    simdattn.attention(q, k, v, causal=True, scores=s1)
    np.testing.assert_allclose(s1, torch_oracle(q, k, v, causal=True)["softmax"], rtol=1e-12, atol=1e-14)
    s2 = np.zeros((1, 2, 5, 5))
    simdattn.attention(q, k, v, causal=True, scores=s2, scores_stage="scaled")
    np.testing.assert_allclose(s2, q @ k.transpose(0, 1, 3, 2) / math.sqrt(8), rtol=1e-12, atol=1e-14)


# ---- strides: views read and written in place ------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_non_contiguous_inputs(dtype, backend):
    rng = np.random.default_rng(21)
    B, H, Hkv, Sq, Sk, D, Dv = 2, 4, 2, 11, 17, 16, 8
    qbuf = rng.standard_normal((B, Sq, H, D)).astype(dtype)
    q = qbuf.transpose(0, 2, 1, 3)  # [B, H, Sq, D] with strides of [B, Sq, H, D]
    kbuf = rng.standard_normal((B, Hkv, Sk, 2 * D)).astype(dtype)
    k = kbuf[:, :, :, ::2]  # every other column
    v1 = rng.standard_normal((B, 1, Sk, Dv)).astype(dtype)
    v = np.broadcast_to(v1, (B, Hkv, Sk, Dv))  # stride 0 along the heads
    assert not q.flags.c_contiguous and not k.flags.c_contiguous and v.strides[1] == 0
    mask = rng.random((B, H, Sq, 2 * Sk)) < 0.8
    mask_view = mask[..., ::2]
    for kw in ({}, {"mask": mask_view}, {"causal": True, "key_lengths": [Sk, 9]}, {"causal": "bottom_right"}):
        got = simdattn.attention(q, k, v, backend=backend, **kw)
        contiguous = {key: np.ascontiguousarray(val) if isinstance(val, np.ndarray) else val for key, val in kw.items()}
        want = simdattn.attention(np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v),
                                  backend=backend, **contiguous)
        rtol, atol = TOL[dtype]
        np.testing.assert_allclose(got, want, rtol=rtol / 10, atol=atol / 10)
        np.testing.assert_allclose(got.astype(np.float64), torch_oracle(q, k, v, **kw)["out"], rtol=rtol, atol=atol)
    # k broadcast over the batch (stride 0 on axis 0) as well
    k0 = np.broadcast_to(kbuf[:1, :, :, :D], (B, Hkv, Sk, D))
    assert k0.strides[0] == 0
    got = simdattn.attention(q, k0, v, backend=backend)
    want = simdattn.attention(np.ascontiguousarray(q), np.ascontiguousarray(k0), np.ascontiguousarray(v),
                              backend=backend)
    np.testing.assert_allclose(got, want, rtol=TOL[dtype][0] / 10, atol=TOL[dtype][1] / 10)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_out_non_contiguous_view_is_written_in_place(dtype, backend):
    rng = np.random.default_rng(22)
    B, H, Sq, Sk, D, Dv = 2, 3, 7, 9, 8, 5
    q64, k64, v64 = (rng.standard_normal(s) for s in ((B, H, Sq, D), (B, H, Sk, D), (B, H, Sk, Dv)))
    q, qo = as_dtype(q64, dtype)
    k, ko = as_dtype(k64, dtype)
    v, vo = as_dtype(v64, dtype)
    odt = out_dtype(dtype)
    want = torch_oracle(qo, ko, vo, causal=True)["out"]
    rtol, atol = TOL[dtype]
    # out as a transposed view of a [B, Sq, H, Dv] buffer
    buf = np.full((B, Sq, H, Dv), -99.0, odt)
    out = buf.transpose(0, 2, 1, 3)
    res = simdattn.attention(q, k, v, causal=True, out=out, backend=backend, **call_kwargs(dtype))
    assert res is out
    assert np.shares_memory(res, buf)
    np.testing.assert_allclose(buf.transpose(0, 2, 1, 3).astype(np.float64), want, rtol=rtol, atol=atol)
    # out as every other column of a wider buffer: the columns in between are untouched
    wide = np.full((B, H, Sq, 2 * Dv), -99.0, odt)
    res = simdattn.attention(q, k, v, causal=True, out=wide[..., 1::2], backend=backend, **call_kwargs(dtype))
    assert np.shares_memory(res, wide)
    np.testing.assert_allclose(wide[..., 1::2].astype(np.float64), want, rtol=rtol, atol=atol)
    assert np.all(wide[..., 0::2] == -99.0)


# ---- errors ------------------------------------------------------------------------------------

def qkv(dtype=np.float32, B=2, H=4, Hkv=2, Sq=5, Sk=7, D=8, Dv=6, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, H, Sq, D)).astype(dtype), rng.standard_normal((B, Hkv, Sk, D)).astype(dtype),
            rng.standard_normal((B, Hkv, Sk, Dv)).astype(dtype))


def expect_error(argument, fn, *args, **kw):
    with pytest.raises(simdattn.Error) as info:
        fn(*args, **kw)
    assert isinstance(info.value, ValueError)
    assert info.value.argument == argument, f"argument {info.value.argument!r}, message: {info.value}"
    return info.value


def test_error_class():
    assert issubclass(simdattn.Error, ValueError)
    q, k, v = qkv()
    with pytest.raises(ValueError):
        simdattn.attention(q, k[:, :, :, :4], v)


def test_errors_shapes_and_dtypes():
    q, k, v = qkv()
    e = expect_error("k", simdattn.attention, q, k[..., :4], v)  # D differs
    assert "k" in str(e)
    expect_error("k", simdattn.attention, q, k[:1], v)  # B differs
    expect_error("k", simdattn.attention, q, qkv(Hkv=3, H=3)[1], v)  # H % Hkv != 0
    expect_error("v", simdattn.attention, q, k, v[:, :, :3])  # Sk differs
    expect_error("q", simdattn.attention, q[0], k, v)  # 3-D
    expect_error("k", simdattn.attention, q, k.astype(np.float64), v)
    expect_error("v", simdattn.attention, q, k, v.astype(np.float16))
    expect_error("q", simdattn.attention, q.astype(np.int8), k, v)
    expect_error("q", simdattn.attention, q.astype(np.complex64), k, v)
    expect_error("out", simdattn.attention, q, k, v, out=np.zeros((2, 4, 5, 6), np.float64))
    expect_error("out", simdattn.attention, q, k, v, out=np.zeros((2, 4, 5, 5), np.float32))
    ro = np.zeros((2, 4, 5, 6), np.float32)
    ro.flags.writeable = False
    expect_error("out", simdattn.attention, q, k, v, out=ro)
    expect_error("dtype", simdattn.attention, q, k, v, dtype="f64")  # converts to bf16 only
    expect_error("dtype", simdattn.attention, q, k, v, dtype="int8")
    expect_error("out", simdattn.attention, q, k, v, dtype="bf16", out=np.zeros((2, 4, 5, 6), np.float64))
    # a correct call of the same arrays works
    assert simdattn.attention(q, k, v).shape == (2, 4, 5, 6)


def test_errors_negative_strides_name_the_argument():
    q, k, v = qkv()
    e = expect_error("q", simdattn.attention, q[..., ::-1], k, v)
    assert "stride" in str(e)
    expect_error("k", simdattn.attention, q, k[:, :, ::-1], v)
    expect_error("v", simdattn.attention, q, k, v[..., ::-1])
    expect_error("out", simdattn.attention, q, k, v, out=np.zeros((2, 4, 5, 6), np.float32)[:, ::-1])
    expect_error("mask", simdattn.attention, q, k, v, mask=np.ones((5, 7), bool)[::-1])
    expect_error("q", simdattn.linear_attention, q[..., ::-1], k, v)


def test_errors_option_strings():
    q, k, v = qkv()
    expect_error("causal", simdattn.attention, q, k, v, causal="diagonal")
    expect_error("causal", simdattn.attention, q, k, v, causal=3)
    expect_error("backend", simdattn.attention, q, k, v, backend="gpu")
    expect_error("scores_stage", simdattn.attention, q, k, v, scores=np.zeros((2, 4, 5, 7), np.float32),
                 scores_stage="logits")
    expect_error("window", simdattn.attention, q, k, v, window=(1, 2, 3))
    expect_error("feature_map", simdattn.linear_attention, q, k, v, feature_map="softmax")
    expect_error("backend", simdattn.linear_attention, q, k, v, backend="gpu")


def test_errors_options_name_the_python_argument():
    """An invalid option raises Error whose .argument is the Python keyword (mask, not options.mask):
    the module documents that .argument names the argument at fault."""
    cases = [
        ("mask", {"mask": np.zeros((5, 6), np.float32)}),
        ("mask", {"mask": np.zeros((5, 7), np.int32)}),
        ("key_lengths", {"key_lengths": [3]}),
        ("key_lengths", {"key_lengths": [3, 8]}),
        ("window", {"window": (-2, 1)}),
        ("softcap", {"softcap": -1.0}),
        ("alibi_slopes", {"alibi_slopes": [0.5] * 3}),
        ("sinks", {"sinks": [0.0] * 5}),
        ("query_offsets", {"query_offsets": [0]}),
        ("lse", {"lse": np.zeros((2, 4, 5, 2), np.float32)}),
        ("scores", {"scores": np.zeros((2, 4, 5, 6), np.float32)}),
        ("scale", {"scale": float("inf")}),
        ("threads", {"threads": -1}),
        ("global_tokens", {"global_tokens": -1}),
        ("block_mask", {"block_mask": np.ones((3, 3), np.uint8), "block_size": 4}),
    ]
    wrong = []
    for argument, kw in cases:
        q, k, v = qkv()
        with pytest.raises(simdattn.Error) as info:
            simdattn.attention(q, k, v, **kw)
        if info.value.argument != argument:
            wrong.append(f"{sorted(kw)}: argument {info.value.argument!r}, expected {argument!r}")
    q, k, v = qkv(np.float64)
    with pytest.raises(simdattn.Error) as info:
        simdattn.attention(q, k, v, backend="onednn")  # oneDNN has no f64 matmul
    if info.value.argument != "backend":
        wrong.append(f"backend='onednn' with float64: argument {info.value.argument!r}, expected 'backend'")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("bad", [
    {"k": "wrong_shape"}, {"mask": np.zeros((5, 6), np.float32)}, {"causal": "sideways"}, {"backend": "tpu"},
    {"key_lengths": [1, 99]}, {"window": (-5, 0)}, {"lse": np.zeros((1, 1, 1, 1), np.float32)},
    {"dtype": "bf16", "k": "wrong_shape"}, {"q": "negative_stride"},
])
def test_failed_call_leaves_out_untouched(bad):
    q, k, v = qkv()
    bad = dict(bad)
    if bad.pop("k", None):
        k = k[..., :4]
    if bad.pop("q", None):
        q = q[:, :, ::-1]
    out = np.full((2, 4, 5, 6), 4242.0, np.float32)
    lse = np.full((2, 4, 5, 1), 4242.0, np.float32)
    kw = {"lse": lse, **bad}
    with pytest.raises(simdattn.Error):
        simdattn.attention(q, k, v, out=out, **kw)
    assert np.all(out == 4242.0)
    assert np.all(lse == 4242.0)


# ---- linear attention ------------------------------------------------------------------------

def linear_oracle(q, k, v, causal, feature_map, eps):
    q, k, v = (torch.from_numpy(np.array(x, dtype=np.float64)) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, 1)
    v = v.repeat_interleave(group, 1)
    phi = {"elu1": lambda x: torch.nn.functional.elu(x) + 1, "relu": torch.relu, "identity": lambda x: x}[feature_map]
    a = torch.matmul(phi(q), phi(k).transpose(-1, -2))  # [B, H, Sq, Sk]: phi(q_i) . phi(k_j)
    if causal:
        a = torch.tril(a)
    return (torch.matmul(a, v) / (a.sum(-1, keepdim=True) + eps)).numpy()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("feature_map", ["elu1", "relu", "identity"])
@pytest.mark.parametrize("causal", [False, True])
def test_linear_attention_vs_oracle(causal, feature_map, dtype, backend):
    rng = np.random.default_rng(int(causal) * 100 + len(feature_map) * 10 + len(dtype))
    B, Hkv, group, D, Dv = 2, 2, 2, 12, 7
    Sq = Sk = 37
    if not causal:
        Sk = 23
    q = rng.standard_normal((B, Hkv * group, Sq, D))
    k = rng.standard_normal((B, Hkv, Sk, D))
    v = rng.standard_normal((B, Hkv, Sk, Dv))
    if feature_map == "identity":  # keep the denominators away from 0
        q, k = np.abs(q) + 0.1, np.abs(k) + 0.1
    q, k, v = (x.astype(dtype) for x in (q, k, v))
    want = linear_oracle(q, k, v, causal, feature_map, 1e-6)
    got = simdattn.linear_attention(q, k, v, causal=causal, feature_map=feature_map, backend=backend, chunk=8)
    assert got.dtype == np.dtype(dtype) and got.shape == want.shape
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol * 5 if dtype == "float32" else rtol,
                               atol=atol * 5 if dtype == "float32" else atol)
    # out= as a non-contiguous view, and eps
    buf = np.zeros((q.shape[0], q.shape[2], q.shape[1], Dv), dtype)
    res = simdattn.linear_attention(q, k, v, causal=causal, feature_map=feature_map, backend=backend, eps=0.5,
                                    out=buf.transpose(0, 2, 1, 3))
    assert np.shares_memory(res, buf)
    np.testing.assert_allclose(buf.transpose(0, 2, 1, 3).astype(np.float64),
                               linear_oracle(q, k, v, causal, feature_map, 0.5), rtol=rtol * 5, atol=atol * 5)


def test_linear_attention_causal_needs_equal_lengths():
    q, k, v = qkv()
    with pytest.raises(simdattn.Error):
        simdattn.linear_attention(q, k, v, causal=True)


# ---- the layer vs torch.nn.MultiheadAttention ------------------------------------------------

def make_torch_mha(E, H, kdim=None, vdim=None, dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    m = torch.nn.MultiheadAttention(E, H, bias=True, batch_first=True, kdim=kdim, vdim=vdim, dtype=dtype)
    with torch.no_grad():
        for p in m.parameters():  # torch zero-initialises the biases: make every parameter count
            p.copy_(torch.randn_like(p) * 0.3)
    return m


def layer_from_torch(m, **kw):
    if m._qkv_same_embed_dim:
        wq, wk, wv = m.in_proj_weight.detach().chunk(3)
    else:
        wq, wk, wv = m.q_proj_weight.detach(), m.k_proj_weight.detach(), m.v_proj_weight.detach()
    bq, bk, bv = m.in_proj_bias.detach().chunk(3)
    a = lambda t: t.numpy().copy()  # noqa: E731
    return simdattn.MultiHeadAttention(a(wq), a(wk), a(wv), a(m.out_proj.weight.detach()), heads=m.num_heads,
                                       bq=a(bq), bk=a(bk), bv=a(bv), bo=a(m.out_proj.bias.detach()), **kw)


MHA_TOL = {torch.float64: (1e-10, 1e-10), torch.float32: (2e-5, 2e-5)}


@pytest.mark.parametrize("tdtype", [torch.float64, torch.float32])
def test_mha_self_attention_vs_torch(tdtype):
    B, S, E, H = 3, 10, 32, 4
    m = make_torch_mha(E, H, dtype=tdtype, seed=1)
    layer = layer_from_torch(m)
    np_dtype = {torch.float64: np.float64, torch.float32: np.float32}[tdtype]
    assert (layer.d_model, layer.heads, layer.kv_heads, layer.head_dim, layer.kdim, layer.vdim) == (E, H, H, 8, E, E)
    assert layer.dtype == {torch.float64: "f64", torch.float32: "f32"}[tdtype] and layer.causal is False
    rng = np.random.default_rng(3)
    x = rng.standard_normal((B, S, E)).astype(np_dtype)
    xt = torch.from_numpy(x)
    rtol, atol = MHA_TOL[tdtype]
    with torch.no_grad():
        # plain, with averaged weights
        y_t, w_t = m(xt, xt, xt, need_weights=True)
        y, w = layer.forward(x, need_weights=True)
        assert y.dtype == np_dtype and y.shape == (B, S, E) and w.shape == (B, S, S)
        np.testing.assert_allclose(y, y_t.numpy(), rtol=rtol, atol=atol)
        np.testing.assert_allclose(w, w_t.numpy(), rtol=rtol, atol=atol)
        # key_padding_mask and an additive attn_mask, per-head weights
        kpm = rng.random((B, S)) < 0.3
        kpm[:, 0] = False  # no fully padded row (torch gives NaN there)
        am = rng.standard_normal((S, S)).astype(np_dtype)
        y_t, w_t = m(xt, xt, xt, key_padding_mask=torch.from_numpy(kpm), attn_mask=torch.from_numpy(am),
                     need_weights=True, average_attn_weights=False)
        y, w = layer.forward(x, key_padding_mask=kpm, attn_mask=am, need_weights=True, average_attn_weights=False)
        assert w.shape == (B, H, S, S)
        np.testing.assert_allclose(y, y_t.numpy(), rtol=rtol, atol=atol)
        np.testing.assert_allclose(w, w_t.numpy(), rtol=rtol, atol=atol)
        assert np.all(w[np.broadcast_to(kpm[:, None, None, :], w.shape)] == 0)
        # a per-(batch, head) attn_mask: torch's [B*H, S, S] is ours [B, H, S, S]
        am4 = rng.standard_normal((B, H, S, S)).astype(np_dtype)
        am4[..., 3] = -np.inf
        y_t, _ = m(xt, xt, xt, attn_mask=torch.from_numpy(am4.reshape(B * H, S, S)), need_weights=False)
        y = layer.forward(x, attn_mask=am4)
        assert isinstance(y, np.ndarray)
        np.testing.assert_allclose(y, y_t.numpy(), rtol=rtol, atol=atol)
        # causal=True against torch with an upper-triangular -inf mask; out= given
        causal_mask = torch.triu(torch.full((S, S), -math.inf, dtype=tdtype), diagonal=1)
        y_t, _ = m(xt, xt, xt, attn_mask=causal_mask, need_weights=False)
        out = np.zeros((B, S, E), np_dtype)
        y = layer.forward(x, causal=True, out=out)
        assert y is out
        np.testing.assert_allclose(out, y_t.numpy(), rtol=rtol, atol=atol)
        # reference backend and non-contiguous input (copied)
        xs = np.repeat(x, 2, axis=2)[:, :, ::2]
        assert not xs.flags.c_contiguous
        np.testing.assert_allclose(layer.forward(xs, causal=True, backend="reference"), y_t.numpy(), rtol=rtol,
                                   atol=atol)


@pytest.mark.parametrize("tdtype", [torch.float64, torch.float32])
def test_mha_cross_attention_vs_torch(tdtype):
    B, Sq, Sk, E, H, kdim, vdim = 2, 6, 11, 24, 3, 20, 13
    m = make_torch_mha(E, H, kdim=kdim, vdim=vdim, dtype=tdtype, seed=2)
    assert not m._qkv_same_embed_dim
    layer = layer_from_torch(m)
    assert (layer.kdim, layer.vdim, layer.d_model) == (kdim, vdim, E)
    np_dtype = {torch.float64: np.float64, torch.float32: np.float32}[tdtype]
    rng = np.random.default_rng(4)
    xq = rng.standard_normal((B, Sq, E)).astype(np_dtype)
    xk = rng.standard_normal((B, Sk, kdim)).astype(np_dtype)
    xv = rng.standard_normal((B, Sk, vdim)).astype(np_dtype)
    kpm = rng.random((B, Sk)) < 0.4
    kpm[:, -1] = False
    am = rng.standard_normal((Sq, Sk)).astype(np_dtype)
    rtol, atol = MHA_TOL[tdtype]
    with torch.no_grad():
        for kw_t, kw in (({}, {}),
                         ({"key_padding_mask": torch.from_numpy(kpm), "attn_mask": torch.from_numpy(am)},
                          {"key_padding_mask": kpm, "attn_mask": am})):
            for average in (True, False):
                y_t, w_t = m(torch.from_numpy(xq), torch.from_numpy(xk), torch.from_numpy(xv), need_weights=True,
                             average_attn_weights=average, **kw_t)
                y, w = layer.forward(xq, xk, xv, need_weights=True, average_attn_weights=average, **kw)
                np.testing.assert_allclose(y, y_t.numpy(), rtol=rtol, atol=atol)
                np.testing.assert_allclose(w, w_t.numpy(), rtol=rtol, atol=atol)
    expect_error("key", layer.forward, xq)  # self-attention needs kdim == vdim == d_model
    expect_error("value", layer.forward, xq, xk, None)
    expect_error("query", layer.forward, xq.astype(np.float16), xk, xv)


# The loaders, on tiny checkpoints written with the published tensor names (tests/cli's
# model_families.py, NumPy only), against each family's float64 definition there.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cli"))
import model_families  # noqa: E402


@pytest.mark.parametrize("family,layer", [("gpt2", 1), ("qwen2", 0), ("qwen2", 1), ("gemma2", 0), ("bert", 1),
                                          ("llama", 1)])
def test_from_pretrained_matches_the_family_definition(tmp_path, family, layer):
    rng = np.random.default_rng(7)
    W = model_families.write_checkpoint(str(tmp_path), family, rng)
    cfg = dict(model_families.FAMILIES[family]["config"])
    m = simdattn.MultiHeadAttention.from_pretrained(str(tmp_path), layer, dtype="f64")
    assert m.dtype == "f64" and m.d_model == 32
    assert m.causal == (family in model_families.DECODERS)
    x = rng.standard_normal((2, 7, 32))
    want = model_families.reference(family, cfg, W, layer, x)
    got = m.forward(x)
    assert np.abs(got - want).max() <= 1e-10 * max(1.0, np.abs(want).max())


def test_from_pretrained_errors_name_the_file(tmp_path):
    model_families.write_checkpoint(str(tmp_path), "qwen2", np.random.default_rng(1))
    os.remove(os.path.join(str(tmp_path), "model.safetensors"))
    with pytest.raises(simdattn.Error) as e:
        simdattn.MultiHeadAttention.from_pretrained(str(tmp_path), 0)
    assert "model.safetensors" in str(e.value)


@pytest.mark.parametrize("attention", ["self", "cross"])
def test_from_diffusers_matches_the_definition(tmp_path, attention):
    rng = np.random.default_rng(3)
    path = str(tmp_path / "unet.safetensors")
    W = model_families.write_diffusers(path, rng, dtype="F32")
    m = simdattn.MultiHeadAttention.from_diffusers(path, model_families.DIFFUSERS_PREFIX.rstrip("."), 4,
                                                   attention=attention, dtype="f64")
    x = rng.standard_normal((2, 5, 32))
    if attention == "self":
        want, got = model_families.diffusers_reference(W, x), m.forward(x)
    else:
        enc = rng.standard_normal((2, 6, 24))
        want = model_families.diffusers_reference(W, x, enc, attention="cross")
        got = m.forward(x, enc, enc)
    assert np.abs(got - want).max() <= 1e-10 * max(1.0, np.abs(want).max())


@pytest.mark.parametrize("hf", [False, True])
def test_from_safetensors_matches_the_reference(tmp_path, hf):
    import mha_weights
    rng = np.random.default_rng(11)
    tensors, w = mha_weights.make_weights(rng, 24, 4, kv_heads=2 if hf else None, hf=hf,
                                          prefix="layers.0.attn." if hf else "", dtype=np.float64)
    path = str(tmp_path / "w.safetensors")
    mha_weights.write_safetensors(path, tensors)
    m = simdattn.MultiHeadAttention.from_safetensors(path, 4, prefix="layers.0.attn." if hf else "", dtype="f64")
    assert (m.heads, m.kv_heads, m.d_model) == (4, 2 if hf else 4, 24)
    x = rng.standard_normal((2, 5, 24))
    want = mha_weights.mha_reference(w, 4, x, causal="top-left")
    got = m.forward(x, causal="top_left")
    assert np.abs(got - want).max() <= 1e-10 * max(1.0, np.abs(want).max())


def test_mha_constructor_errors():
    m = make_torch_mha(16, 4, seed=5)
    wq, wk, wv = (t.detach().numpy().copy() for t in m.in_proj_weight.chunk(3))
    wo = m.out_proj.weight.detach().numpy().copy()
    with pytest.raises(simdattn.Error):
        simdattn.MultiHeadAttention(wq, wk, wv, wo[:, :8], heads=4)
    with pytest.raises(simdattn.Error):
        simdattn.MultiHeadAttention(wq, wk, wv, wo, heads=3)
    expect_error("wq", simdattn.MultiHeadAttention, wq[0], wk, wv, wo, heads=4)


# ---- the KV cache ------------------------------------------------------------------------------

def causal_layer(dtype=np.float64, seed=6, E=32, H=4, kv_heads=0):
    rng = np.random.default_rng(seed)
    hd = E // H
    Hkv = kv_heads or H
    w = lambda r, c: (rng.standard_normal((r, c)) / math.sqrt(c)).astype(dtype)  # noqa: E731
    b = lambda n: (rng.standard_normal(n) * 0.1).astype(dtype)  # noqa: E731
    return simdattn.MultiHeadAttention(w(H * hd, E), w(Hkv * hd, E), w(Hkv * hd, E), w(E, H * hd), heads=H,
                                       kv_heads=kv_heads, bq=b(H * hd), bk=b(Hkv * hd), bv=b(Hkv * hd), bo=b(E),
                                       causal=True)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 2e-5)])
def test_kv_cache_decoding_equals_full_forward(dtype, tol):
    B, S, E = 2, 12, 32
    layer = causal_layer(dtype, kv_heads=2)
    assert layer.causal is True and layer.kv_heads == 2
    rng = np.random.default_rng(7)
    x = rng.standard_normal((B, S, E)).astype(dtype)
    full = layer.forward(x)  # causal by the layer's configuration
    np.testing.assert_allclose(full, layer.forward(x, causal=True), rtol=0, atol=0)
    # the layer's causal setting is in effect: the first token's output ignores the later ones
    x2 = x.copy()
    x2[:, 1:] += 1.0
    np.testing.assert_allclose(layer.forward(x2)[:, 0], full[:, 0], rtol=tol, atol=tol)
    cache = simdattn.KvCache(layer, B, 16)
    assert cache.batch == B and cache.capacity == 16 and cache.lengths == [0, 0]
    assert cache.dtype == layer.dtype
    steps = []
    for t in range(S):
        steps.append(layer.forward(x[:, t:t + 1], cache=cache))
        assert cache.lengths == [t + 1, t + 1]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=tol, atol=tol)
    # prefill in chunks after a reset
    cache.reset()
    assert cache.lengths == [0, 0]
    y1 = layer.forward(np.ascontiguousarray(x[:, :5]), cache=cache)
    y2 = layer.forward(np.ascontiguousarray(x[:, 5:]), cache=cache)
    assert cache.lengths == [S, S]
    np.testing.assert_allclose(np.concatenate([y1, y2], axis=1), full, rtol=tol, atol=tol)
    np.testing.assert_allclose(full, layer.forward(x, causal="top_left"), rtol=0, atol=0)


def test_kv_cache_truncate_capacity_and_per_sequence_lengths():
    B, S, E = 2, 6, 32
    layer = causal_layer(np.float64, seed=8)
    rng = np.random.default_rng(9)
    x = rng.standard_normal((B, S, E))
    new = rng.standard_normal((B, 1, E))
    cache = simdattn.KvCache(layer, B, 8)
    layer.forward(x, cache=cache)
    assert cache.lengths == [6, 6]
    # sequence 0 back to 3 tokens: the next token of each sequence continues from its own length
    cache.truncate(0, 3)
    assert cache.lengths == [3, 6]
    y = layer.forward(new, cache=cache)
    assert cache.lengths == [4, 7]
    want0 = layer.forward(np.concatenate([x[:1, :3], new[:1]], axis=1))[0, -1]
    want1 = layer.forward(np.concatenate([x[1:], new[1:]], axis=1))[0, -1]
    np.testing.assert_allclose(y[0, 0], want0, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(y[1, 0], want1, rtol=1e-12, atol=1e-12)
    # exceeding the capacity (7 + 2 > 8) raises and leaves the cache as it was
    with pytest.raises(simdattn.Error):
        layer.forward(rng.standard_normal((B, 2, E)), cache=cache)
    assert cache.lengths == [4, 7]
    last = rng.standard_normal((B, 1, E))
    y = layer.forward(last, cache=cache)
    assert cache.lengths == [5, 8]
    want1 = layer.forward(np.concatenate([x[1:], new[1:], last[1:]], axis=1))[0, -1]
    np.testing.assert_allclose(y[1, 0], want1, rtol=1e-12, atol=1e-12)
    # full now: one more token raises, lengths unchanged
    with pytest.raises(simdattn.Error):
        layer.forward(last, cache=cache)
    assert cache.lengths == [5, 8]
    # a cache is for self-attention; masks/top_left causal are not for the cached forward
    with pytest.raises(simdattn.Error):
        layer.forward(last, last, last, cache=cache)
    assert cache.lengths == [5, 8]
    cache.reset()
    assert cache.lengths == [0, 0]


# ---- the GIL ---------------------------------------------------------------------------------

def test_gil_released_two_threads_overlap():
    """Two threads each call attention(); their calls must run at the same time.

    With the GIL held during a call, the two calls' computations are serialised: a thread's
    [start, end] interval can then only overlap the other's by the other's waiting time, at most
    about half of the longer interval (the containing one spans both calls). Calls that truly run
    concurrently overlap by nearly all of both intervals. The test asserts the intervals
    intersect, and, for at least one of a few repetitions, by more than 75% of the longer one.
    """
    rng = np.random.default_rng(10)
    B, H, S, D = 1, 8, 1024, 64
    arrays = [tuple(rng.standard_normal((B, H, S, D)).astype(np.float32) for _ in range(3)) for _ in range(2)]
    ratios = []
    for _ in range(5):
        barrier = threading.Barrier(2)
        times = [None, None]
        errors = []

        def run(i):
            try:
                q, k, v = arrays[i]
                barrier.wait()
                t0 = time.perf_counter()
                simdattn.attention(q, k, v, backend="native", threads=1)
                times[i] = (t0, time.perf_counter())
            except Exception as e:  # pragma: no cover - reported below
                errors.append(e)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        (s0, e0), (s1, e1) = times
        inter = min(e0, e1) - max(s0, s1)
        ratios.append(inter / max(e0 - s0, e1 - s1))
    assert max(ratios) > 0, f"the calls never overlapped: {ratios}"
    assert max(ratios) > 0.75, f"overlap / longer interval per repetition: {ratios}"


def test_gil_released_python_runs_during_a_call():
    """While a thread is inside attention(), the main thread keeps executing Python."""
    rng = np.random.default_rng(11)
    q, k, v = (rng.standard_normal((1, 8, 2048, 64)).astype(np.float32) for _ in range(3))
    best = 0.0
    for _ in range(3):
        span = {}
        started = threading.Event()

        def run():
            started.set()
            span["start"] = time.perf_counter()
            simdattn.attention(q, k, v, backend="native", threads=1)
            span["end"] = time.perf_counter()

        t = threading.Thread(target=run)
        beats = []
        t.start()
        started.wait()
        while t.is_alive():
            beats.append(time.perf_counter())
        t.join()
        inside = [b for b in beats if span["start"] < b < span["end"]]
        # the largest stretch of the call with no heartbeat: all of it if the GIL were held
        marks = [span["start"]] + inside + [span["end"]]
        gap = max(b - a for a, b in zip(marks, marks[1:]))
        best = max(best, 1.0 - gap / (span["end"] - span["start"]))
    assert best > 0.5, "the main thread could not run Python while attention() computed"


# ---- module information ----------------------------------------------------------------------

def test_info():
    info = simdattn.info()
    assert isinstance(info, dict)
    assert set(info) >= {"version", "isa", "isa_forced", "isas", "isa_notes", "default_threads", "thread_budget",
                         "backends", "onednn_version"}
    assert info["version"] == simdattn.__version__
    assert info["isa"] in info["isas"]
    assert {"native", "reference"} <= set(info["backends"])
    assert isinstance(info["default_threads"], int) and info["default_threads"] >= 1
    assert isinstance(info["thread_budget"], int) and info["thread_budget"] >= 1


def test_set_thread_runtime():
    before = simdattn.thread_runtime()
    assert before in ("team", "openmp") and simdattn.info()["thread_runtime"] == before
    q = np.random.default_rng(3).standard_normal((2, 4, 150, 32)).astype(np.float32)
    outs = {}
    try:
        for runtime in ("openmp", "team"):
            simdattn.set_thread_runtime(runtime)
            assert simdattn.thread_runtime() == runtime and simdattn.info()["thread_runtime"] == runtime
            outs[runtime] = simdattn.attention(q, q, q, causal=True, threads=2)
        with pytest.raises(simdattn.Error) as e:
            simdattn.set_thread_runtime("tbb")
        assert e.value.argument == "runtime" and simdattn.thread_runtime() == "team"
    finally:
        simdattn.set_thread_runtime(before)
    assert outs["team"].tobytes() == outs["openmp"].tobytes()


def test_set_thread_budget():
    before = simdattn.info()["thread_budget"]
    try:
        simdattn.set_thread_budget(1)
        assert simdattn.info()["thread_budget"] == 1
    finally:
        simdattn.set_thread_budget(0)
    assert simdattn.info()["thread_budget"] == before


def test_standard_alibi_slopes():
    s = simdattn.standard_alibi_slopes(8)
    assert s.dtype == np.float32
    np.testing.assert_allclose(s, 2.0 ** -np.arange(1, 9), rtol=3e-7)
    s = simdattn.standard_alibi_slopes(12)
    want = list(2.0 ** (-8 * np.arange(1, 9) / 8)) + list(2.0 ** (-4 * np.array([1, 3, 5, 7]) / 8))
    np.testing.assert_allclose(s, want, rtol=3e-7)  # float32, within a few ulp
    expect_error("heads", simdattn.standard_alibi_slopes, 0)


def test_docstrings():
    doc = simdattn.attention.__doc__
    for word in ("mask", "causal", "out", "scale", "key_lengths", "backend"):
        assert word in doc
    import io
    import contextlib
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        help(simdattn.attention)
    assert "mask" in buf.getvalue() and "causal" in buf.getvalue()
    for obj in (simdattn.linear_attention, simdattn.MultiHeadAttention, simdattn.MultiHeadAttention.forward,
                simdattn.KvCache, simdattn.Error, simdattn):
        assert obj.__doc__ and len(obj.__doc__) > 20
