#!/usr/bin/env python3
"""A tiny Qwen3-Next checkpoint written with NumPy only (config.json + model.safetensors with the
published tensor names and shapes, F32 or BF16), and its two token mixers in float64, written from
transformers' modeling_qwen3_next.py: the gated full attention (Qwen3NextAttention) and the Gated
DeltaNet linear attention (Qwen3NextGatedDeltaNet) with its carried state.

    python3 qwen3_next_model.py            # self-check of the references, prints OK
    python3 qwen3_next_model.py OUT_DIR    # writes OUT_DIR/config.json and the weights

Used by tests/python/layers/test_qwen3_next.py and tests/cli/test_models.py.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mha_weights  # noqa: E402  (write_safetensors, bf16 rounding)

# Small sizes; the linear value head (6) differs from the key head (8) on purpose, and each
# key head serves two value heads.
CONFIG = {
    "model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"], "vocab_size": 64,
    "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    "rms_norm_eps": 1e-6, "attention_bias": False, "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 6,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "hidden_act": "silu",
    "max_position_embeddings": 256,
}


def layer_types(cfg):
    """Each layer's kind; without layer_types, every full_attention_interval-th layer (default 4)
    is full attention, as the configuration class fills it in."""
    if cfg.get("layer_types"):
        return list(cfg["layer_types"])
    every = cfg.get("full_attention_interval", 4)
    return ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(cfg["num_hidden_layers"])]


def full_layers(cfg):
    return [i for i, t in enumerate(layer_types(cfg)) if t == "full_attention"]


def linear_layers(cfg):
    return [i for i, t in enumerate(layer_types(cfg)) if t == "linear_attention"]


def gdn_dims(cfg):
    """(Hk, Hv, Dk, Dv, kernel, conv_dim) of the linear-attention layers."""
    Hk, Hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    Dk, Dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    return Hk, Hv, Dk, Dv, cfg["linear_conv_kernel_dim"], 2 * Hk * Dk + Hv * Dv


def attention_dims(cfg):
    """(hidden, H, Hkv, head_dim) of the full-attention layers."""
    d, H = cfg["hidden_size"], cfg["num_attention_heads"]
    return d, H, cfg.get("num_key_value_heads", H), cfg.get("head_dim") or d // H


def stored(a, dtype):
    """The weight as the checkpoint stores it: (safetensors entry, its float64 value)."""
    a = np.asarray(a, np.float64)
    if dtype == "BF16":
        return ("BF16", mha_weights.bf16_bits(a)), mha_weights.to_bf16(a)
    v = a.astype({"F32": np.float32}[dtype])
    return v, v.astype(np.float64)


def checkpoint_tensors(cfg, rng):
    """{name without "model.": float64 array}: every layer's mixer, plus neighbours a loader skips."""
    d, H, Hkv, hd = attention_dims(cfg)
    Hk, Hv, Dk, Dv, K, conv_dim = gdn_dims(cfg)
    g = lambda *shape: rng.normal(0, 1 / np.sqrt(shape[-1]), shape)  # noqa: E731  std 1/sqrt(fan_in)
    t = {}
    for n, kind in enumerate(layer_types(cfg)):
        if kind == "linear_attention":
            a = f"layers.{n}.linear_attn."
            t[a + "in_proj_qkvz.weight"] = g(2 * Hk * Dk + 2 * Hv * Dv, d)
            t[a + "in_proj_ba.weight"] = g(2 * Hv, d)
            t[a + "conv1d.weight"] = rng.normal(0, 1 / np.sqrt(K), (conv_dim, 1, K))  # depthwise: fan_in K
            t[a + "dt_bias"] = rng.normal(0, 0.5, Hv)
            t[a + "A_log"] = np.log(rng.uniform(1, 16, Hv))
            t[a + "norm.weight"] = 1 + rng.normal(0, 0.2, Dv)
            t[a + "out_proj.weight"] = g(d, Hv * Dv)
        else:
            a = f"layers.{n}.self_attn."
            t[a + "q_proj.weight"], t[a + "k_proj.weight"] = g(H * hd * 2, d), g(Hkv * hd, d)
            t[a + "v_proj.weight"], t[a + "o_proj.weight"] = g(Hkv * hd, d), g(d, H * hd)
            if cfg.get("attention_bias"):
                for p, m in (("q", H * hd * 2), ("k", Hkv * hd), ("v", Hkv * hd), ("o", d)):
                    t[a + f"{p}_proj.bias"] = rng.normal(0, 0.1, m)
            # Qwen3NextRMSNorm scales by (1 + weight): stored weights sit around 0
            t[a + "q_norm.weight"], t[a + "k_norm.weight"] = rng.normal(0, 0.2, hd), rng.normal(0, 0.2, hd)
        t[f"layers.{n}.input_layernorm.weight"] = rng.normal(0, 0.2, d)
        t[f"layers.{n}.post_attention_layernorm.weight"] = rng.normal(0, 0.2, d)
    t["embed_tokens.weight"] = g(cfg.get("vocab_size", 64), d)
    t["norm.weight"] = rng.normal(0, 0.2, d)
    return t


