"""simdattn.MultiHeadAttention against torch.nn.MultiheadAttention and the model families' float64
definitions (the checkpoint loaders), and its KV cache against the full forward.

Run:  PYTHONPATH=build/python /usr/bin/python3 -m pytest -q tests/python
(ctest registers the folder as the test `python`).
"""
import math
import os
import sys

import numpy as np
import pytest
import torch

import simdattn
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from oracles import expect_error  # noqa: E402


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
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "cli", "checkpoints"))
import model_families  # noqa: E402


@pytest.mark.parametrize("family,layer", [("gpt2", 1), ("qwen2", 0), ("qwen2", 1), ("gemma2", 0), ("bert", 1),
                                          ("llama", 1), ("gpt_oss", 0), ("gpt_oss", 1), ("deepseek_v2", 1),
                                          ("deepseek_v3", 0)])
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


@pytest.mark.parametrize("family,edit", [
    ("gpt_oss", lambda c: (c.pop("num_key_value_heads"), c.update(num_attention_heads=16))),  # absent: 8
    ("gpt_oss", lambda c: c.update(num_key_value_heads=None)),  # null: as many as heads
    ("gpt_oss", lambda c: c.pop("head_dim")),  # absent: 64
    ("gpt_oss", lambda c: c.update(head_dim=None)),  # null: hidden_size / heads
    ("deepseek_v3", lambda c: c.update(rope_interleave=None)),  # null is falsy where the class tests it
    ("deepseek_v3", lambda c: c.update(rope_interleave=False)),
    ("mistral", lambda c: (c.pop("num_key_value_heads"), c.update(num_attention_heads=16, head_dim=4))),  # 8
    ("qwen2", lambda c: (c.pop("num_key_value_heads"), c.update(num_attention_heads=64, head_dim=2))),  # 32
    ("gemma2", lambda c: (c.pop("num_key_value_heads"), c.update(num_attention_heads=8))),  # 4
    ("qwen3", lambda c: c.pop("head_dim")),  # 128
    ("llama", lambda c: (c.pop("num_key_value_heads"), c.pop("num_hidden_layers"))),  # heads; 32 layers
    ("vit", lambda c: c.update(qkv_bias=None)),  # nn.Linear's bias=None: none
    ("gpt2", lambda c: c.update(scale_attn_weights=None)),  # tested for truth: unscaled
    ("llama", lambda c: c.update(original_max_position_embeddings=32)),  # over rope_scaling's (16)
    ("llama", lambda c: c.update(rope_scaling={k: v for k, v in c["rope_scaling"].items()  # max_position_embeddings'
                                               if k != "original_max_position_embeddings"})),  # 2048
    ("mistral", lambda c: c.update(rope_scaling={"rope_type": "yarn", "factor": 4.0})),  # Mistral's 131072 positions
    ("gpt2", lambda c: c.update(hidden_size=c.pop("n_embd"), num_attention_heads=c.pop("n_head"),
                                num_hidden_layers=c.pop("n_layer")))])  # GPT2Config's attribute_map
def test_from_pretrained_absent_and_null_keys_as_transformers_reads_them(tmp_path, family, edit):
    rng = np.random.default_rng(3)
    W = model_families.write_checkpoint(str(tmp_path), family, rng, config_edit=edit, shapes_follow_edit=True)
    cfg = dict(model_families.FAMILIES[family]["config"])
    edit(cfg)
    m = simdattn.MultiHeadAttention.from_pretrained(str(tmp_path), 1, dtype="f64")
    x = rng.standard_normal((1, 6, 32))
    want = model_families.reference(family, cfg, W, 1, x)
    got = m.forward(x)
    assert np.abs(got - want).max() <= 1e-10 * max(1.0, np.abs(want).max())


def test_from_pretrained_arguments_as_the_contract_names_them(tmp_path):
    # (model_dir, layer_index, dtype=None): a pathlib.Path, the contract's keywords, dtype third;
    # the earlier keywords dir= and layer= still taken
    rng = np.random.default_rng(5)
    model_families.write_checkpoint(str(tmp_path), "gpt_oss", rng)
    x = rng.standard_normal((1, 4, 32))
    want = simdattn.MultiHeadAttention.from_pretrained(str(tmp_path), 1, dtype="f64").forward(x)
    for m in (simdattn.MultiHeadAttention.from_pretrained(tmp_path, 1, "f64"),
              simdattn.MultiHeadAttention.from_pretrained(model_dir=tmp_path, layer_index=1, dtype="f64"),
              simdattn.MultiHeadAttention.from_pretrained(dir=str(tmp_path), layer=1, dtype="f64")):
        assert m.dtype == "f64" and np.array_equal(m.forward(x), want)
    expect_error("model_dir", simdattn.MultiHeadAttention.from_pretrained, 3, 1)


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


@pytest.mark.parametrize("cache_dtype,tol", [(None, 1e-4), ("bf16", 3e-2), ("int8", 6e-2)])
def test_gpt_oss_cached_and_pool_steps_equal_the_prefill(tmp_path, cache_dtype, tol):
    """gpt-oss's layers (sinks, a sliding layer of window 3 and a full one, YaRN): a prompt and
    then steps of 1-3 tokens through a KvCache and through a KvPool equal the whole sequence's
    forward, row for row."""
    rng = np.random.default_rng(17)
    model_families.write_checkpoint(str(tmp_path), "gpt_oss", rng)
    for layer in (0, 1):
        m = simdattn.MultiHeadAttention.from_pretrained(str(tmp_path), layer, dtype="f32")
        x = rng.standard_normal((1, 12, 32)).astype(np.float32)
        full = m.forward(x)[0]
        cache = simdattn.KvCache(m, 1, 16, dtype=cache_dtype)
        pool = simdattn.KvPool(m, 8, 4, 1, cache_dtype)
        seq = pool.add()
        at = 0
        for n in (5, 1, 3, 1, 2):
            step = x[:, at:at + n]
            got = m.forward(step, cache=cache)[0]
            pooled = m.forward_pool([seq], [step[0]], pool)[0]
            scale = max(1.0, np.abs(full[at:at + n]).max())
            assert np.abs(got - full[at:at + n]).max() <= tol * scale, (layer, at)
            assert np.abs(pooled - full[at:at + n]).max() <= tol * scale, (layer, at)
            at += n


