"""Shared by the CLI's end-to-end tests (test_*.py beside it): the `simdattn` binary under test,
an independent NumPy float64 oracle, and CliCase (a temporary directory, .npy files, the CLI run).

The oracle below is written from docs/design.md's maths and position rule, not from the C++ code:
scores = scale * Q K^T + additive mask, hidden keys get -inf, stable softmax, rows with no
visible key are zero.
"""
import os
import subprocess
import tempfile
import unittest

import numpy as np

BIN = None  # the binary under test: each test file sets it from its first argument


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


def info_fields():
    r = subprocess.run([BIN, "info"], capture_output=True, text=True, timeout=60)
    return dict(line.split(": ", 1) if ": " in line else (line.rstrip(":"), "") for line in r.stdout.splitlines()[1:])


def backends():
    return info_fields()["backends"].split()


def backend_dtypes(backend):
    """The dtypes `simdattn info` says the backend takes on this machine."""
    return set(info_fields()[f"dtypes {backend}"].split())
