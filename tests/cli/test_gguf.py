#!/usr/bin/env python3
"""`simdattn mha --gguf FILE --layer N` on GGUF files written by gguf_files.py from the family
tests' checkpoints (model_families.py): each layer equals the one `--model` loads from the
Hugging Face directory it was converted from, bitwise for F32, F16 and BF16 files and for Q8_0
against the directory holding the Q8_0-rounded weights; broken files exit 2 with one line
naming the fault.

    python3 test_gguf.py path/to/simdattn [unittest args]
"""
import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "checkpoints"))
import gguf_files as gg  # noqa: E402
import mha_weights  # noqa: E402
import model_families as mf  # noqa: E402
import cli_case  # noqa: E402  (CliCase)

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


class Gguf(cli_case.CliCase):
    def setUp(self):
        super().setUp()
        self.rng = np.random.default_rng(20261205)

    def mha(self, *args, rc=0):
        out = self.path("y.npy")
        if os.path.exists(out):
            os.remove(out)
        r = self.run_cli("mha", "--out", out, *args)
        self.assertEqual(r.returncode, rc, r.stderr)
        if rc != 0:
            self.assertEqual(r.stderr.count("\n"), 1, r.stderr)  # one line
            self.assertFalse(os.path.exists(out))
            return r.stderr
        return np.load(out)

    def checkpoint(self, family, dtype, config_edit=None, name=None):
        """The family's test checkpoint with its weights stored in dtype, and its values."""
        spec = mf.FAMILIES[family]
        saved = spec["dtype"]
        spec["dtype"] = dtype
        try:
            d = self.path(name or f"{family}-{dtype}")
            return d, mf.write_checkpoint(d, family, self.rng, weight_scale=2.0, config_edit=config_edit)
        finally:
            spec["dtype"] = saved

    def gguf(self, name, family, W, ttype, cfg=None, **kw):
        path = self.path(name)
        gg.write(path, *gg.convert(family, cfg or mf.FAMILIES[family]["config"], W, ttype), **kw)
        return path

    def both(self, d, g, layer, x, *extra):
        """The layer from the directory and from the GGUF file on x: (y_hf, y_gguf)."""
        q = self.save("x.npy", x)
        y_hf = self.mha("--model", d, "--layer", str(layer), "--query", q, *extra)
        y_gg = self.mha("--gguf", g, "--layer", str(layer), "--query", q, *extra)
        return y_hf, y_gg

    def compare(self, family, ttype, cfg=None, config_edit=None, tol=0.0):
        """The family's layers 0 and 1 from its directory and from its GGUF file of type ttype:
        equal within tol of max |y| (0: bitwise)."""
        B, S = 2, 9
        pos = self.save("pos.npy", np.array([np.arange(S), np.arange(S) + 5], np.int64))
        d, W = self.checkpoint(family, ttype, config_edit, name=f"{family}-{ttype}-{tol}")
        g = self.gguf(f"{family}-{ttype}-{tol}.gguf", family, W, ttype, cfg)
        x = self.rng.standard_normal((B, S, 32)).astype(np.float32)
        for layer in (0, 1):  # qwen2's layer 1 slides, its layer 0 does not
            y_hf, y_gg = self.both(d, g, layer, x, "--positions", pos)
            what = f"{family} {ttype} layer {layer}"
            self.assertEqual(y_gg.dtype, y_hf.dtype, what)
            self.assertGreater(np.abs(y_gg).max(), 0.1, what)  # a real output
            if tol == 0.0:
                self.assertTrue(np.array_equal(y_hf, y_gg), f"{what}: max diff {np.abs(y_hf - y_gg).max()}")
            else:
                self.assertLess(np.abs(y_hf - y_gg).max(), tol * np.abs(y_hf).max(), what)

    def test_every_family_and_type_equals_the_hugging_face_layer_bitwise(self):
        for family in ("mistral", "qwen2", "qwen3"):  # mistral: linear RoPE scaling and a window
            for ttype in ("F32", "F16", "BF16"):
                self.compare(family, ttype)
        # llama without Llama 3.1's scaling, which GGUF keeps only as per-frequency factors
        cfg = dict(mf.FAMILIES["llama"]["config"], rope_scaling={"rope_type": "linear", "factor": 4.0})
        for ttype in ("F32", "F16", "BF16"):
            self.compare("llama", ttype, cfg=cfg, config_edit=lambda c: c.update(rope_scaling=cfg["rope_scaling"]))

    def test_llama3_rope_factors_within_one_rounding_of_the_blended_frequencies(self):
        """rope_freqs.weight holds 1 / ((1 - s) / factor + s) in f32 for the frequencies between
        the two wavelengths, where Hugging Face computes (1 - s) inv / factor + s inv: those
        frequencies agree to f32 rounding, the others exactly."""
        for ttype in ("F32", "BF16"):
            self.compare("llama", ttype, tol=1e-5 if ttype == "F32" else 2e-2)

    def test_permutation_matters(self):
        """Loading llama's permuted q and k as they lie gives another layer: the undoing is needed."""
        d, W = self.checkpoint("mistral", "F32")
        meta, tensors = gg.convert("mistral", mf.FAMILIES["mistral"]["config"], W, "F32")
        unpermuted = []
        for name, t, shape, raw in tensors:
            if name.startswith("blk.0.attn_q.") or name.startswith("blk.0.attn_k."):
                a = W[f"layers.0.self_attn.{name[11]}_proj.weight"]
                raw = gg.tensor_bytes(a, t)
            unpermuted.append((name, t, shape, raw))
        g = self.path("raw.gguf")
        gg.write(g, meta, unpermuted)
        y_hf, y_gg = self.both(d, g, 0, self.rng.standard_normal((1, 6, 32)).astype(np.float32))
        self.assertGreater(np.abs(y_hf - y_gg).max(), 1e-3)

    def test_q8_0_equals_the_layer_of_its_rounded_weights(self):
        for family in ("mistral", "qwen2"):  # (llama's Llama 3.1 RoPE: the test above)
            d, W = self.checkpoint(family, "F32")
            g = self.gguf(f"{family}-q8.gguf", family, W, "Q8_0")
            # the directory of the weights Q8_0 holds: every 2-D attention weight rounded
            rounded = {k: (gg.q8_0_values(v) if v.ndim == 2 and ".self_attn." in k else v) for k, v in W.items()}
            dq = self.path(f"{family}-q8-hf")
            os.makedirs(dq)
            with open(os.path.join(d, "config.json")) as f, open(os.path.join(dq, "config.json"), "w") as out:
                out.write(f.read())
            prefix = mf.FAMILIES[family]["prefix"]
            mha_weights.write_safetensors(os.path.join(dq, "model.safetensors"),
                                          {prefix + k: v.astype(np.float32) for k, v in rounded.items()})
            x = self.rng.standard_normal((2, 7, 32)).astype(np.float32)
            for layer in (0, 1):
                y_q8, y_gg = self.both(dq, g, layer, x)
                self.assertTrue(np.array_equal(y_q8, y_gg), f"{family} layer {layer}")
                y_hf = self.mha("--model", d, "--layer", str(layer), "--query", self.save("x.npy", x))
                err = np.abs(y_gg - y_hf).max() / np.abs(y_hf).max()
                # a sanity bound (weights rounded to 1/254 of their block's largest, then a softmax
                # sharpened by weight_scale 2); the bitwise check above is the contract
                self.assertLess(err, 5e-2, f"{family} layer {layer}: Q8_0 against the unrounded weights")
                self.assertGreater(err, 0.0)  # it did round

    def test_dtype_flag_and_bf16_default(self):
        d, W = self.checkpoint("llama", "BF16")
        g32 = self.gguf("f32.gguf", "llama", W, "F32")
        g16 = self.gguf("bf16.gguf", "llama", W, "BF16")
        x = self.rng.standard_normal((1, 5, 32)).astype(np.float32)
        y_hf, y16 = self.both(d, g16, 1, x)  # both compute in bf16 (a BF16 query weight)
        self.assertTrue(np.array_equal(y_hf, y16))
        y32 = self.mha("--gguf", g32, "--layer", "1", "--query", self.save("x.npy", x), "--dtype", "bf16")
        self.assertTrue(np.array_equal(y_hf, y32))

    def broken_cases(self):
        """(file bytes or (metadata, tensors, kw), extra args, the text the error must name)."""
        _, W = self.checkpoint("llama", "F32")
        cfg = mf.FAMILIES["llama"]["config"]
        meta, tensors = gg.convert("llama", cfg, W, "F32")
        good = gg.gguf_bytes(meta, tensors)
        arch = good.index(b"llama", good.index(b"general.architecture"))  # the value's bytes
        huge_string = good[:arch - 8] + (2 ** 40).to_bytes(8, "little") + good[arch:]
        q = next(t for t in tensors if t[0] == "blk.0.attn_q.weight")
        q4 = [(n, "Q4_0", s, b"\0" * (s[0] * s[1] // 32 * 18)) if n == q[0] else (n, t, s, r) for n, t, s, r in tensors]
        k_wrong = [(n, t, [s[0] * 2, s[1]], r * 2) if n == "blk.0.attn_k.weight" else (n, t, s, r)
                   for n, t, s, r in tensors]
        return [
            (b"GGML" + good[4:], [], "magic"),
            (good[:4] + (1).to_bytes(4, "little") + good[8:], [], "version 1"),
            (good[:10], [], "tensor count"),
            (gg.gguf_bytes(meta, tensors, counts=(10 ** 12, len(meta))), [], "tensor count 1000000000000"),
            (huge_string, [], "general.architecture"),
            (gg.gguf_bytes(meta + [("general.alignment", gg.U32, 48)], tensors), [], "general.alignment 48"),
            (gg.gguf_bytes(meta + [("x.bad", 13, b"")], tensors), [], "unknown value type 13"),
            (gg.gguf_bytes(meta, tensors + [q]), [], "duplicate tensor 'blk.0.attn_q.weight'"),
            (gg.gguf_bytes(meta, q4), [], "Q4_0"),
            (gg.gguf_bytes(meta, tensors, offsets={"blk.1.attn_output.weight": 2 ** 30}), [], "blk.1.attn_output.weight"),
            (gg.gguf_bytes(meta, tensors, offsets={"blk.0.attn_q.weight": 16}), [], "not a multiple of the alignment"),
            (gg.gguf_bytes(meta, tensors, offsets={"blk.0.attn_k.weight": 0}), [], "overlap"),
            (gg.gguf_bytes(meta, [t for t in tensors if t[0] != "blk.0.attn_v.weight"]), [], "blk.0.attn_v.weight"),
            (gg.gguf_bytes(meta, k_wrong), [], "blk.0.attn_k.weight"),
            (gg.gguf_bytes([(k, v, "gpt2" if k == "general.architecture" else x) for k, v, x in meta], tensors), [],
             "architecture 'gpt2'"),
            (gg.gguf_bytes([m for m in meta if m[0] != "llama.attention.head_count"], tensors), [],
             "llama.attention.head_count"),
            (good, ["--layer", "2"], "llama.block_count = 2"),
        ]

    def test_broken_files_exit_2_naming_the_fault(self):
        x = self.save("x.npy", self.rng.standard_normal((1, 4, 32)).astype(np.float32))
        for i, (data, extra, named) in enumerate(self.broken_cases()):
            p = self.path(f"broken{i}.gguf")
            with open(p, "wb") as f:
                f.write(data)
            args = ["--gguf", p, "--query", x, *(extra or ["--layer", "0"])]
            err = self.mha(*args, rc=2)
            self.assertIn(named, err, named)
            if "--layer" not in extra:
                self.assertIn(p, err, named)  # the file is named

    def test_usage_errors(self):
        _, W = self.checkpoint("qwen2", "F32")
        g = self.gguf("q.gguf", "qwen2", W, "F32")
        x = self.save("x.npy", self.rng.standard_normal((1, 4, 32)).astype(np.float32))
        for args, named in ((["--gguf", g, "--model", self.dir, "--layer", "0"], "--model"),
                            (["--gguf", g], "--layer"),
                            (["--gguf", g, "--layer", "0", "--heads", "4"], "--heads"),
                            (["--gguf", g, "--layer", "0", "--rope-theta", "10"], "--rope-theta"),
                            (["--gguf", g, "--layer", "0", "--key", x, "--value", x], "--key"),
                            (["--gguf", self.path("nowhere.gguf"), "--layer", "0"], "nowhere.gguf")):
            err = self.mha(*args, "--query", x, rc=2)
            self.assertIn(named, err, args)


if __name__ == "__main__":
    cli_case.BIN = os.path.abspath(sys.argv.pop(1))
    unittest.main()
