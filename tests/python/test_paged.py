"""simdattn.attention_paged, KvPool and MultiHeadAttention.forward_pool against a float64 NumPy
oracle written from the contract (docs/serving.md): per sequence, keys gathered through the block
table, query j at position seq_len - query_len + j.

Run:  PYTHONPATH=build/python /usr/bin/python3 -m pytest -q tests/python/test_paged.py
"""
import numpy as np
import pytest

import simdattn

TOL = {"float32": 2e-5, "float16": 2e-3, "bf16": 2e-2}


def bf16_round(x):
    """float32 values rounded to bfloat16 (nearest even), as float64."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    return b.astype(np.uint32).view(np.float32).astype(np.float64)


def oracle(q, k_cache, v_cache, table, seq_lens, query_start, causal=True, scale=None, window=None,
           softcap=None, alibi=None, sinks=None):
    q, k_cache, v_cache = (np.asarray(a, np.float64) for a in (q, k_cache, v_cache))
    total_q, H, D = q.shape
    bs, Hkv, Dv = k_cache.shape[1], k_cache.shape[2], v_cache.shape[3]
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    out = np.zeros((total_q, H, Dv))
    for i, L in enumerate(seq_lens):
        q0, q1 = query_start[i], query_start[i + 1]
        t = np.arange(L)
        k = k_cache[table[i][t // bs], t % bs]  # [L, Hkv, D]
        v = v_cache[table[i][t // bs], t % bs]
        for j in range(q1 - q0):
            p = L - (q1 - q0) + j
            vis = np.ones(L, bool)
            if causal:
                vis &= t <= p
            if window is not None:
                if window[0] >= 0:
                    vis &= t >= p - window[0]
                if window[1] >= 0:
                    vis &= t <= p + window[1]
            for h in range(H):
                hk = h // (H // Hkv)
                s = k[:, hk] @ q[q0 + j, h] * scale
                if softcap is not None:
                    s = softcap * np.tanh(s / softcap)
                if alibi is not None:
                    s = s + alibi[h] * (t - p)
                s = np.where(vis, s, -np.inf)
                m = s.max() if vis.any() else -np.inf
                if sinks is not None:
                    m = max(m, sinks[h])
                if m == -np.inf or not vis.any():
                    continue
                w = np.exp(s - m)
                den = w.sum() + (np.exp(sinks[h] - m) if sinks is not None else 0.0)
                out[q0 + j, h] = (w @ v[:, hk]) / den
    return out


def make_case(rng, seq_lens, query_lens, H=4, Hkv=2, D=16, Dv=16, bs=16, dtype="float32"):
    blocks = [(L + bs - 1) // bs for L in seq_lens]
    num_blocks = sum(blocks) + 2
    perm = rng.permutation(num_blocks)
    table = np.full((len(seq_lens), max(blocks) + 1), -5, np.int32)
    n = 0
    for i, b in enumerate(blocks):
        table[i, :b] = perm[n:n + b]
        n += b
    npdt = np.float16 if dtype == "float16" else np.float32
    q = rng.standard_normal((sum(query_lens), H, D)).astype(npdt)
    k = rng.standard_normal((num_blocks, bs, Hkv, D)).astype(npdt)
    v = rng.standard_normal((num_blocks, bs, Hkv, Dv)).astype(npdt)
    qs = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int64)
    return q, k, v, table, np.asarray(seq_lens, np.int64), qs


OPTIONS = [
    {},
    {"window": (20, 0)},
    {"softcap": 4.0, "alibi": True, "sinks": True},
    {"causal": None, "scale": 0.25},
]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bf16"])
@pytest.mark.parametrize("bs", [1, 16, 32, 5])
def test_attention_paged_matches_the_oracle(dtype, bs):
    rng = np.random.default_rng(7 + bs)
    seq_lens, query_lens = [1, 37, 600, 80, 300], [1, 7, 1, 64, 300]
    q, k, v, table, lens, qs = make_case(rng, seq_lens, query_lens, bs=bs, dtype=dtype)
    H = q.shape[1]
    slopes = np.asarray(simdattn_slopes(H), np.float32)
    sinks = rng.standard_normal(H).astype(np.float32)
    for opt in OPTIONS:
        kw = {key: val for key, val in opt.items() if key not in ("alibi", "sinks")}
        if opt.get("alibi"):
            kw["alibi_slopes"] = slopes
        if opt.get("sinks"):
            kw["sinks"] = sinks
        call = dict(kw)
        if dtype == "bf16":
            call["dtype"] = "bf16"
        got = simdattn.attention_paged(q, k, v, table, lens, query_start=qs, **call)
        ins = (bf16_round(q), bf16_round(k), bf16_round(v)) if dtype == "bf16" else (q, k, v)
        want = oracle(*ins, table, seq_lens, qs, causal=kw.get("causal", True) is not None,
                      scale=kw.get("scale"), window=kw.get("window"), softcap=kw.get("softcap"),
                      alibi=kw.get("alibi_slopes"), sinks=kw.get("sinks"))
        assert got.shape == want.shape
        assert np.abs(got.astype(np.float64) - want).max() <= TOL[dtype] * max(1.0, np.abs(ins[2]).max()), opt
        # bitwise identical at any thread count
        for threads in (1, 2, 3):
            again = simdattn.attention_paged(q, k, v, table, lens, query_start=qs, threads=threads, **call)
            assert np.array_equal(again, got)


def simdattn_slopes(H):
    """ALiBi's standard slopes for H a power of two: 2^(-8 k / H)."""
    return [2.0 ** (-8.0 * (i + 1) / H) for i in range(H)]


