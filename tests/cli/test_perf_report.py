#!/usr/bin/env python3
"""scripts/perf_report.py on a JSON run of the perf suite built in this checkout.

Usage: test_perf_report.py PATH_TO_SIMDATTN_PERF PATH_TO_PERF_REPORT_PY
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

PERF = REPORT = None
# A few fast benchmarks: the machine limits and two attention workloads on every backend.
FILTER = r"^(peak/fma/t1|bandwidth/read/t1|attention/[a-z]+/(bert|decode)/t1)$"


class PerfReport(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="simdattn_perf_report_")
        cls.run_json = os.path.join(cls.tmp.name, "run.json")
        with open(cls.run_json, "w") as f:
            subprocess.run([PERF, f"--benchmark_filter={FILTER}", "--benchmark_min_time=0.01",
                            "--benchmark_repetitions=2", "--benchmark_format=json"],
                           stdout=f, stderr=subprocess.DEVNULL, check=True, timeout=300)
        with open(cls.run_json) as f:
            cls.names = {b["run_name"] for b in json.load(f)["benchmarks"]}

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def report(self, *args):
        return subprocess.run([sys.executable, REPORT, *args], capture_output=True, text=True, timeout=120)

    def test_table(self):
        r = self.report("table", self.run_json)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("peak/fma/t1", r.stdout)
        blocks = r.stdout.split("\n\n")[1:]
        self.assertEqual(len(blocks), 2)  # bert and decode
        for block in blocks:
            lines = block.strip().splitlines()
            backends = {line.split()[0] for line in lines[2:]}
            self.assertEqual(backends, {n.split("/")[1] for n in self.names if n.startswith("attention/")})
            for line in lines[2:]:
                self.assertRegex(line, r"%\s+\d+\.\d\dx$")  # % of limit, ratio to the best other
        self.assertIn("GB/s", blocks[1])  # decode is measured against bandwidth

    def test_diff(self):
        r = self.report("diff", self.run_json, self.run_json)
        self.assertEqual(r.returncode, 0, r.stderr)
        rows = [line for line in r.stdout.splitlines() if line.startswith(("attention/", "peak/", "bandwidth/"))]
        self.assertEqual(len(rows), len(self.names))
        for row in rows:
            self.assertIn("1.000x  (noise)", row)  # a run against itself
        self.assertIn("noise:", r.stdout)

    def test_plot(self):
        png = os.path.join(self.tmp.name, "chart.png")
        r = self.report("plot", self.run_json, "--threads", "1", "--out", png)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(png, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")

    def test_bad_input(self):
        bad = os.path.join(self.tmp.name, "bad.json")
        with open(bad, "w") as f:
            f.write("{not json")
        r = self.report("table", bad)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("bad.json", r.stderr)
        r = self.report("plot", self.run_json, "--threads", "7", "--out", os.path.join(self.tmp.name, "x.png"))
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("t7", r.stderr)


if __name__ == "__main__":
    PERF = os.path.abspath(sys.argv.pop(1))
    REPORT = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
