#!/usr/bin/env python3
"""End-to-end tests of `simdattn run` against an independent NumPy float64 oracle
(cli_case.py's, written from docs/design.md's maths and docs/cli.md's command line): every
option, and the score modifiers (softcap, ALiBi, T5, sinks, offsets) with their lse and scores
outputs.

Usage: test_cli.py PATH_TO_SIMDATTN [unittest args]   (ctest passes the built binary)
"""
import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "checkpoints"))
import cli_case  # noqa: E402  (tests/cli/cli_case.py)
from cli_case import CliCase, backend_dtypes, backends, oracle  # noqa: E402
import mha_weights  # noqa: E402  (tests/cli/checkpoints/mha_weights.py)


class RunMatchesOracle(CliCase):
    """`simdattn run --backend reference` agrees with the NumPy float64 oracle to 1e-12 relative."""

    def check(self, q, k, v, extra=(), rtol=1e-12, backend="reference", **kw):
        o = self.run_attention(q, k, v, "--backend", backend, *extra)
        want = oracle(q, k, v, **kw)
        self.assertEqual(o.shape, want.shape)
        self.assertEqual(o.dtype, q.dtype)
        scale = max(1.0, np.abs(v).max())
        err = np.abs(o - want).max() / scale
        self.assertLessEqual(err, rtol, f"max error {err} with {extra}")

    def test_plain_and_scaled(self):
        q, k, v = self.inputs()
        self.check(q, k, v)
        self.check(q, k, v, ["--scale", "0.3"], scale=0.3)

    def test_causal_both_alignments(self):
        for Sq, Sk in ((5, 7), (7, 5), (6, 6)):
            q, k, v = self.inputs(Sq=Sq, Sk=Sk)
            for c in ("top-left", "bottom-right"):
                self.check(q, k, v, ["--causal", c], causal=c)

    def test_masks(self):
        q, k, v = self.inputs()
        B, H, Sq, Sk = 2, 4, 5, 7
        for shape in ((Sq, Sk), (B, 1, Sq, Sk), (B, H, Sq, Sk), (B, 1, 1, Sk)):
            bmask = self.rng.random(shape) < 0.7
            self.save("m.npy", bmask)
            self.check(q, k, v, ["--mask", self.path("m.npy")], mask=bmask)
            u8 = bmask.astype(np.uint8) * 3
            self.save("m.npy", u8)
            self.check(q, k, v, ["--mask", self.path("m.npy")], mask=u8)
            add = self.rng.standard_normal(shape)
            add[self.rng.random(shape) < 0.2] = -np.inf
            for dt in (np.float32, np.float64):
                self.save("m.npy", add.astype(dt))
                self.check(q, k, v, ["--mask", self.path("m.npy")], mask=add.astype(dt))

    def test_key_lengths_and_windows(self):
        q, k, v = self.inputs()
        for dt in (np.int32, np.int64):
            L = np.array([3, 0], dtype=dt)
            self.save("L.npy", L)
            self.check(q, k, v, ["--key-lengths", self.path("L.npy")], key_lengths=L)
            self.check(q, k, v, ["--key-lengths", self.path("L.npy"), "--causal", "bottom-right"],
                       key_lengths=L, causal="bottom-right")
        for w in ((1, 0), (0, 2), (-1, 1), (2, -1)):
            self.check(q, k, v, ["--window", f"{w[0]},{w[1]}"], window=w)
            self.check(q, k, v, ["--window", f"{w[0]},{w[1]}", "--causal", "top-left"],
                       window=w, causal="top-left")

    def test_multi_query_and_strange_sizes(self):
        q, k, v = self.inputs(B=1, H=3, Hkv=1, Sq=1, Sk=1, D=1, Dv=3)
        self.check(q, k, v)
        q, k, v = self.inputs(B=1, H=2, Hkv=1, Sq=9, Sk=33, D=17, Dv=5)
        self.check(q, k, v, ["--causal", "bottom-right"], causal="bottom-right")

    def test_native_and_f32(self):
        q, k, v = self.inputs(dtype=np.float32)
        self.check(q, k, v, ["--causal", "top-left", "--threads", "2"], rtol=1e-5, backend="native",
                   causal="top-left")
        q, k, v = self.inputs()
        self.check(q, k, v, ["--threads", "1"], backend="native")

    def test_half_precision(self):
        """<f2 files compute in f16 by default; --dtype rounds the inputs (to nearest even, done
        here by bit manipulation) and the output keeps Q's .npy dtype."""
        def to_bf16(x):  # f32 array -> its bf16 rounding, as float64
            u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
            u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
            return u.astype(np.uint32).view(np.float32).astype(np.float64)
        q, k, v = self.inputs(dtype=np.float16)
        for backend in ("reference", "native"):
            o = self.run_attention(q, k, v, "--backend", backend, "--causal", "bottom-right")
            self.assertEqual(o.dtype, np.float16)
            want = oracle(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), causal="bottom-right")
            self.assertLessEqual(np.abs(o.astype(np.float64) - want).max(), 2e-3 * max(1.0, np.abs(v).max()))
        q, k, v = self.inputs(dtype=np.float32)
        for backend in ("reference", "native", "onednn"):
            if backend not in backends():
                continue
            if "bf16" not in backend_dtypes(backend):  # oneDNN without a bf16 matmul on this CPU
                self.assertEqual(backend, "onednn")
                continue
            o = self.run_attention(q, k, v, "--backend", backend, "--dtype", "bf16")
            self.assertEqual(o.dtype, np.float32)
            want = oracle(to_bf16(q), to_bf16(k), to_bf16(v))
            self.assertLessEqual(np.abs(o - want).max(), 1e-2 * max(1.0, np.abs(v).max()))
            # the output went through bf16: every value is a bf16 value
            self.assertTrue(np.array_equal(to_bf16(o), o.astype(np.float64)))
            if "f16" not in backend_dtypes(backend):
                continue
            o16 = self.run_attention(q, k, v, "--backend", backend, "--dtype", "f16")
            want16 = oracle(*(x.astype(np.float16).astype(np.float64) for x in (q, k, v)))
            self.assertLessEqual(np.abs(o16 - want16).max(), 2e-3 * max(1.0, np.abs(v).max()))

    def test_sparse_patterns(self):
        q, k, v = self.inputs(B=2, H=2, Hkv=1, Sq=40, Sk=50, D=8, Dv=8)
        blocks = self.rng.random((5, 7)) < 0.4  # block size 8: ceil(40/8) x ceil(50/8)
        blocks[2, :] = False  # rows 16..23 see only global keys
        bm = self.save("bm.npy", blocks)
        for backend in ("reference", "native"):
            self.check(q, k, v, ["--global-tokens", "2", "--causal", "bottom-right"], backend=backend,
                       global_tokens=2, causal="bottom-right")
            self.check(q, k, v, ["--block-mask", bm, "--block-size", "8"], backend=backend,
                       block_mask=blocks, block_size=8)
            self.check(q, k, v, ["--block-mask", bm, "--block-size", "8", "--global-tokens", "3",
                                 "--window", "6,0"], backend=backend,
                       block_mask=blocks, block_size=8, global_tokens=3, window=(6, 0))

    def test_onednn(self):
        if "onednn" not in backends():
            self.skipTest("the onednn backend is not built")
        q, k, v = self.inputs(dtype=np.float32)
        self.check(q, k, v, ["--causal", "bottom-right"], rtol=1e-5, backend="onednn",
                   causal="bottom-right")
        mask = self.rng.random((2, 1, 5, 7)) < 0.7
        L = np.array([7, 3], dtype=np.int64)
        self.check(q, k, v, ["--mask", self.save("m.npy", mask), "--key-lengths", self.save("L.npy", L),
                             "--window", "2,1"], rtol=1e-5, backend="onednn", mask=mask,
                   key_lengths=L, window=(2, 1))
        # f64 is refused: oneDNN has none
        q, k, v = self.inputs()
        args = ["run", "--q", self.save("q.npy", q), "--k", self.save("k.npy", k),
                "--v", self.save("v.npy", v), "--out", self.path("o64.npy"), "--backend", "onednn"]
        r = self.run_cli(*args)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--backend", r.stderr)
        self.assertFalse(os.path.exists(self.path("o64.npy")))


