"""Qwen3-Next's layers through simdattn against float64 reimplementations of transformers' code
(tests/cli/checkpoints/qwen3_next_model.py): the gated full attention (MultiHeadAttention.from_pretrained,
whole and continued through a KvCache) and the Gated DeltaNet (GatedDeltaNet.from_pretrained,
whole and continued through a GatedDeltaNetState: the conv window and the recurrent state carried
across calls of any length, the chunked form past 64 tokens); threads 1/2/3 bitwise; bad
arguments named.

Run:  PYTHONPATH=build/python /usr/bin/python3 -m pytest -q tests/python/layers/test_qwen3_next.py
"""
import json
import os
import sys

import numpy as np
import pytest

import simdattn
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from oracles import expect_error  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "cli", "checkpoints"))
import qwen3_next_model as q3n  # noqa: E402


def rel_err(a, b):
    return float(np.abs(np.asarray(a, np.float64) - b).max() / max(np.abs(b).max(), 1e-30))


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("qwen3_next"))
    cfg, values = q3n.write_checkpoint(d, np.random.default_rng(7))
    return d, cfg, values


def test_gated_deltanet_whole_sequence(model):
    d, cfg, values = model
    rng = np.random.default_rng(1)
    for layer in q3n.linear_layers(cfg):
        gdn = simdattn.GatedDeltaNet.from_pretrained(d, layer)
        assert (gdn.key_heads, gdn.value_heads, gdn.key_head_dim, gdn.value_head_dim, gdn.conv_kernel) == (2, 4, 8, 6, 4)
        for S in (1, 3, 70, 131):  # within one chunk, and three or five chunks of 32
            x = rng.standard_normal((2, S, 32)).astype(np.float32)
            ref, _ = q3n.gated_deltanet_reference(cfg, values, layer, x)
            assert rel_err(gdn.forward(x), ref) < 1e-4, (layer, S)


@pytest.mark.parametrize("splits", [(1, 1, 1, 1, 1), (2, 5, 1), (70, 1, 3), (3, 90, 2)])
def test_gated_deltanet_continued_equals_whole(model, splits):
    d, cfg, values = model
    layer = q3n.linear_layers(cfg)[1]
    gdn = simdattn.GatedDeltaNet.from_pretrained(d, layer)
    rng = np.random.default_rng(sum(splits))
    x = rng.standard_normal((2, sum(splits), 32)).astype(np.float32)
    whole = gdn.forward(x)
    ref, ref_state = q3n.gated_deltanet_reference(cfg, values, layer, x)
    state = simdattn.GatedDeltaNetState(gdn, 2)
    parts, t = [], 0
    for n in splits:
        parts.append(gdn.forward(x[:, t:t + n], state=state))
        t += n
    assert state.tokens == sum(splits)
    cont = np.concatenate(parts, axis=1)
    assert rel_err(cont, ref) < 1e-4
    assert rel_err(cont, whole) < 1e-4
    assert rel_err(state.recurrent, ref_state["recurrent"]) < 1e-4
    # the window: the last K - 1 pre-conv inputs, [B, K - 1, conv_dim] (the reference's is [B, conv_dim, K - 1])
    assert rel_err(state.conv_window, np.transpose(ref_state["conv"], (0, 2, 1))) < 1e-5
    # without the carried state the continuation differs: the state is what carries it
    fresh = gdn.forward(x[:, splits[0]:splits[0] + splits[1]])
    assert rel_err(fresh, ref[:, splits[0]:splits[0] + splits[1]]) > 1e-3


def test_gated_deltanet_state_bytes_and_reset(model):
    d, cfg, _ = model
    gdn = simdattn.GatedDeltaNet.from_pretrained(d, 0)
    Hk, Hv, Dk, Dv, K, conv_dim = q3n.gdn_dims(cfg)
    state = simdattn.GatedDeltaNetState(gdn, 3)
    assert state.bytes == 3 * (Hv * Dk * Dv * 4 + (K - 1) * conv_dim * 4)
    bf = simdattn.GatedDeltaNetState(simdattn.GatedDeltaNet.from_pretrained(d, 0, dtype="bf16"), 3)
    assert bf.bytes == 3 * (Hv * Dk * Dv * 4 + (K - 1) * conv_dim * 2)
    x = np.random.default_rng(2).standard_normal((3, 5, 32)).astype(np.float32)
    first = gdn.forward(x, state=state)
    assert state.tokens == 5 and np.abs(state.recurrent).max() > 0
    state.reset()
    assert state.tokens == 0 and not np.any(state.recurrent) and not np.any(state.conv_window)
    np.testing.assert_array_equal(gdn.forward(x, state=state), first)


def test_gated_deltanet_threads_bitwise(model):
    d, cfg, _ = model
    gdn = simdattn.GatedDeltaNet.from_pretrained(d, 2)
    x = np.random.default_rng(3).standard_normal((3, 100, 32)).astype(np.float32)
    outs = [gdn.forward(x, threads=t) for t in (1, 2, 3)]
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


