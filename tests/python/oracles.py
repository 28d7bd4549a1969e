"""Shared by the Python module's tests: independent float64 oracles (torch and NumPy), the
random cases over every attention feature, and small helpers (inputs, expected errors).

Not a test file: the test_*.py files beside it import it (pytest puts this directory on sys.path).
Needs numpy and torch (1.13: no F.scaled_dot_product_attention, so the oracle is written with
plain torch ops).
"""
import math

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

    Returns a dict: out [B,H,Sq,Dv], lse [B,H,Sq], and the score stages scaled, capped,
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
    return {"out": out.numpy(), "lse": lse[..., 0].numpy(), "scaled": scaled.numpy(), "capped": capped.numpy(),
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


# ---- helpers -----------------------------------------------------------------------------------

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