def write_checkpoint(out_dir, rng, dtype="F32", config_edit=None):
    """out_dir/config.json and out_dir/model.safetensors (tensors under "model.", dtype F32 or
    BF16). Returns (cfg, {name without "model.": float64 value as stored})."""
    os.makedirs(out_dir, exist_ok=True)
    cfg = json.loads(json.dumps(CONFIG))
    if config_edit:
        config_edit(cfg)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    entries, values = {}, {}
    for name, a in checkpoint_tensors(cfg, rng).items():
        entries["model." + name], values[name] = stored(a, dtype)
    mha_weights.write_safetensors(os.path.join(out_dir, "model.safetensors"), entries, {"format": "pt"})
    return cfg, values


# ---- the float64 definitions ----------------------------------------------------------------

def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def silu(x):
    return x * sigmoid(x)


def softplus(x):
    """torch's F.softplus (beta 1, threshold 20: the identity above it)."""
    return np.where(x > 20, x, np.logaddexp(0, np.minimum(x, 20)))


def linear(x, W, name):
    """nn.Linear from the tensors name.weight (and name.bias when the checkpoint has one)."""
    return x @ W[name + ".weight"].T + W.get(name + ".bias", 0.0)


def rope_of(cfg):
    """(theta, rotary_dim) as compute_default_rope_parameters reads them."""
    p = cfg.get("rope_parameters") or {}
    assert p.get("rope_type", "default") == "default", p
    theta = p.get("rope_theta", cfg.get("rope_theta", 10000.0))
    factor = p.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))
    return theta, int(attention_dims(cfg)[3] * factor)