def test_gated_deltanet_bf16(model, tmp_path):
    d, cfg, values = model
    bd = str(tmp_path)
    cfg16, values16 = q3n.write_checkpoint(bd, np.random.default_rng(7), dtype="BF16")
    gdn = simdattn.GatedDeltaNet.from_pretrained(bd, 0)
    assert gdn.dtype == "bf16"
    x = np.random.default_rng(4).standard_normal((2, 80, 32)).astype(np.float32)
    ref, _ = q3n.gated_deltanet_reference(cfg16, values16, 0, q3n.mha_weights.to_bf16(x))
    y = gdn.forward(x)
    assert y.dtype == np.float32
    assert rel_err(y, ref) < 2e-2


def test_full_attention_layer(model):
    d, cfg, values = model
    layer = q3n.full_layers(cfg)[0]
    mha = simdattn.MultiHeadAttention.from_pretrained(d, layer)
    assert (mha.heads, mha.kv_heads, mha.head_dim, mha.causal) == (4, 2, 16, True)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 9, 32)).astype(np.float32)
    ref = q3n.attention_reference(cfg, values, layer, x)
    assert rel_err(mha.forward(x), ref) < 1e-5
    # continued: a cache of the prefix, then the rest in steps
    cache = simdattn.KvCache(mha, 2, 16)
    parts = [mha.forward(x[:, :4], cache=cache)] + [mha.forward(x[:, t:t + 1], cache=cache) for t in range(4, 9)]
    assert rel_err(np.concatenate(parts, axis=1), ref) < 1e-5
    # f64: the float64 definition to the f32 rounding of (1 + weight), which transformers computes
    # in f32 (Qwen3NextRMSNorm: 1.0 + weight.float()) and the oracle in f64
    m64 = simdattn.MultiHeadAttention.from_pretrained(d, layer, dtype="f64")
    assert rel_err(m64.forward(x.astype(np.float64)), ref) < 1e-7


def test_full_attention_with_biases_and_default_layer_types(tmp_path):
    def edit(cfg):
        cfg["attention_bias"] = True
        del cfg["layer_types"]  # the configuration class's pattern: layer 3 of 4 is full attention
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 500.0}  # partial_rotary_factor's default 0.25
    cfg, values = q3n.write_checkpoint(str(tmp_path), np.random.default_rng(8), config_edit=edit)
    cfg["partial_rotary_factor"] = 0.25
    mha = simdattn.MultiHeadAttention.from_pretrained(str(tmp_path), 3, dtype="f64")
    x = np.random.default_rng(9).standard_normal((1, 7, 32))
    assert rel_err(mha.forward(x), q3n.attention_reference(cfg, values, 3, x)) < 1e-7
    gdn = simdattn.GatedDeltaNet.from_pretrained(str(tmp_path), 2)
    assert gdn.hidden_size == 32


def test_from_pretrained_arguments_as_the_contract_names_them(model):
    d, cfg, _ = model
    import pathlib
    layer = cfg["layer_types"].index("linear_attention")
    x = np.random.default_rng(12).standard_normal((1, 5, 32)).astype(np.float32)
    want = simdattn.GatedDeltaNet.from_pretrained(d, layer).forward(x)
    for gdn in (simdattn.GatedDeltaNet.from_pretrained(pathlib.Path(d), layer, None),
                simdattn.GatedDeltaNet.from_pretrained(model_dir=pathlib.Path(d), layer_index=layer),
                simdattn.GatedDeltaNet.from_pretrained(dir=d, layer=layer)):
        assert np.array_equal(gdn.forward(x), want)


def test_legacy_layer_type_names(tmp_path):
    # transformers' configurations remap "attention" and "mamba" (remap_legacy_layer_types)
    cfg, values = q3n.write_checkpoint(str(tmp_path), np.random.default_rng(10))
    legacy = dict(cfg, layer_types=["attention" if t == "full_attention" else "mamba" for t in cfg["layer_types"]])
    with open(os.path.join(str(tmp_path), "config.json"), "w") as f:
        json.dump(legacy, f)
    full = cfg["layer_types"].index("full_attention")
    mha = simdattn.MultiHeadAttention.from_pretrained(str(tmp_path), full, dtype="f64")
    x = np.random.default_rng(11).standard_normal((1, 5, 32))
    assert rel_err(mha.forward(x), q3n.attention_reference(cfg, values, full, x)) < 1e-7
    simdattn.GatedDeltaNet.from_pretrained(str(tmp_path), cfg["layer_types"].index("linear_attention"))
    expect_error("layer", simdattn.GatedDeltaNet.from_pretrained, str(tmp_path), full)


