#!/usr/bin/env python3
"""What the `simdattn` command says about itself: verbose mode through the environment
(SIMDATTN_VERBOSE: one parseable line per call on the real stderr), `info`'s ISA notes, and the
peak `compare` states its "% peak" against for each dtype.

    python3 test_diagnostics.py path/to/simdattn [unittest args]
"""
import json
import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli_case  # noqa: E402  (CliCase: a temporary directory, .npy files, the CLI run)

KEYS = ("op", "backend", "path", "not", "isa", "dtype", "kv_dtype", "opts", "threads", "runtime", "time_us")


def verbose_lines(stderr):
    """The verbose lines of a run's stderr, each as a dict; fails on a malformed one."""
    out = []
    for line in stderr.splitlines():
        if not line.startswith("simdattn: op="):
            continue
        fields = {}
        for word in line.split(" ")[1:]:
            key, eq, value = word.partition("=")
            if not eq or not key or not value or key in fields:
                raise AssertionError(f"field {word!r} in {line!r}")
            fields[key] = value
        missing = [k for k in KEYS if k not in fields]
        if missing:
            raise AssertionError(f"no {missing} in {line!r}")
        out.append(fields)
    return out


class ThreadRuntime(cli_case.CliCase):
    """SIMDATTN_THREAD_RUNTIME: `info` and the verbose line name the runtime; a bad value is an error."""

    def test_info_and_the_verbose_line_name_it(self):
        q, k, v = self.inputs(B=1, H=2, Hkv=2, Sq=300, Sk=300, D=16, Dv=16, dtype=np.float32)
        qkv = ["--q", self.save("q.npy", q), "--k", self.save("k.npy", k), "--v", self.save("v.npy", v)]
        for env, want in (({}, "team"), ({"SIMDATTN_THREAD_RUNTIME": "team"}, "team"),
                          ({"SIMDATTN_THREAD_RUNTIME": "openmp"}, "openmp")):
            r = self.run_cli("info", env=env)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn(f"thread runtime: {want}\n", r.stdout)
            r = self.run_cli("run", *qkv, "--out", self.path(f"o_{want}.npy"), "--threads", "2",
                             env=dict(env, SIMDATTN_VERBOSE="1"))
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual([f["runtime"] for f in verbose_lines(r.stderr)], [want])
        # both runtimes write the same bytes
        self.assertEqual(np.load(self.path("o_team.npy")).tobytes(), np.load(self.path("o_openmp.npy")).tobytes())

    def test_an_unknown_runtime_is_named(self):
        for cmd in (["info"], ["compare", "--sq", "8"]):
            r = self.run_cli(*cmd, env={"SIMDATTN_THREAD_RUNTIME": "tbb"})
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("SIMDATTN_THREAD_RUNTIME", r.stderr)
            self.assertIn("'tbb'", r.stderr)


