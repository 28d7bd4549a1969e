"""The module itself: the GIL released during calls, info, the thread runtime and budget,
standard ALiBi slopes, docstrings.

Run:  PYTHONPATH=build/python /usr/bin/python3 -m pytest -q tests/python
(ctest registers the folder as the test `python`).
"""
import threading
import time

import numpy as np
import pytest

import simdattn
from oracles import expect_error


# ---- the GIL ---------------------------------------------------------------------------------

def test_gil_released_two_threads_overlap():
    """Two threads each call attention(); their calls must run at the same time.

    With the GIL held during a call, the two calls' computations are serialised: a thread's
    [start, end] interval can then only overlap the other's by the other's waiting time, at most
    about half of the longer interval (the containing one spans both calls). Calls that truly run
    concurrently overlap by nearly all of both intervals. The test asserts the intervals
    intersect, and, for at least one of a few repetitions, by more than 75% of the longer one.
    """
    rng = np.random.default_rng(10)
    B, H, S, D = 1, 8, 1024, 64
    arrays = [tuple(rng.standard_normal((B, H, S, D)).astype(np.float32) for _ in range(3)) for _ in range(2)]
    ratios = []
    for _ in range(5):
        barrier = threading.Barrier(2)
        times = [None, None]
        errors = []

        def run(i):
            try:
                q, k, v = arrays[i]
                barrier.wait()
                t0 = time.perf_counter()
                simdattn.attention(q, k, v, backend="native", threads=1)
                times[i] = (t0, time.perf_counter())
            except Exception as e:  # pragma: no cover - reported below
                errors.append(e)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        (s0, e0), (s1, e1) = times
        inter = min(e0, e1) - max(s0, s1)
        ratios.append(inter / max(e0 - s0, e1 - s1))
    assert max(ratios) > 0, f"the calls never overlapped: {ratios}"
    assert max(ratios) > 0.75, f"overlap / longer interval per repetition: {ratios}"


def test_gil_released_python_runs_during_a_call():
    """While a thread is inside attention(), the main thread keeps executing Python."""
    rng = np.random.default_rng(11)
    q, k, v = (rng.standard_normal((1, 8, 2048, 64)).astype(np.float32) for _ in range(3))
    best = 0.0
    for _ in range(3):
        span = {}
        started = threading.Event()

        def run():
            started.set()
            span["start"] = time.perf_counter()
            simdattn.attention(q, k, v, backend="native", threads=1)
            span["end"] = time.perf_counter()

        t = threading.Thread(target=run)
        beats = []
        t.start()
        started.wait()
        while t.is_alive():
            beats.append(time.perf_counter())
        t.join()
        inside = [b for b in beats if span["start"] < b < span["end"]]
        # the largest stretch of the call with no heartbeat: all of it if the GIL were held
        marks = [span["start"]] + inside + [span["end"]]
        gap = max(b - a for a, b in zip(marks, marks[1:]))
        best = max(best, 1.0 - gap / (span["end"] - span["start"]))
    assert best > 0.5, "the main thread could not run Python while attention() computed"


# ---- module information ----------------------------------------------------------------------

def test_info():
    info = simdattn.info()
    assert isinstance(info, dict)
    assert set(info) >= {"version", "isa", "isa_forced", "isas", "isa_notes", "default_threads", "thread_budget",
                         "backends", "onednn_version"}
    assert info["version"] == simdattn.__version__
    assert info["isa"] in info["isas"]
    assert {"native", "reference"} <= set(info["backends"])
    assert isinstance(info["default_threads"], int) and info["default_threads"] >= 1
    assert isinstance(info["thread_budget"], int) and info["thread_budget"] >= 1


def test_set_thread_runtime():
    before = simdattn.thread_runtime()
    assert before in ("team", "openmp") and simdattn.info()["thread_runtime"] == before
    q = np.random.default_rng(3).standard_normal((2, 4, 150, 32)).astype(np.float32)
    outs = {}
    try:
        for runtime in ("openmp", "team"):
            simdattn.set_thread_runtime(runtime)
            assert simdattn.thread_runtime() == runtime and simdattn.info()["thread_runtime"] == runtime
            outs[runtime] = simdattn.attention(q, q, q, causal=True, threads=2)
        for member in (simdattn.ThreadRuntime.openmp, simdattn.ThreadRuntime.team):  # C++'s enum's names
            simdattn.set_thread_runtime(member)
            assert simdattn.thread_runtime() == member and simdattn.thread_runtime() == member.value
        with pytest.raises(simdattn.Error) as e:
            simdattn.set_thread_runtime("tbb")
        assert e.value.argument == "runtime" and simdattn.thread_runtime() == "team"
    finally:
        simdattn.set_thread_runtime(before)
    assert outs["team"].tobytes() == outs["openmp"].tobytes()


def test_set_thread_budget():
    before = simdattn.info()["thread_budget"]
    try:
        simdattn.set_thread_budget(1)
        assert simdattn.info()["thread_budget"] == 1
    finally:
        simdattn.set_thread_budget(0)
    assert simdattn.info()["thread_budget"] == before


def test_standard_alibi_slopes():
    s = simdattn.standard_alibi_slopes(8)
    assert s.dtype == np.float32
    np.testing.assert_allclose(s, 2.0 ** -np.arange(1, 9), rtol=3e-7)
    s = simdattn.standard_alibi_slopes(12)
    want = list(2.0 ** (-8 * np.arange(1, 9) / 8)) + list(2.0 ** (-4 * np.array([1, 3, 5, 7]) / 8))
    np.testing.assert_allclose(s, want, rtol=3e-7)  # float32, within a few ulp
    expect_error("heads", simdattn.standard_alibi_slopes, 0)


def test_docstrings():
    doc = simdattn.attention.__doc__
    for word in ("mask", "causal", "out", "scale", "key_lengths", "backend"):
        assert word in doc
    import io
    import contextlib
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        help(simdattn.attention)
    assert "mask" in buf.getvalue() and "causal" in buf.getvalue()
    for obj in (simdattn.linear_attention, simdattn.MultiHeadAttention, simdattn.MultiHeadAttention.forward,
                simdattn.KvCache, simdattn.Error, simdattn):
        assert obj.__doc__ and len(obj.__doc__) > 20
