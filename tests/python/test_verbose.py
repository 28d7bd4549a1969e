"""simdattn.set_verbose: one 'simdattn: key=value ...' line per call on the process's stderr
(file descriptor 2, where the library writes it), none when off; SIMDATTN_VERBOSE in a child
process's environment turns it on.

Run:  PYTHONPATH=build/python /usr/bin/python3 -m pytest -q tests/python/test_verbose.py
"""
import os
import subprocess
import sys

import numpy as np

import simdattn


def lines_of(err):
    return [dict(w.split("=", 1) for w in line.split(" ")[1:])
            for line in err.splitlines() if line.startswith("simdattn: ")]


def inputs():
    rng = np.random.default_rng(5)
    return [rng.standard_normal((1, 2, 1, 16)).astype(np.float32),
            rng.standard_normal((1, 2, 40, 16)).astype(np.float32),
            rng.standard_normal((1, 2, 40, 16)).astype(np.float32)]


def test_set_verbose(capfd):
    q, k, v = inputs()
    assert not simdattn.verbose()
    simdattn.set_verbose(True)
    try:
        assert simdattn.verbose()
        for _ in range(3):
            simdattn.attention(q, k, v)
    finally:
        simdattn.set_verbose(False)
    simdattn.attention(q, k, v)  # off again: no line
    lines = lines_of(capfd.readouterr().err)
    assert len(lines) == 3
    for f in lines:
        assert (f["op"], f["backend"], f["path"], f["q"]) == ("attention", "native", "decode", "1x2x1x16")
        assert float(f["time_us"]) > 0


def test_environment():
    code = ("import numpy as np, simdattn; q = np.ones((1, 1, 4, 8), np.float32); "
            "simdattn.attention(q, q, q); print(simdattn.verbose())")
    env = dict(os.environ, SIMDATTN_VERBOSE="1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True"
    (f,) = lines_of(r.stderr)
    assert f["op"] == "attention" and f["q"] == "1x1x4x8"
