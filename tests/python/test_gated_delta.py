"""simdattn.gated_delta_rule against a float64 NumPy oracle written from the recurrence (the Gated
DeltaNet paper's, as flash-linear-attention's fused_recurrent_gated_delta_rule states it): the
recurrence (T = 1 steps, a carried state) and the chunked form (T past a chunk of 32) agree with it
within f32 rounding; GQA-style value heads; the L2 norm; bad arguments named.

Run:  PYTHONPATH=build/python /usr/bin/python3 -m pytest -q tests/python/test_gated_delta.py
"""
import numpy as np
import pytest

import simdattn


def oracle(q, k, v, g, beta, scale=None, initial_state=None, use_qk_l2norm=False):
    q, k, v, g, beta = (np.asarray(a, np.float64) for a in (q, k, v, g, beta))
    B, T, H, Dk = q.shape
    Hv, Dv = v.shape[2], v.shape[3]
    scale = Dk ** -0.5 if scale is None else scale
    out = np.zeros((B, T, Hv, Dv))
    S = np.zeros((B, Hv, Dk, Dv)) if initial_state is None else np.array(initial_state, np.float64)
    for b in range(B):
        for h in range(Hv):
            hq = h // (Hv // H)
            for t in range(T):
                qt, kt = q[b, t, hq].copy(), k[b, t, hq].copy()
                if use_qk_l2norm:
                    qt /= np.sqrt((qt * qt).sum() + 1e-6)
                    kt /= np.sqrt((kt * kt).sum() + 1e-6)
                qt *= scale
                S[b, h] *= np.exp(g[b, t, h])
                u = beta[b, t, h] * (v[b, t, h] - S[b, h].T @ kt)
                S[b, h] += np.outer(kt, u)
                out[b, t, h] = S[b, h].T @ qt
    return out, S


def inputs(rng, B, T, H, Hv, Dk, Dv):
    q = rng.standard_normal((B, T, H, Dk)).astype(np.float32)
    k = rng.standard_normal((B, T, H, Dk)).astype(np.float32)
    v = rng.standard_normal((B, T, Hv, Dv)).astype(np.float32)
    g = -rng.uniform(0.0, 0.3, (B, T, Hv)).astype(np.float32)
    beta = rng.uniform(0.0, 1.0, (B, T, Hv)).astype(np.float32)
    return q, k, v, g, beta


@pytest.mark.parametrize("T", [1, 5, 64, 65, 150])
@pytest.mark.parametrize("l2", [False, True])
def test_matches_the_recurrence(T, l2):
    rng = np.random.default_rng(T + 100 * l2)
    q, k, v, g, beta = inputs(rng, 2, T, 2, 4, 16, 12)
    if not l2:  # keys small enough that the unnormalized delta rule stays stable
        k *= 0.2
    s0 = rng.standard_normal((2, 4, 16, 12)).astype(np.float32) * 0.1
    out, fin = simdattn.gated_delta_rule(q, k, v, g, beta, initial_state=s0, output_final_state=True,
                                         use_qk_l2norm=l2, scale=0.3)
    want, want_s = oracle(q, k, v, g, beta, 0.3, s0, l2)
    assert out.shape == (2, T, 4, 12) and fin.shape == (2, 4, 16, 12) and fin.dtype == np.float32
    assert np.abs(out - want).max() <= 1e-4 * max(1.0, np.abs(want).max())
    assert np.abs(fin - want_s).max() <= 1e-4 * max(1.0, np.abs(want_s).max())


