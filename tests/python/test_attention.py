"""simdattn.attention and simdattn.linear_attention against independent float64 oracles (torch and
NumPy): every feature and random combinations of them, lse and scores outputs, strided views.

Run:  PYTHONPATH=build/python /usr/bin/python3 -m pytest -q tests/python
(ctest registers the folder as the test `python`).
"""
import math

import numpy as np
import pytest
import torch

import simdattn
from oracles import (BACKENDS, DTYPES, FEATURES, TOL, as_dtype, call_kwargs, check_attention, make_case, numpy_oracle,
                     out_dtype, qkv, t5_bucket, torch_oracle)


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
        np.testing.assert_allclose(lse[1], np.broadcast_to(sinks[:, None], (2, 6)), rtol=1e-6)
        # an additive mask of -inf everywhere
        out = simdattn.attention(q, k, v, mask=np.full((6, 4), -np.inf, np.float32), backend=backend)
        assert np.all(out == 0)
        # a window without causal is aligned bottom-right: (0, 0) shows query i key i + Sk - Sq
        out = simdattn.attention(q, k, v, window=(0, 0), backend=backend)
        assert np.all(out[:, :, :2] == 0)
        # the one visible key's weight is exp of the scaled score's rounding residual: within an ulp of 1
        np.testing.assert_allclose(out[:, :, 2:], v, rtol=3e-7, atol=0)
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
    lse = buf[..., 1].transpose(0, 2, 1)  # [B, H, Sq], as the contract has it
    res = simdattn.attention(q, k, v, backend=backend, lse=lse, **kw, **call_kwargs(dtype))
    assert isinstance(res, np.ndarray)
    tol = max(TOL[dtype][0], 2e-6)
    np.testing.assert_allclose(lse.astype(np.float64), want["lse"], rtol=tol, atol=tol)
    assert np.all(buf[..., 0] == 7.0) and np.all(buf[..., 2] == 7.0)
    # lse= and return_lse=True: the given array comes back ([B, H, Sq, 1], the C++ view's shape, too)
    for lse2 in (np.zeros((B, H, Sq), np.float32), np.zeros((B, H, Sq, 1), np.float32)):
        out2, got = simdattn.attention(q, k, v, backend=backend, lse=lse2, return_lse=True, **kw,
                                       **call_kwargs(dtype))
        assert got is lse2
        np.testing.assert_array_equal(lse2.reshape(B, H, Sq), lse)
    assert simdattn.attention(q, k, v, backend=backend, return_lse=True, **kw, **call_kwargs(dtype))[1].shape == (B, H, Sq)


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