def test_strided_caches_read_in_place_and_decode_without_query_start():
    rng = np.random.default_rng(3)
    seq_lens = [40, 1, 513]
    q, k, v, table, lens, _ = make_case(rng, seq_lens, [1, 1, 1], bs=8)
    # every other block of a bigger array, and int64 tables and lengths
    big_k = np.zeros((2 * k.shape[0],) + k.shape[1:], np.float32)
    big_v = np.zeros((2 * v.shape[0],) + v.shape[1:], np.float32)
    big_k[::2], big_v[::2] = k, v
    out = np.full((3, q.shape[1], v.shape[3]), 9.0, np.float32)
    res = simdattn.attention_paged(q, big_k[::2], big_v[::2], table.astype(np.int64), lens, out=out)
    assert res is out
    want = oracle(q, k, v, table, seq_lens, [0, 1, 2, 3])
    assert np.abs(out - want).max() <= 2e-5 * max(1.0, np.abs(v).max())


def test_every_bad_input_is_named_and_out_is_untouched():
    rng = np.random.default_rng(4)
    q, k, v, table, lens, qs = make_case(rng, [40, 20], [3, 1], bs=16)
    out = np.full((4, q.shape[1], v.shape[3]), 5.0, np.float32)

    def err(argument, *args, **kw):
        with pytest.raises(simdattn.Error) as e:
            simdattn.attention_paged(*args, out=out, **kw)
        assert e.value.argument == argument, str(e.value)
        assert (out == 5.0).all()

    bad = table.copy()
    bad[0, 1] = k.shape[0]
    err("block_table", q, k, v, bad, lens, query_start=qs)
    err("block_table", q, k, v, table[:, :2], lens, query_start=qs)  # 40 keys need 3 blocks of 16
    err("query_start", q, k, v, table, lens, query_start=[0, 3, 2])
    err("query_start", q, k, v, table, lens, query_start=[0, 1, 3])
    err("seq_lens", q, k, v, table, np.array([2, 20]), query_start=qs)  # 3 query tokens, 2 keys
    err("q", q, k, v, table, lens)  # 4 tokens without query_start
    err("k_cache", q, k.astype(np.float16), v, table, lens, query_start=qs)
    err("v_cache", q, k, v[:, :8], table, lens, query_start=qs)
    err("block_table", q, k, v, table.astype(np.float32), lens, query_start=qs)
    err("causal", q, k, v, table, lens, query_start=qs, causal="top_left")
    err("sinks", q, k, v, table, lens, query_start=qs, sinks=[1.0])


