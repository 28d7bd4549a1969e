"""8-bit K/V codes from Python: quantize_kv against a NumPy oracle written from the formats (float32
divisions, the nearest code of every code's value with ties to the even code, saturation, zero
rows, subnormal fp8 results, NaN/inf refused), dequantize_kv, and attention over the codes
against a float64 NumPy attention on their values."""
import numpy as np
import pytest

import simdattn

MAX = {"int8": 127.0, "fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}


def fp8_value(code, fmt):
    """The value of one fp8 code, from the OCP definitions."""
    sign = -1.0 if code & 0x80 else 1.0
    if fmt == "fp8_e4m3":
        e, m = (code >> 3) & 0xF, code & 7
        if e == 15 and m == 7:
            return np.nan
        return sign * (m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    e, m = (code >> 2) & 0x1F, code & 3
    if e == 31:
        return sign * np.inf if m == 0 else np.nan
    return sign * (m / 4 * 2.0 ** -14 if e == 0 else (1 + m / 4) * 2.0 ** (e - 15))


def oracle(x, fmt):
    """codes, scales of x [..., D] float32 by the contract."""
    x = np.asarray(x, np.float32)
    s = (np.abs(x).max(axis=-1) / np.float32(MAX[fmt])).astype(np.float32)
    safe = np.where(s == 0, np.float32(1), s)
    y = (x / safe[..., None]).astype(np.float32)  # one float32 division
    if fmt == "int8":
        c = np.clip(np.rint(y), -127, 127).astype(np.int8)
        c[s == 0] = 0
        return c, s
    vals = np.array([fp8_value(c, fmt) for c in range(128)])
    finite = np.isfinite(vals)
    codes = np.arange(128)[finite]
    vals = vals[finite]
    a = np.minimum(np.abs(y.astype(np.float64)), MAX[fmt])
    dist = np.abs(a[..., None] - vals)
    best = dist.min(axis=-1, keepdims=True)
    tie = dist == best
    # among the nearest, the even code
    pick = np.where(tie & (codes % 2 == 0), codes, 255).min(axis=-1)
    pick = np.where(pick == 255, np.where(tie, codes, 255).min(axis=-1), pick)
    c = (pick | np.where(np.signbit(y), 0x80, 0)).astype(np.uint8)
    c[s == 0] = 0
    return c, s


def value_of(codes, scales, fmt):
    if fmt == "int8":
        v = codes.astype(np.float32)
    else:
        table = np.array([fp8_value(c, fmt) for c in range(256)], np.float32)
        v = table[codes]
    return (v * scales[..., None]).astype(np.float32)


@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3", "fp8_e5m2"])
def test_quantize_matches_the_formula(fmt):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4, 17, 72)).astype(np.float32)
    x[0, 0, 0] = 0.0                              # a zero row
    x[0, 0, 1] *= 1e-39                           # subnormal scale and results
    x[0, 0, 2, 5] = 300.0                         # an outlier channel
    x[0, 0, 3] = np.arange(72) % 9 - 4.0          # quotients on ties
    x[0, 0, 4] = -0.0
    codes, scales = simdattn.quantize_kv(x, fmt)
    want_c, want_s = oracle(x, fmt)
    assert codes.dtype == (np.int8 if fmt == "int8" else np.uint8)
    assert codes.shape == x.shape and scales.shape == x.shape[:-1] and scales.dtype == np.float32
    np.testing.assert_array_equal(scales, want_s)
    np.testing.assert_array_equal(codes, want_c)
    back = simdattn.dequantize_kv(codes, scales, fmt)
    np.testing.assert_array_equal(back, value_of(codes, scales, fmt))
    # float64 and float16 inputs: rounded / widened to float32 first
    np.testing.assert_array_equal(simdattn.quantize_kv(x.astype(np.float64), fmt)[0], want_c)
    h = x.astype(np.float16)
    np.testing.assert_array_equal(simdattn.quantize_kv(h, fmt)[0], oracle(h.astype(np.float32), fmt)[0])


@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3", "fp8_e5m2"])
def test_nonfinite_rows_and_bad_arguments(fmt):
    x = np.ones((2, 8), np.float32)
    for bad in (np.nan, np.inf, -np.inf):
        y = x.copy()
        y[1, 3] = bad
        with pytest.raises(simdattn.Error, match="x"):
            simdattn.quantize_kv(y, fmt)
    with pytest.raises(simdattn.Error, match="dtype"):
        simdattn.quantize_kv(x, "int4")
    codes, scales = simdattn.quantize_kv(x, fmt)
    with pytest.raises(simdattn.Error, match="scales"):
        simdattn.dequantize_kv(codes, -scales, fmt)
    with pytest.raises(simdattn.Error, match="codes"):
        simdattn.dequantize_kv(codes.astype(np.int16), scales, fmt)


