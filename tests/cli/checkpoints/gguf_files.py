#!/usr/bin/env python3
"""Small GGUF files for the tests, written with NumPy only from llama.cpp's published layout
(docs/gguf.md of ggml: little-endian; "GGUF", version u32, tensor count u64, metadata count u64;
the metadata pairs; the tensor infos; the data section at the next multiple of
general.alignment) and from what its converter (convert_hf_to_gguf.py) writes for a Hugging Face
llama-family checkpoint: the names blk.N.attn_{q,k,v,output}, dims innermost first, llama's q / k
rows permuted within each head, 2-D weights in the output type and 1-D tensors in F32.

    python3 gguf_files.py OUT.gguf FAMILY TYPE   # a model_families.py checkpoint as GGUF

Used by tests/cli/test_gguf.py and tests/python/layers/test_gguf.py.
"""
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mha_weights  # noqa: E402  (bf16 rounding)
import model_families as mf  # noqa: E402

# metadata value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?",
           U64: "<Q", I64: "<q", F64: "<d"}
# ggml tensor types: id, elements per block, bytes per block
GGML = {"F32": (0, 1, 4), "F16": (1, 1, 2), "Q4_0": (2, 32, 18), "Q8_0": (8, 32, 34), "BF16": (30, 1, 2)}
# the architecture llama.cpp's converter writes each family as, and whether it permutes q and k
ARCH = {"llama": ("llama", True), "mistral": ("llama", True), "qwen2": ("qwen2", False), "qwen3": ("qwen3", False)}


def gstring(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def value(vtype, v):
    """A metadata value's bytes (after its type): a scalar, a string, or (ARRAY, elem_type, list)."""
    if vtype == STRING:
        return gstring(v)
    if vtype not in _SCALAR and vtype not in (STRING, ARRAY):  # a type GGUF does not have: raw bytes
        return v
    if vtype == ARRAY:
        etype, items = v
        return struct.pack("<IQ", etype, len(items)) + b"".join(value(etype, x) for x in items)
    return struct.pack(_SCALAR[vtype], v)


def tensor_bytes(a, ttype):
    """The data of float array `a` (torch shape, C order) stored as ggml type ttype."""
    a = np.ascontiguousarray(a, np.float64)
    if ttype == "F32":
        return a.astype("<f4").tobytes()
    if ttype == "F16":
        return a.astype("<f2").tobytes()
    if ttype == "BF16":
        return mha_weights.bf16_bits(a).astype("<u2").tobytes()
    if ttype == "Q8_0":
        d, q = q8_0_quantize(a)
        blocks = np.zeros((d.size, 34), np.uint8)
        blocks[:, :2] = d.astype("<f2").reshape(-1, 1).view(np.uint8)
        blocks[:, 2:] = q.reshape(-1, 32).view(np.uint8)
        return blocks.tobytes()
    raise ValueError(ttype)


def q8_0_quantize(a):
    """ggml's Q8_0 of rows of `a` (f32): per block of 32, d = max|x| / 127, q = round(x / d) (half
    away from zero); d kept as f16. Returns (d [blocks] f16, q [blocks, 32] int8)."""
    x = np.asarray(a, np.float32).reshape(-1, 32)
    amax = np.abs(x).max(axis=1)
    d = (amax / np.float32(127)).astype(np.float32)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), np.float32(0)).astype(np.float32)
    v = x * inv[:, None]
    q = (np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))).astype(np.int8)
    return d.astype(np.float16), q


def q8_0_values(a):
    """The values a Q8_0 tensor of `a` holds, as ggml dequantizes them (f32 d * q), as float64."""
    d, q = q8_0_quantize(a)
    return (d.astype(np.float32)[:, None] * q.astype(np.float32)).astype(np.float64).reshape(np.shape(a))


