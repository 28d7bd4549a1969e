#!/usr/bin/env python3
"""The `simdattn` command's other jobs end to end: `linear` against the NumPy quadratic form,
`mha` (the layer from a weights file) against a float64 layer, `compare`'s JSON, and `info`.

Usage: test_cli_commands.py PATH_TO_SIMDATTN [unittest args]   (ctest passes the built binary)
"""
import json
import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "checkpoints"))
import cli_case  # noqa: E402  (tests/cli/cli_case.py)
from cli_case import CliCase, backend_dtypes, backends  # noqa: E402
import mha_weights  # noqa: E402  (tests/cli/checkpoints/mha_weights.py)


def linear_oracle(q, k, v, causal=False, feature_map="elu1", eps=1e-6):
    """float64 quadratic form of linear attention (Katharopoulos et al. 2020)."""
    phi = {"elu1": lambda x: np.where(x > 0, x + 1, np.exp(np.minimum(x, 0))),
           "relu": lambda x: np.maximum(x, 0), "identity": lambda x: x}[feature_map]
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    fk, vv = np.repeat(phi(k), g, axis=1), np.repeat(v, g, axis=1)
    w = np.einsum("bhid,bhjd->bhij", phi(q), fk)
    if causal:
        w = np.tril(w)
    return np.einsum("bhij,bhjd->bhid", w, vv) / (w.sum(axis=-1, keepdims=True) + eps)


class Linear(CliCase):
    """`simdattn linear` against the NumPy quadratic form; bad flags exit 2."""

    def test_matches_oracle(self):
        q, k, v = (self.rng.uniform(0.05, 1.5, s) for s in ((2, 4, 70, 8), (2, 2, 70, 8), (2, 2, 70, 5)))
        for fm in ("elu1", "relu", "identity"):
            for causal in (False, True):
                for backend, dtype, tol in (("reference", np.float64, 1e-12), ("native", np.float32, 1e-5)):
                    args = ["linear", "--q", self.save("q.npy", q.astype(dtype)), "--k", self.save("k.npy", k.astype(dtype)),
                            "--v", self.save("v.npy", v.astype(dtype)), "--out", self.path("o.npy"),
                            "--feature-map", fm, "--backend", backend] + (["--causal"] if causal else [])
                    r = self.run_cli(*args)
                    self.assertEqual(r.returncode, 0, r.stderr)
                    o = np.load(self.path("o.npy"))
                    self.assertEqual(o.dtype, dtype)
                    want = linear_oracle(q.astype(dtype), k.astype(dtype), v.astype(dtype), causal, fm)
                    self.assertLess(np.abs(o - want).max(), tol, (fm, causal, backend))

    def test_dtype(self):
        """--dtype bf16|f16 rounds the inputs (bf16 by bit manipulation here) and the output keeps Q's
        .npy dtype; <f2 files compute in f16 by default. Oracle: float64 on the rounded inputs."""
        q, k, v = (self.rng.uniform(0.05, 1.5, s) for s in ((2, 4, 33, 8), (2, 2, 33, 8), (2, 2, 33, 5)))
        tol = {"bf16": 1e-2, "f16": 2e-3}  # of max(1, max|V|) = 1.5
        rounders = {"bf16": mha_weights.to_bf16, "f16": lambda x: x.astype(np.float32).astype(np.float16).astype(np.float64)}
        for backend in ("reference", "native"):
            for dt, rnd in rounders.items():
                for causal in (False, True):
                    args = ["linear", "--q", self.save("q.npy", q.astype(np.float32)),
                            "--k", self.save("k.npy", k.astype(np.float32)), "--v", self.save("v.npy", v.astype(np.float32)),
                            "--out", self.path("o.npy"), "--backend", backend, "--dtype", dt] + (["--causal"] if causal else [])
                    r = self.run_cli(*args)
                    self.assertEqual(r.returncode, 0, r.stderr)
                    o = np.load(self.path("o.npy"))
                    self.assertEqual(o.dtype, np.float32)
                    want = linear_oracle(rnd(q), rnd(k), rnd(v), causal, "elu1")
                    self.assertLessEqual(np.abs(o - want).max(), tol[dt] * 1.5, (backend, dt, causal))
                    # the output went through the dtype: rounding it again changes nothing
                    self.assertTrue(np.array_equal(rnd(o), o.astype(np.float64)), (backend, dt))
            h = [x.astype(np.float16) for x in (q, k, v)]
            r = self.run_cli("linear", "--q", self.save("q.npy", h[0]), "--k", self.save("k.npy", h[1]),
                             "--v", self.save("v.npy", h[2]), "--out", self.path("o.npy"), "--backend", backend)
            self.assertEqual(r.returncode, 0, r.stderr)
            o = np.load(self.path("o.npy"))
            self.assertEqual(o.dtype, np.float16)
            want = linear_oracle(*(x.astype(np.float64) for x in h), False, "elu1")
            self.assertLessEqual(np.abs(o.astype(np.float64) - want).max(), 2e-3 * 1.5)
        r = self.run_cli("linear", "--q", self.path("q.npy"), "--k", self.path("k.npy"), "--v", self.path("v.npy"),
                         "--out", self.path("o.npy"), "--dtype", "f8")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--dtype: expected f32, f64, bf16 or f16, got 'f8'", r.stderr)

    def test_bad_input(self):
        q = self.save("q.npy", np.ones((1, 1, 4, 2), np.float32))
        k = self.save("k.npy", np.ones((1, 1, 5, 2), np.float32))
        base = ["linear", "--q", q, "--k", k, "--v", k, "--out", self.path("o.npy")]
        for extra, fragment in ((["--causal"], "--causal"), (["--feature-map", "tanh"], "--feature-map"),
                                (["--backend", "onednn"], "--backend"), (["--threads", "0"], "--threads")):
            r = self.run_cli(*base, *extra)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
            self.assertIn(fragment, r.stderr)
            self.assertFalse(os.path.exists(self.path("o.npy")))