def modified_oracle(q, k, v, scale=None, causal="none", key_lengths=None, offsets=None, mask=None,
                    softcap=None, slopes=None, t5=None, t5_bidirectional=True, t5_max_distance=128,
                    sinks=None):
    """docs/design.md's score modifiers in float64: returns (O, lse, {stage: scores})."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    B, H, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    k = np.repeat(k, H // Hkv, axis=1)
    v = np.repeat(v, H // Hkv, axis=1)
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    scaled = scale * np.einsum("bhid,bhjd->bhij", q, k)
    capped = scaled if softcap is None else softcap * np.tanh(scaled / softcap)
    L = np.full(B, Sk) if key_lengths is None else np.asarray(key_lengths, dtype=np.int64)
    biased = capped.copy()
    visible = np.ones((B, H, Sq, Sk), dtype=bool)
    i = np.arange(Sq)[:, None]
    j = np.arange(Sk)[None, :]
    for b in range(B):
        if offsets is not None:
            off = int(offsets[b])
        else:
            off = 0 if causal == "top-left" else L[b] - Sq
        pos = i + off
        rel = j - pos
        vis = j < L[b]
        if causal != "none":
            vis = vis & (j <= pos)
        visible[b] &= vis
        for h in range(H):
            if slopes is not None:
                biased[b, h] += float(slopes[h]) * rel
            if t5 is not None:
                biased[b, h] += np.asarray(t5, dtype=np.float64)[mha_weights.t5_bucket(rel, t5_bidirectional, t5.shape[0],
                                                                           t5_max_distance), h]
    if mask is not None:
        biased = biased + np.broadcast_to(mask, (B, H, Sq, Sk)).astype(np.float64)
    biased = np.where(visible, biased, -np.inf)
    m = biased.max(axis=-1, keepdims=True)
    sink = None if sinks is None else np.asarray(sinks, dtype=np.float64)[None, :, None, None]
    if sink is not None:
        m = np.maximum(m, sink)
    safe_m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(visible, np.exp(biased - safe_m), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    if sink is not None:
        total = total + np.where(np.isfinite(biased).any(axis=-1, keepdims=True), np.exp(sink - safe_m), 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        w = np.where(total > 0, e / total, 0.0)
        lse = np.where(total > 0, safe_m + np.log(total), -np.inf)
    if sink is not None:  # a row with no visible key: lse = sink
        lse = np.where(total > 0, lse, np.broadcast_to(sink, lse.shape))
    o = np.einsum("bhij,bhjd->bhid", w, v)
    return o, lse[..., 0], {"scaled": scaled, "capped": capped, "biased": biased, "softmax": w}


class Modifiers(CliCase):
    """`simdattn run` with the score modifiers against modified_oracle (written from the docs)."""

    def run_mod(self, q, k, v, extra, backend="reference"):
        args = ["run", "--q", self.save("q.npy", q), "--k", self.save("k.npy", k), "--v", self.save("v.npy", v),
                "--out", self.path("o.npy"), "--backend", backend, "--lse-out", self.path("lse.npy"), *extra]
        r = self.run_cli(*args)
        self.assertEqual(r.returncode, 0, r.stderr)
        return np.load(self.path("o.npy")), np.load(self.path("lse.npy"))

    def check(self, extra, kw, dtype=np.float64, backend="reference", rtol=1e-12, lse_tol=1e-6, **shape):
        q, k, v = self.inputs(dtype=dtype, **shape)
        o, lse = self.run_mod(q, k, v, extra, backend)
        want, want_lse, _ = modified_oracle(q, k, v, **kw)
        err = np.abs(o - want).max() / max(1.0, np.abs(v).max())
        self.assertLessEqual(err, rtol, f"{extra} ({backend}): error {err}")
        self.assertEqual(lse.dtype, np.float32)
        fin = np.isfinite(want_lse)
        self.assertTrue(np.array_equal(fin, np.isfinite(lse)), f"{extra}: lse infinities differ")
        self.assertTrue(np.all(lse[~fin] == want_lse[~fin]))
        if fin.any():
            self.assertLessEqual(np.abs(lse[fin] - want_lse[fin]).max() / max(1.0, np.abs(want_lse[fin]).max()), lse_tol)

    def files(self, H=4, B=2):
        slopes = self.rng.standard_normal(H).astype(np.float32) * 0.3
        sinks = self.rng.standard_normal(H).astype(np.float32)
        table = self.rng.standard_normal((16, H)).astype(np.float32)
        offsets = np.array([3, -2][:B], dtype=np.int64)
        return (self.save("slopes.npy", slopes), slopes, self.save("sinks.npy", sinks), sinks,
                self.save("t5.npy", table), table, self.save("off.npy", offsets), offsets)

    def test_each_modifier_alone_and_combined_both_backends(self):
        sp, slopes, kp, sinks, tp, table, op, offsets = self.files()
        cases = [
            (["--softcap", "2.5"], dict(softcap=2.5)),
            (["--alibi"], dict(slopes=mha_weights.alibi_slopes(4))),
            (["--alibi-slopes", sp, "--causal", "bottom-right"], dict(slopes=slopes, causal="bottom-right")),
            (["--t5-bias", tp, "--t5-max-distance", "20"], dict(t5=table, t5_max_distance=20)),
            (["--t5-bias", tp, "--t5-unidirectional", "--causal", "top-left"],
             dict(t5=table, t5_bidirectional=False, causal="top-left")),
            (["--sinks", kp], dict(sinks=sinks)),
            (["--query-offset", op, "--causal", "top-left", "--alibi"],
             dict(offsets=offsets, causal="top-left", slopes=mha_weights.alibi_slopes(4))),
            (["--softcap", "1.7", "--alibi-slopes", sp, "--t5-bias", tp, "--sinks", kp, "--causal", "bottom-right"],
             dict(softcap=1.7, slopes=slopes, t5=table, sinks=sinks, causal="bottom-right")),
        ]
        onednn = "onednn" in backends()
        for extra, kw in cases:
            self.check(extra, kw, Sq=9, Sk=23)
            self.check(extra, kw, dtype=np.float32, backend="native", rtol=1e-5, lse_tol=1e-5, Sq=40, Sk=150)
            if onednn:
                self.check(extra, kw, dtype=np.float32, backend="onednn", rtol=1e-5, lse_tol=1e-5, Sq=40, Sk=150)

    def test_fully_masked_rows_with_sinks(self):
        sp, slopes, kp, sinks, tp, table, op, offsets = self.files()
        L = np.array([0, 4], dtype=np.int64)
        self.save("L.npy", L)
        for backend in ("reference", "native"):
            self.check(["--key-lengths", self.path("L.npy"), "--sinks", kp], dict(key_lengths=L, sinks=sinks),
                       backend=backend, rtol=1e-12 if backend == "reference" else 1e-6)
            self.check(["--key-lengths", self.path("L.npy")], dict(key_lengths=L),
                       backend=backend, rtol=1e-12 if backend == "reference" else 1e-6)

    def test_scores_out_every_stage(self):
        sp, slopes, kp, sinks, tp, table, op, offsets = self.files()
        q, k, v = self.inputs(Sq=6, Sk=11)
        mask = self.rng.standard_normal((6, 11))
        self.save("m.npy", mask)
        extra = ["--softcap", "2", "--alibi-slopes", sp, "--t5-bias", tp, "--sinks", kp, "--causal", "bottom-right",
                 "--mask", self.path("m.npy")]
        _, _, stages = modified_oracle(q, k, v, softcap=2.0, slopes=slopes, t5=table, sinks=sinks,
                                       causal="bottom-right", mask=mask)
        for backend in ("reference", "native"):
            for stage in ("scaled", "capped", "biased", "softmax"):
                o, _ = self.run_mod(q, k, v, [*extra, "--scores-out", self.path("s.npy"), "--scores-stage", stage],
                                    backend)
                got = np.load(self.path("s.npy"))
                want = stages[stage]
                self.assertEqual(got.shape, want.shape)
                self.assertTrue(np.array_equal(np.isinf(got), np.isinf(want)), stage)
                fin = np.isfinite(want)
                self.assertLessEqual(np.abs(got[fin] - want[fin]).max(), 1e-12 * max(1.0, np.abs(want[fin]).max()), stage)
        # the default stage is softmax
        self.run_mod(q, k, v, [*extra, "--scores-out", self.path("s.npy")])
        self.assertLessEqual(np.abs(np.load(self.path("s.npy")) - stages["softmax"]).max(), 1e-12)

    def test_bad_modifier_input(self):
        sp, slopes, kp, sinks, tp, table, op, offsets = self.files()
        q, k, v = self.inputs(dtype=np.float32)
        base = ["run", "--q", self.save("q.npy", q), "--k", self.save("k.npy", k), "--v", self.save("v.npy", v),
                "--out", self.path("out.npy")]
        wrong = self.save("wrong.npy", np.zeros(3, dtype=np.float32))
        bad_t5 = self.save("badt5.npy", np.zeros((16, 3), dtype=np.float32))
        for extra, fragment in (
                (["--softcap", "0"], "--softcap"),
                (["--softcap", "x"], "--softcap"),
                (["--alibi", "--alibi-slopes", sp], "--alibi"),
                (["--alibi-slopes", wrong], "--alibi-slopes"),
                (["--sinks", wrong], "--sinks"),
                (["--query-offset", wrong], "--query-offset"),
                (["--t5-bias", bad_t5], "--t5-bias"),
                (["--t5-bias", tp, "--t5-max-distance", "2"], "--t5-max-distance"),
                (["--t5-max-distance", "20"], "--t5-max-distance"),
                (["--scores-stage", "biased"], "--scores-stage"),
                (["--scores-out", self.path("s.npy"), "--scores-stage", "raw"], "--scores-stage")):
            r = self.run_cli(*base, *extra, "--scores-out", self.path("s.npy"), "--lse-out", self.path("l.npy")) \
                if "--scores-stage" not in extra and "--scores-out" not in extra else self.run_cli(*base, *extra)
            self.assertEqual(r.returncode, 2, f"{extra}: {r.stderr}")
            lines = r.stderr.strip().splitlines()
            self.assertEqual(len(lines), 1, r.stderr)
            self.assertIn(fragment, lines[0])
            for f in ("out.npy", "s.npy", "l.npy"):
                self.assertFalse(os.path.exists(self.path(f)), f"{f} written despite {extra}")


if __name__ == "__main__":
    cli_case.BIN = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
