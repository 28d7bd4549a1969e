"""The module's entries with torch tensors (DLPack) instead of NumPy arrays.

Every option of the NumPy tests (oracles.py's features) again with torch tensors in
float32, float64, float16 and bfloat16 against the same float64 oracle; outputs are torch
tensors of the query's dtype; inputs and out= are read and written in place (the module's view
of a tensor is the tensor's own memory: data_ptr() and strides).

Run:  PYTHONPATH=build/python /usr/bin/python3 -m pytest -q tests/python/test_torch_tensors.py
"""
import numpy as np
import pytest
import torch

import simdattn
from oracles import FEATURES, TOL, make_case, torch_oracle

TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
                "bfloat16": torch.bfloat16}
TOL_OF = {"float32": TOL["float32"], "float64": TOL["float64"], "float16": TOL["float16"], "bfloat16": TOL["bf16"]}


def tensor(x, dtype):
    """(torch tensor of dtype, the float64 values it holds) for a float64 array."""
    t = torch.from_numpy(np.ascontiguousarray(x)).to(TORCH_DTYPES[dtype])
    return t, t.to(torch.float64).numpy()


def torch_kwargs(kw):
    """attention()'s keyword arguments with every array a torch tensor (bool masks as torch.bool)."""
    out = {}
    for name, value in kw.items():
        if isinstance(value, np.ndarray):
            out[name] = torch.from_numpy(value.copy())
        else:
            out[name] = value
    return out


@pytest.mark.parametrize("backend", ["native", "reference"])
@pytest.mark.parametrize("dtype", list(TORCH_DTYPES))
@pytest.mark.parametrize("feature", FEATURES)
def test_attention_features_with_torch_tensors(feature, dtype, backend):
    q64, k64, v64, kw = make_case(FEATURES.index(feature), feature)
    q, qo = tensor(q64, dtype)
    k, ko = tensor(k64, dtype)
    v, vo = tensor(v64, dtype)
    want = torch_oracle(qo, ko, vo, **kw)
    out, lse = simdattn.attention(q, k, v, backend=backend, return_lse=True, **torch_kwargs(kw))
    assert isinstance(out, torch.Tensor) and out.dtype == TORCH_DTYPES[dtype]
    assert isinstance(lse, torch.Tensor) and lse.dtype == torch.float32
    rtol, atol = TOL_OF[dtype]
    np.testing.assert_allclose(out.to(torch.float64).numpy(), want["out"], rtol=rtol, atol=atol)
    lse_tol = max(rtol, 2e-6)
    np.testing.assert_allclose(lse.to(torch.float64).numpy(), want["lse"], rtol=lse_tol, atol=lse_tol)