@pytest.mark.parametrize("family", ["deepseek_v2", "deepseek_v3"])
@pytest.mark.parametrize("cache_dtype,tol", [(None, 1e-4), ("bf16", 3e-2), ("int8", 6e-2)])
def test_mla_latent_cache_steps_equal_the_prefill(tmp_path, family, cache_dtype, tol):
    """DeepSeek's MLA over its latent cache (the absorbed form: each head over the one latent row
    a token): a prompt, then steps of 1-3 tokens, row for row the whole sequence's forward (the
    expanded form); the cache holds kv_lora_rank + qk_rope_head_dim values a token."""
    rng = np.random.default_rng(23)
    model_families.write_checkpoint(str(tmp_path), family, rng)
    cfg = model_families.FAMILIES[family]["config"]
    width = cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]
    for layer in (0, 1):
        m = simdattn.MultiHeadAttention.from_pretrained(str(tmp_path), layer, dtype="f32")
        x = rng.standard_normal((2, 12, 32)).astype(np.float32)
        full = m.forward(x)
        cache = simdattn.KvCache(m, 2, 16, dtype=cache_dtype)
        per_row = {None: 4 * width, "bf16": 2 * width, "int8": width + 4}[cache_dtype]
        assert cache.bytes_per_token == per_row
        at = 0
        for n in (5, 1, 3, 1, 2):
            got = m.forward(x[:, at:at + n], cache=cache)
            scale = max(1.0, np.abs(full[:, at:at + n]).max())
            assert np.abs(got - full[:, at:at + n]).max() <= tol * scale, (layer, at)
            at += n
        assert list(cache.lengths) == [12, 12]


@pytest.mark.parametrize("pool_dtype,tol", [(None, 1e-4), ("bf16", 3e-2), ("int8", 6e-2)])
def test_mla_pool_steps_forks_and_drafts(tmp_path, pool_dtype, tol):
    """DeepSeek-V3's MLA over a KvPool of latent rows: two sequences' prompts and steps in one
    forward_pool batch equal each one's prefill; a fork shares the prompt's blocks (copy-on-write
    when it writes); a draft tree's accepted path equals a causal step of those tokens."""
    rng = np.random.default_rng(29)
    model_families.write_checkpoint(str(tmp_path), "deepseek_v3", rng)
    m = simdattn.MultiHeadAttention.from_pretrained(str(tmp_path), 1, dtype="f32")
    cfg = model_families.FAMILIES["deepseek_v3"]["config"]
    width = cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]
    pool = simdattn.KvPool(m, 40, 4, 1, pool_dtype)
    assert pool.bytes_per_token == {None: 4 * width, "bf16": 2 * width, "int8": width + 4}[pool_dtype]
    if pool_dtype != "bf16":  # (NumPy has no bfloat16 view)
        assert pool.keys(0).shape[-1] == width and pool.values(0).shape[-1] == cfg["kv_lora_rank"]
    x = rng.standard_normal((2, 11, 32)).astype(np.float32)
    full = m.forward(x)
    a, b = pool.add(), pool.add()
    at = 0
    for n in (6, 1, 2, 1, 1):
        ya, yb = m.forward_pool([a, b], [x[0, at:at + n], x[1, at:at + n]], pool)
        for y, row in ((ya, 0), (yb, 1)):
            scale = max(1.0, np.abs(full[row, at:at + n]).max())
            assert np.abs(y - full[row, at:at + n]).max() <= tol * scale, at
        at += n
    # a fork continues like its parent would
    c = pool.fork(a)
    x2 = np.concatenate([x[0], rng.standard_normal((3, 32)).astype(np.float32)])[None]
    want = m.forward(x2)[0, 11:]
    got = m.forward_pool([c], [x2[0, 11:]], pool)[0]
    assert np.abs(got - want).max() <= tol * max(1.0, np.abs(want).max())
    assert pool.length(a) == 11 and pool.length(c) == 14
    # a draft tree over b: token 0 the root, 1 and 2 its children; accept [0, 2]
    drafts = rng.standard_normal((3, 32)).astype(np.float32)
    mask = np.array([[1, 0, 0], [1, 1, 0], [1, 0, 1]], bool)
    out = m.forward_pool([b], [drafts], pool, tree_masks=[mask], positions=[11 + np.array([0, 1, 1])])[0]
    pool.accept(b, 11, [0, 2])
    want = m.forward(np.concatenate([x[1], drafts[[0, 2]]])[None])[0, 11:]
    assert np.abs(out[[0, 2]] - want).max() <= tol * max(1.0, np.abs(want).max())
    with pytest.raises(simdattn.Error) as e:
        w = lambda *sh: rng.standard_normal(sh).astype(np.float32)  # noqa: E731
        plain = simdattn.MultiHeadAttention(w(32, 32), w(32, 32), w(32, 32), w(32, 32), heads=4)
        m.forward_pool([b], [drafts], simdattn.KvPool(plain, 8, 4))
    assert e.value.argument == "pool"
    for s in (a, b, c):
        pool.release(s)
    assert pool.free_blocks == pool.num_blocks
