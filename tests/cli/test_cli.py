#!/usr/bin/env python3
"""End-to-end tests of the `simdattn` CLI against an independent NumPy float64 oracle.

Usage: test_cli.py PATH_TO_SIMDATTN   (ctest passes the built binary)

The oracle below is written from docs/design.md's maths and position rule, not from the C++ code:
scores = scale * Q K^T + additive mask, hidden keys get -inf, stable softmax, rows with no
visible key are zero.
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mha_weights  # noqa: E402  (tests/cli/mha_weights.py)

BIN = None  # set from argv


def oracle(q, k, v, scale=None, causal="none", mask=None, key_lengths=None, window=None,
           global_tokens=0, block_mask=None, block_size=64):
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    B, H, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    group = H // Hkv
    k = np.repeat(k, group, axis=1)
    v = np.repeat(v, group, axis=1)
    if scale is None:
        scale = 1.0 / np.sqrt(D)
    s = scale * np.einsum("bhid,bhjd->bhij", q, k)
    visible = np.ones((B, H, Sq, Sk), dtype=bool)
    L = np.full(B, Sk) if key_lengths is None else np.asarray(key_lengths, dtype=np.int64)
    i = np.arange(Sq)[:, None]
    j = np.arange(Sk)[None, :]
    for b in range(B):
        offset = 0 if causal == "top-left" else L[b] - Sq
        pos = i + offset
        allow = np.ones((Sq, Sk), dtype=bool)
        if causal != "none":
            allow = allow & (j <= pos)
        if window is not None:
            left, right = window
            if left >= 0:
                allow = allow & (j >= pos - left)
            if right >= 0:
                allow = allow & (j <= pos + right)
        if block_mask is not None:
            allow = allow & (np.asarray(block_mask)[i // block_size, j // block_size] != 0)
        # global tokens: key j < G, or a query at position 0 <= p < G, whatever else hides
        glob = (j < global_tokens) | ((pos >= 0) & (pos < global_tokens))
        visible[b] &= (j < L[b]) & (allow | glob)
    if mask is not None:
        m = np.broadcast_to(mask, (B, H, Sq, Sk))
        if m.dtype in (np.bool_, np.uint8):
            visible &= m != 0
        else:
            s = s + m.astype(np.float64)
    s = np.where(visible, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    safe_m = np.where(np.isfinite(m), m, 0.0)
    w = np.where(visible, np.exp(s - safe_m), 0.0)
    l = w.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        o = np.einsum("bhij,bhjd->bhid", w, v) / l
    return np.where(l > 0, o, 0.0)


class CliCase(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="simdattn_cli_")
        self.dir = self.tmp.name
        self.rng = np.random.default_rng(1234)

    def tearDown(self):
        self.tmp.cleanup()

    def path(self, name):
        return os.path.join(self.dir, name)

    def save(self, name, array):
        p = self.path(name)
        np.save(p, array)
        return p

    def run_cli(self, *args, env=None):
        e = dict(os.environ)
        if env:
            e.update(env)
        return subprocess.run([BIN, *args], capture_output=True, text=True, env=e, timeout=120)

    def inputs(self, B=2, H=4, Hkv=2, Sq=5, Sk=7, D=8, Dv=6, dtype=np.float64):
        q = self.rng.standard_normal((B, H, Sq, D)).astype(dtype)
        k = self.rng.standard_normal((B, Hkv, Sk, D)).astype(dtype)
        v = self.rng.standard_normal((B, Hkv, Sk, Dv)).astype(dtype)
        return q, k, v

    def run_attention(self, q, k, v, *extra):
        args = ["run", "--q", self.save("q.npy", q), "--k", self.save("k.npy", k),
                "--v", self.save("v.npy", v), "--out", self.path("o.npy"), *extra]
        r = self.run_cli(*args)
        self.assertEqual(r.returncode, 0, r.stderr)
        return np.load(self.path("o.npy"))


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


class BadInput(CliCase):
    """Every bad input exits 2 with one line on stderr naming the flag, and leaves no file."""

    def setUp(self):
        super().setUp()
        q, k, v = self.inputs(dtype=np.float32)
        self.q, self.k, self.v = self.save("q.npy", q), self.save("k.npy", k), self.save("v.npy", v)

    def expect_fail(self, args, fragment):
        out = self.path("out.npy")
        r = self.run_cli(*args)
        self.assertEqual(r.returncode, 2, f"{args}: {r.stderr}")
        lines = r.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertIn(fragment, lines[0])
        self.assertFalse(os.path.exists(out), "output written despite the error")
        leftovers = [f for f in os.listdir(self.dir) if ".tmp" in f]
        self.assertEqual(leftovers, [])

    def base(self, **override):
        args = {"--q": self.q, "--k": self.k, "--v": self.v, "--out": self.path("out.npy")}
        args.update(override)
        flat = ["run"]
        for key, val in args.items():
            if val is not None:
                flat += [key, val]
        return flat

    def bad_file(self, name, content):
        p = self.path(name)
        with open(p, "wb") as f:
            f.write(content)
        return p

    def test_command_line(self):
        self.expect_fail(self.base(**{"--q": None}), "--q")
        self.expect_fail(self.base() + ["--bogus", "1"], "--bogus")
        self.expect_fail(self.base() + ["--causal", "diagonal"], "--causal")
        self.expect_fail(self.base() + ["--scale", "abc"], "--scale")
        self.expect_fail(self.base() + ["--scale", "inf"], "--scale")
        self.expect_fail(self.base() + ["--window", "3"], "--window")
        self.expect_fail(self.base() + ["--window", "-2,1"], "--window")
        self.expect_fail(self.base() + ["--window", "1,x"], "--window")
        self.expect_fail(self.base() + ["--threads", "0"], "--threads")
        self.expect_fail(self.base() + ["--threads", "two"], "--threads")
        self.expect_fail(self.base() + ["--backend", "gpu"], "--backend")
        self.expect_fail(["frobnicate"], "frobnicate")
        self.expect_fail([], "no command")
        self.expect_fail(["--bogus"], "unknown option '--bogus'")
        self.expect_fail(["-x", "run"], "unknown option '-x'")

    def test_empty_values_are_errors_not_absent_options(self):
        for flag in ("--mask", "--scale", "--window", "--threads", "--key-lengths", "--global-tokens",
                     "--block-mask", "--causal", "--backend"):
            self.expect_fail(self.base() + [flag, ""], flag + ": expected a value")
        self.expect_fail(self.base(**{"--out": ""}), "--out: expected a value")

    def test_numbers_are_plain_decimals(self):
        for flag, bad in (("--scale", "0x10"), ("--scale", " 1"), ("--scale", "1 "), ("--scale", "1e400"),
                          ("--scale", "nan"), ("--threads", " 2"), ("--threads", "0x2"), ("--threads", "4097"),
                          ("--window", " 1,2"), ("--window", "1, 2"), ("--window", "1 ,2")):
            self.expect_fail(self.base() + [flag, bad], flag)
        # A subnormal scale is a finite number (strtod reports it as an underflow).
        r = self.run_cli(*self.base(), "--scale", "1e-310", "--backend", "reference")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(np.isfinite(np.load(self.path("out.npy"))).all())

    def test_dtypes_named_as_numpy_writes_them(self):
        L = self.save("Lb.npy", np.array([True, False]))
        self.expect_fail(self.base() + ["--key-lengths", L], "expected dtype <i4 or <i8, got |b1")
        self.expect_fail(self.base(**{"--q": self.save("q8.npy", np.zeros((2, 4, 5, 8), np.int64))}),
                         "expected dtype <f2, <f4 or <f8, got <i8")
        self.expect_fail(self.base(**{"--q": self.dir}), "is a directory")

    def test_outputs_too_large_for_memory(self):
        # Zero-element inputs can declare any shape. Shapes attention rejects fail before the
        # output is allocated (D = 0 here, with a 12 GiB output: once allocated and zeroed
        # first); an output that cannot exist exits 2 naming --out, not as an internal error.
        def header_only(name, shape):  # a valid .npy of zero elements with this shape
            text = "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }" % "".join(f"{d}, " for d in shape)
            text += " " * (63 - (10 + len(text)) % 64) + "\n"
            with open(self.path(name), "wb") as f:
                f.write(b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text.encode())
            return self.path(name)
        q = header_only("q0.npy", (1, 2, 1 << 28, 0))
        self.expect_fail(self.base(**{"--q": q}), "--q: shape [1, 2, 268435456, 0] needs head size D >= 1")
        q1 = self.save("q1.npy", np.zeros((1, 1, 1, 8), np.float32))
        k0 = header_only("k0.npy", (1, 1, 0, 8))
        for dv, fragment in ((1 << 50, "more than this machine's memory"), (1 << 61, "overflows")):
            v0 = header_only("v0.npy", (1, 1, 0, dv))
            self.expect_fail(self.base(**{"--q": q1, "--k": k0, "--v": v0}), f"--out: the output [1, 1, 1, {dv}]")
            self.expect_fail(self.base(**{"--q": q1, "--k": k0, "--v": v0}), fragment)

    def test_long_output_name(self):
        # The temporary file is named after the output but fits the 255-byte name limit too.
        out = self.path("o" * 247 + ".npy")
        r = self.run_cli(*self.base(**{"--out": out}), "--backend", "reference")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(np.load(out).shape, (2, 4, 5, 6))
        self.assertEqual([f for f in os.listdir(self.dir) if ".tmp" in f], [])

    def test_unreadable_and_malformed_files(self):
        self.expect_fail(self.base(**{"--q": self.path("missing.npy")}), "--q")
        with open(self.q, "rb") as f:
            good = f.read()
        self.expect_fail(self.base(**{"--k": self.bad_file("t.npy", good[:-5])}), "truncated")
        self.expect_fail(self.base(**{"--k": self.bad_file("e.npy", b"")}), "--k")
        self.expect_fail(self.base(**{"--k": self.bad_file("g.npy", b"garbage" * 20)}), "magic")
        bad_header = good.replace(b"'shape'", b"'shapE'", 1)
        self.expect_fail(self.base(**{"--k": self.bad_file("h.npy", bad_header)}), "header")
        # Raw bytes from the file come out as printable text (expect_fail checks one line;
        # run_cli decodes stderr as UTF-8, which these bytes are not).
        raw_key = good.replace(b"'shape'", b"'sh\x0c\xe8e'", 1)
        self.expect_fail(self.base(**{"--k": self.bad_file("r.npy", raw_key)}), "'sh\\x0c\\xe8e'")
        f = np.asfortranarray(self.rng.standard_normal((2, 2, 7, 8)).astype(np.float32))
        self.expect_fail(self.base(**{"--k": self.save("f.npy", f)}), "Fortran")
        self.expect_fail(self.base(**{"--k": self.save("be.npy", np.zeros((2, 2, 7, 8), ">f4"))}),
                         "big-endian")
        self.expect_fail(self.base(**{"--q": self.save("i.npy", np.zeros((2, 4, 5, 8), np.int32))}),
                         "--q")
        self.expect_fail(self.base(**{"--q": self.save("c.npy", np.zeros((2, 4, 5, 8), np.complex64))}),
                         "unsupported dtype")

    def test_dtype_flag(self):
        self.expect_fail(self.base() + ["--dtype", "f8"], "--dtype: expected f32, f64, bf16 or f16, got 'f8'")
        if "onednn" in backends():
            # oneDNN 2.6 has no f64 matmul, and no f16 one on any CPU; `info` says so
            self.assertEqual(backend_dtypes("onednn") & {"f64", "f16"}, set())
            for dt in ("f64", "f16"):
                self.expect_fail(self.base() + ["--dtype", dt, "--backend", "onednn"], f"has no {dt} matmul")

    def test_shapes_and_dtypes(self):
        self.expect_fail(self.base(**{"--q": self.save("r3.npy", np.zeros((4, 5, 8), np.float32))}),
                         "4-D")
        self.expect_fail(self.base(**{"--k": self.save("k64.npy", np.zeros((2, 2, 7, 8)))}), "--k")
        self.expect_fail(self.base(**{"--k": self.save("kd.npy", np.zeros((2, 2, 7, 9), np.float32))}),
                         "--k")
        self.expect_fail(self.base(**{"--k": self.save("kh.npy", np.zeros((2, 3, 7, 8), np.float32)),
                                      "--v": self.save("vh.npy", np.zeros((2, 3, 7, 6), np.float32))}),
                         "not a multiple")
        self.expect_fail(self.base(**{"--v": self.save("vs.npy", np.zeros((2, 2, 6, 6), np.float32))}),
                         "--v")

    def test_mask_and_key_lengths(self):
        self.expect_fail(self.base() + ["--mask", self.save("m1.npy", np.ones((3, 7), bool))],
                         "--mask")
        self.expect_fail(self.base() + ["--mask", self.save("m2.npy", np.ones((5, 7), np.int32))],
                         "--mask")
        self.expect_fail(self.base() + ["--mask", self.save("m3.npy", np.ones((1, 1, 1, 5, 7), bool))],
                         "--mask")
        self.expect_fail(self.base() + ["--key-lengths", self.save("l1.npy", np.array([1, 2, 3]))],
                         "--key-lengths")
        self.expect_fail(self.base() + ["--key-lengths", self.save("l2.npy", np.array([1.0, 2.0]))],
                         "--key-lengths")
        self.expect_fail(self.base() + ["--key-lengths", self.save("l3.npy", np.array([1, 8]))],
                         "--key-lengths")
        self.expect_fail(self.base() + ["--key-lengths", self.save("l4.npy", np.array([-1, 2]))],
                         "--key-lengths")

    def test_sparse_flags(self):
        bm = self.save("bm.npy", np.ones((1, 1), dtype=bool))  # q/k are 5 and 7 long: bs 8 -> (1, 1)
        self.expect_fail(self.base() + ["--global-tokens", "-1"], "--global-tokens")
        self.expect_fail(self.base() + ["--block-size", "8"], "--block-size: needs --block-mask")
        self.expect_fail(self.base() + ["--block-mask", bm, "--block-size", "0"], "--block-size")
        self.expect_fail(self.base() + ["--block-mask", bm, "--block-size", "2"], "expected shape (3, 4)")
        self.expect_fail(self.base() + ["--block-mask", self.save("f.npy", np.ones((1, 1))), "--block-size", "8"],
                         "|b1 or |u1")

    def test_unwritable_output(self):
        self.expect_fail(self.base(**{"--out": os.path.join(self.dir, "no", "such", "dir.npy")}),
                         "--out")

    def test_existing_output_survives_a_failure(self):
        out = self.path("keep.npy")
        np.save(out, np.arange(3.0))
        r = self.run_cli(*self.base(**{"--out": out}), "--causal", "sideways")
        self.assertEqual(r.returncode, 2)
        np.testing.assert_array_equal(np.load(out), np.arange(3.0))


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


def info_fields():
    r = subprocess.run([BIN, "info"], capture_output=True, text=True, timeout=60)
    return dict(line.split(": ", 1) if ": " in line else (line.rstrip(":"), "") for line in r.stdout.splitlines()[1:])


def backends():
    return info_fields()["backends"].split()


def backend_dtypes(backend):
    """The dtypes `simdattn info` says the backend takes on this machine."""
    return set(info_fields()[f"dtypes {backend}"].split())


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
    BIN = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