class Mha(CliCase):
    """`simdattn mha` on weights written by mha_weights.py (NumPy only) matches the float64 layer."""

    def run_mha(self, weights, heads, xq, *extra, xk=None, xv=None, rc=0):
        args = ["mha", "--weights", weights, "--heads", str(heads), "--query", self.save("x.npy", xq),
                "--out", self.path("y.npy"), *extra]
        if xk is not None:
            args += ["--key", self.save("xk.npy", xk), "--value", self.save("xv.npy", xv)]
        r = self.run_cli(*args)
        self.assertEqual(r.returncode, rc, r.stderr)
        return np.load(self.path("y.npy")) if rc == 0 else r

    def test_torch_names_self_attention(self):
        t, w = mha_weights.make_weights(self.rng, 16, 4, dtype=np.float64)
        path = self.path("w.safetensors")
        mha_weights.write_safetensors(path, t)
        x = self.rng.standard_normal((2, 7, 16))
        pad = np.zeros((2, 7), dtype=bool)
        pad[1, 5:] = True
        for causal in ("none", "top-left"):
            y = self.run_mha(path, 4, x, "--causal", causal, "--key-padding-mask", self.save("pad.npy", pad))
            want = mha_weights.mha_reference(w, 4, x, causal=causal, key_padding_mask=pad)
            self.assertEqual(y.dtype, np.float64)
            self.assertLess(np.abs(y - want).max(), 1e-12)

    def test_hf_names_grouped_query_prefix_f32_every_backend(self):
        t, w = mha_weights.make_weights(self.rng, 24, 6, kv_heads=2, hf=True, prefix="model.layers.0.attn.")
        path = self.path("hf.safetensors")
        mha_weights.write_safetensors(path, t, {"format": "pt"})
        x = self.rng.standard_normal((1, 9, 24)).astype(np.float32)
        want = mha_weights.mha_reference(w, 6, x, causal="bottom-right")
        for backend in backends():
            y = self.run_mha(path, 6, x, "--prefix", "model.layers.0.attn.", "--causal", "bottom-right",
                             "--backend", backend, "--threads", "2")
            self.assertEqual(y.dtype, np.float32)
            self.assertLess(np.abs(y - want).max() / max(1.0, np.abs(want).max()), 2e-5, backend)

    def test_rope_every_style_and_scaling_and_explicit_positions(self):
        """--rope-* flags against rope_reference (float64, from the definition)."""
        t, w = mha_weights.make_weights(self.rng, 32, 4, kv_heads=2, hf=True, dtype=np.float64)
        path = self.path("rope.safetensors")
        mha_weights.write_safetensors(path, t)
        x = self.rng.standard_normal((2, 9, 32))
        pos = np.array([[0, 1, 2, 3, 4, 5, 6, 7, 8], [3, 4, 5, 6, 7, 8, 9, 10, 11]], dtype=np.int64)
        cases = [
            (["--rope-theta", "10000"], dict()),
            (["--rope-theta", "500", "--rope-style", "interleaved"], dict(theta=500.0, style="interleaved")),
            (["--rope-theta", "1000", "--rotary-dim", "4"], dict(theta=1000.0, rotary_dim=4)),
            (["--rope-scaling", "linear", "--rope-factor", "4"], dict(scaling="linear", factor=4.0)),
            (["--rope-theta", "500000", "--rope-scaling", "llama3", "--rope-factor", "8", "--rope-low-freq-factor", "1",
              "--rope-high-freq-factor", "4", "--rope-original-max-positions", "64"],
             dict(theta=500000.0, scaling="llama3", factor=8.0, low=1.0, high=4.0, original=64)),
        ]
        for extra, kw in cases:
            y = self.run_mha(path, 4, x, "--causal", "top-left", "--backend", "reference", *extra)
            want = mha_weights.mha_reference(w, 4, x, causal="top-left", rope=kw)
            self.assertLess(np.abs(y - want).max(), 1e-12, extra)
        y = self.run_mha(path, 4, x, "--causal", "top-left", "--rope-theta", "100", "--positions", self.save("p.npy", pos))
        want = mha_weights.mha_reference(w, 4, x, causal="top-left", rope=dict(theta=100.0, positions=pos))
        self.assertLess(np.abs(y - want).max(), 1e-12)
        for extra, fragment in ((["--rotary-dim", "5"], "--rotary-dim"), (["--rope-theta", "0"], "--rope-theta"),
                                (["--rope-style", "odd"], "--rope-style"), (["--rope-factor", "2"], "--rope-factor"),
                                (["--rope-theta", "10", "--positions", self.save("bad.npy", pos[:, :3])], "--positions")):
            if os.path.exists(self.path("y.npy")):
                os.remove(self.path("y.npy"))
            r = self.run_mha(path, 4, x, *extra, rc=2)
            self.assertIn(fragment, r.stderr)
            self.assertFalse(os.path.exists(self.path("y.npy")))

    def test_cross_attention_with_kdim_vdim(self):
        t, w = mha_weights.make_weights(self.rng, 8, 2, kdim=5, vdim=3, dtype=np.float64)
        path = self.path("cross.safetensors")
        mha_weights.write_safetensors(path, t)
        xq = self.rng.standard_normal((2, 4, 8))
        xk, xv = self.rng.standard_normal((2, 6, 5)), self.rng.standard_normal((2, 6, 3))
        y = self.run_mha(path, 2, xq, xk=xk, xv=xv)
        self.assertLess(np.abs(y - mha_weights.mha_reference(w, 2, xq, xk, xv)).max(), 1e-12)

    def test_dtype_bf16_checkpoint_and_f16(self):
        """A BF16 checkpoint runs a bf16 layer unless --dtype says otherwise; an <f2 query runs f16;
        the output keeps the query's .npy dtype. Oracle: float64 with the layer's roundings (to bf16
        by bit manipulation)."""
        t, w = mha_weights.make_weights(self.rng, 16, 4, hf=True)
        path = self.path("bf16.safetensors")
        mha_weights.write_safetensors(path, {n: ("BF16", mha_weights.bf16_bits(a)) for n, a in t.items()})
        wb = {k: mha_weights.to_bf16(v) for k, v in w.items()}
        x = self.rng.standard_normal((2, 5, 16)).astype(np.float32)
        y = self.run_mha(path, 4, x, "--causal", "top-left")
        self.assertEqual(y.dtype, np.float32)
        want = mha_weights.mha_reference(wb, 4, mha_weights.to_bf16(x), causal="top-left", rnd=mha_weights.to_bf16)
        self.assertLessEqual(np.abs(y - want).max(), 1e-2 * max(1.0, np.abs(want).max()))
        self.assertTrue(np.array_equal(mha_weights.to_bf16(y), y.astype(np.float64)))  # went through bf16
        y32 = self.run_mha(path, 4, x, "--causal", "top-left", "--dtype", "f32")
        want32 = mha_weights.mha_reference(wb, 4, x, causal="top-left")
        self.assertLessEqual(np.abs(y32 - want32).max(), 2e-5 * max(1.0, np.abs(want32).max()))
        # An F32 checkpoint with an <f2 query: an f16 layer (weights rounded to f16), f16 output.
        t32, w32 = mha_weights.make_weights(self.rng, 16, 4)
        path32 = self.path("f32.safetensors")
        mha_weights.write_safetensors(path32, t32)
        xh = self.rng.standard_normal((1, 6, 16)).astype(np.float16)
        yh = self.run_mha(path32, 4, xh, "--backend", "reference")
        self.assertEqual(yh.dtype, np.float16)
        f16 = lambda a: np.asarray(a).astype(np.float16).astype(np.float64)
        want16 = mha_weights.mha_reference({k: f16(v) for k, v in w32.items()}, 4, xh, rnd=f16)
        self.assertLessEqual(np.abs(yh - want16).max(), 2e-3 * max(1.0, np.abs(want16).max()))
        r = self.run_mha(path32, 4, x, "--dtype", "f8", rc=2)
        self.assertIn("--dtype", r.stderr)

    def test_bad_input(self):
        t, _ = mha_weights.make_weights(self.rng, 8, 2)
        path = self.path("w.safetensors")
        mha_weights.write_safetensors(path, t)
        x = self.rng.standard_normal((1, 3, 8)).astype(np.float32)
        with open(self.path("bad.safetensors"), "wb") as f:
            f.write(b"\xff" * 8 + b"{}")
        for args, fragment in ((["--weights", self.path("bad.safetensors")], "header length"),
                               (["--weights", self.path("missing.safetensors")], "--weights"),
                               (["--heads", "3"], "--heads"),
                               (["--prefix", "layer9."], "no attention weights"),
                               (["--kv-heads", "1"], "kv_heads")):
            full = {"--weights": path, "--heads": "2", **dict(zip(args[::2], args[1::2]))}
            cmd = ["mha", "--query", self.save("x.npy", x), "--out", self.path("y.npy")]
            for k, v in full.items():
                cmd += [k, v]
            r = self.run_cli(*cmd)
            self.assertEqual(r.returncode, 2, f"{args}: {r.stderr}")
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
            self.assertIn(fragment, r.stderr)
            self.assertFalse(os.path.exists(self.path("y.npy")))
        r = self.run_mha(path, 2, x.reshape(1, 3, 8, 1), rc=2)
        self.assertIn("--query", r.stderr)
        r = self.run_mha(path, 2, self.rng.standard_normal((1, 3, 6)).astype(np.float32), rc=2)
        self.assertIn("--query", r.stderr)
        r = self.run_mha(path, 2, x, "--key", self.save("k.npy", x), rc=2)
        self.assertIn("--value", r.stderr)