def test_errors(model):
    d, cfg, _ = model
    e = expect_error("layer", simdattn.MultiHeadAttention.from_pretrained, d, 0)
    assert "GatedDeltaNet" in str(e)
    e = expect_error("layer", simdattn.GatedDeltaNet.from_pretrained, d, 3)
    assert "MultiHeadAttention" in str(e)
    expect_error("layer", simdattn.GatedDeltaNet.from_pretrained, d, 4)
    expect_error("dtype", simdattn.GatedDeltaNet.from_pretrained, d, 0, dtype="f64")
    gdn = simdattn.GatedDeltaNet.from_pretrained(d, 0)
    state = simdattn.GatedDeltaNetState(gdn, 2)
    x = np.ones((3, 4, 32), np.float32)
    expect_error("state", gdn.forward, x, state=state)
    expect_error("x", gdn.forward, np.ones((2, 4, 31), np.float32))
    bad = np.ones((2, 4, 32), np.float32)
    bad[1, 2, 5] = np.nan
    e = expect_error("x", gdn.forward, bad, state=state)
    assert "[1, 2, 5]" in str(e)
    assert state.tokens == 0 and not np.any(state.recurrent)  # nothing written
    other = simdattn.GatedDeltaNet.from_pretrained(d, 0, dtype="bf16")
    expect_error("state", other.forward, np.ones((2, 4, 32), np.float32), state=state)
    expect_error("batch", simdattn.GatedDeltaNetState, gdn, 0)


def c_library():
    """The C API's shared library of this build (build/engine/libsimdattn.so beside build/python), or None."""
    import ctypes
    base = os.path.dirname(os.path.dirname(os.path.abspath(simdattn.__file__)))
    path = os.path.join(base, "..", "engine", "libsimdattn.so")
    return ctypes.CDLL(path) if os.path.exists(path) else None


def test_c_api_gated_deltanet(model):
    """simdattn_gdn_* (C API 6) through ctypes: the same layer and state as the Python class."""
    import ctypes as C
    lib = c_library()
    if lib is None:
        pytest.skip("no build/engine/libsimdattn.so beside this module")
    d, cfg, _ = model

    class Seq(C.Structure):
        _fields_ = [("struct_size", C.c_size_t), ("data", C.c_void_p), ("dtype", C.c_int), ("batch", C.c_int64),
                    ("seq", C.c_int64), ("width", C.c_int64)]

    lib.simdattn_last_error.restype = C.c_char_p
    lib.simdattn_last_error_argument.restype = C.c_char_p
    layer, state = C.c_void_p(), C.c_void_p()
    assert lib.simdattn_gdn_from_pretrained(d.encode(), 1, 0, 0, C.byref(layer)) == 0, lib.simdattn_last_error()
    hidden, vh = C.c_int64(), C.c_int64()
    assert lib.simdattn_gdn_get_info(layer, C.byref(hidden), None, C.byref(vh), None, None, None, None) == 0
    assert (hidden.value, vh.value) == (32, 4)
    assert lib.simdattn_gdn_state_create(layer, C.c_int64(2), C.byref(state)) == 0
    x = np.random.default_rng(6).standard_normal((2, 9, 32)).astype(np.float32)
    y = np.zeros_like(x)

    def seq(a):
        return Seq(C.sizeof(Seq), a.ctypes.data, 0, a.shape[0], a.shape[1], a.shape[2])

    for t0, t1 in ((0, 4), (4, 9)):
        xs, ys = np.ascontiguousarray(x[:, t0:t1]), np.zeros((2, t1 - t0, 32), np.float32)
        assert lib.simdattn_gdn_forward(layer, C.byref(seq(xs)), C.byref(seq(ys)), state, 0) == 0, lib.simdattn_last_error()
        y[:, t0:t1] = ys
    py = simdattn.GatedDeltaNet.from_pretrained(d, 1)
    pst = simdattn.GatedDeltaNetState(py, 2)
    np.testing.assert_array_equal(y, np.concatenate([py.forward(x[:, :4], state=pst), py.forward(x[:, 4:], state=pst)], 1))
    nbytes, tokens = C.c_int64(), C.c_int64()
    assert lib.simdattn_gdn_state_get_info(state, C.byref(nbytes), C.byref(tokens)) == 0
    assert (nbytes.value, tokens.value) == (simdattn.GatedDeltaNetState(py, 2).bytes, 9)
    assert lib.simdattn_gdn_state_reset(state) == 0
    assert lib.simdattn_gdn_state_get_info(state, None, C.byref(tokens)) == 0 and tokens.value == 0
    # errors: a status and the argument named, nothing returned
    bad = C.c_void_p()
    assert lib.simdattn_gdn_from_pretrained(d.encode(), 3, 0, 0, C.byref(bad)) == 1 and not bad.value
    assert lib.simdattn_last_error_argument() == b"layer"
    assert lib.simdattn_gdn_forward(layer, C.byref(seq(np.zeros((3, 1, 32), np.float32))),
                                    C.byref(seq(np.zeros((3, 1, 32), np.float32))), state, 0) == 1
    assert lib.simdattn_last_error_argument() == b"state"
    assert lib.simdattn_gdn_forward(None, None, None, None, 0) == 1
    lib.simdattn_gdn_state_free(state)
    lib.simdattn_gdn_free(layer)
