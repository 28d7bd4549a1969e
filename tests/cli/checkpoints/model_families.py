#!/usr/bin/env python3
"""Tiny checkpoints of the model families `simdattn mha --model` loads, written with NumPy only
(config.json + safetensors with each family's published tensor names, shapes and dtypes; one
family sharded), and each family's attention sub-layer in float64, written from its published
definition (the papers and Hugging Face's / diffusers' reference implementations):

    python3 model_families.py OUT_DIR FAMILY     # writes OUT_DIR/config.json and the weights

Used by tests/cli/test_models.py, tests/cli/test_gguf.py and tests/python/layers/.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mha_weights  # noqa: E402  (write_safetensors, bf16 rounding, rope_reference, t5_bucket, alibi_slopes)

# Per family: its config.json, the dtype its weights ship in, the prefix its tensors carry (as
# the publisher's head-model checkpoints do), and how many shards.
FAMILIES = {
    "bert": dict(config={"model_type": "bert", "hidden_size": 32, "num_attention_heads": 4,
                         "num_hidden_layers": 2, "layer_norm_eps": 1e-12}, dtype="F32", prefix="bert."),
    "roberta": dict(config={"model_type": "roberta", "hidden_size": 32, "num_attention_heads": 4,
                            "num_hidden_layers": 2}, dtype="F32", prefix="roberta."),
    "vit": dict(config={"model_type": "vit", "hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 2,
                        "qkv_bias": True}, dtype="F32", prefix="vit."),
    "deit": dict(config={"model_type": "deit", "hidden_size": 32, "num_attention_heads": 2, "num_hidden_layers": 2},
                 dtype="F16", prefix="deit."),
    "gpt2": dict(config={"model_type": "gpt2", "n_embd": 32, "n_head": 4, "n_layer": 2, "n_positions": 64,
                         "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": True}, dtype="F32", prefix=""),
    "t5": dict(config={"model_type": "t5", "d_model": 32, "d_kv": 6, "num_heads": 4, "num_layers": 2,
                       "num_decoder_layers": 2, "relative_attention_num_buckets": 8,
                       "relative_attention_max_distance": 12}, dtype="F32", prefix=""),
    "bloom": dict(config={"model_type": "bloom", "hidden_size": 32, "n_head": 4, "n_layer": 2},
                  dtype="BF16", prefix="transformer."),
    "llama": dict(config={"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
                          "num_hidden_layers": 2, "rope_theta": 500000.0, "attention_bias": False,
                          "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 16}},
                  dtype="BF16", prefix="model.", shards=2),
    "mistral": dict(config={"model_type": "mistral", "hidden_size": 32, "num_attention_heads": 4,
                            "num_key_value_heads": 2, "head_dim": 8, "num_hidden_layers": 2, "sliding_window": 4,
                            "rope_theta": 10000.0, "rope_scaling": {"type": "linear", "factor": 2.0}},
                    dtype="BF16", prefix="model."),
    "qwen2": dict(config={"model_type": "qwen2", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
                          "num_hidden_layers": 2, "rope_theta": 1000000.0, "use_sliding_window": True,
                          "sliding_window": 3, "max_window_layers": 1}, dtype="F32", prefix="model."),
    "qwen3": dict(config={"model_type": "qwen3", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
                          "head_dim": 16, "num_hidden_layers": 2, "rms_norm_eps": 1e-6,
                          "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}},
                  dtype="BF16", prefix="model."),
    "gemma2": dict(config={"model_type": "gemma2", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
                           "head_dim": 16, "num_hidden_layers": 2, "query_pre_attn_scalar": 24,
                           "attn_logit_softcapping": 2.0, "final_logit_softcapping": 30.0, "sliding_window": 4,
                           "rope_theta": 10000.0}, dtype="F32", prefix="model."),
    "gpt_oss": dict(config={"model_type": "gpt_oss", "hidden_size": 32, "num_attention_heads": 4,
                            "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 2, "sliding_window": 3,
                            "layer_types": ["sliding_attention", "full_attention"], "rope_theta": 150000.0,
                            "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                             "truncate": False, "original_max_position_embeddings": 64},
                            "attention_bias": True}, dtype="BF16", prefix="model."),
    # Multi-head Latent Attention: V2 without a q LoRA, with biases and V2-Lite's YaRN (mscale =
    # mscale_all_dim); V3 with a q LoRA, YaRN of mscale_all_dim 1 (scores times mscale^2)
    "deepseek_v2": dict(config={"model_type": "deepseek_v2", "hidden_size": 32, "num_attention_heads": 4,
                                "num_hidden_layers": 2, "q_lora_rank": None, "kv_lora_rank": 12, "qk_nope_head_dim": 6,
                                "qk_rope_head_dim": 4, "v_head_dim": 5, "attention_bias": True, "rope_theta": 10000.0,
                                "max_position_embeddings": 640, "rms_norm_eps": 1e-3,
                                "rope_scaling": {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 16,
                                                 "beta_fast": 32, "beta_slow": 1, "mscale": 0.707,
                                                 "mscale_all_dim": 0.707}},
                        dtype="BF16", prefix="model."),
    "deepseek_v3": dict(config={"model_type": "deepseek_v3", "hidden_size": 32, "num_attention_heads": 4,
                                "num_hidden_layers": 2, "q_lora_rank": 12, "kv_lora_rank": 10, "qk_nope_head_dim": 6,
                                "qk_rope_head_dim": 4, "v_head_dim": 8, "rope_theta": 10000.0,
                                "max_position_embeddings": 640, "rms_norm_eps": 1e-3,
                                "rope_scaling": {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 16,
                                                 "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}},
                        dtype="F32", prefix="model."),
}
DECODERS = ("gpt2", "bloom", "llama", "mistral", "qwen2", "qwen3", "gemma2", "gpt_oss", "deepseek_v2", "deepseek_v3")
MLA = ("deepseek_v2", "deepseek_v3")
LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gpt_oss")
# a diffusers UNet transformer block (no config.json of its own): d 32, 4 heads, cross width 24
DIFFUSERS_PREFIX = "down_blocks.0.attentions.0.transformer_blocks.0."


def heads_of(cfg):
    return cfg.get("n_head", cfg.get("num_heads", cfg.get("num_attention_heads")))


def dims(cfg):
    """(d_model, heads, kv_heads, head_dim) as the family's config gives them."""
    d = cfg.get("n_embd", cfg.get("d_model", cfg.get("hidden_size")))
    H = heads_of(cfg)
    family = cfg.get("model_type")
    # the configuration classes' defaults when absent; null: as many kv heads as heads, d // H
    Hkv = cfg.get("num_key_value_heads", {"gpt_oss": 8, "mistral": 8, "qwen2": 32, "qwen3": 32, "gemma2": 4}.get(family, H))
    hd = cfg.get("head_dim", cfg.get("d_kv", {"gpt_oss": 64, "qwen3": 128, "gemma2": 256}.get(family, d // H)))
    return d, H, H if Hkv is None else Hkv, d // H if hd is None else hd


def stored(a, dtype):
    """The weight as the checkpoint stores it: (safetensors entry, its float64 value)."""
    a = np.asarray(a, np.float64)
    if dtype == "BF16":
        return ("BF16", mha_weights.bf16_bits(a)), mha_weights.to_bf16(a)
    np_t = {"F32": np.float32, "F16": np.float16, "F64": np.float64}[dtype]
    v = a.astype(np_t)
    return v, v.astype(np.float64)


def family_tensors(family, rng, weight_scale=1.0, cfg=None):
    """{name: float64 array} of the family's attention tensors (and a few neighbours a loader must
    skip), every layer, names as published (without the prefix); cfg: the config they are for
    (default the family's)."""
    cfg = cfg or FAMILIES[family]["config"]
    d, H, Hkv, hd = dims(cfg)
    layers = cfg.get("n_layer", cfg.get("num_layers", cfg.get("num_hidden_layers", 2)))
    g = lambda *shape, s=None: rng.normal(0, (s or 1.0 / np.sqrt(shape[-1])) * weight_scale, shape)  # noqa: E731
    b = lambda n: rng.normal(0, 0.1, n)  # noqa: E731
    t = {}
    for n in range(layers):
        if family in ("bert", "roberta", "vit", "deit"):
            inner = "self" if family in ("bert", "roberta") else "attention"
            a = f"encoder.layer.{n}.attention."
            for p in ("query", "key", "value"):
                t[a + f"{inner}.{p}.weight"], t[a + f"{inner}.{p}.bias"] = g(d, d), b(d)
            t[a + "output.dense.weight"], t[a + "output.dense.bias"] = g(d, d), b(d)
            t[f"encoder.layer.{n}.intermediate.dense.weight"] = g(2 * d, d)
        elif family == "gpt2":
            a = f"h.{n}.attn."
            t[a + "c_attn.weight"], t[a + "c_attn.bias"] = g(d, 3 * d, s=1 / np.sqrt(d)), b(3 * d)
            t[a + "c_proj.weight"], t[a + "c_proj.bias"] = g(d, d), b(d)
            t[f"h.{n}.ln_1.weight"] = np.ones(d)
        elif family == "t5":
            for stack in ("encoder", "decoder"):
                a = f"{stack}.block.{n}.layer.0.SelfAttention."
                for p in "qkv":
                    t[a + f"{p}.weight"] = g(H * hd, d)
                t[a + "o.weight"] = g(d, H * hd)
                if n == 0:
                    t[a + "relative_attention_bias.weight"] = rng.normal(0, 1.0, (cfg["relative_attention_num_buckets"], H))
                t[f"{stack}.block.{n}.layer.0.layer_norm.weight"] = np.ones(d)
            a = f"decoder.block.{n}.layer.1.EncDecAttention."
            for p in "qkv":
                t[a + f"{p}.weight"] = g(H * hd, d)
            t[a + "o.weight"] = g(d, H * hd)
        elif family == "bloom":
            a = f"h.{n}.self_attention."
            t[a + "query_key_value.weight"], t[a + "query_key_value.bias"] = g(3 * d, d), b(3 * d)
            t[a + "dense.weight"], t[a + "dense.bias"] = g(d, d), b(d)
            t[f"h.{n}.input_layernorm.weight"] = np.ones(d)
        elif family in MLA:
            a = f"layers.{n}.self_attn."
            m = mla_dims(cfg)
            qk = m["nope"] + m["rope"]
            if m["q_lora"]:
                t[a + "q_a_proj.weight"], t[a + "q_b_proj.weight"] = g(m["q_lora"], d), g(H * qk, m["q_lora"])
                t[a + "q_a_layernorm.weight"] = 1 + rng.normal(0, 0.2, m["q_lora"])
            else:
                t[a + "q_proj.weight"] = g(H * qk, d)
            t[a + "kv_a_proj_with_mqa.weight"] = g(m["kv_lora"] + m["rope"], d)
            t[a + "kv_a_layernorm.weight"] = 1 + rng.normal(0, 0.2, m["kv_lora"])
            t[a + "kv_b_proj.weight"] = g(H * (m["nope"] + m["v"]), m["kv_lora"])
            t[a + "o_proj.weight"] = g(d, H * m["v"])
            if cfg.get("attention_bias"):
                if m["q_lora"]:
                    t[a + "q_a_proj.bias"] = b(m["q_lora"])
                t[a + "kv_a_proj_with_mqa.bias"], t[a + "o_proj.bias"] = b(m["kv_lora"] + m["rope"]), b(d)
        else:  # llama-like
            a = f"layers.{n}.self_attn."
            t[a + "q_proj.weight"], t[a + "k_proj.weight"] = g(H * hd, d), g(Hkv * hd, d)
            t[a + "v_proj.weight"], t[a + "o_proj.weight"] = g(Hkv * hd, d), g(d, H * hd)
            if family in ("qwen2", "gpt_oss"):
                t[a + "q_proj.bias"], t[a + "k_proj.bias"], t[a + "v_proj.bias"] = b(H * hd), b(Hkv * hd), b(Hkv * hd)
            if family == "gpt_oss":
                t[a + "o_proj.bias"], t[a + "sinks"] = b(d), rng.normal(0, 1.0, H)
            if family == "qwen3":
                t[a + "q_norm.weight"], t[a + "k_norm.weight"] = 1 + rng.normal(0, 0.2, hd), 1 + rng.normal(0, 0.2, hd)
            t[f"layers.{n}.input_layernorm.weight"] = np.ones(d)
    if family in LLAMA_LIKE:
        t["embed_tokens.weight"] = g(50, d)
    if family == "gpt2":
        t["wte.weight"] = g(50, d)
    return t


def write_checkpoint(out_dir, family, rng, weight_scale=1.0, config_edit=None, shapes_follow_edit=False):
    """config.json and the weights (single file or shards with their index) under out_dir, as the
    family's publisher lays them out; the weights' shapes those of the family's config, or of the
    edited one with shapes_follow_edit. Returns {published name without prefix: float64 value as
    stored}."""
    spec = FAMILIES[family]
    os.makedirs(out_dir, exist_ok=True)
    cfg = dict(spec["config"])
    if config_edit:
        config_edit(cfg)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    values, entries = {}, {}
    for name, a in family_tensors(family, rng, weight_scale, cfg if shapes_follow_edit else None).items():
        entries[spec["prefix"] + name], values[name] = stored(a, spec["dtype"])
    if family == "gpt2":  # the causal-mask buffers the published file carries, which a loader skips
        for n in range(cfg.get("n_layer", cfg.get("num_hidden_layers", 12))):
            entries[f"h.{n}.attn.bias"] = ("BOOL", np.tril(np.ones((1, 1, 8, 8), np.uint8)))
    shards = spec.get("shards", 1)
    if shards == 1:
        mha_weights.write_safetensors(os.path.join(out_dir, "model.safetensors"), entries, {"format": "pt"})
        return values
    names = sorted(entries)
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: entries[n] for n in names[s::shards]}
        mha_weights.write_safetensors(os.path.join(out_dir, fname), part, {"format": "pt"})
        weight_map.update({n: fname for n in part})
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f, indent=2, sort_keys=True)
    return values


def write_diffusers(path, rng, dtype="F16", qkv_bias=False):
    """A UNet file with one transformer block: attn1 (self, d 32) and attn2 (cross, width 24),
    to_q / to_k / to_v without bias (with qkv_bias: with one, as attention_bias=True builds
    them), to_out.0 with one. Returns its values by name."""
    d, inner, cross = 32, 32, 24
    t = {}
    for attn, kd in (("attn1", d), ("attn2", cross)):
        a = DIFFUSERS_PREFIX + attn + "."
        t[a + "to_q.weight"] = rng.normal(0, 1 / np.sqrt(d), (inner, d))
        t[a + "to_k.weight"] = rng.normal(0, 1 / np.sqrt(kd), (inner, kd))
        t[a + "to_v.weight"] = rng.normal(0, 1 / np.sqrt(kd), (inner, kd))
        t[a + "to_out.0.weight"] = rng.normal(0, 1 / np.sqrt(inner), (d, inner))
        if qkv_bias:
            for n in ("to_q", "to_k", "to_v"):
                t[a + n + ".bias"] = rng.normal(0, 0.5, inner)
        t[a + "to_out.0.bias"] = rng.normal(0, 0.1, d)
    t[DIFFUSERS_PREFIX + "norm1.weight"] = np.ones(d)
    entries, values = {}, {}
    for n, a in t.items():
        entries[n], values[n] = stored(a, dtype)
    mha_weights.write_safetensors(path, entries, {"format": "pt"})
    return values


# ---- the float64 definitions ----------------------------------------------------------------

def softmax_attention(q, k, v, scale, visible, bias=None, softcap=None, sinks=None):
    """q [B, H, Sq, hd], k / v [B, H, Sk, hd] (grouped heads already repeated): the scaled
    scores, soft-capped, plus the bias, hidden keys out; sinks [H]: one more logit per head in the
    softmax's denominator (gpt-oss), with no value; rows without a visible key give 0."""
    s = scale * (q @ k.transpose(0, 1, 3, 2))
    if softcap:
        s = softcap * np.tanh(s / softcap)
    if bias is not None:
        s = s + bias
    s = np.where(visible, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    if sinks is not None:
        m = np.maximum(m, np.asarray(sinks, np.float64)[None, :, None, None])
    e = np.where(visible, np.exp(s - np.where(np.isfinite(m), m, 0.0)), 0.0)
    l = e.sum(axis=-1, keepdims=True)
    if sinks is not None:
        l = l + np.exp(np.asarray(sinks, np.float64)[None, :, None, None] - m)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(l > 0, (e @ v) / l, 0.0)


def mla_dims(cfg):
    """An MLA config's sizes, with the configuration classes' defaults (q_lora_rank null: 0)."""
    q = cfg.get("q_lora_rank", 1536)
    return dict(q_lora=q or 0, kv_lora=cfg.get("kv_lora_rank", 512), nope=cfg.get("qk_nope_head_dim", 128),
                rope=cfg.get("qk_rope_head_dim", 64), v=cfg.get("v_head_dim", 128))


def mla_reference(family, cfg, W, layer, x, visible, positions, rnd):
    """transformers' DeepseekV2Attention / DeepseekV3Attention in float64: the q LoRA (or q_proj),
    the compressed kv and its RMSNorm (eps 1e-6, the class default), the rotary part in interleaved
    pairs (V3's rope_interleave false: rotate_half) at YaRN's frequencies, scores at
    (nope + rope)^-1/2 times mscale^2, o_proj."""
    B, S, _ = x.shape
    H = cfg["num_attention_heads"]
    m = mla_dims(cfg)
    nope, rope, vd = m["nope"], m["rope"], m["v"]
    a = f"layers.{layer}.self_attn."
    lin = lambda z, w, bias=None: z @ w.T + (0 if bias is None else bias)  # noqa: E731
    if m["q_lora"]:
        cq = rnd(lin(x, W[a + "q_a_proj.weight"], W.get(a + "q_a_proj.bias")))
        q = rnd(lin(rnd(rms_norm(cq, W[a + "q_a_layernorm.weight"], 1e-6)), W[a + "q_b_proj.weight"]))
    else:
        q = rnd(lin(x, W[a + "q_proj.weight"]))
    q = q.reshape(B, S, H, nope + rope).transpose(0, 2, 1, 3)
    ckv = rnd(lin(x, W[a + "kv_a_proj_with_mqa.weight"], W.get(a + "kv_a_proj_with_mqa.bias")))
    c, k_pe = ckv[..., :m["kv_lora"]], ckv[..., m["kv_lora"]:]
    kv = rnd(lin(rnd(rms_norm(c, W[a + "kv_a_layernorm.weight"], 1e-6)), W[a + "kv_b_proj.weight"]))
    kv = kv.reshape(B, S, H, nope + vd).transpose(0, 2, 1, 3)
    k_nope, v = kv[..., :nope], kv[..., nope:]
    kw = rope_of_config(cfg, rope)
    style = "half" if family == "deepseek_v3" and not cfg.get("rope_interleave", True) else "interleaved"
    pos = positions if positions is not None else np.broadcast_to(np.arange(S), (B, S))
    q_pe = rnd(mha_weights.rope_reference(q[..., nope:], pos, style=style, **kw))
    k_pe = rnd(mha_weights.rope_reference(k_pe[:, None], pos, style=style, **kw))
    q = np.concatenate([q[..., :nope], q_pe], axis=-1)
    k = np.concatenate([k_nope, np.broadcast_to(k_pe, (B, H, S, rope))], axis=-1)
    scale = (nope + rope) ** -0.5
    s = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    if s and s.get("rope_type", s.get("type", "default")) != "default" and s.get("mscale_all_dim"):
        f = kw["factor"]
        ms = 1.0 if f <= 1 else 0.1 * s["mscale_all_dim"] * np.log(f) + 1.0
        scale *= ms * ms
    o = rnd(heads_merge(softmax_attention(q, k, v, scale, visible)))
    return rnd(lin(o, W[a + "o_proj.weight"], W.get(a + "o_proj.bias")))


def heads_split(x, H, hd):
    B, S, _ = x.shape
    return x.reshape(B, S, H, hd).transpose(0, 2, 1, 3)


def heads_merge(o):
    B, H, S, hd = o.shape
    return o.transpose(0, 2, 1, 3).reshape(B, S, H * hd)


def rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * w


# max_position_embeddings' defaults in the configuration classes
MAX_POSITIONS = {"llama": 2048, "mistral": 131072, "qwen2": 32768, "qwen3": 32768, "gemma2": 8192, "gpt_oss": 131072,
                 "deepseek_v2": 2048, "deepseek_v3": 4096}


def rope_of_config(cfg, hd):
    """rope_reference's keywords from a config (rope_theta / rope_scaling, or rope_parameters)."""
    p = cfg.get("rope_parameters")
    s = p if p is not None else cfg.get("rope_scaling")
    kw = dict(theta=(p or {}).get("rope_theta", cfg.get("rope_theta", 10000.0)))
    if s:
        kind = s.get("rope_type", s.get("type"))
        # llama3's and yarn's: the config's own original_max_position_embeddings over the scaling's
        # (standardize_rope_params), else max_position_embeddings (the classes' defaults)
        max_pos = cfg.get("max_position_embeddings", MAX_POSITIONS.get(cfg.get("model_type"), 2048))
        original = cfg.get("original_max_position_embeddings") or s.get("original_max_position_embeddings") or max_pos
        if kind == "linear":
            kw.update(scaling="linear", factor=s["factor"])
        elif kind == "llama3":
            kw.update(scaling="llama3", factor=s["factor"], low=s["low_freq_factor"], high=s["high_freq_factor"],
                      original=original)
        elif kind == "yarn":  # Hugging Face's reading of the keys (defaults, the mscale ratio)
            factor = s.get("factor") or cfg["max_position_embeddings"] / original
            mscale = lambda f, m=1.0: 1.0 if f <= 1 else 0.1 * m * np.log(f) + 1.0  # noqa: E731
            att = s.get("attention_factor")
            if att is None:
                ms, ma = s.get("mscale"), s.get("mscale_all_dim")
                att = mscale(factor, ms) / mscale(factor, ma) if ms and ma else mscale(factor)
            kw.update(scaling="yarn", factor=factor, original=original, beta_fast=s.get("beta_fast") or 32,
                      beta_slow=s.get("beta_slow") or 1, truncate=s.get("truncate", True), attention_factor=att)
    return kw


def reference(family, cfg, W, layer, x, enc=None, pad=None, positions=None, stack="encoder", attention="self",
              rnd=None):
    """The family's attention sub-layer on x [B, S, d] in float64 from the published tensors W
    (names without prefix): projections, attention, output projection. enc: the encoder output
    for cross-attention; pad [B, Sk] True = padding; positions [B, S] (rotary families; default
    0..S-1). rnd: the rounding of a 16-bit layer's activations (projections, attention output)."""
    rnd = rnd or (lambda a: a)
    x = np.asarray(x, np.float64)
    B, S, _ = x.shape
    d, H, Hkv, hd = dims(cfg)
    lin = lambda a, w, bias=None: a @ w.T + (0 if bias is None else bias)  # noqa: E731  nn.Linear
    src = x if enc is None else np.asarray(enc, np.float64)
    Sk = src.shape[1]
    i, j = np.arange(S)[:, None], np.arange(Sk)[None, :]
    visible = np.ones((B, 1, S, Sk), bool)
    if pad is not None:
        visible &= ~np.asarray(pad, bool)[:, None, None, :]
    bias, softcap, sinks = None, None, None
    scale = 1.0 / np.sqrt(hd)
    if family in ("bert", "roberta", "vit", "deit"):
        inner = "self" if family in ("bert", "roberta") else "attention"
        a = f"encoder.layer.{layer}.attention."
        qkv_bias = cfg.get("qkv_bias", True)  # (ViT's nn.Linear(.., bias=config.qkv_bias): null is none)
        q, k, v = (rnd(lin(x, W[a + f"{inner}.{p}.weight"], W[a + f"{inner}.{p}.bias"] if qkv_bias else None))
                   for p in ("query", "key", "value"))
        wo, bo = W[a + "output.dense.weight"], W[a + "output.dense.bias"]
    elif family == "gpt2":  # Conv1D: x W + b, c_attn's columns q | k | v
        a = f"h.{layer}.attn."
        qkv = rnd(x @ W[a + "c_attn.weight"] + W[a + "c_attn.bias"])
        q, k, v = qkv[..., :d], qkv[..., d:2 * d], qkv[..., 2 * d:]
        wo, bo = W[a + "c_proj.weight"].T, W[a + "c_proj.bias"]
        if not cfg.get("scale_attn_weights", True):  # (GPT2Attention tests it for truth)
            scale = 1.0
        if cfg.get("scale_attn_by_inverse_layer_idx"):
            scale /= layer + 1
        visible &= j <= i
    elif family == "t5":
        sub = "layer.1.EncDecAttention." if attention == "cross" else "layer.0.SelfAttention."
        a = f"{stack}.block.{layer}.{sub}"
        q, k, v = rnd(lin(x, W[a + "q.weight"])), rnd(lin(src, W[a + "k.weight"])), rnd(lin(src, W[a + "v.weight"]))
        wo, bo = W[a + "o.weight"], None
        scale = 1.0
        if attention == "self":
            table = W[f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]
            buckets = mha_weights.t5_bucket(j - i, stack == "encoder", cfg["relative_attention_num_buckets"],
                                cfg.get("relative_attention_max_distance", 128))
            bias = table[buckets].transpose(2, 0, 1)[None]  # [1, H, S, Sk]
            if stack == "decoder":
                visible &= j <= i
    elif family == "bloom":  # fused_qkv.view(B, S, H, 3, hd)
        a = f"h.{layer}.self_attention."
        f = rnd(lin(x, W[a + "query_key_value.weight"], W[a + "query_key_value.bias"])).reshape(B, S, H, 3, hd)
        q, k, v = (f[..., t, :].reshape(B, S, H * hd) for t in range(3))
        wo, bo = W[a + "dense.weight"], W[a + "dense.bias"]
        # alibi = slope * key position, from the padding mask's cumulative sum
        keep = np.ones((B, Sk)) if pad is None else (~np.asarray(pad, bool)).astype(np.float64)
        kpos = (np.cumsum(keep, axis=-1) - 1) * keep
        bias = mha_weights.alibi_slopes(H).astype(np.float64)[None, :, None, None] * kpos[:, None, None, :]
        visible &= j <= i
    elif family in MLA:
        return mla_reference(family, cfg, W, layer, x, visible & (j <= i), positions, rnd)
    else:
        a = f"layers.{layer}.self_attn."
        q = lin(x, W[a + "q_proj.weight"], W.get(a + "q_proj.bias"))
        k = lin(x, W[a + "k_proj.weight"], W.get(a + "k_proj.bias"))
        v = lin(x, W[a + "v_proj.weight"], W.get(a + "v_proj.bias"))
        q, k, v = rnd(q), rnd(k), rnd(v)
        wo, bo = W[a + "o_proj.weight"], W.get(a + "o_proj.bias")
        visible &= j <= i
        win = None
        if family == "mistral":
            win = cfg.get("sliding_window", 4096)
        elif family in ("qwen2", "qwen3"):
            if cfg.get("use_sliding_window") and layer >= cfg.get("max_window_layers", 28):
                win = cfg.get("sliding_window", 4096)
        elif family == "gemma2":
            win = cfg.get("sliding_window", 4096) if layer % 2 == 0 else None
            scale = cfg.get("query_pre_attn_scalar", 256) ** -0.5
            softcap = cfg.get("attn_logit_softcapping", 50.0)
        elif family == "gpt_oss":  # GptOssAttention: sinks, the sliding layers' window
            types = cfg.get("layer_types") or ["sliding_attention" if n % 2 == 0 else "full_attention" for n in range(layer + 1)]
            win = cfg.get("sliding_window", 128) if types[layer] == "sliding_attention" else None
            sinks = W[a + "sinks"]
        if win:
            visible &= j > i - win
    if family in LLAMA_LIKE:
        q, k = heads_split(q, H, hd), heads_split(k, Hkv, hd)
        if family == "qwen3":
            eps = cfg.get("rms_norm_eps", 1e-6)
            q = rnd(rms_norm(q, W[a + "q_norm.weight"], eps))
            k = rnd(rms_norm(k, W[a + "k_norm.weight"], eps))
        pos = positions if positions is not None else np.broadcast_to(np.arange(S), (B, S))
        kw = rope_of_config(cfg, hd)
        q, k = rnd(mha_weights.rope_reference(q, pos, **kw)), rnd(mha_weights.rope_reference(k, pos, **kw))
    else:
        q, k = heads_split(q, H, hd), heads_split(k, Hkv, hd)
    v = heads_split(v, Hkv, hd)
    k, v = np.repeat(k, H // Hkv, axis=1), np.repeat(v, H // Hkv, axis=1)
    o = rnd(heads_merge(softmax_attention(q, k, v, scale, visible, bias, softcap, sinks)))
    return rnd(lin(o, wo, bo))


def diffusers_reference(W, x, enc=None, heads=4, attention="self"):
    """A diffusers Attention (attn1 / attn2): to_q / to_k / to_v, SDPA at 1/sqrt(head_dim),
    to_out.0."""
    a = DIFFUSERS_PREFIX + ("attn1." if attention == "self" else "attn2.")
    x = np.asarray(x, np.float64)
    src = x if enc is None else np.asarray(enc, np.float64)
    b = lambda n: W.get(a + n + ".bias", 0.0)  # noqa: E731
    q, k, v = x @ W[a + "to_q.weight"].T + b("to_q"), src @ W[a + "to_k.weight"].T + b("to_k"), src @ W[a + "to_v.weight"].T + b("to_v")
    hd = q.shape[-1] // heads
    q, k, v = heads_split(q, heads, hd), heads_split(k, heads, hd), heads_split(v, heads, hd)
    visible = np.ones((x.shape[0], 1, x.shape[1], src.shape[1]), bool)
    o = heads_merge(softmax_attention(q, k, v, 1 / np.sqrt(hd), visible))
    return o @ W[a + "to_out.0.weight"].T + W[a + "to_out.0.bias"]


if __name__ == "__main__":
    out, family = sys.argv[1], sys.argv[2]
    if family == "diffusers":
        os.makedirs(out, exist_ok=True)
        write_diffusers(os.path.join(out, "diffusion_pytorch_model.safetensors"), np.random.default_rng(0))
    else:
        write_checkpoint(out, family, np.random.default_rng(0))