@pytest.mark.parametrize("dtype", list(TORCH_DTYPES))
def test_inputs_and_out_are_read_and_written_in_place(dtype):
    t = TORCH_DTYPES[dtype]
    base = torch.randn(2, 9, 3, 16).to(t)       # [B, S, H, D] storage
    q = base.permute(0, 2, 1, 3)                # [B, H, S, D] view: strides (432, 16, 48, 1)
    k = torch.randn(2, 3, 16, 11).to(t).transpose(2, 3)[:, :, ::2]  # strided rows, a column-major view
    v = torch.randn(2, 3, 6, 8).to(t)
    ptr, name, shape, strides = simdattn._array_view(q)
    assert ptr == q.data_ptr() and shape == list(q.shape) and strides == list(q.stride())
    assert name == {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16"}[dtype]
    ptr, _, _, strides = simdattn._array_view(k)
    assert ptr == k.data_ptr() and strides == list(k.stride())
    out_base = torch.full((2, 9, 3, 8), float("nan"), dtype=t)
    out = out_base.permute(0, 2, 1, 3)
    r = simdattn.attention(q, k, v, out=out)
    assert r is out and r.data_ptr() == out_base.data_ptr()
    assert not torch.isnan(out_base).any()
    want = torch_oracle(q.double().numpy(), k.double().numpy(), v.double().numpy())["out"]
    rtol, atol = TOL_OF[dtype]
    np.testing.assert_allclose(out.double().numpy(), want, rtol=rtol, atol=atol)
    # a new output shares nothing with the inputs and is a fresh tensor of the query's kind
    fresh = simdattn.attention(q, k, v)
    assert isinstance(fresh, torch.Tensor) and fresh.is_contiguous() and fresh.dtype == t
    assert torch.equal(fresh, out)


def test_requires_grad_bool_and_mixed_kinds():
    q = torch.randn(1, 2, 4, 8, requires_grad=True)  # read as its values (inference: no gradient)
    k, v = torch.randn(1, 2, 5, 8), np.random.default_rng(0).standard_normal((1, 2, 5, 8)).astype(np.float32)
    mask = torch.rand(4, 5) < 0.6                    # bool: torch 1.13's DLPack has no bool, NumPy reads it
    mask[:, 0] = True
    out = simdattn.attention(q, k, v, mask=mask)
    assert isinstance(out, torch.Tensor) and not out.requires_grad  # the query's kind
    assert torch.equal(out, simdattn.attention(q.detach(), k, v, mask=mask))
    want = torch_oracle(q.detach().double().numpy(), k.double().numpy(), v.astype(np.float64),
                        mask=mask.numpy())["out"]
    np.testing.assert_allclose(out.double().numpy(), want, rtol=2e-5, atol=2e-5)
    out_np = simdattn.attention(v.reshape(1, 2, 5, 8)[:, :, :4], k, v)
    assert isinstance(out_np, np.ndarray)


def test_errors_name_the_argument_for_tensors():
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    for bad, arg in [(dict(k=k.to(torch.int32)), "k"), (dict(out=torch.empty(1, 2, 4, 7)), "out"),
                     (dict(out=torch.empty(1, 2, 4, 8, dtype=torch.float64)), "out"),
                     (dict(mask=torch.randn(3, 5)), "mask")]:
        args = dict(q=q, k=k, v=v)
        args.update({a: b for a, b in bad.items() if a in args})
        kw = {a: b for a, b in bad.items() if a not in args}
        with pytest.raises(simdattn.Error) as e:
            simdattn.attention(args["q"], args["k"], args["v"], **kw)
        assert e.value.argument == arg, (bad, e.value)
    # a failed call leaves out untouched
    out = torch.full((1, 2, 4, 8), 7.0)
    with pytest.raises(simdattn.Error):
        simdattn.attention(q, k, v, out=out, mask=torch.randn(3, 5))
    assert torch.all(out == 7.0)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_linear_attention_with_tensors(dtype):
    rng = np.random.default_rng(2)
    q64, k64, v64 = (rng.standard_normal(s) for s in [(2, 2, 6, 8), (2, 2, 6, 8), (2, 2, 6, 5)])
    want = simdattn.linear_attention(q64, k64, v64, causal=True)
    (q, _), (k, _), (v, _) = tensor(q64, dtype), tensor(k64, dtype), tensor(v64, dtype)
    ref = simdattn.linear_attention(q.double().numpy(), k.double().numpy(), v.double().numpy(), causal=True)
    out = simdattn.linear_attention(q, k, v, causal=True)
    assert isinstance(out, torch.Tensor) and out.dtype == TORCH_DTYPES[dtype]
    rtol, atol = TOL_OF[dtype]
    np.testing.assert_allclose(out.double().numpy(), ref, rtol=rtol, atol=atol * 10)
    assert want.shape == tuple(out.shape)


@pytest.mark.parametrize("code", ["int8", "fp8_e4m3", "fp8_e5m2"])
def test_quantize_kv_with_tensors(code):
    x = np.random.default_rng(5).standard_normal((3, 4, 16)).astype(np.float32)
    codes_np, scales_np = simdattn.quantize_kv(x, code)
    codes, scales = simdattn.quantize_kv(torch.from_numpy(x), code)
    assert isinstance(codes, torch.Tensor) and codes.dtype == (torch.int8 if code == "int8" else torch.uint8)
    assert np.array_equal(codes.numpy(), codes_np) and np.array_equal(scales.numpy(), scales_np)
    back = simdattn.dequantize_kv(codes, scales, code)
    assert isinstance(back, torch.Tensor)
    assert np.array_equal(back.numpy(), simdattn.dequantize_kv(codes_np, scales_np, code))
    # a bf16 tensor quantizes as its float32 values
    xb = torch.from_numpy(x).bfloat16()
    cb, sb = simdattn.quantize_kv(xb, code)
    c2, s2 = simdattn.quantize_kv(xb.float().numpy(), code)
    assert np.array_equal(cb.numpy(), c2) and np.array_equal(sb.numpy(), s2)


def test_attention_paged_with_tensors():
    rng = np.random.default_rng(7)
    H, Hkv, D, bs, nb = 4, 2, 16, 4, 6
    kc = rng.standard_normal((nb, bs, Hkv, D)).astype(np.float32)
    vc = rng.standard_normal((nb, bs, Hkv, D)).astype(np.float32)
    q = rng.standard_normal((3, H, D)).astype(np.float32)
    table = np.array([[2, 0, 5], [1, 3, 4]], np.int32)
    args = dict(block_table=table, seq_lens=[10, 7], query_start=[0, 2, 3])
    want = simdattn.attention_paged(q, kc, vc, **args)
    for t in (torch.float32, torch.bfloat16):
        qt, kt, vt = (torch.from_numpy(a).to(t) for a in (q, kc, vc))
        got = simdattn.attention_paged(qt, kt, vt, block_table=torch.from_numpy(table), seq_lens=torch.tensor([10, 7]),
                                       query_start=[0, 2, 3])
        assert isinstance(got, torch.Tensor) and got.dtype == t
        ref = simdattn.attention_paged(qt.float().numpy(), kt.float().numpy(), vt.float().numpy(), **args)
        np.testing.assert_allclose(got.float().numpy(), ref, rtol=2e-2 if t == torch.bfloat16 else 1e-6,
                                   atol=2e-2 if t == torch.bfloat16 else 1e-6)
    np.testing.assert_allclose(simdattn.attention_paged(torch.from_numpy(q), torch.from_numpy(kc),
                                                        torch.from_numpy(vc), **args).numpy(), want)


def make_layer(dtype, E=32, H=4, seed=3):
    rng = np.random.default_rng(seed)
    w = [rng.standard_normal((E, E)) * 0.2 for _ in range(4)]
    b = [rng.standard_normal(E) * 0.1 for _ in range(4)]
    tensors = [torch.from_numpy(x).to(dtype) for x in w + b]
    return simdattn.MultiHeadAttention(*tensors[:4], heads=H, bq=tensors[4], bk=tensors[5], bv=tensors[6],
                                       bo=tensors[7]), w, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_layer_forward_and_caches_with_tensors(dtype):
    layer, w, b = make_layer(dtype)
    assert layer.dtype == {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16"}[dtype]
    ref_layer = simdattn.MultiHeadAttention(*[torch.from_numpy(x).to(dtype).double().numpy() for x in w], heads=4,
                                            bq=torch.from_numpy(b[0]).to(dtype).double().numpy(),
                                            bk=torch.from_numpy(b[1]).to(dtype).double().numpy(),
                                            bv=torch.from_numpy(b[2]).to(dtype).double().numpy(),
                                            bo=torch.from_numpy(b[3]).to(dtype).double().numpy())
    x = torch.randn(2, 6, 32).to(dtype)
    y, wts = layer.forward(x, causal=True, need_weights=True)
    assert isinstance(y, torch.Tensor) and y.dtype == dtype and isinstance(wts, torch.Tensor)
    want = ref_layer.forward(x.double().numpy(), causal=True)
    tol = {torch.float32: 2e-5, torch.float64: 1e-12, torch.float16: 1e-2, torch.bfloat16: 6e-2}[dtype]
    np.testing.assert_allclose(y.double().numpy(), want, rtol=tol, atol=tol)
    # out= in place
    out = torch.empty(2, 6, 32, dtype=dtype)
    assert layer.forward(x, causal=True, out=out) is out and torch.equal(out, y)
    # a KV cache: the prompt then one token equals the whole causal forward
    cache = simdattn.KvCache(layer, 2, 16)
    y1 = layer.forward(x[:, :5], cache=cache)
    y2 = layer.forward(x[:, 5:], cache=cache)
    assert isinstance(y2, torch.Tensor)
    np.testing.assert_allclose(torch.cat([y1, y2], 1).double().numpy(), y.double().numpy(), rtol=tol, atol=tol)
    # the pool: two sequences stepped together, outputs as tensors
    pool = simdattn.KvPool(layer, 16, block_size=4, dtype="f32" if dtype == torch.float64 else None)
    s0, s1 = pool.add(), pool.add()
    outs = layer.forward_pool([s0, s1], [x[0, :5], x[1, :5]], pool)
    assert all(isinstance(o, torch.Tensor) and o.dtype == dtype and o.shape == (5, 32) for o in outs)
    pool_tol = max(tol, 2e-5)  # an f64 layer's pool holds f32
    np.testing.assert_allclose(torch.stack(outs).double().numpy(), y1.double().numpy(), rtol=pool_tol, atol=pool_tol)