def attention_reference(cfg, values, layer, x, positions=None):
    """Qwen3NextAttention on x [B, S, hidden] (causal, no cache) -> [B, S, hidden]."""
    W, x = values, np.asarray(x, np.float64)
    B, S, _ = x.shape
    d, H, Hkv, hd = attention_dims(cfg)
    eps = cfg.get("rms_norm_eps", 1e-6)
    a = f"layers.{layer}.self_attn."
    norm = lambda z, w: z / np.sqrt((z * z).mean(-1, keepdims=True) + eps) * (1 + w)  # noqa: E731
    qg = linear(x, W, a + "q_proj").reshape(B, S, H, 2 * hd)  # per head: query | gate
    q, gate = qg[..., :hd], qg[..., hd:].reshape(B, S, H * hd)
    q = norm(q, W[a + "q_norm.weight"]).transpose(0, 2, 1, 3)
    k = norm(linear(x, W, a + "k_proj").reshape(B, S, Hkv, hd), W[a + "k_norm.weight"]).transpose(0, 2, 1, 3)
    v = linear(x, W, a + "v_proj").reshape(B, S, Hkv, hd).transpose(0, 2, 1, 3)
    theta, r = rope_of(cfg)
    pos = np.broadcast_to(np.arange(S), (B, S)) if positions is None else np.asarray(positions)
    inv_freq = 1.0 / theta ** (np.arange(0, r, 2, dtype=np.float64) / r)
    f = pos[:, :, None].astype(np.float64) * inv_freq  # [B, S, r/2]
    emb = np.concatenate([f, f], axis=-1)[:, None]  # [B, 1, S, r]
    cos, sin = np.cos(emb), np.sin(emb)

    def rotary(t):  # the first r dims: t * cos + rotate_half(t) * sin; the rest pass
        t_rot = t[..., :r]
        half = np.concatenate([-t_rot[..., r // 2:], t_rot[..., :r // 2]], axis=-1)
        return np.concatenate([t_rot * cos + half * sin, t[..., r:]], axis=-1)

    q, k = rotary(q), rotary(k)
    k, v = np.repeat(k, H // Hkv, axis=1), np.repeat(v, H // Hkv, axis=1)  # repeat_kv
    s = (q @ k.transpose(0, 1, 3, 2)) * hd ** -0.5
    s = np.where(np.tril(np.ones((S, S), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    o = (p / p.sum(-1, keepdims=True)) @ v
    o = o.transpose(0, 2, 1, 3).reshape(B, S, H * hd) * sigmoid(gate)
    return linear(o, W, a + "o_proj")


def recurrent_gated_delta_rule(q, k, v, g, beta, state=None):
    """torch_recurrent_gated_delta_rule with the qk L2 norm: q, k [B, S, Hv, Dk] (already repeated
    to the value heads), v [B, S, Hv, Dv], g, beta [B, S, Hv]; state [B, Hv, Dk, Dv] or None.
    Returns (o [B, S, Hv, Dv], final state)."""
    l2 = lambda t: t / np.sqrt((t * t).sum(-1, keepdims=True) + 1e-6)  # noqa: E731
    q, k = l2(q) * q.shape[-1] ** -0.5, l2(k)
    B, S, Hv, Dk = k.shape
    st = np.zeros((B, Hv, Dk, v.shape[-1])) if state is None else np.array(state, np.float64)
    o = np.zeros(v.shape)
    for t in range(S):
        st = st * np.exp(g[:, t])[..., None, None]
        u = beta[:, t, :, None] * (v[:, t] - np.einsum("bhkv,bhk->bhv", st, k[:, t]))
        st = st + k[:, t, :, :, None] * u[:, :, None, :]
        o[:, t] = np.einsum("bhkv,bhk->bhv", st, q[:, t])
    return o, st


def chunk_gated_delta_rule(q, k, v, g, beta, state=None, chunk=64):
    """torch_chunk_gated_delta_rule (qk L2 norm, with an initial state) ported to float64: the
    same arguments and result as recurrent_gated_delta_rule."""
    l2 = lambda t: t / np.sqrt((t * t).sum(-1, keepdims=True) + 1e-6)  # noqa: E731
    q, k = l2(q), l2(k)
    q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))  # [B, H, S, D]
    g, beta = g.transpose(0, 2, 1), beta.transpose(0, 2, 1)
    B, H, S, Dk = k.shape
    Dv = v.shape[-1]
    pad = (chunk - S % chunk) % chunk
    q, k, v = (np.pad(t, ((0, 0), (0, 0), (0, pad), (0, 0))) for t in (q, k, v))
    g, beta = (np.pad(t, ((0, 0), (0, 0), (0, pad))) for t in (g, beta))
    q = q * Dk ** -0.5
    v_beta, k_beta = v * beta[..., None], k * beta[..., None]
    N = (S + pad) // chunk
    q, k, v, k_beta, v_beta = (t.reshape(B, H, N, chunk, t.shape[-1]) for t in (q, k, v, k_beta, v_beta))
    g = g.reshape(B, H, N, chunk).cumsum(-1)
    decay = np.tril(np.exp(np.tril(g[..., :, None] - g[..., None, :])))
    attn = -(k_beta @ k.swapaxes(-1, -2)) * decay
    attn = np.where(np.triu(np.ones((chunk, chunk), bool)), 0.0, attn)
    for i in range(1, chunk):
        row, sub = attn[..., i, :i].copy(), attn[..., :i, :i].copy()
        attn[..., i, :i] = row + (row[..., :, None] * sub).sum(-2)
    attn = attn + np.eye(chunk)
    value = attn @ v_beta
    k_cumdecay = attn @ (k_beta * np.exp(g)[..., None])
    st = np.zeros((B, H, Dk, Dv)) if state is None else np.array(state, np.float64)
    out = np.zeros((B, H, N, chunk, Dv))
    strict = np.triu(np.ones((chunk, chunk), bool), 1)
    for i in range(N):
        q_i, k_i, v_i, g_i = q[:, :, i], k[:, :, i], value[:, :, i], g[:, :, i]
        a_i = np.where(strict, 0.0, (q_i @ k_i.swapaxes(-1, -2)) * decay[:, :, i])
        v_new = v_i - k_cumdecay[:, :, i] @ st
        out[:, :, i] = (q_i * np.exp(g_i)[..., None]) @ st + a_i @ v_new
        st = (st * np.exp(g_i[..., -1])[..., None, None]
              + (k_i * np.exp(g_i[..., -1:] - g_i)[..., None]).swapaxes(-1, -2) @ v_new)
    out = out.reshape(B, H, N * chunk, Dv)[:, :, :S]
    return out.transpose(0, 2, 1, 3), st


def gated_deltanet_reference(cfg, values, layer, x, state=None, rule=recurrent_gated_delta_rule):
    """Qwen3NextGatedDeltaNet on x [B, S, hidden] after the tokens state summarizes. state: None
    (nothing seen) or {"conv": [B, conv_dim, kernel-1] the last pre-convolution inputs (zeros
    before the first token), "recurrent": [B, Hv, Dk, Dv]}. Returns (y [B, S, hidden], the state
    after x). rule: the delta-rule core (the self-check swaps in the chunked form)."""
    W, x = values, np.asarray(x, np.float64)
    B, S, _ = x.shape
    Hk, Hv, Dk, Dv, K, conv_dim = gdn_dims(cfg)
    r = Hv // Hk
    a = f"layers.{layer}.linear_attn."
    # fix_query_key_value_ordering: per key head group q | k | v (r heads) | z (r heads), b | a
    qkvz = linear(x, W, a + "in_proj_qkvz").reshape(B, S, Hk, 2 * Dk + 2 * r * Dv)
    q, k = qkvz[..., :Dk], qkvz[..., Dk:2 * Dk]
    v, z = qkvz[..., 2 * Dk:2 * Dk + r * Dv], qkvz[..., 2 * Dk + r * Dv:].reshape(B, S, Hv, Dv)
    ba = linear(x, W, a + "in_proj_ba").reshape(B, S, Hk, 2 * r)
    b, a_ = ba[..., :r].reshape(B, S, Hv), ba[..., r:].reshape(B, S, Hv)
    mixed = np.concatenate([q.reshape(B, S, -1), k.reshape(B, S, -1), v.reshape(B, S, -1)], axis=-1)
    # causal depthwise conv1d (no bias) over the carried window and the new tokens, then SiLU
    window = np.zeros((B, conv_dim, K - 1)) if state is None else np.asarray(state["conv"], np.float64)
    seq = np.concatenate([window.transpose(0, 2, 1), mixed], axis=1)  # [B, K-1+S, conv_dim]
    w = W[a + "conv1d.weight"][:, 0, :]  # [conv_dim, K]
    conv = sum(seq[:, j:j + S] * w[:, j] for j in range(K))
    mixed = silu(conv)
    q = mixed[..., :Hk * Dk].reshape(B, S, Hk, Dk)
    k = mixed[..., Hk * Dk:2 * Hk * Dk].reshape(B, S, Hk, Dk)
    v = mixed[..., 2 * Hk * Dk:].reshape(B, S, Hv, Dv)
    beta = sigmoid(b)
    g = -np.exp(W[a + "A_log"]) * softplus(a_ + W[a + "dt_bias"])
    q, k = np.repeat(q, r, axis=2), np.repeat(k, r, axis=2)  # value head h reads key head h // r
    o, rec = rule(q, k, v, g, beta, None if state is None else state["recurrent"])
    # Qwen3NextRMSNormGated per (token, value head), then out_proj
    eps = cfg.get("rms_norm_eps", 1e-6)
    o = W[a + "norm.weight"] * (o / np.sqrt((o * o).mean(-1, keepdims=True) + eps)) * silu(z)
    y = linear(o.reshape(B, S, Hv * Dv), W, a + "out_proj")
    return y, {"conv": seq[:, seq.shape[1] - (K - 1):].transpose(0, 2, 1).copy(), "recurrent": rec}


def _self_check():
    import tempfile
    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in ("F32", "BF16"):
            cfg, W = write_checkpoint(os.path.join(tmp, dtype), np.random.default_rng(1), dtype)
            with open(os.path.join(tmp, dtype, "model.safetensors"), "rb") as f:
                header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
            for name, val in W.items():
                assert header["model." + name]["shape"] == list(val.shape), name
                assert header["model." + name]["dtype"] == dtype, name
            assert len(header) == len(W) + 1  # and __metadata__
        assert full_layers(cfg) == [3] and linear_layers(cfg) == [0, 1, 2]
        B, S, d = 2, 7, cfg["hidden_size"]
        x = rng.normal(0, 1, (B, S, d))
        y = attention_reference(cfg, W, 3, x)
        assert y.shape == (B, S, d) and np.isfinite(y).all()
        shifted = attention_reference(cfg, W, 3, x, positions=np.arange(S)[None] + np.array([[5], [11]]))
        print(f"attention: |y| {np.abs(y).max():.3f}, rotary shift-invariance {np.abs(shifted - y).max():.1e}")
        assert np.abs(shifted - y).max() < 1e-12  # only relative positions enter the scores
        x2 = x.copy()
        x2[:, -1] += 1
        assert np.array_equal(attention_reference(cfg, W, 3, x2)[:, :-1], y[:, :-1])  # causal
        for layer in linear_layers(cfg):
            whole, st = gated_deltanet_reference(cfg, W, layer, x)
            parts, s = [], None
            for lo, hi in ((0, 1), (1, 3), (3, 4), (4, 7)):  # the first call shorter than the window
                yp, s = gated_deltanet_reference(cfg, W, layer, x[:, lo:hi], s)
                parts.append(yp)
            split = np.abs(np.concatenate(parts, axis=1) - whole).max()
            assert split < 1e-12 and np.abs(s["recurrent"] - st["recurrent"]).max() < 1e-12, split
            assert np.array_equal(s["conv"], st["conv"]) and st["conv"].shape == (B, gdn_dims(cfg)[5], 3)
        print(f"gated deltanet: |y| {np.abs(whole).max():.3f}, whole vs split {split:.1e}")
        # the recurrence against transformers' chunked form: two chunks, a carried state
        xl = rng.normal(0, 1, (B, 75, d))
        _, s0 = gated_deltanet_reference(cfg, W, 1, xl[:, :5])
        y_r, s_r = gated_deltanet_reference(cfg, W, 1, xl[:, 5:], s0)
        y_c, s_c = gated_deltanet_reference(cfg, W, 1, xl[:, 5:], s0, rule=chunk_gated_delta_rule)
        e_layer = max(np.abs(y_c - y_r).max() / np.abs(y_r).max(), np.abs(s_c["recurrent"] - s_r["recurrent"]).max())
        Hv, Dk, Dv, T = 4, 8, 6, 150  # and alone, with slow decay so the state carries across chunks
        q, k = rng.normal(0, 1, (B, T, Hv, Dk)), rng.normal(0, 1, (B, T, Hv, Dk))
        v, g = rng.normal(0, 1, (B, T, Hv, Dv)), -rng.uniform(0, 0.05, (B, T, Hv))
        beta, s0 = rng.uniform(0, 1, (B, T, Hv)), rng.normal(0, 0.3, (B, Hv, Dk, Dv))
        (o_r, f_r), (o_c, f_c) = (fn(q, k, v, g, beta, s0) for fn in (recurrent_gated_delta_rule, chunk_gated_delta_rule))
        e_core = max(np.abs(o_c - o_r).max() / np.abs(o_r).max(), np.abs(f_c - f_r).max() / np.abs(f_r).max())
        print(f"recurrent vs chunked: layer (70 tokens) {e_layer:.1e}, core (150 tokens) {e_core:.1e}")
        assert e_layer < 1e-10 and e_core < 1e-10
    print("OK")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        write_checkpoint(sys.argv[1], np.random.default_rng(0), sys.argv[2] if len(sys.argv) > 2 else "F32")
    else:
        _self_check()
