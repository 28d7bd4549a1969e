"""simdattn.torch: simdattn's attention behind PyTorch's own interfaces (inference only).

scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
    is_causal=False, scale=None, enable_gqa=False)
    torch.nn.functional.scaled_dot_product_attention's semantics (torch 2.x): [..., L, E]
    layouts with any leading dimensions (broadcast as torch's matmul broadcasts them), a bool
    mask where True takes part or a float mask added to the scores, is_causal top-left
    aligned, enable_gqa sharing key/value heads among query heads; the result in the query's
    dtype. A query row whose every key is masked gives zeros (as torch's math backend since
    2.5; its earlier releases give NaN).

MultiheadAttention(embed_dim, num_heads, ...)
    A torch.nn.Module with torch.nn.MultiheadAttention's parameters (names, shapes, state
    dict), whose forward() computes the attention with simdattn.

Tensors are read in place through DLPack (no copy where a view expresses the layout); the
attention runs in simdattn with the GIL released. Gradients are not tracked (inference only):
inputs that require grad are read detached. This module imports torch; `import simdattn`
alone never does. Importing it makes the openmp thread runtime the process's default (torch's
OpenMP pool runs simdattn's loops) unless the runtime was chosen.
"""
import math

import torch

from . import _simdattn

__all__ = ["scaled_dot_product_attention", "MultiheadAttention"]

# PyTorch is an OpenMP host (its intra-op pool is libgomp's): simdattn's parallel loops run on that
# pool (the openmp runtime) unless the runtime was chosen (set_thread_runtime before this import,
# or SIMDATTN_THREAD_RUNTIME): right after a torch op on its pool, simdattn's own team would wake
# workers that compete with torch's spinning ones for the cores (perf/hosts/host_openmp.py torch;
# docs/serving.md, "Thread runtimes").
_simdattn._set_default_thread_runtime("openmp")

_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _tensor(x, name):
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.device.type != "cpu":
        raise ValueError(f"{name}: expected a CPU tensor, got device {x.device}")
    return x.detach()