class Compare(CliCase):
    """`simdattn compare`: one JSON entry per backend, errors within tolerance, bad input exits 2."""

    def compare_json(self, *args):
        r = self.run_cli("compare", "--json", *args)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout)

    def test_named_workload(self):
        entries = self.compare_json("--workload", "bert", "--threads", "2")
        self.assertEqual(sorted(e["backend"] for e in entries), sorted(backends()))
        for e in entries:
            self.assertEqual(e["workload"], "bert")
            self.assertEqual(e["threads"], 1 if e["backend"] == "reference" else 2)
            self.assertGreater(e["median_ms"], 0.0)
            self.assertGreater(e["gflops"], 0.0)
            self.assertLessEqual(e["max_abs_err"], e["tolerance"])
            self.assertEqual(e["rows_checked"], 128)
            # GFLOP/s is the workload's FLOPs over the median time
            self.assertAlmostEqual(e["gflops"], e["flops"] / (e["median_ms"] * 1e-3) * 1e-9,
                                   delta=1e-6 * e["gflops"])
        self.assertEqual(entries[0]["flops"], 4 * 12 * 128 * 128 * 64)

    def test_explicit_sizes_and_table(self):
        entries = self.compare_json("--b", "2", "--h", "6", "--hkv", "3", "--sq", "33", "--sk", "70",
                                    "--d", "20", "--dv", "12", "--causal", "bottom-right", "--threads", "1")
        self.assertEqual(len(entries), len(backends()))
        for e in entries:
            self.assertTrue(e["workload"].startswith("custom:"), e["workload"])
            self.assertLessEqual(e["max_abs_err"], e["tolerance"])
        r = self.run_cli("compare", "--sq", "16", "--h", "2", "--d", "8")
        self.assertEqual(r.returncode, 0, r.stderr)
        for name in backends():
            self.assertIn("\n" + name + " ", r.stdout)
        self.assertIn("max abs err", r.stdout)

    def test_dtype(self):
        """--dtype runs every backend that takes it here (as `info` lists) in it, each within the
        dtype's tolerance of the reference; the default is f32."""
        factor = {"f32": 1e-5, "f64": 1e-12, "bf16": 1e-2, "f16": 2e-3}
        for dt in ("bf16", "f16", "f64", None):
            args = ["--b", "2", "--h", "4", "--hkv", "2", "--sq", "40", "--sk", "150", "--d", "24", "--causal", "top-left"]
            entries = self.compare_json(*args, *(["--dtype", dt] if dt else []))
            dt = dt or "f32"
            self.assertEqual(sorted(e["backend"] for e in entries),
                             sorted(b for b in backends() if dt in backend_dtypes(b)), dt)
            self.assertIn("native", [e["backend"] for e in entries])
            for e in entries:
                self.assertEqual(e["dtype"], dt)
                # max|V| of 2 x 2 x 150 x 24 standard normal draws lies well inside [2, 10]
                self.assertTrue(2 * factor[dt] <= e["tolerance"] <= 10 * factor[dt], e)
                self.assertLessEqual(e["max_abs_err"], e["tolerance"], e)
        r = self.run_cli("compare", "--sq", "16", "--h", "2", "--d", "8", "--dtype", "f16")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("), f16, ", r.stdout)
        self.assertIn("tolerance: max abs err <= 0.002 * max(1, max|V|)", r.stdout)

    def test_bad_arguments(self):
        for args, fragment in ((["--workload", "gpt5"], "--workload"),
                               (["--dtype", "f8"], "--dtype: expected f32, f64, bf16 or f16, got 'f8'"),
                               (["--workload", "bert", "--sq", "4"], "--workload"),
                               (["--h", "6", "--hkv", "4"], "--hkv"),
                               (["--sq", "0"], "--sq"),
                               (["--d", "-3"], "--d"),
                               (["--b", "x"], "--b"),
                               (["--threads", "0"], "--threads"),
                               (["--causal", "left"], "--causal"),
                               (["--h", "64", "--sq", "100000", "--sk", "100000"], "GiB")):
            r = self.run_cli("compare", *args)
            self.assertEqual(r.returncode, 2, f"{args}: {r.stderr}")
            lines = r.stderr.strip().splitlines()
            self.assertEqual(len(lines), 1, r.stderr)
            self.assertIn(fragment, lines[0])
            self.assertEqual(r.stdout, "")


