#!/usr/bin/env python3
"""`mpirun -np N simdattn run ... --context-parallel zigzag|contiguous` (label mpi): rank 0 writes
the output and lse of the ordinary run, within f32 rounding, for 1 to 4 ranks, both orders, keys
only (cross-attention, key lengths) and the causal ring (queries sharded too); a bad value is one
line and exit 2 on every rank, and no file.

    python3 test_context_parallel.py path/to/simdattn [unittest args]
"""
import os
import subprocess
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli_case  # noqa: E402  (CliCase)

MPIRUN = ["mpirun", "--oversubscribe", "--allow-run-as-root"]


class ContextParallel(cli_case.CliCase):
    def mpirun(self, ranks, *args):
        env = dict(os.environ, OMP_NUM_THREADS="1")
        return subprocess.run(MPIRUN + ["-np", str(ranks), cli_case.BIN, *args], capture_output=True, text=True,
                              env=env, timeout=300)

    def compare(self, q, k, v, *extra):
        files = ["--q", self.save("q.npy", q), "--k", self.save("k.npy", k), "--v", self.save("v.npy", v)]
        r = self.run_cli("run", *files, "--out", self.path("o1.npy"), "--lse-out", self.path("l1.npy"), *extra)
        self.assertEqual(r.returncode, 0, r.stderr)
        o1, l1 = np.load(self.path("o1.npy")), np.load(self.path("l1.npy"))
        # every rank count 1-4 once, the orders alternating (each mpirun costs a start-up)
        for ranks, order in ((1, "zigzag"), (2, "contiguous"), (3, "zigzag"), (4, "contiguous"), (2, "zigzag")):
            with self.subTest(ranks=ranks, order=order, extra=extra):
                for f in ("o2.npy", "l2.npy"):
                    if os.path.exists(self.path(f)):
                        os.remove(self.path(f))
                r = self.mpirun(ranks, "run", *files, "--out", self.path("o2.npy"), "--lse-out",
                                self.path("l2.npy"), "--context-parallel", order, *extra)
                self.assertEqual(r.returncode, 0, r.stderr)
                o2, l2 = np.load(self.path("o2.npy")), np.load(self.path("l2.npy"))
                self.assertEqual(o2.shape, o1.shape)
                self.assertLessEqual(np.abs(o2 - o1).max(), 1e-5 * max(1.0, np.abs(v).max()))
                self.assertLessEqual(np.abs(l2 - l1).max(), 1e-5 * max(1.0, np.abs(l1).max()))

    def test_keys_sharded(self):
        q, k, v = self.inputs(B=2, H=4, Hkv=2, Sq=5, Sk=23, D=8, Dv=6, dtype=np.float32)
        self.compare(q, k, v)
        self.compare(q, k, v, "--causal", "bottom-right", "--alibi", "--window", "6,0")
        lengths = self.save("len.npy", np.array([17, 3], dtype=np.int64))
        self.compare(q, k, v, "--key-lengths", lengths, "--softcap", "4")

    def test_causal_ring(self):
        q, k, v = self.inputs(B=1, H=4, Hkv=1, Sq=29, Sk=29, D=8, Dv=8, dtype=np.float32)
        self.compare(q, k, v, "--causal", "top-left")
        self.compare(q, k, v, "--causal", "bottom-right", "--sinks", self.save("s.npy", np.float32([0, 1, -1, 2])))

    def test_bad_values_are_one_line_on_every_rank(self):
        q, k, v = self.inputs(B=1, H=2, Hkv=2, Sq=3, Sk=9, D=4, Dv=4, dtype=np.float32)
        files = ["--q", self.save("q.npy", q), "--k", self.save("k.npy", k), "--v", self.save("v.npy", v),
                 "--out", self.path("o.npy")]
        r = self.mpirun(2, "run", *files, "--context-parallel", "diagonal")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertEqual(r.stderr.count("--context-parallel: expected zigzag or contiguous"), 2, r.stderr)
        # an option no sharded call takes: the same error from both ranks, no file
        r = self.mpirun(2, "run", *files, "--context-parallel", "zigzag", "--global-tokens", "1")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertEqual(r.stderr.count("--global-tokens: sharded_attention does not take it"), 2, r.stderr)
        self.assertFalse(os.path.exists(self.path("o.npy")))


if __name__ == "__main__":
    cli_case.BIN = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