def make_layer(rng, d=32, H=4, Hkv=2):
    hd = d // H
    w = lambda *s: (0.2 * rng.standard_normal(s)).astype(np.float32)
    return simdattn.MultiHeadAttention(w(d, d), w(Hkv * hd, d), w(Hkv * hd, d), w(d, d), heads=H, kv_heads=Hkv,
                                       rope={"theta": 10000.0})


def test_forward_pool_matches_the_kv_cache_and_fork_copies_on_write():
    rng = np.random.default_rng(5)
    layer = make_layer(rng)
    pool = simdattn.KvPool(layer, num_blocks=64, block_size=4)
    seqs = [pool.add() for _ in range(3)]
    caches = [simdattn.KvCache(layer, 1, 128) for _ in seqs]
    for round_ in ([5, 9, 1], [1, 1, 12], [1, 1, 1]):
        xs = [rng.standard_normal((t, 32)).astype(np.float32) for t in round_]
        outs = layer.forward_pool(seqs, xs, pool)
        for s, x, y, c in zip(seqs, xs, outs, caches):
            want = layer.forward(x[None], cache=c)[0]
            assert np.abs(y - want).max() <= 2e-5
            assert pool.length(s) == c.lengths[0]
    child = pool.fork(seqs[0])
    parent_table = pool.block_table(seqs[0])
    x = rng.standard_normal((2, 32)).astype(np.float32)
    layer.forward_pool([child], [x], pool)
    assert pool.block_table(seqs[0]) == parent_table
    assert pool.block_table(child)[-1] != parent_table[-1]
    # the pool's own blocks through attention_paged: the parent's keys as the layer left them
    k, v = pool.keys(0), pool.values(0)
    assert k.shape == (64, 4, 2, 8) and not k.flags.writeable
    assert v.shape == k.shape and not v.flags.writeable
    for s in [*seqs, child]:
        pool.release(s)
    assert pool.free_blocks == pool.num_blocks
    with pytest.raises(simdattn.Error) as e:
        layer.forward_pool([seqs[0]], [x], pool)
    assert e.value.argument == "steps[0].sequence"


def test_pool_scheduler_batches_threads_and_matches_the_kv_cache():
    import threading
    rng = np.random.default_rng(6)
    layer = make_layer(rng)
    pool = simdattn.KvPool(layer, num_blocks=128, block_size=8)
    sched = simdattn.PoolScheduler(layer, pool, token_budget=16)
    prompts = [rng.standard_normal((n, 32)).astype(np.float32) for n in (40, 1, 9, 23)]
    decodes = [[rng.standard_normal((1, 32)).astype(np.float32) for _ in range(5)] for _ in prompts]
    results = [None] * len(prompts)

    def stream(i):
        s = sched.open()
        outs = [sched.step(s, prompts[i])] + [sched.step(s, x) for x in decodes[i]]
        results[i] = (s, outs)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, (s, outs) in enumerate(results):
        cache = simdattn.KvCache(layer, 1, 128)
        want = [layer.forward(prompts[i][None], cache=cache)[0]] + [layer.forward(x[None], cache=cache)[0] for x in decodes[i]]
        for got, w in zip(outs, want):
            assert np.abs(got - w).max() <= 1e-4 * max(1.0, np.abs(w).max())
        assert sched.length(s) == len(prompts[i]) + 5
        sched.close(s)
    assert sched.free_blocks == 128
    assert sched.tokens_run == sum(len(p) + 5 for p in prompts)
    assert sched.batches >= 40 // 16