class Info(CliCase):
    def test_info(self):
        r = self.run_cli("info")
        self.assertEqual(r.returncode, 0, r.stderr)
        fields = dict(line.split(": ", 1) for line in r.stdout.splitlines()[1:])
        self.assertTrue(r.stdout.startswith("simdattn "))
        self.assertIn(fields["isa"].split()[0], ("sse2", "avx2", "avx512", "avx512_bf16", "amx"))
        self.assertIn("sse2", fields["isa available"].split())
        self.assertGreaterEqual(int(fields["threads"]), 1)
        self.assertGreaterEqual(int(fields["thread budget"]), int(fields["threads"]))
        self.assertIn("reference", fields["backends"].split())

    def test_forced_isa(self):
        r = self.run_cli("info", env={"SIMDATTN_ISA": "sse2"})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("isa: sse2 (forced by SIMDATTN_ISA)", r.stdout)
        r = self.run_cli("info", env={"SIMDATTN_ISA": "mmx"})
        self.assertEqual(r.returncode, 2)
        self.assertIn("SIMDATTN_ISA", r.stderr)

    def test_bad_isa_is_an_input_error_for_every_command(self):
        # Valid inputs, so the only fault is the environment: exit 2, one line naming
        # SIMDATTN_ISA and what it accepts, no output file.
        q, k, v = self.inputs(dtype=np.float32)
        run = ["run", "--q", self.save("q.npy", q), "--k", self.save("k.npy", k), "--v", self.save("v.npy", v),
               "--out", self.path("o.npy"), "--backend", "native"]
        linear = ["linear", "--q", self.path("q.npy"), "--k", self.path("k.npy"), "--v", self.path("v.npy"),
                  "--out", self.path("o.npy")]
        for env in ("mmx", "AVX2", "avx512 "):
            for args in (run, linear, ["compare", "--sq", "8", "--h", "2", "--d", "8"], ["info"]):
                r = self.run_cli(*args, env={"SIMDATTN_ISA": env})
                self.assertEqual(r.returncode, 2, f"{env!r} {args[0]}: {r.stderr}")
                lines = r.stderr.strip().splitlines()
                self.assertEqual(len(lines), 1, r.stderr)
                self.assertIn("SIMDATTN_ISA", lines[0])
                self.assertIn("expected amx, avx512_bf16, avx512, avx2 or sse2", lines[0])
                self.assertNotIn("internal error", lines[0])
                self.assertFalse(os.path.exists(self.path("o.npy")), args[0])


if __name__ == "__main__":
    cli_case.BIN = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
