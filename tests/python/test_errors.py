"""The Python module's errors: simdattn.Error (a ValueError) naming the argument, and a failed
call leaving its output untouched.

Run:  PYTHONPATH=build/python /usr/bin/python3 -m pytest -q tests/python
(ctest registers the folder as the test `python`).
"""
import numpy as np
import pytest

import simdattn
from oracles import qkv, expect_error


def test_error_class():
    assert issubclass(simdattn.Error, ValueError)
    q, k, v = qkv()
    with pytest.raises(ValueError):
        simdattn.attention(q, k[:, :, :, :4], v)


def test_errors_shapes_and_dtypes():
    q, k, v = qkv()
    e = expect_error("k", simdattn.attention, q, k[..., :4], v)  # D differs
    assert "k" in str(e)
    expect_error("k", simdattn.attention, q, k[:1], v)  # B differs
    expect_error("k", simdattn.attention, q, qkv(Hkv=3, H=3)[1], v)  # H % Hkv != 0
    expect_error("v", simdattn.attention, q, k, v[:, :, :3])  # Sk differs
    expect_error("q", simdattn.attention, q[0], k, v)  # 3-D
    expect_error("k", simdattn.attention, q, k.astype(np.float64), v)
    expect_error("v", simdattn.attention, q, k, v.astype(np.float16))
    expect_error("q", simdattn.attention, q.astype(np.int8), k, v)
    expect_error("q", simdattn.attention, q.astype(np.complex64), k, v)
    expect_error("out", simdattn.attention, q, k, v, out=np.zeros((2, 4, 5, 6), np.float64))
    expect_error("out", simdattn.attention, q, k, v, out=np.zeros((2, 4, 5, 5), np.float32))
    ro = np.zeros((2, 4, 5, 6), np.float32)
    ro.flags.writeable = False
    expect_error("out", simdattn.attention, q, k, v, out=ro)
    expect_error("dtype", simdattn.attention, q, k, v, dtype="f64")  # converts to bf16 only
    expect_error("dtype", simdattn.attention, q, k, v, dtype="int8")
    expect_error("out", simdattn.attention, q, k, v, dtype="bf16", out=np.zeros((2, 4, 5, 6), np.float64))
    # a correct call of the same arrays works
    assert simdattn.attention(q, k, v).shape == (2, 4, 5, 6)


def test_errors_negative_strides_name_the_argument():
    q, k, v = qkv()
    e = expect_error("q", simdattn.attention, q[..., ::-1], k, v)
    assert "stride" in str(e)
    expect_error("k", simdattn.attention, q, k[:, :, ::-1], v)
    expect_error("v", simdattn.attention, q, k, v[..., ::-1])
    expect_error("out", simdattn.attention, q, k, v, out=np.zeros((2, 4, 5, 6), np.float32)[:, ::-1])
    expect_error("mask", simdattn.attention, q, k, v, mask=np.ones((5, 7), bool)[::-1])
    expect_error("q", simdattn.linear_attention, q[..., ::-1], k, v)


def test_errors_option_strings():
    q, k, v = qkv()
    expect_error("causal", simdattn.attention, q, k, v, causal="diagonal")
    expect_error("causal", simdattn.attention, q, k, v, causal=3)
    expect_error("backend", simdattn.attention, q, k, v, backend="gpu")
    expect_error("scores_stage", simdattn.attention, q, k, v, scores=np.zeros((2, 4, 5, 7), np.float32),
                 scores_stage="logits")
    expect_error("window", simdattn.attention, q, k, v, window=(1, 2, 3))
    expect_error("feature_map", simdattn.linear_attention, q, k, v, feature_map="softmax")
    expect_error("backend", simdattn.linear_attention, q, k, v, backend="gpu")


def test_errors_options_name_the_python_argument():
    """An invalid option raises Error whose .argument is the Python keyword (mask, not options.mask):
    the module documents that .argument names the argument at fault."""
    cases = [
        ("mask", {"mask": np.zeros((5, 6), np.float32)}),
        ("mask", {"mask": np.zeros((5, 7), np.int32)}),
        ("key_lengths", {"key_lengths": [3]}),
        ("key_lengths", {"key_lengths": [3, 8]}),
        ("window", {"window": (-2, 1)}),
        ("softcap", {"softcap": -1.0}),
        ("alibi_slopes", {"alibi_slopes": [0.5] * 3}),
        ("sinks", {"sinks": [0.0] * 5}),
        ("query_offsets", {"query_offsets": [0]}),
        ("lse", {"lse": np.zeros((2, 4, 5, 2), np.float32)}),
        ("scores", {"scores": np.zeros((2, 4, 5, 6), np.float32)}),
        ("scale", {"scale": float("inf")}),
        ("threads", {"threads": -1}),
        ("global_tokens", {"global_tokens": -1}),
        ("block_mask", {"block_mask": np.ones((3, 3), np.uint8), "block_size": 4}),
    ]
    wrong = []
    for argument, kw in cases:
        q, k, v = qkv()
        with pytest.raises(simdattn.Error) as info:
            simdattn.attention(q, k, v, **kw)
        if info.value.argument != argument:
            wrong.append(f"{sorted(kw)}: argument {info.value.argument!r}, expected {argument!r}")
    q, k, v = qkv(np.float64)
    with pytest.raises(simdattn.Error) as info:
        simdattn.attention(q, k, v, backend="onednn")  # oneDNN has no f64 matmul
    if info.value.argument != "backend":
        wrong.append(f"backend='onednn' with float64: argument {info.value.argument!r}, expected 'backend'")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("bad", [
    {"k": "wrong_shape"}, {"mask": np.zeros((5, 6), np.float32)}, {"causal": "sideways"}, {"backend": "tpu"},
    {"key_lengths": [1, 99]}, {"window": (-5, 0)}, {"lse": np.zeros((1, 1, 1, 1), np.float32)},
    {"dtype": "bf16", "k": "wrong_shape"}, {"q": "negative_stride"},
])
def test_failed_call_leaves_out_untouched(bad):
    q, k, v = qkv()
    bad = dict(bad)
    if bad.pop("k", None):
        k = k[..., :4]
    if bad.pop("q", None):
        q = q[:, :, ::-1]
    out = np.full((2, 4, 5, 6), 4242.0, np.float32)
    lse = np.full((2, 4, 5, 1), 4242.0, np.float32)
    kw = {"lse": lse, **bad}
    with pytest.raises(simdattn.Error):
        simdattn.attention(q, k, v, out=out, **kw)
    assert np.all(out == 4242.0)
    assert np.all(lse == 4242.0)