class Verbose(cli_case.CliCase):
    def run_args(self, B=1, H=2, Sq=64, Sk=64, D=16):
        q, k, v = self.inputs(B=B, H=H, Hkv=H, Sq=Sq, Sk=Sk, D=D, Dv=D, dtype=np.float32)
        return ["run", "--q", self.save("q.npy", q), "--k", self.save("k.npy", k), "--v", self.save("v.npy", v),
                "--out", self.path("o.npy")]

    def test_environment_turns_it_on(self):
        isa = cli_case.info_fields()["isa"].split()[0]
        r = self.run_cli(*self.run_args(), "--causal", "top-left", "--threads", "1", env={"SIMDATTN_VERBOSE": "1"})
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = verbose_lines(r.stderr)
        self.assertEqual(len(lines), 1, r.stderr)
        f = lines[0]
        self.assertEqual((f["op"], f["backend"], f["path"], f["isa"]), ("attention", "native", "fused", isa))
        self.assertEqual((f["dtype"], f["kv_dtype"], f["q"], f["v"]), ("f32", "f32", "1x2x64x16", "1x2x64x16"))
        self.assertEqual(f["threads"], "1")
        self.assertEqual(f["runtime"], "team")
        self.assertIn("causal:top-left", f["opts"].split(","))
        self.assertGreater(float(f["time_us"]), 0.0)
        # every faster path declined, each name:reason
        declined = [item.split(":", 1)[0] for item in f["not"].split(",")]
        self.assertEqual(declined, ["decode16", "decode.widened", "decode", "decode8", "fused.tiles", "short_keys"])

    def test_a_decode_step_names_its_path(self):
        r = self.run_cli(*self.run_args(Sq=1, Sk=300), "--backend", "native", env={"SIMDATTN_VERBOSE": "1"})
        self.assertEqual(r.returncode, 0, r.stderr)
        (f,) = verbose_lines(r.stderr)
        self.assertEqual(f["path"], "decode")
        self.assertTrue(f["not"].startswith("decode16:"), f["not"])

    def test_off_prints_nothing(self):
        for env in ({}, {"SIMDATTN_VERBOSE": "0"}, {"SIMDATTN_VERBOSE": ""}):
            r = self.run_cli(*self.run_args(), env=env)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stderr, "", env)

    def test_one_line_per_call(self):
        """compare runs each backend many times: one line per call, each backend's own."""
        r = self.run_cli("compare", "--sq", "16", "--h", "2", "--d", "8", "--threads", "1", "--json",
                         env={"SIMDATTN_VERBOSE": "1"})
        self.assertEqual(r.returncode, 0, r.stderr)
        entries = json.loads(r.stdout)
        lines = verbose_lines(r.stderr)
        for e in entries:
            mine = [f for f in lines if f["backend"] == e["backend"] and f["q"] == "1x2x16x8"]
            self.assertEqual(len(mine), e["runs"] + 1, e["backend"])  # the timed calls and the warm-up


class Info(cli_case.CliCase):
    def test_forced_isa_is_noted(self):
        fields = cli_case.info_fields()
        best = fields["isa available"].split()[0]
        r = self.run_cli("info", env={"SIMDATTN_ISA": "sse2"})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"isa note: {best}: usable here but not used: SIMDATTN_ISA=sse2 forces a lower level", r.stdout)
        r = self.run_cli("info")
        self.assertNotIn("SIMDATTN_ISA", r.stdout)


class ComparePeak(cli_case.CliCase):
    def test_each_dtype_against_its_peak(self):
        amx = cli_case.info_fields()["isa"].split()[0] == "amx"
        # bf16 off AMX: the peak of vdpbf16ps where the native bf16 products run on it (the
        # fused.tiles path, which the verbose lines name), else the f32 FMAs'
        r = self.run_cli("compare", "--sq", "32", "--h", "2", "--d", "16", "--threads", "1", "--dtype", "bf16",
                         env={"SIMDATTN_VERBOSE": "1"})
        self.assertEqual(r.returncode, 0, r.stderr)
        pairs = not amx and "backend=native path=fused.tiles " in r.stderr
        bf16 = "amx-bf16" if amx else "vdpbf16ps-bf16" if pairs else "fma-f32"
        want = {"f32": "fma-f32", "f64": "fma-f64", "f16": "fma-f32", "bf16": bf16}
        for dtype, peak in want.items():
            entries = json.loads(self.run_cli("compare", "--sq", "32", "--h", "2", "--d", "16", "--threads", "1",
                                              "--json", "--dtype", dtype).stdout)
            for e in entries:
                self.assertEqual(e["peak"], peak, dtype)
                self.assertAlmostEqual(e["percent_of_peak"], 100 * e["gflops"] / e["peak_gflops"], delta=1e-6)
            r = self.run_cli("compare", "--sq", "32", "--h", "2", "--d", "16", "--threads", "1", "--dtype", dtype)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn(f"% peak is of the {peak} peak (", r.stdout)


if __name__ == "__main__":
    cli_case.BIN = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
