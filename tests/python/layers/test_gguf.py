"""MultiHeadAttention.from_gguf: the layers of GGUF files written by tests/cli/checkpoints/gguf_files.py equal
from_pretrained's on the Hugging Face directories they were converted from."""
import os
import sys

import numpy as np
import pytest

import simdattn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "cli", "checkpoints"))
import gguf_files  # noqa: E402
import model_families  # noqa: E402


@pytest.mark.parametrize("family,ttype", [("mistral", "BF16"), ("qwen2", "F32"), ("qwen3", "F16")])
def test_from_gguf_equals_from_pretrained(tmp_path, family, ttype):
    spec = model_families.FAMILIES[family]
    saved, spec["dtype"] = spec["dtype"], ttype
    try:
        W = model_families.write_checkpoint(str(tmp_path / "hf"), family, np.random.default_rng(5))
    finally:
        spec["dtype"] = saved
    path = str(tmp_path / "m.gguf")
    gguf_files.write(path, *gguf_files.convert(family, spec["config"], W, ttype))
    x = np.random.default_rng(6).standard_normal((2, 6, 32)).astype(np.float32)
    for layer in (0, 1):
        hf = simdattn.MultiHeadAttention.from_pretrained(str(tmp_path / "hf"), layer, dtype="f32")
        gg = simdattn.MultiHeadAttention.from_gguf(path, layer, dtype="f32")
        assert gg.causal and gg.d_model == hf.d_model == 32
        assert np.array_equal(gg.forward(x), hf.forward(x))
    default = simdattn.MultiHeadAttention.from_gguf(path, 0)  # the query weight's dtype
    assert default.dtype == {"F32": "f32", "F16": "f16", "BF16": "bf16"}[ttype]


def test_from_gguf_errors_name_the_file(tmp_path):
    path = str(tmp_path / "bad.gguf")
    with open(path, "wb") as f:
        f.write(b"GGUF\x01\x00\x00\x00")
    with pytest.raises(simdattn.Error) as e:
        simdattn.MultiHeadAttention.from_gguf(path, 0)
    assert path in str(e.value) and "version 1" in str(e.value)
