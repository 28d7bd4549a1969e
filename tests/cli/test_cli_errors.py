#!/usr/bin/env python3
"""Bad input to the `simdattn` command: every bad flag, file or value exits 2 with one line on
stderr naming the flag, and leaves no output file (nor a half-written one).

Usage: test_cli_errors.py PATH_TO_SIMDATTN [unittest args]   (ctest passes the built binary)
"""
import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli_case  # noqa: E402  (tests/cli/cli_case.py)
from cli_case import CliCase, backend_dtypes, backends  # noqa: E402


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


if __name__ == "__main__":
    cli_case.BIN = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