def gguf_bytes(metadata, tensors, alignment=32, version=3, magic=b"GGUF", counts=None, offsets=None):
    """A GGUF file: metadata [(key, vtype, value)], tensors [(name, ggml type, torch shape, data
    bytes)] packed in order, each at a multiple of `alignment` (the general.alignment a file
    states must agree). counts: (tensor_count, kv_count) to write instead of the true ones;
    offsets: {name: data offset} to write instead of the true ones."""
    out = magic + struct.pack("<I", version)
    n_t, n_kv = counts or (len(tensors), len(metadata))
    out += struct.pack("<QQ", n_t, n_kv)
    for key, vtype, v in metadata:
        out += gstring(key) + struct.pack("<I", vtype) + value(vtype, v)
    data, off = b"", 0
    for name, ttype, shape, raw in tensors:
        off = (len(data) + alignment - 1) // alignment * alignment
        data = data.ljust(off, b"\0") + raw
        dims = list(reversed(shape))  # ggml order: innermost first
        tid = GGML[ttype][0] if isinstance(ttype, str) else ttype
        out += gstring(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        out += struct.pack("<IQ", tid, (offsets or {}).get(name, off))
    out = out.ljust((len(out) + alignment - 1) // alignment * alignment, b"\0")
    return out + data


def permute(w, n_head):
    """llama.cpp's converter's reordering of q / k rows (LlamaModel.permute): within each head, the
    rows of Hugging Face's halves become adjacent pairs."""
    w = np.asarray(w)
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_factors(cfg, rotary):
    """rope_freqs.weight for Llama 3.1's scaling: frequency i's divisor, from rope_scaling's keys."""
    s = cfg["rope_scaling"]
    theta = cfg.get("rope_theta", 10000.0)
    freqs = 1.0 / theta ** (np.arange(0, rotary, 2, dtype=np.float32) / np.float32(rotary))
    old, low, high, factor = s["original_max_position_embeddings"], s["low_freq_factor"], s["high_freq_factor"], s["factor"]
    out = []
    for f in freqs.astype(np.float64):
        wave = 2 * np.pi / f
        if wave < old / high:
            out.append(1.0)
        elif wave > old / low:
            out.append(factor)
        else:
            smooth = (old / wave - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out)


def convert(family, cfg, W, ttype, layers=None):
    """(metadata, tensors) of the GGUF file of a model_families.py checkpoint: W {published name
    without prefix: float64 value as stored}, 2-D weights as ttype, 1-D tensors F32."""
    arch, permuted = ARCH[family]
    d, H, Hkv, hd = mf.dims(cfg)
    n_layers = cfg["num_hidden_layers"] if layers is None else layers
    meta = [("general.architecture", STRING, arch), ("general.name", STRING, "tiny " + family),
            (f"{arch}.block_count", U32, n_layers), (f"{arch}.context_length", U32, 64),
            (f"{arch}.embedding_length", U32, d), (f"{arch}.attention.head_count", U32, H),
            (f"{arch}.attention.head_count_kv", U32, Hkv),
            (f"{arch}.rope.freq_base", F32, float(cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)))),
            (f"{arch}.attention.layer_norm_rms_epsilon", F32, cfg.get("rms_norm_eps", 1e-6))]
    if "head_dim" in cfg:
        meta += [(f"{arch}.attention.key_length", U32, hd), (f"{arch}.attention.value_length", U32, hd)]
    if permuted:
        meta.append((f"{arch}.rope.dimension_count", U32, hd))
    scaling = cfg.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    tensors = []
    if kind == "linear":
        meta += [(f"{arch}.rope.scaling.type", STRING, "linear"), (f"{arch}.rope.scaling.factor", F32, scaling["factor"])]
    elif kind == "llama3":
        tensors.append(("rope_freqs.weight", "F32", [hd // 2], tensor_bytes(llama3_factors(cfg, hd), "F32")))
    # the window as test_models' configs set it: Mistral's on every layer, Qwen2's from max_window_layers
    if family == "mistral" and cfg.get("sliding_window"):
        meta.append((f"{arch}.attention.sliding_window", U32, cfg["sliding_window"]))
    if family in ("qwen2", "qwen3") and cfg.get("use_sliding_window"):
        meta.append((f"{arch}.attention.sliding_window", U32, cfg["sliding_window"]))
        first = cfg.get("max_window_layers", 28)
        meta.append((f"{arch}.attention.sliding_window_pattern", ARRAY, (BOOL, [n >= first for n in range(n_layers)])))
    meta.append(("general.file_type", U32, {"F32": 0, "F16": 1, "Q8_0": 7, "BF16": 32}[ttype]))
    tensors.append(("token_embd.weight", ttype, list(W["embed_tokens.weight"].shape), tensor_bytes(W["embed_tokens.weight"], ttype)))
    names = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
             "q_norm": "attn_q_norm", "k_norm": "attn_k_norm"}
    for n in range(n_layers):
        tensors.append((f"blk.{n}.attn_norm.weight", "F32", [d], tensor_bytes(np.ones(d), "F32")))
        for hf, gg in names.items():
            for kind_ in ("weight", "bias"):
                a = W.get(f"layers.{n}.self_attn.{hf}.{kind_}")
                if a is None:
                    continue
                if permuted and hf in ("q_proj", "k_proj"):
                    a = permute(a, H if hf == "q_proj" else Hkv)
                t = ttype if a.ndim == 2 else "F32"
                tensors.append((f"blk.{n}.{gg}.{kind_}", t, list(a.shape), tensor_bytes(a, t)))
    return meta, tensors


def write(path, metadata, tensors, **kw):
    with open(path, "wb") as f:
        f.write(gguf_bytes(metadata, tensors, **kw))


if __name__ == "__main__":
    out, family, ttype = sys.argv[1:4]
    W = mf.write_checkpoint(out + ".hf", family, np.random.default_rng(0))
    write(out, *convert(family, mf.FAMILIES[family]["config"], W, ttype))