def _as_bhsd(x, lead, rows, cols):
    """x broadcast to lead + [rows, cols] as 4-D [B, H, rows, cols] (a view where strides allow)."""
    x = x.expand(*lead, rows, cols)
    if len(lead) == 2:
        return x
    if len(lead) < 2:
        return x.reshape(1, lead[0] if lead else 1, rows, cols)
    return x.reshape(math.prod(lead[:-1]), lead[-1], rows, cols)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """softmax(query key^T * scale + mask) value, as torch.nn.functional.scaled_dot_product_attention.

    query [..., L, E], key [..., S, E], value [..., S, Ev] (leading dimensions broadcast;
    with enable_gqa the -3 axis holds heads, Hq a multiple of the key's and the value's);
    attn_mask broadcastable to [..., L, S]: bool (True takes part) or float (added; float32
    or the query's dtype); is_causal: query i sees keys j <= i (top-left; needs attn_mask
    None); scale default 1/sqrt(E). float32, float64, float16 or bfloat16, one dtype for
    the three. Returns [..., L, Ev] in the query's dtype. dropout_p must be 0 (inference).
    Raises ValueError naming the argument for anything torch refuses.
    """
    query, key, value = _tensor(query, "query"), _tensor(key, "key"), _tensor(value, "value")
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p: simdattn computes inference only; expected 0.0, got {dropout_p}")
    for name, x in (("query", query), ("key", key), ("value", value)):
        if x.dtype not in _FLOATS:
            raise ValueError(f"{name}: expected float32, float64, float16 or bfloat16, got {x.dtype}")
        if x.dim() < 2:
            raise ValueError(f"{name}: expected at least 2 dimensions [..., seq, dim], got {x.dim()}")
    for name, x in (("key", key), ("value", value)):
        if x.dtype != query.dtype:
            raise ValueError(f"{name}: expected the query's dtype {query.dtype}, got {x.dtype}")
    L, E = query.shape[-2], query.shape[-1]
    S, Ev = key.shape[-2], value.shape[-1]
    if key.shape[-1] != E:
        raise ValueError(f"key: expected its last dimension to be the query's {E}, got {key.shape[-1]}")
    if value.shape[-2] != S:
        raise ValueError(f"value: expected {S} rows (the key's), got {value.shape[-2]}")
    if is_causal and attn_mask is not None:
        raise ValueError("attn_mask: expected None with is_causal=True (torch refuses both)")
    if scale is None:
        scale = 1.0 / math.sqrt(E) if E > 0 else 1.0

    # Grouped-query heads: query head h reads key/value head h // (Hq / Hkv), as torch's
    # repeat_interleave along -3. simdattn takes that grouping as it is when key and value
    # have the same number of heads; otherwise they are repeated as torch does.
    kv_heads = None
    if enable_gqa and query.dim() >= 3:
        hq, hk, hv = query.shape[-3], key.shape[-3] if key.dim() >= 3 else 1, value.shape[-3] if value.dim() >= 3 else 1
        if key.dim() < 3 or value.dim() < 3 or hk == 0 or hv == 0 or hq % hk or hq % hv:
            raise ValueError(f"enable_gqa: the number of key heads ({hk}) and value heads ({hv}) must divide the "
                             f"query's ({hq}) along dimension -3")
        if hk == hv and hk != hq:
            kv_heads = hk
        elif hk != hq or hv != hq:
            key = key.repeat_interleave(hq // hk, -3)
            value = value.repeat_interleave(hq // hv, -3)

    def lead_of(x):
        shape = list(x.shape[:-2])
        if kv_heads is not None:
            shape[-1] = query.shape[-3]  # broadcast as if repeated
        return shape

    mask = None
    if attn_mask is not None:
        mask = _tensor(attn_mask, "attn_mask")
        if mask.dtype != torch.bool and mask.dtype != torch.float32 and mask.dtype != query.dtype:
            raise ValueError(f"attn_mask: expected bool, float32 or the query's dtype {query.dtype}, got {mask.dtype}")
        if mask.dim() < 2:
            mask = mask.reshape(*([1] * (2 - mask.dim())), *mask.shape)
    try:
        shapes = [query.shape[:-2], lead_of(key), lead_of(value)] + ([mask.shape[:-2]] if mask is not None else [])
        lead = list(torch.broadcast_shapes(*shapes))
        if mask is not None:
            mask = mask.expand(*lead, L, S)
    except RuntimeError as e:
        raise ValueError(f"attn_mask: the shapes do not broadcast together ({e})" if mask is not None
                         else f"key: the leading dimensions do not broadcast with the query's ({e})") from None

    q4 = _as_bhsd(query, lead, L, E)
    if kv_heads is not None:
        kv_lead = lead[:-1] + [kv_heads]
        k4, v4 = _as_bhsd(key, kv_lead, S, E), _as_bhsd(value, kv_lead, S, Ev)
    else:
        k4, v4 = _as_bhsd(key, lead, S, E), _as_bhsd(value, lead, S, Ev)
    m4 = None
    if mask is not None:
        m4 = _as_bhsd(mask, lead, L, S)
        if m4.dtype == torch.bool:
            m4 = m4.view(torch.uint8)  # torch's DLPack export has no bool; nonzero = take part
    out = torch.empty(q4.shape[0], q4.shape[1], L, Ev, dtype=query.dtype)
    _simdattn.attention(q4, k4, v4, mask=m4, causal="top_left" if is_causal else None, scale=scale, out=out)
    return out.reshape(*lead, L, Ev)


def _key_padding_float(mask, dtype):
    """torch's key_padding_mask / attn_mask conventions made additive: bool True = hidden (-inf)."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype).masked_fill_(mask, float("-inf"))
    if not mask.is_floating_point():
        raise ValueError("expected a bool or float mask")
    return mask.to(dtype)


class MultiheadAttention(torch.nn.Module):
    """torch.nn.MultiheadAttention's layer with simdattn computing the attention (inference).

    The parameters are torch.nn.MultiheadAttention's (in_proj_weight or q/k/v_proj_weight,
    in_proj_bias, out_proj.weight, out_proj.bias), so state dicts load either way; forward()
    takes and returns what torch's does. dropout > 0, add_bias_kv and add_zero_attn are
    refused (ValueError naming them): this layer is for inference.
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
                 kdim=None, vdim=None, batch_first=False, device=None, dtype=None):
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"embed_dim and num_heads: expected positive, got {embed_dim} and {num_heads}")
        if embed_dim % num_heads:
            raise ValueError(f"num_heads: expected a divisor of embed_dim {embed_dim}, got {num_heads}")
        if dropout != 0.0:
            raise ValueError(f"dropout: simdattn's layer is for inference; expected 0.0, got {dropout}")
        if add_bias_kv:
            raise ValueError("add_bias_kv: not supported by simdattn's layer (expected False)")
        if add_zero_attn:
            raise ValueError("add_zero_attn: not supported by simdattn's layer (expected False)")
        if device is not None and torch.device(device).type != "cpu":
            raise ValueError(f"device: simdattn runs on the CPU, got {device}")
        factory = {"device": device, "dtype": dtype}
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.head_dim = embed_dim // num_heads
        if self._qkv_same_embed_dim:
            self.in_proj_weight = torch.nn.Parameter(torch.empty((3 * embed_dim, embed_dim), **factory))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        else:
            self.q_proj_weight = torch.nn.Parameter(torch.empty((embed_dim, embed_dim), **factory))
            self.k_proj_weight = torch.nn.Parameter(torch.empty((embed_dim, self.kdim), **factory))
            self.v_proj_weight = torch.nn.Parameter(torch.empty((embed_dim, self.vdim), **factory))
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = torch.nn.Parameter(torch.empty(3 * embed_dim, **factory))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = torch.nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.bias_k = self.bias_v = None
        self.add_zero_attn = False
        self._reset_parameters()

    def _reset_parameters(self):
        # torch's initialisation: Xavier-uniform projections, zero biases
        if self._qkv_same_embed_dim:
            torch.nn.init.xavier_uniform_(self.in_proj_weight)
        else:
            torch.nn.init.xavier_uniform_(self.q_proj_weight)
            torch.nn.init.xavier_uniform_(self.k_proj_weight)
            torch.nn.init.xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            torch.nn.init.constant_(self.in_proj_bias, 0.0)
            torch.nn.init.constant_(self.out_proj.bias, 0.0)

    @classmethod
    def from_torch(cls, module):
        """A copy of a torch.nn.MultiheadAttention (its configuration and parameters)."""
        if not isinstance(module, torch.nn.MultiheadAttention):
            raise ValueError(f"module: expected a torch.nn.MultiheadAttention, got {type(module).__name__}")
        if module.bias_k is not None:
            raise ValueError("module: add_bias_kv is not supported by simdattn's layer")
        if module.add_zero_attn:
            raise ValueError("module: add_zero_attn is not supported by simdattn's layer")
        ref = module.out_proj.weight
        m = cls(module.embed_dim, module.num_heads, dropout=0.0, bias=module.in_proj_bias is not None,
                kdim=module.kdim, vdim=module.vdim, batch_first=module.batch_first, dtype=ref.dtype)
        m.load_state_dict(module.state_dict())
        return m

    def _projections(self):
        e = self.embed_dim
        if self._qkv_same_embed_dim:
            w = self.in_proj_weight.detach()
            wq, wk, wv = w[:e], w[e:2 * e], w[2 * e:]
        else:
            wq, wk, wv = self.q_proj_weight.detach(), self.k_proj_weight.detach(), self.v_proj_weight.detach()
        b = self.in_proj_bias.detach() if self.in_proj_bias is not None else None
        bq, bk, bv = (None, None, None) if b is None else (b[:e], b[e:2 * e], b[2 * e:])
        return (wq, bq), (wk, bk), (wv, bv)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        """torch.nn.MultiheadAttention.forward: returns (attn_output, attn_weights or None).

        query [L, N, E] ([N, L, E] with batch_first; [L, E] unbatched), key [S, N, kdim],
        value [S, N, vdim]; key_padding_mask [N, S] (bool: True = ignore; float: added);
        attn_mask [L, S] or [N * num_heads, L, S] (bool: True = not allowed; float: added);
        is_causal: a hint that attn_mask is the causal mask (torch 2.x: attn_mask required).
        attn_weights: [N, L, S] averaged over heads, or [N, num_heads, L, S].
        """
        query, key, value = _tensor(query, "query"), _tensor(key, "key"), _tensor(value, "value")
        if is_causal and attn_mask is None:
            raise ValueError("attn_mask: is_causal is a hint that attn_mask is the causal mask; attn_mask is required")
        batched = query.dim() == 3
        if query.dim() not in (2, 3):
            raise ValueError(f"query: expected a 2-D (unbatched) or 3-D tensor, got {query.dim()}-D")
        for name, x in (("key", key), ("value", value)):
            if x.dim() != query.dim():
                raise ValueError(f"{name}: expected {query.dim()}-D like the query, got {x.dim()}-D")
        if not batched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif self.batch_first:
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        # [L, N, E] from here on, as torch's functional form
        L, N, E = query.shape
        S = key.shape[0]
        if E != self.embed_dim:
            raise ValueError(f"query: expected embed_dim {self.embed_dim}, got {E}")
        if key.shape[:2] != value.shape[:2] or key.shape[1] != N:
            raise ValueError(f"key: expected [S, N, kdim] and value [S, N, vdim] with N = {N}, got "
                             f"{tuple(key.shape)} and {tuple(value.shape)}")
        if key.shape[2] != self.kdim or value.shape[2] != self.vdim:
            raise ValueError(f"key: expected kdim {self.kdim} and vdim {self.vdim}, got {key.shape[2]} and "
                             f"{value.shape[2]}")
        dtype = self.out_proj.weight.dtype
        for name, x in (("query", query), ("key", key), ("value", value)):
            if x.dtype != dtype:
                raise ValueError(f"{name}: expected the layer's dtype {dtype}, got {x.dtype}")
        H, hd = self.num_heads, self.head_dim
        (wq, bq), (wk, bk), (wv, bv) = self._projections()
        with torch.no_grad():
            q = torch.nn.functional.linear(query, wq, bq)  # [L, N, E]
            k = torch.nn.functional.linear(key, wk, bk)
            v = torch.nn.functional.linear(value, wv, bv)
        # heads as views: [L, N, H, hd] -> [N, H, L, hd]
        q4 = q.view(L, N, H, hd).permute(1, 2, 0, 3)
        k4 = k.view(S, N, H, hd).permute(1, 2, 0, 3)
        v4 = v.view(S, N, H, hd).permute(1, 2, 0, 3)

        mask = None  # additive, broadcastable to [N, H, L, S]
        if attn_mask is not None:
            attn_mask = _tensor(attn_mask, "attn_mask")
            if attn_mask.dim() == 2:
                if attn_mask.shape != (L, S):
                    raise ValueError(f"attn_mask: expected [{L}, {S}], got {list(attn_mask.shape)}")
                mask = _key_padding_float(attn_mask, dtype).view(1, 1, L, S)
            elif attn_mask.dim() == 3:
                if attn_mask.shape != (N * H, L, S):
                    raise ValueError(f"attn_mask: expected [{N * H}, {L}, {S}], got {list(attn_mask.shape)}")
                mask = _key_padding_float(attn_mask, dtype).view(N, H, L, S)
            else:
                raise ValueError(f"attn_mask: expected 2-D or 3-D, got {attn_mask.dim()}-D")
        if key_padding_mask is not None:
            key_padding_mask = _tensor(key_padding_mask, "key_padding_mask")
            if key_padding_mask.shape != (N, S):
                raise ValueError(f"key_padding_mask: expected [{N}, {S}], got {list(key_padding_mask.shape)}")
            kpm = _key_padding_float(key_padding_mask, dtype).view(N, 1, 1, S)
            mask = kpm if mask is None else mask + kpm
        if mask is not None:
            mask = mask.expand(N, H, L, S)

        o = torch.empty(L, N, H, hd, dtype=dtype)  # the heads' outputs in [L, N, E] order
        weights = torch.empty(N, H, L, S, dtype=torch.float64 if dtype == torch.float64 else torch.float32) \
            if need_weights else None
        _simdattn.attention(q4, k4, v4, mask=mask, out=o.permute(1, 2, 0, 3), scores=weights)
        with torch.no_grad():
            out = torch.nn.functional.linear(o.view(L, N, E), self.out_proj.weight.detach(),
                                             self.out_proj.bias.detach() if self.out_proj.bias is not None else None)
        if self.batch_first and batched:
            out = out.transpose(0, 1)
        if not batched:
            out = out.squeeze(1)
        if weights is not None:
            weights = weights.to(dtype)
            if average_attn_weights:
                weights = weights.mean(dim=1)
            if not batched:
                weights = weights.squeeze(0)
        return out, weights