@pytest.mark.parametrize("strong", [200.0, 1e6, 3e38])
def test_strong_decays_then_weak_ones_match_the_recurrence(strong):
    # A chunk's decays summed in f32 would leave the weak ones after a strong one a few bits (4e-4
    # off at 200), and overflow to -inf at 3e38 (NaN from their differences).
    rng = np.random.default_rng(int(strong) % 1000)
    q, k, v, g, beta = inputs(rng, 1, 70, 1, 2, 16, 8)
    g[:, :10] = -strong
    g[:, 10:] = -0.05
    g[:, 40] = -strong
    out, fin = simdattn.gated_delta_rule(q, k, v, g, beta, output_final_state=True, use_qk_l2norm=True)
    want, want_s = oracle(q, k, v, g, beta, None, None, True)
    assert np.abs(out - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
    assert np.abs(fin - want_s).max() <= 1e-5 * max(1.0, np.abs(want_s).max())


def test_value_heads_grouped_or_split_over_the_threads_bitwise():
    # one key head of six value heads: items of 3 heads at 1 thread, of one head at 2 and 3
    rng = np.random.default_rng(8)
    q, k, v, g, beta = inputs(rng, 1, 100, 1, 6, 8, 5)
    s0 = rng.standard_normal((1, 6, 8, 5)).astype(np.float32)
    want, want_s = oracle(q, k, v, g, beta, initial_state=s0, use_qk_l2norm=True)
    full, fin = simdattn.gated_delta_rule(q, k, v, g, beta, initial_state=s0, use_qk_l2norm=True,
                                          output_final_state=True, threads=1)
    assert np.abs(full - want).max() < 1e-4 * np.abs(want).max()
    for t in (2, 3, 4):
        o, s = simdattn.gated_delta_rule(q, k, v, g, beta, initial_state=s0, use_qk_l2norm=True,
                                         output_final_state=True, threads=t)
        assert np.array_equal(o, full) and np.array_equal(s, fin)


def test_decode_steps_carry_the_state_and_threads_agree_bitwise():
    rng = np.random.default_rng(3)
    q, k, v, g, beta = inputs(rng, 1, 70, 2, 2, 8, 8)
    full, fin = simdattn.gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True, output_final_state=True, threads=1)
    for t in (2, 3):
        assert np.array_equal(simdattn.gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True, threads=t), full)
    # a 40-token prefill, then 30 decode steps from its state
    out, s = simdattn.gated_delta_rule(q[:, :40], k[:, :40], v[:, :40], g[:, :40], beta[:, :40], use_qk_l2norm=True,
                                       output_final_state=True)
    steps = [out]
    for t in range(40, 70):
        o, s = simdattn.gated_delta_rule(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], g[:, t:t + 1], beta[:, t:t + 1],
                                         initial_state=s, output_final_state=True, use_qk_l2norm=True)
        steps.append(o)
    assert np.abs(np.concatenate(steps, axis=1) - full).max() <= 1e-4 * max(1.0, np.abs(full).max())
    assert np.abs(s - fin).max() <= 1e-4 * max(1.0, np.abs(fin).max())


def test_bad_arguments_are_named():
    rng = np.random.default_rng(4)
    q, k, v, g, beta = inputs(rng, 1, 4, 2, 2, 8, 8)
    bad_g = g.copy()
    bad_g[0, 1, 0] = 0.5
    nan_v = v.copy()
    nan_v[0, 2, 1, 3] = np.nan
    cases = [
        (dict(g=bad_g), "g"),
        (dict(v=nan_v), "v"),
        (dict(v=v[:, :, :1]), "v"),            # Hv 1 is not a multiple of H 2
        (dict(k=k[:, :3]), "k"),
        (dict(beta=beta[:, :, :1]), "beta"),
        (dict(q=q.astype(np.float64)), "q"),
    ]
    for change, name in cases:
        args = dict(q=q, k=k, v=v, g=g, beta=beta)
        args.update(change)
        with pytest.raises(simdattn.Error) as e:
            simdattn.gated_delta_rule(args["q"], args["k"], args["v"], args["g"], args["beta"])
        assert e.value.argument == name, (name, str(e.value))
    with pytest.raises(simdattn.Error) as e:
        simdattn.gated_delta_rule(q, k, v, g, beta, initial_state=np.zeros((1, 2, 8, 7), np.float32))
    assert e.value.argument == "initial_state"
    with pytest.raises(simdattn.Error) as e:
        simdattn.gated_delta_rule(q, k, v, g, beta, scale=float("nan"))
    assert e.value.argument == "scale"
    with pytest.raises(simdattn.Error) as e:
        simdattn.gated_delta_rule(q, k, v, g, beta, threads=-1)
    assert e.value.argument == "threads"
    for scale in (-0.5, 0.0):  # any finite scale, as flash-linear-attention takes it
        got = simdattn.gated_delta_rule(q, k, v, g, beta, scale=scale)
        want = oracle(q, k, v, g, beta, scale)[0]
        assert np.abs(got - want).max() <= 1e-4 * max(1.0, np.abs(want).max())
    out = np.full((1, 4, 2, 8), 7.0, np.float32)
    with pytest.raises(simdattn.Error):
        simdattn.gated_delta_rule(q, k, v, bad_g, beta, out=out)
    assert (out == 7.0).all()  # nothing written


def test_bf16_inputs_within_1e_2():
    """torch bf16 q, k, v (computed in f32, the output rounded to bf16) against the float64
    recurrence of the same bf16 values."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    q, k, v, g, beta = inputs(rng, 1, 80, 2, 2, 16, 8)
    tq, tk, tv = (torch.from_numpy(a).to(torch.bfloat16) for a in (q, k, v))
    out = simdattn.gated_delta_rule(tq, tk, tv, torch.from_numpy(g), torch.from_numpy(beta), use_qk_l2norm=True)
    assert out.dtype == torch.bfloat16
    want, _ = oracle(tq.float().numpy(), tk.float().numpy(), tv.float().numpy(), g, beta, use_qk_l2norm=True)
    assert np.abs(out.float().numpy() - want).max() <= 1e-2 * max(1.0, np.abs(want).max())
