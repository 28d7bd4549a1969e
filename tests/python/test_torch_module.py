"""simdattn.torch: scaled_dot_product_attention against a float64 reference written from torch's
documentation, and MultiheadAttention against torch.nn.MultiheadAttention itself.

Run:  PYTHONPATH=build/python /usr/bin/python3 -m pytest -q tests/python/test_torch_module.py
"""
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import simdattn
import simdattn.torch as st

torch.set_num_threads(1)

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
# (rtol, atol) against the float64 reference on the same (rounded) inputs
TOL = {torch.float32: 2e-5, torch.float64: 1e-12, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def sdpa_reference(query, key, value, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """torch's documented definition of scaled_dot_product_attention, in float64.

    A row whose every score is -inf gives zeros (torch's math backend's safe softmax, 2.5+).
    """
    q, k, v = query.double(), key.double(), value.double()
    L, S = q.size(-2), k.size(-2)
    scale_factor = 1 / math.sqrt(q.size(-1)) if scale is None else scale
    attn_bias = torch.zeros(L, S, dtype=torch.float64)
    if is_causal:
        keep = torch.ones(L, S, dtype=torch.bool).tril(diagonal=0)
        attn_bias = attn_bias.masked_fill(keep.logical_not(), float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            attn_bias = attn_bias.masked_fill(attn_mask.logical_not(), float("-inf"))
        else:
            attn_bias = attn_mask.double() + attn_bias
    if enable_gqa:
        k = k.repeat_interleave(q.size(-3) // k.size(-3), -3)
        v = v.repeat_interleave(q.size(-3) // v.size(-3), -3)
    w = q @ k.transpose(-2, -1) * scale_factor
    w = w + attn_bias
    masked = torch.isneginf(w).all(dim=-1, keepdim=True)
    w = torch.softmax(w, dim=-1).masked_fill(masked, 0.0)
    return w @ v


def broadcast_variant(rng, shape):
    """shape with some leading dimensions set to 1 or dropped (a shape that broadcasts to it)."""
    s = [1 if rng.random() < 0.35 else d for d in shape]
    drop = int(rng.integers(0, len(s) + 1)) if rng.random() < 0.3 else 0
    return s[drop:]


def random_case(seed):
    rng = np.random.default_rng(seed)
    dtype = DTYPES[seed % len(DTYPES)]
    nlead = int(rng.integers(0, 4))  # 0..3 leading dimensions
    lead = [int(rng.integers(1, 4)) for _ in range(nlead)]
    L, S = int(rng.integers(1, 20)), int(rng.integers(1, 24))
    E, Ev = int(rng.choice([1, 4, 8, 16, 33, 64])), int(rng.choice([1, 5, 8, 16]))
    gqa = nlead >= 1 and rng.random() < 0.3
    kv_lead = list(lead)
    if gqa:
        hk = int(rng.choice([1, 2]))
        lead[-1] = hk * int(rng.integers(1, 4))
        kv_lead[-1] = hk
    q_lead = broadcast_variant(rng, lead) if rng.random() < 0.3 else lead
    k_lead = kv_lead if gqa or rng.random() < 0.7 else broadcast_variant(rng, kv_lead)
    t = lambda *s: torch.randn(*s, dtype=torch.float64).to(dtype)  # noqa: E731
    if gqa:
        q_lead = lead  # the heads axis (-3) stays
    q, k, v = t(*q_lead, L, E), t(*k_lead, S, E), t(*k_lead, S, Ev)
    kw = {}
    choice = rng.random()
    if choice < 0.25:
        kw["is_causal"] = True
    elif choice < 0.65:
        mshape = broadcast_variant(rng, lead + [L, S]) if rng.random() < 0.7 else [L, S]
        if not mshape or (len(mshape) < 2 and rng.random() < 0.5):
            mshape = [L, S]
        if rng.random() < 0.5:
            m = torch.from_numpy(rng.random(mshape) < 0.7)
        else:
            m = torch.from_numpy(rng.standard_normal(mshape))
            m[torch.from_numpy(rng.random(mshape) < 0.15)] = float("-inf")
            m = m.to(dtype if rng.random() < 0.5 else torch.float32)
        kw["attn_mask"] = m
    if rng.random() < 0.4:
        kw["scale"] = float(rng.uniform(0.05, 1.0))
    if gqa:
        kw["enable_gqa"] = True
    return q, k, v, kw, dtype


@pytest.mark.parametrize("seed", range(240))
def test_sdpa_random_cases_vs_documented_reference(seed):
    q, k, v, kw, dtype = random_case(seed)
    out = st.scaled_dot_product_attention(q, k, v, **kw)
    want = sdpa_reference(q, k, v, **kw)
    assert isinstance(out, torch.Tensor) and out.dtype == dtype
    assert out.shape == want.shape, (out.shape, want.shape, kw)
    tol = TOL[dtype]
    np.testing.assert_allclose(out.double().numpy(), want.numpy(), rtol=tol, atol=tol)


def test_sdpa_every_mask_broadcast_shape():
    B, H, L, S, E = 2, 3, 5, 7, 8
    q, k, v = torch.randn(B, H, L, E), torch.randn(B, H, S, E), torch.randn(B, H, S, E)
    for shape in [(L, S), (1, S), (S,), (L, 1), (1, 1), (H, L, S), (1, L, S), (B, 1, L, S), (B, H, L, S),
                  (1, H, 1, S), (B, 1, 1, S), (1, 1, L, S), (B, H, 1, 1)]:
        for kind in ("bool", "float"):
            m = torch.rand(*shape) < 0.7 if kind == "bool" else torch.randn(*shape)
            out = st.scaled_dot_product_attention(q, k, v, attn_mask=m)
            want = sdpa_reference(q, k, v, attn_mask=m)
            np.testing.assert_allclose(out.double().numpy(), want.numpy(), rtol=2e-5, atol=2e-5,
                                       err_msg=f"{kind} mask {shape}")


@pytest.mark.parametrize("L,S", [(3, 9), (9, 3), (1, 6), (6, 6)])
def test_sdpa_causal_is_top_left_for_any_lengths(L, S):
    q, k, v = torch.randn(2, 4, L, 16), torch.randn(2, 4, S, 16), torch.randn(2, 4, S, 8)
    out = st.scaled_dot_product_attention(q, k, v, is_causal=True)
    np.testing.assert_allclose(out.double().numpy(), sdpa_reference(q, k, v, is_causal=True).numpy(), rtol=2e-5,
                               atol=2e-5)
    # query i sees keys 0..i: the explicit lower-triangular mask gives the same
    tril = torch.ones(L, S, dtype=torch.bool).tril()
    if L <= S:
        assert torch.equal(out, st.scaled_dot_product_attention(q, k, v, attn_mask=tril))


def test_sdpa_gqa_equals_repeated_heads_and_reads_in_place():
    q, k, v = torch.randn(2, 8, 5, 16), torch.randn(2, 2, 7, 16), torch.randn(2, 2, 7, 16)
    out = st.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    rep = st.scaled_dot_product_attention(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1))
    np.testing.assert_allclose(out.numpy(), rep.numpy(), rtol=1e-6, atol=1e-6)
    # different key and value head counts are repeated as torch does
    v1 = torch.randn(2, 1, 7, 16)
    out = st.scaled_dot_product_attention(q, k, v1, enable_gqa=True)
    np.testing.assert_allclose(out.double().numpy(), sdpa_reference(q, k, v1, enable_gqa=True).numpy(), rtol=2e-5,
                               atol=2e-5)


def test_sdpa_non_contiguous_inputs_and_leading_dims():
    base = torch.randn(2, 7, 3, 16)       # [B, S, H, D]: heads as a strided view
    q = base.transpose(1, 2)
    out = st.scaled_dot_product_attention(q, q, q)
    np.testing.assert_allclose(out.double().numpy(), sdpa_reference(q, q, q).numpy(), rtol=2e-5, atol=2e-5)
    x = torch.randn(2, 3, 2, 5, 8)        # three leading dimensions
    out = st.scaled_dot_product_attention(x, x, x, is_causal=True)
    assert out.shape == (2, 3, 2, 5, 8)
    np.testing.assert_allclose(out.double().numpy(), sdpa_reference(x, x, x, is_causal=True).numpy(), rtol=2e-5,
                               atol=2e-5)
    y = torch.randn(5, 8)                 # no leading dimension
    np.testing.assert_allclose(st.scaled_dot_product_attention(y, y, y).double().numpy(),
                               sdpa_reference(y, y, y).numpy(), rtol=2e-5, atol=2e-5)


def test_sdpa_refusals_name_the_argument():
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    cases = [
        (dict(dropout_p=0.1), "dropout_p"),
        (dict(is_causal=True, attn_mask=torch.ones(4, 5, dtype=torch.bool)), "attn_mask"),
        (dict(key=k.double()), "key"),
        (dict(value=torch.randn(1, 2, 6, 8)), "value"),
        (dict(key=torch.randn(1, 2, 5, 7)), "key"),
        (dict(attn_mask=torch.ones(4, 5, dtype=torch.int32)), "attn_mask"),
        (dict(attn_mask=torch.ones(3, 5)), "attn_mask"),
        (dict(query=torch.randn(1, 3, 4, 8), enable_gqa=True), "enable_gqa"),
        (dict(query=q.int()), "query"),
        (dict(query=np.zeros((1, 2, 4, 8), np.float32)), "query"),
    ]
    for change, name in cases:
        args = dict(query=q, key=k, value=v)
        args.update(change)
        with pytest.raises(ValueError) as e:
            st.scaled_dot_product_attention(**args)
        assert str(e.value).startswith(name), (change, str(e.value))


# ---- MultiheadAttention against torch.nn.MultiheadAttention ------------------------------------

def torch_mha(E, H, seed, **kw):
    torch.manual_seed(seed)
    m = torch.nn.MultiheadAttention(E, H, **kw)
    with torch.no_grad():
        for p in m.parameters():  # torch zero-initialises the biases: make every parameter count
            p.copy_(torch.randn_like(p) * 0.3)
    return m.eval()


def check_same(ours, theirs, *args, **kw):
    with torch.no_grad():
        y_t, w_t = theirs(*args, **kw)
        y, w = ours(*args, **kw)
    assert y.shape == y_t.shape and y.dtype == y_t.dtype
    np.testing.assert_allclose(y.numpy(), y_t.numpy(), rtol=1e-5, atol=1e-5)
    if w_t is None:
        assert w is None
    else:
        assert w.shape == w_t.shape
        np.testing.assert_allclose(w.numpy(), w_t.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("need_weights,average", [(True, True), (True, False), (False, True)])
def test_mha_self_attention_with_masks(batch_first, need_weights, average):
    E, H, N, L = 32, 4, 3, 9
    m = torch_mha(E, H, 1, batch_first=batch_first)
    ours = st.MultiheadAttention(E, H, batch_first=batch_first)
    ours.load_state_dict(m.state_dict())
    x = torch.randn(N, L, E) if batch_first else torch.randn(L, N, E)
    kw = dict(need_weights=need_weights, average_attn_weights=average)
    check_same(ours, m, x, x, x, **kw)
    kpm = torch.rand(N, L) < 0.3
    kpm[:, 0] = False  # no fully padded row (torch 1.13 gives NaN there)
    check_same(ours, m, x, x, x, key_padding_mask=kpm, **kw)
    # a float key_padding_mask is added; torch 1.13's inference fast path (batch_first self-attention)
    # turns it into a bool mask instead, so its general path (train mode: dropout is 0) is the oracle
    check_same(ours, m.train(), x, x, x, key_padding_mask=torch.randn(N, L), **kw)
    m.eval()
    causal = torch.triu(torch.ones(L, L, dtype=torch.bool), diagonal=1)         # True = not allowed
    check_same(ours, m, x, x, x, attn_mask=causal, key_padding_mask=kpm, **kw)
    check_same(ours, m, x, x, x, attn_mask=torch.randn(L, L), **kw)
    per_head = torch.rand(N * H, L, L) < 0.3
    per_head[..., 0] = False
    check_same(ours, m, x, x, x, attn_mask=per_head, **kw)
    check_same(ours, m, x, x, x, attn_mask=torch.randn(N * H, L, L), key_padding_mask=kpm, **kw)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("kdim,vdim", [(None, None), (20, 13)])
def test_mha_cross_attention_kdim_vdim(batch_first, kdim, vdim):
    E, H, N, L, S = 24, 3, 2, 5, 11
    m = torch_mha(E, H, 2, kdim=kdim, vdim=vdim, batch_first=batch_first)
    ours = st.MultiheadAttention.from_torch(m)
    assert set(ours.state_dict()) == set(m.state_dict())
    shape = (lambda s, d: (N, s, d)) if batch_first else (lambda s, d: (s, N, d))
    q, k, v = torch.randn(*shape(L, E)), torch.randn(*shape(S, kdim or E)), torch.randn(*shape(S, vdim or E))
    kpm = torch.rand(N, S) < 0.4
    kpm[:, 0] = False
    for avg in (True, False):
        check_same(ours, m, q, k, v, key_padding_mask=kpm, average_attn_weights=avg)
    check_same(ours, m, q, k, v, attn_mask=torch.randn(L, S), need_weights=False)


def test_mha_unbatched_no_bias_and_float64():
    E, H, L, S = 16, 2, 4, 6
    m = torch_mha(E, H, 3, bias=False)
    ours = st.MultiheadAttention.from_torch(m)
    assert ours.in_proj_bias is None and ours.out_proj.bias is None
    q, kv = torch.randn(L, E), torch.randn(S, E)
    check_same(ours, m, q, kv, kv)
    check_same(ours, m, q, kv, kv, key_padding_mask=torch.tensor([False, True, False, False, True, False]))
    m64 = torch_mha(E, H, 4).double()
    ours64 = st.MultiheadAttention.from_torch(m64)
    x = torch.randn(L, 2, E, dtype=torch.float64)
    with torch.no_grad():
        y_t, w_t = m64(x, x, x)
        y, w = ours64(x, x, x)
    assert y.dtype == torch.float64
    np.testing.assert_allclose(y.numpy(), y_t.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(w.numpy(), w_t.numpy(), rtol=1e-12, atol=1e-12)


def test_mha_is_causal_hint_and_refusals():
    E, H, L = 16, 2, 5
    m = torch_mha(E, H, 5)
    ours = st.MultiheadAttention.from_torch(m)
    x = torch.randn(L, 1, E)
    mask = torch.triu(torch.full((L, L), float("-inf")), diagonal=1)
    with torch.no_grad():
        y_t, _ = m(x, x, x, attn_mask=mask)
    y, _ = ours(x, x, x, attn_mask=mask, is_causal=True)
    np.testing.assert_allclose(y.numpy(), y_t.numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="^attn_mask"):
        ours(x, x, x, is_causal=True)
    for kw, name in [(dict(dropout=0.1), "dropout"), (dict(add_bias_kv=True), "add_bias_kv"),
                     (dict(add_zero_attn=True), "add_zero_attn"), (dict(num_heads=3), "num_heads")]:
        args = dict(embed_dim=E, num_heads=H)
        args.update(kw)
        with pytest.raises(ValueError, match="^" + name):
            st.MultiheadAttention(**args)
    with pytest.raises(ValueError, match="^module"):
        st.MultiheadAttention.from_torch(torch.nn.MultiheadAttention(E, H, add_bias_kv=True))
    with pytest.raises(ValueError, match="^query"):
        ours(torch.randn(L, 1, E + 1), x, x)
    with pytest.raises(ValueError, match="^key_padding_mask"):
        ours(x, x, x, key_padding_mask=torch.zeros(1, L + 1, dtype=torch.bool))


def test_mha_state_dict_round_trip_and_module_behaviour():
    m = torch_mha(32, 4, 6)
    ours = st.MultiheadAttention(32, 4)
    ours.load_state_dict(m.state_dict())
    m2 = torch.nn.MultiheadAttention(32, 4)
    m2.load_state_dict(ours.state_dict())  # and back
    x = torch.randn(5, 2, 32)
    check_same(ours, m2.eval(), x, x, x)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in m.named_parameters()]
    # a parameter changed in place takes effect on the next call (nothing cached)
    with torch.no_grad():
        m.out_proj.weight.mul_(2)
        ours.out_proj.weight.mul_(2)
    check_same(ours, m, x, x, x)


def runtime_in_a_new_process(code, env=None):
    e = dict(os.environ)
    e.pop("SIMDATTN_THREAD_RUNTIME", None)
    e.update(env or {})
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_importing_simdattn_torch_selects_openmp_unless_chosen():
    # plain simdattn: team; simdattn.torch makes openmp the default (torch's pool runs the loops)
    assert runtime_in_a_new_process(
        "import simdattn; print(simdattn.thread_runtime()); import simdattn.torch; print(simdattn.thread_runtime())"
    ) == ["team", "openmp"]
    # a default, not a choice: after a call on team, the import still switches
    assert runtime_in_a_new_process(
        "import numpy as np, simdattn; q = np.ones((1, 2, 300, 16), np.float32); simdattn.attention(q, q, q); "
        "import simdattn.torch; print(simdattn.thread_runtime())") == ["openmp"]
    # a choice stands: the environment's, or set_thread_runtime's before the import
    assert runtime_in_a_new_process("import simdattn.torch, simdattn; print(simdattn.thread_runtime())",
                                    {"SIMDATTN_THREAD_RUNTIME": "team"}) == ["team"]
    assert runtime_in_a_new_process(
        "import simdattn; simdattn.set_thread_runtime('team'); import simdattn.torch; print(simdattn.thread_runtime())"
    ) == ["team"]