def reference_attention(q, k, v, causal):
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    B, H, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    k = np.repeat(k, H // Hkv, axis=1)
    v = np.repeat(v, H // Hkv, axis=1)
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(D)
    if causal:
        i = np.arange(Sq)[:, None] + (Sk - Sq)
        s = np.where(np.arange(Sk)[None, :] <= i, s, -np.inf)
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    return (w / w.sum(axis=-1, keepdims=True)) @ v


@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("sq", [1, 40])
def test_attention_over_codes(fmt, sq):
    rng = np.random.default_rng(6)
    q = rng.standard_normal((2, 4, sq, 64)).astype(np.float32)
    k = rng.standard_normal((2, 2, 150, 64)).astype(np.float32)
    v = rng.standard_normal((2, 2, 150, 64)).astype(np.float32)
    kc, ks = simdattn.quantize_kv(k, fmt)
    vc, vs = simdattn.quantize_kv(v, fmt)
    want = reference_attention(q, value_of(kc, ks, fmt), value_of(vc, vs, fmt), causal=True)
    for backend in ("native", "reference"):
        out = simdattn.attention(q, kc, vc, k_scale=ks, v_scale=vs, kv_dtype=fmt, causal="bottom_right",
                                 backend=backend)
        assert np.abs(out - want).max() <= 1e-5
    one = simdattn.attention(q, kc, vc, k_scale=ks, v_scale=vs, kv_dtype=fmt, causal="bottom_right", threads=1)
    three = simdattn.attention(q, kc, vc, k_scale=ks, v_scale=vs, kv_dtype=fmt, causal="bottom_right", threads=3)
    np.testing.assert_array_equal(one, three)
    with pytest.raises(simdattn.Error, match="k_scale"):
        simdattn.attention(q, kc, vc, v_scale=vs, kv_dtype=fmt)
    with pytest.raises(simdattn.Error, match="kv_dtype"):
        simdattn.attention(q, kc, vc, k_scale=ks, v_scale=vs, kv_dtype="int4")


@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_attention_paged_over_codes(fmt, block_size):
    rng = np.random.default_rng(7)
    H, Hkv, D = 4, 2, 64
    seq_lens = np.array([700, 1, 40, 129], np.int64)
    qlens = np.array([1, 1, 7, 64], np.int64)
    need = [(n + block_size - 1) // block_size for n in seq_lens]
    num_blocks = sum(need) + 3
    perm = rng.permutation(num_blocks)
    table = np.full((len(seq_lens), max(need)), num_blocks + 5, np.int32)  # unread entries out of range
    at = 0
    for i, n in enumerate(need):
        table[i, :n] = perm[at:at + n]
        at += n
    k = rng.standard_normal((num_blocks, block_size, Hkv, D)).astype(np.float32)
    v = rng.standard_normal((num_blocks, block_size, Hkv, D)).astype(np.float32)
    kc, ks = simdattn.quantize_kv(k, fmt)
    vc, vs = simdattn.quantize_kv(v, fmt)
    kh, vh = value_of(kc, ks, fmt), value_of(vc, vs, fmt)
    starts = np.concatenate([[0], np.cumsum(qlens)])
    q = rng.standard_normal((int(starts[-1]), H, D)).astype(np.float32)
    want = np.zeros((q.shape[0], H, D))
    for i, n in enumerate(seq_lens):
        t = np.arange(n)
        keys = kh[table[i, t // block_size], t % block_size]  # [n, Hkv, D]
        vals = vh[table[i, t // block_size], t % block_size]
        qi = q[starts[i]:starts[i + 1]]
        want[starts[i]:starts[i + 1]] = reference_attention(
            qi.transpose(1, 0, 2)[None], keys.transpose(1, 0, 2)[None], vals.transpose(1, 0, 2)[None],
            causal=True)[0].transpose(1, 0, 2)
    outs = {}
    for backend, threads in (("native", 1), ("native", 3), ("reference", 1)):
        outs[(backend, threads)] = simdattn.attention_paged(
            q, kc, vc, table, seq_lens, query_start=starts, k_scale=ks, v_scale=vs, kv_dtype=fmt,
            backend=backend, threads=threads)
        assert np.abs(outs[(backend, threads)] - want).max() <= 1e-5
    np.testing.assert_array_equal(outs[("native", 1)], outs[("native", 3)])
    bad = vs.copy()
    bad[table[3, 0], 0, 1] = -1.0
    with pytest.raises(simdattn.Error, match="v_scale"):
        simdattn.attention_paged(q, kc, vc, table, seq_lens, query_start=starts, k_scale=ks, v_scale=bad, kv_dtype=fmt)
    bad[table[3, 0], 0, 1] = vs[table[3, 0], 0, 1]
    bad[perm[-1], 0, 0] = np.nan  # a block no sequence reads: not checked, not read
    simdattn.attention_paged(q, kc, vc, table, seq_lens, query_start=starts, k_scale=ks, v_scale=bad, kv_dtype=fmt)


@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3", "fp8_e5m2"])
def test_layer_over_8bit_cache_and_pool(fmt):
    """An f32 layer decoding over an 8-bit KvCache (native) equals the reference backend over the
    same codes; an 8-bit KvPool gives the same outputs, and exposes its scales."""
    rng = np.random.default_rng(8)
    E, H, Hkv = 32, 4, 2
    hd = E // H
    w = lambda r, c: (rng.standard_normal((r, c)) / np.sqrt(c)).astype(np.float32)  # noqa: E731
    layer = simdattn.MultiHeadAttention(w(H * hd, E), w(Hkv * hd, E), w(Hkv * hd, E), w(E, H * hd), heads=H,
                                        kv_heads=Hkv, causal=True)
    x = rng.standard_normal((1, 10, E)).astype(np.float32)
    native, ref = simdattn.KvCache(layer, 1, 16, dtype=fmt), simdattn.KvCache(layer, 1, 16, dtype=fmt)
    assert native.dtype == fmt
    pool = simdattn.KvPool(layer, 8, 4, dtype=fmt)
    seq = pool.add()
    outs = []
    for chunk in (x[:, :6], x[:, 6:7], x[:, 7:10]):
        chunk = np.ascontiguousarray(chunk)
        a = layer.forward(chunk, cache=native)
        b = layer.forward(chunk, cache=ref, backend="reference")
        c = layer.forward_pool([seq], [chunk[0]], pool)[0]
        assert np.abs(a - b).max() <= 1e-5
        assert np.abs(a[0] - c).max() <= 1e-5
        outs.append(a)
    assert pool.key_scales().shape == (8, 4, Hkv) and pool.key_scales().dtype == np.float32
    assert pool.keys().dtype == (np.int8 if fmt == "int8" else np.uint8)
    bad = np.ascontiguousarray(x[:, :1]).copy()
    bad[0, 0, 3] = np.nan
    with pytest.raises(simdattn.Error, match="cache"):
        layer.forward(bad, cache=native)
    assert native.lengths == [10]


@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3"])
def test_attention_paged_over_codes_every_option(fmt):
    """Window, softcap, ALiBi, sinks, a scale and no causality over 8-bit blocks: native against
    the reference backend on the same codes (attention()'s float64 oracle on their values)."""
    rng = np.random.default_rng(9)
    H, Hkv, D, bs = 4, 2, 32, 16
    seq_lens = np.array([600, 9, 70], np.int64)
    qlens = np.array([1, 9, 20], np.int64)
    need = [(n + bs - 1) // bs for n in seq_lens]
    table = np.zeros((3, max(need)), np.int32)
    perm = rng.permutation(sum(need))
    at = 0
    for i, n in enumerate(need):
        table[i, :n] = perm[at:at + n]
        at += n
    k = rng.standard_normal((sum(need), bs, Hkv, D)).astype(np.float32)
    v = rng.standard_normal((sum(need), bs, Hkv, D)).astype(np.float32)
    kc, ks = simdattn.quantize_kv(k, fmt)
    vc, vs = simdattn.quantize_kv(v, fmt)
    starts = np.concatenate([[0], np.cumsum(qlens)])
    q = rng.standard_normal((int(starts[-1]), H, D)).astype(np.float32)
    slopes = simdattn.standard_alibi_slopes(H)
    for opts in ({"window": (40, 0)}, {"softcap": 5.0, "alibi_slopes": slopes, "sinks": [0.5] * H},
                 {"causal": None, "scale": 0.2}, {"causal": None, "window": (8, 8), "sinks": [1.0] * H}):
        outs = [simdattn.attention_paged(q, kc, vc, table, seq_lens, query_start=starts, k_scale=ks, v_scale=vs,
                                         kv_dtype=fmt, backend=b, **opts) for b in ("native", "reference")]
        assert np.abs(outs[0] - outs[1]).max() <= 1e-5, opts
