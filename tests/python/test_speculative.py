"""Speculative decoding's calls (docs/serving.md): attention_paged's tree masks and lse, and
merge_attention_states, against a float64 NumPy oracle written from the contract: new token j of
sequence i sees its context (keys < seq_len - q_len) and the new tokens its row of M_i lists.

Run:  PYTHONPATH=build/python /usr/bin/python3 -m pytest -q tests/python/test_speculative.py
"""
import os

import numpy as np
import pytest

import simdattn
from test_paged import bf16_round

TOL = {"float32": 2e-5, "float16": 2e-3, "bf16": 2e-2}


def tree_oracle(q, k_cache, v_cache, table, seq_lens, qs, masks, scale=None, softcap=None, sinks=None):
    """out [total_q, H, Dv] and lse [total_q, H] in float64."""
    q, k_cache, v_cache = (np.asarray(a, np.float64) for a in (q, k_cache, v_cache))
    total_q, H, D = q.shape
    bs, Hkv, Dv = k_cache.shape[1], k_cache.shape[2], v_cache.shape[3]
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    out = np.zeros((total_q, H, Dv))
    lse = np.full((total_q, H), -np.inf)
    for i, L in enumerate(seq_lens):
        ql = qs[i + 1] - qs[i]
        ctx = L - ql
        t = np.arange(L)
        k = k_cache[table[i][t // bs], t % bs]
        v = v_cache[table[i][t // bs], t % bs]
        for j in range(ql):
            vis = np.concatenate([np.ones(ctx, bool), np.asarray(masks[i][j], bool)])
            for h in range(H):
                hk = h // (H // Hkv)
                s = k[:, hk] @ q[qs[i] + j, h] * scale
                if softcap is not None:
                    s = softcap * np.tanh(s / softcap)
                s = s[vis]
                terms = list(s) + ([sinks[h]] if sinks is not None else [])
                if not terms:
                    continue
                m = max(terms)
                lse[qs[i] + j, h] = m + np.log(np.sum(np.exp(np.asarray(terms) - m)))
                if s.size:
                    w = np.exp(s - lse[qs[i] + j, h])
                    out[qs[i] + j, h] = w @ v[vis, hk]
    return out, lse


def random_tree(rng, n):
    """A draft tree's mask: token j sees itself and its ancestors (parent < j), as drafted trees do."""
    parent = [-1] + [int(rng.integers(0, j)) for j in range(1, n)]
    m = np.zeros((n, n), bool)
    for j in range(n):
        a = j
        while a >= 0:
            m[j, a] = True
            a = parent[a]
    return m


def make_tree_case(rng, contexts, qlens, bs, H=4, Hkv=2, D=16, Dv=12, npdt=np.float32):
    seq_lens = [c + n for c, n in zip(contexts, qlens)]
    blocks = [(L + bs - 1) // bs for L in seq_lens]
    num_blocks = sum(blocks) + 2
    perm = rng.permutation(num_blocks)
    table = np.full((len(seq_lens), max(blocks) + 1), num_blocks + 3, np.int32)  # unread entries out of range
    at = 0
    for i, b in enumerate(blocks):
        table[i, :b] = perm[at:at + b]
        at += b
    q = rng.standard_normal((sum(qlens), H, D)).astype(npdt)
    k = rng.standard_normal((num_blocks, bs, Hkv, D)).astype(npdt)
    v = rng.standard_normal((num_blocks, bs, Hkv, Dv)).astype(npdt)
    qs = np.concatenate([[0], np.cumsum(qlens)]).astype(np.int64)
    masks = [random_tree(rng, n) if rng.random() < 0.5 else rng.random((n, n)) < 0.4 for n in qlens]
    return q, k, v, table, np.asarray(seq_lens, np.int64), qs, masks


def flat(masks):
    return np.concatenate([m.reshape(-1) for m in masks] + [np.zeros(0, bool)])


@pytest.mark.parametrize("dtype", ["float32", "float16", "bf16"])
@pytest.mark.parametrize("bs", [1, 16, 32])
def test_tree_masks_and_lse_match_the_oracle(dtype, bs):
    rng = np.random.default_rng(100 + bs)
    contexts, qlens = [0, 300, 17, 64, 5], [6, 40, 1, 32, 3]
    npdt = np.float16 if dtype == "float16" else np.float32
    q, k, v, table, lens, qs, masks = make_tree_case(rng, contexts, qlens, bs, npdt=npdt)
    masks[0][2] = False  # no context and an empty row: sees nothing
    sinks = rng.standard_normal(q.shape[1]).astype(np.float32)
    for opt in ({}, {"softcap": 3.0}, {"sinks": sinks, "scale": 0.3}, {"causal": None}):
        call = dict(opt)
        if dtype == "bf16":
            call["dtype"] = "bf16"
        got, lse = simdattn.attention_paged(q, k, v, table, lens, query_start=qs, tree_mask=flat(masks),
                                            return_lse=True, **call)
        ins = (bf16_round(q), bf16_round(k), bf16_round(v)) if dtype == "bf16" else (q, k, v)
        want, want_lse = tree_oracle(*ins, table, lens, qs, masks, scale=opt.get("scale"),
                                     softcap=opt.get("softcap"), sinks=opt.get("sinks"))
        assert np.abs(got.astype(np.float64) - want).max() <= TOL[dtype] * max(1.0, np.abs(ins[2]).max()), opt
        assert lse.dtype == np.float32 and lse.shape == want_lse.shape
        assert np.array_equal(np.isneginf(lse), np.isneginf(want_lse)), opt
        fin = np.isfinite(want_lse)
        assert np.abs(lse[fin] - want_lse[fin]).max() <= 10 * TOL[dtype], opt
        if "sinks" not in opt:
            assert np.all(got[2] == 0) and np.all(np.isneginf(lse[2])), opt  # the row that sees nothing
        for threads in (1, 2, 3):  # bitwise identical at any thread count
            again, lse_again = simdattn.attention_paged(q, k, v, table, lens, query_start=qs, tree_mask=flat(masks),
                                                        return_lse=True, threads=threads, **call)
            assert np.array_equal(again, got) and np.array_equal(lse_again, lse), (opt, threads)
        ref = simdattn.attention_paged(q, k, v, table, lens, query_start=qs, tree_mask=flat(masks), backend="reference",
                                       **call)
        assert np.abs(ref.astype(np.float64) - want).max() <= TOL[dtype] * max(1.0, np.abs(ins[2]).max()), opt


@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3", "fp8_e5m2"])
def test_tree_masks_over_8bit_caches(fmt):
    rng = np.random.default_rng(7)
    q, k, v, table, lens, qs, masks = make_tree_case(rng, [100, 0, 33], [24, 5, 9], 16, H=8, Hkv=2, D=32, Dv=32)
    kc, ks = simdattn.quantize_kv(k, fmt)
    vc, vs = simdattn.quantize_kv(v, fmt)
    kh, vh = simdattn.dequantize_kv(kc, ks, fmt), simdattn.dequantize_kv(vc, vs, fmt)
    got, lse = simdattn.attention_paged(q, kc, vc, table, lens, query_start=qs, k_scale=ks, v_scale=vs, kv_dtype=fmt,
                                        tree_mask=flat(masks), return_lse=True)
    ref, ref_lse = simdattn.attention_paged(q, kc, vc, table, lens, query_start=qs, k_scale=ks, v_scale=vs,
                                            kv_dtype=fmt, tree_mask=flat(masks), return_lse=True, backend="reference")
    assert np.abs(got - ref).max() <= 1e-5 and np.abs(lse - ref_lse).max() <= 1e-5
    want, want_lse = tree_oracle(q, kh, vh, table, lens, qs, masks)
    fin = np.isfinite(want_lse)
    assert np.abs(got - want).max() <= 1e-4 and np.abs(lse[fin] - want_lse[fin]).max() <= 1e-4
    again = simdattn.attention_paged(q, kc, vc, table, lens, query_start=qs, k_scale=ks, v_scale=vs, kv_dtype=fmt,
                                     tree_mask=flat(masks), threads=3)
    assert np.array_equal(again, got)


def test_tree_mask_start_places_each_matrix_and_bad_ones_are_named():
    rng = np.random.default_rng(3)
    q, k, v, table, lens, qs, masks = make_tree_case(rng, [10, 20], [3, 4], 16)
    plain = simdattn.attention_paged(q, k, v, table, lens, query_start=qs, tree_mask=flat(masks))
    # the same matrices from element 5 on, with more after them, placed by tree_mask_start (int32 or int64)
    spread = np.concatenate([np.ones(5, bool), masks[0].reshape(-1), masks[1].reshape(-1), np.ones(3, bool)])
    for dt in (np.int32, np.int64):
        starts = np.array([5, 5 + 9, 5 + 9 + 16], dt)
        got = simdattn.attention_paged(q, k, v, table, lens, query_start=qs, tree_mask=spread.astype(np.uint8),
                                       tree_mask_start=starts)
        assert np.array_equal(got, plain)
    for causal in ("top_left", "none", True):  # ignored with a tree mask (top_left refused without one)
        assert np.array_equal(simdattn.attention_paged(q, k, v, table, lens, query_start=qs, tree_mask=flat(masks),
                                                       causal=causal), plain)
    # a mask that shows every new token its predecessors and itself is bottom-right causal
    causal = [np.tril(np.ones((n, n), bool)) for n in (3, 4)]
    assert np.array_equal(simdattn.attention_paged(q, k, v, table, lens, query_start=qs, tree_mask=flat(causal)),
                          simdattn.attention_paged(q, k, v, table, lens, query_start=qs))
    out = np.full((7, 4, 12), 5.0, np.float32)
    bad = [
        ("tree_mask", dict(tree_mask=flat(masks)[:-1])),                          # too short
        ("tree_mask", dict(tree_mask=flat(masks).reshape(1, -1))),                # not 1-D
        ("tree_mask", dict(tree_mask=flat(masks).astype(np.float32))),            # not bool / uint8
        ("tree_mask", dict(tree_mask=flat(masks), window=(4, 0))),                # positions not linear
        ("tree_mask", dict(tree_mask=flat(masks), alibi_slopes=[0.5] * 4)),
        ("tree_mask_start", dict(tree_mask=flat(masks), tree_mask_start=[0, 9])),        # N + 1 entries
        ("tree_mask_start", dict(tree_mask=flat(masks), tree_mask_start=[0, 8, 24])),    # 3^2 apart
        ("tree_mask_start", dict(tree_mask=flat(masks), tree_mask_start=[1, 10, 26])),   # past the end
        ("tree_mask_start", dict(tree_mask_start=[0, 9, 25])),                           # without a mask
        ("tree_mask_start", dict(tree_mask=flat(masks), tree_mask_start=[0.5, 9.5, 25.5])),  # not integers
        ("lse", dict(lse=np.zeros((7, 3), np.float32))),
        ("lse", dict(lse=np.zeros((7, 4), np.float64))),
    ]
    for name, kw in bad:
        with pytest.raises(simdattn.Error) as e:
            simdattn.attention_paged(q, k, v, table, lens, query_start=qs, out=out, **kw)
        assert e.value.argument == name, (name, kw, str(e.value))
        assert np.all(out == 5.0), name  # nothing written


def test_lse_without_a_tree_and_in_a_given_array():
    rng = np.random.default_rng(5)
    q, k, v, table, lens, qs, _ = make_tree_case(rng, [50, 0], [1, 9], 16)
    ones = [np.tril(np.ones((n, n), bool)) for n in (1, 9)]
    want, want_lse = tree_oracle(q, k, v, table, lens, qs, ones)
    lse = np.zeros((10, 4), np.float32)
    got = simdattn.attention_paged(q, k, v, table, lens, query_start=qs, lse=lse)  # lse written, out returned
    assert isinstance(got, np.ndarray) and np.abs(got - want).max() <= 2e-5
    assert np.abs(lse - want_lse).max() <= 2e-5
    strided = np.zeros((10, 8), np.float32)[:, ::2]
    out, back = simdattn.attention_paged(q, k, v, table, lens, query_start=qs, lse=strided, return_lse=True)
    assert back is strided and np.array_equal(strided, lse)


def merge_oracle(oa, la, ob, lb):
    la, lb = np.asarray(la, np.float64), np.asarray(lb, np.float64)
    m = np.maximum(la, lb)
    both = np.isneginf(la) & np.isneginf(lb)
    m = np.where(both, 0.0, m)
    wa, wb = np.exp(la - m), np.exp(lb - m)
    den = np.where(both, 1.0, wa + wb)
    out = (wa[..., None] * np.asarray(oa, np.float64) + wb[..., None] * np.asarray(ob, np.float64)) / den[..., None]
    lse = np.where(both, -np.inf, m + np.log(den))
    return np.where(both[..., None], 0.0, out), lse


def test_merge_of_split_key_sets_equals_one_call_over_their_union():
    """Keys of each sequence split into its context and its new tokens (two tree masks, one all
    zeros, one without the context) merge into the call over all of them."""
    rng = np.random.default_rng(11)
    q, k, v, table, lens, qs, masks = make_tree_case(rng, [40, 0, 200], [8, 3, 16], 16)
    sinks = rng.standard_normal(4).astype(np.float32)
    full, full_lse = simdattn.attention_paged(q, k, v, table, lens, query_start=qs, tree_mask=flat(masks),
                                              sinks=sinks, return_lse=True)
    # A: the contexts alone (sinks here only), B: the new tokens alone (sequences cut to their new tokens)
    none = [np.zeros_like(m) for m in masks]
    out_a, lse_a = simdattn.attention_paged(q, k, v, table, lens, query_start=qs, tree_mask=flat(none), sinks=sinks,
                                            return_lse=True)
    ctx_only = tree_oracle(q, k, v, table, lens, qs, none, sinks=sinks)
    assert np.abs(out_a - ctx_only[0]).max() <= 2e-5
    # B: each sequence's new tokens alone, as its tree shows them (float64, then rounded)
    q_lens = np.diff(qs)
    lse_b = np.full_like(lse_a, -np.inf)
    out_b = np.zeros_like(out_a)
    for i in range(len(lens)):
        ql = q_lens[i]
        ctx = lens[i] - ql
        t = np.arange(ctx, lens[i])
        kk = k[table[i][t // 16], t % 16].astype(np.float64)
        vv = v[table[i][t // 16], t % 16].astype(np.float64)
        for j in range(ql):
            for h in range(4):
                s = kk[masks[i][j], h // 2] @ q[qs[i] + j, h].astype(np.float64) / 4.0
                if s.size:
                    mx = s.max()
                    lse_b[qs[i] + j, h] = mx + np.log(np.exp(s - mx).sum())
                    out_b[qs[i] + j, h] = np.exp(s - lse_b[qs[i] + j, h]) @ vv[masks[i][j], h // 2]
    out, lse = simdattn.merge_attention_states(out_a, lse_a, out_b, lse_b)
    assert np.abs(out - full).max() <= 2e-5 and np.abs(lse - full_lse).max() <= 2e-5
    want, want_lse = merge_oracle(out_a, lse_a, out_b, lse_b)
    assert np.abs(out - want).max() <= 1e-6 and np.allclose(lse, want_lse, atol=1e-6)
    # in place, into a's arrays
    a2, l2 = out_a.copy(), lse_a.copy()
    res = simdattn.merge_attention_states(a2, l2, out_b, lse_b, out=a2, lse=l2)
    assert res[0] is a2 and res[1] is l2 and np.array_equal(a2, out) and np.array_equal(l2, lse)


def test_merge_edges_dtypes_and_errors():
    rng = np.random.default_rng(2)
    oa, ob = rng.standard_normal((5, 3, 8)), rng.standard_normal((5, 3, 8))
    la, lb = rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal((5, 3)).astype(np.float32)
    la[0, 0] = lb[0, 0] = -np.inf  # both empty: 0 and -inf
    la[1, 1] = -np.inf             # a empty: b's row exactly
    oa[1, 1] = np.nan              # ... which a's row (never read) cannot spoil
    lb[2, 2] = -np.inf
    for npdt, tol in ((np.float32, 1e-6), (np.float16, 1e-3)):
        a, b = oa.astype(npdt), ob.astype(npdt)
        out, lse = simdattn.merge_attention_states(a, la, b, lb)
        assert out.dtype == npdt and lse.dtype == np.float32
        want, want_lse = merge_oracle(np.where(np.isnan(a), 0, a), la, b, lb)
        assert np.abs(out.astype(np.float64) - want).max() <= tol
        assert np.array_equal(np.isneginf(lse), np.isneginf(want_lse))
        assert np.all(out[0, 0] == 0) and lse[0, 0] == -np.inf
        assert np.array_equal(out[1, 1], b[1, 1]) and lse[1, 1] == lb[1, 1]
        assert np.array_equal(out[2, 2], a[2, 2])
    # states far from 0: the weights stay each one's share (equal states average, at any size)
    big = np.array([[1e10], [1e16], [-1e30], [3e38]], np.float32)
    ones = np.ones((4, 1, 8), np.float32)
    out, lse = simdattn.merge_attention_states(ones, big, 3 * ones, big)
    assert np.all(out == 2.0) and np.array_equal(lse, big + np.float32(np.log(2.0)))
    a, b = oa.astype(np.float32), ob.astype(np.float32)
    bad = [
        ("out_b", (a, la, b[:4], lb), {}),
        ("out_b", (a, la, b.astype(np.float16), lb), {}),
        ("lse_a", (a, la[:, :2], b, lb), {}),
        ("lse_b", (a, la, b, lb.astype(np.float64)), {}),
        ("out_a", (a[0], la, b, lb), {}),
        ("out", (a, la, b, lb), {"out": np.zeros((5, 3, 7), np.float32)}),
        ("lse", (a, la, b, lb), {"lse": np.zeros((5, 3), np.float64)}),
    ]
    for name, args, kw in bad:
        with pytest.raises(simdattn.Error) as e:
            simdattn.merge_attention_states(*args, **kw)
        assert e.value.argument == name, (name, str(e.value))


def pool_rows(pool, seq, layer):
    """The sequence's K and V rows (and an 8-bit pool's scales) at `layer`, token by token."""
    table, bs = pool.block_table(seq), pool.block_size
    n = pool.length(seq, layer)
    parts = [pool.keys(layer), pool.values(layer)]
    if pool.dtype in ("int8", "fp8_e4m3", "fp8_e5m2"):
        parts += [pool.key_scales(layer), pool.value_scales(layer)]
    return [np.array([p[table[t // bs], t % bs] for t in range(n)]) for p in parts]


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_accept_keeps_the_kept_drafts_in_every_layer_and_never_changes_a_fork(dtype):
    from test_paged import make_layer
    rng = np.random.default_rng(21)
    layer = make_layer(rng)
    pool = simdattn.KvPool(layer, num_blocks=40, block_size=4, layers=2, dtype=dtype)
    seq = pool.add()
    for lay in (0, 1):
        layer.forward_pool([seq], [rng.standard_normal((5, 32)).astype(np.float32)], pool, lay)
    child = pool.fork(seq)  # shares every block: the parent's accept copies what it changes
    drafts = rng.standard_normal((6, 32)).astype(np.float32)
    layer.forward_pool([seq], [drafts], pool, 0)
    layer.forward_pool([seq], [drafts[:4]], pool, 1)  # layer 1 holds 4 of the 6 drafts
    before = [pool_rows(pool, seq, lay) for lay in (0, 1)]
    child_before = [pool_rows(pool, child, lay) for lay in (0, 1)]
    table_before = list(pool.block_table(seq))
    free_before = pool.free_blocks
    bad = [("seq", (child + 7, 5, [0])), ("first", (seq, 12, [])), ("first", (seq, -1, [])),
           ("kept", (seq, 5, [1, 1])), ("kept", (seq, 5, [2, 0])), ("kept", (seq, 5, [6])), ("kept", (seq, 5, [-1])),
           ("kept", (seq, 5, [0.5, 2.7])),  # floats refused, not truncated
           ("kept", (seq, 5, list(range(7))))]  # more entries than the 6 drafts
    for name, args in bad:
        with pytest.raises(simdattn.Error) as e:
            pool.accept(*args)
        assert e.value.argument == name, (name, str(e.value))
        assert list(pool.block_table(seq)) == table_before and pool.free_blocks == free_before  # nothing changed
        assert pool.length(seq, 0) == 11 and pool.length(seq, 1) == 9
    kept = [1, 2, 5]  # drafts 1, 2 and 5 of 5 .. 10
    pool.accept(seq, 5, kept)
    assert pool.length(seq, 0) == 8 and pool.length(seq, 1) == 7  # layer 1 had drafts 0-3: keeps 1 and 2
    for lay, n_drafts in ((0, 6), (1, 4)):
        after = pool_rows(pool, seq, lay)
        keep = [5 + r for r in kept if r < n_drafts]
        for b, a in zip(before[lay], after):
            assert np.array_equal(a[:5], b[:5]) and np.array_equal(a[5:], b[keep])
        for b, a in zip(child_before[lay], pool_rows(pool, child, lay)):
            assert np.array_equal(a, b)
    assert pool.block_table(seq)[:1] == table_before[:1]  # untouched blocks stay shared
    assert len(pool.block_table(seq)) == 2
    pool.accept(seq, 6, [])  # none kept: the length becomes first
    assert pool.length(seq) == 6
    pool.release(seq)
    pool.release(child)
    assert pool.free_blocks == pool.num_blocks


def test_layer_tree_step_equals_per_token_forwards_over_each_tokens_ancestors():
    from test_paged import make_layer
    rng = np.random.default_rng(31)
    layer = make_layer(rng)
    pool = simdattn.KvPool(layer, num_blocks=80, block_size=4)
    seq = pool.add()
    ctx = 7
    layer.forward_pool([seq], [rng.standard_normal((ctx, 32)).astype(np.float32)], pool)
    base = pool.fork(seq)
    n = 9
    parent = [-1] + [int(rng.integers(0, j)) for j in range(1, n)]
    paths = []
    for j in range(n):
        path, a = [], j
        while a >= 0:
            path.insert(0, a)
            a = parent[a]
        paths.append(path)
    mask = np.zeros((n, n), bool)
    for j, path in enumerate(paths):
        mask[j, path] = True
    depth = np.array([len(p) - 1 for p in paths], np.int64)
    x = rng.standard_normal((n, 32)).astype(np.float32)
    other = pool.fork(base)  # a causal step in the same call, beside the tree
    y = rng.standard_normal((3, 32)).astype(np.float32)
    outs = layer.forward_pool([seq, other], [x, y], pool, tree_masks=[mask, None],
                              positions=[ctx + depth, ctx + np.arange(3)])
    assert pool.length(seq) == ctx + n
    for j, path in enumerate(paths):
        c = pool.fork(base)
        want = layer.forward_pool([c], [x[path]], pool, positions=[ctx + np.arange(len(path))])[0][-1]
        assert np.abs(outs[0][j] - want).max() <= 2e-5, j
        pool.release(c)
    c = pool.fork(base)
    assert np.abs(outs[1] - layer.forward_pool([c], [y], pool)[0]).max() <= 2e-5
    # bad masks are named; nothing appended
    for bad, name in ((np.ones((n, n - 1), bool), "tree_masks[0]"), (np.ones((n, n), np.float32), "tree_masks[0]")):
        with pytest.raises(simdattn.Error) as e:
            layer.forward_pool([c], [x], pool, tree_masks=[bad], positions=[ctx + depth])
        assert e.value.argument == name
    assert pool.length(c) == ctx + 3


def test_a_windowed_layer_takes_no_tree():
    rng = np.random.default_rng(4)
    w = lambda *s: (0.2 * rng.standard_normal(s)).astype(np.float32)
    layer = simdattn.MultiHeadAttention(w(32, 32), w(16, 32), w(16, 32), w(32, 32), heads=4, kv_heads=2, window=(8, 0))
    pool = simdattn.KvPool(layer, num_blocks=8, block_size=4)
    s = pool.add()
    with pytest.raises(simdattn.Error) as e:
        layer.forward_pool([s], [w(3, 32)], pool, tree_masks=[np.tril(np.ones((3, 3), bool))])
    assert e.value.argument == "steps[0].tree_mask"
    assert pool.length(s) == 0 and pool.free_blocks == 8
    # a layer without RoPE ignores positions, but not a wrong count or a negative one
    for bad in (np.arange(2), np.array([0, -1, 2])):
        with pytest.raises(simdattn.Error) as e:
            layer.forward_pool([s], [w(3, 32)], pool, positions=[bad])
        assert "positions" in e.value.argument
    assert pool.length(s) == 0 and pool.free_blocks == 8


def lines_of(err):
    return [dict(w.split("=", 1) for w in line.split(" ")[1:])
            for line in err.splitlines() if line.startswith("simdattn: ")]


def test_forward_pool_takes_the_cascade_by_itself_and_equals_unshared_twins(capfd):
    """4 forks of a 512-token prompt (8 kv heads of 128, f32: 16 MiB of shared rows), a decode step
    each: the layer attends the prompt once (its verbose line says cascade=4x512); each fork's
    output equals an unshared twin's (the same rows, its own copy of the prompt)."""
    from test_paged import make_layer
    rng = np.random.default_rng(41)
    d = 1024
    layer = make_layer(rng, d=d, H=8, Hkv=8)
    pool = simdattn.KvPool(layer, num_blocks=200, block_size=16)
    prompt = rng.standard_normal((512, d)).astype(np.float32)
    p = pool.add()
    layer.forward_pool([p], [prompt], pool)
    own = [rng.standard_normal((n, d)).astype(np.float32) for n in (3, 17, 0, 40)]
    forks, twins = [], []
    for x in own:
        forks.append(pool.fork(p))
        twins.append(pool.add())
        layer.forward_pool([twins[-1]], [prompt], pool)
        if len(x):
            layer.forward_pool([forks[-1], twins[-1]], [x, x], pool)
    step = [rng.standard_normal((1, d)).astype(np.float32) for _ in forks]
    capfd.readouterr()
    simdattn.set_verbose(True)
    try:
        got = layer.forward_pool(forks, step, pool)
        want = layer.forward_pool(twins, step, pool)
    finally:
        simdattn.set_verbose(False)
    lines = lines_of(capfd.readouterr().err)
    assert [line.get("cascade") for line in lines] == ["4x512", None]
    for g, w in zip(got, want):
        assert np.abs(g - w).max() <= 1e-5 * max(1.0, np.abs(w).max())


def test_simdattn_cascade_environment_never_and_a_bad_value():
    import subprocess
    import sys
    code = ("import simdattn, numpy as np, sys; sys.path.insert(0, %r); from test_paged import make_layer; "
            "rng = np.random.default_rng(1); layer = make_layer(rng); pool = simdattn.KvPool(layer, 8, 4); s = pool.add()\n"
            "try:\n    layer.forward_pool([s], [np.ones((2, 32), np.float32)], pool)\n"
            "except simdattn.Error as e:\n    print(e.argument, pool.length(s)); sys.exit(0)\n"
            "print('ran', pool.length(s))") % os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ)
    for value, want in (("never", "ran 2"), ("always", "ran 2"), ("sometimes", "SIMDATTN_CASCADE 0")):
        env["SIMDATTN_CASCADE"] = value
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == want


def test_pool_scheduler_runs_a_draft_tree_whole_and_accepts_a_path():
    """A tree step through the PoolScheduler (token budget smaller than the tree: it still runs
    whole, in one batch) equals forward_pool's tree step; accept keeps the chosen path."""
    from test_paged import make_layer
    rng = np.random.default_rng(43)
    layer = make_layer(rng)
    pool_a = simdattn.KvPool(layer, num_blocks=40, block_size=4)
    pool_b = simdattn.KvPool(layer, num_blocks=40, block_size=4)
    ctx = rng.standard_normal((9, 32)).astype(np.float32)
    sa = pool_a.add()
    layer.forward_pool([sa], [ctx], pool_a)
    n = 7
    mask = random_tree(rng, n)
    depth = mask.sum(axis=1) - 1
    drafts = rng.standard_normal((n, 32)).astype(np.float32)
    want = layer.forward_pool([sa], [drafts], pool_a, tree_masks=[mask], positions=[9 + depth])[0]
    sched = simdattn.PoolScheduler(layer, pool_b, token_budget=2)
    sb = sched.open()
    sched.step(sb, ctx)
    got = sched.step(sb, drafts, positions=9 + depth, tree_mask=mask)
    assert np.abs(got - want).max() <= 2e-5
    assert sched.length(sb) == 9 + n
    path = [j for j in range(n) if mask[n - 1, j]]  # the root .. draft n - 1
    sched.accept(sb, 9, path)
    pool_a.accept(sa, 9, path)
    assert sched.length(sb) == 9 + len(path)
    x = rng.standard_normal((1, 32)).astype(np.float32)
    nxt = sched.step(sb, x)
    assert np.abs(nxt - layer.forward_pool([sa], [x], pool_a)[0]).max() <= 2e-5
    with pytest.raises(simdattn.Error) as e:
        sched.step(sb, drafts, tree_mask=np.ones((n, n - 1), bool))
    assert e.value.argument == "tree_mask"
    with pytest.raises(simdattn.Error) as e:
        sched.accept(sb, 9, [3, 1])
    assert e.value.argument == "kept"
    sched.close(sb)
