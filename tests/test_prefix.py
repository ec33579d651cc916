"""Issue 30, part 3: a grid over L or the burn-in draws its chain once.

- the sampler's stream is prefix-stable: a chain drawn for more steps holds every shorter
  configuration's sample, bit for bit (tokens, kernels, conditionals, dtypes);
- the samples are those of the sampler before the chain was split out (digests of the tokens
  recorded at commit c580ee7);
- a phase grid over ``data.L`` × ``data.burn_in`` draws one chain (compiled at most once) and its
  every theory column equals ``theory_report``'s for the point's configuration, with ``==``.
"""

from __future__ import annotations

import hashlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gflow
import gflow.runs._samples
from gflow.core import DataConfig, chain_steps, draw_chain, sample, sample_from_chain
from gflow.runs._phase import run_phase
from gflow.runs._samples import SampleBank

FIELDS = ("X", "y", "zq", "cond", "pi")


def _same(a, b) -> bool:
    return all(np.asarray(getattr(a, f)).dtype == np.asarray(getattr(b, f)).dtype
               and np.array_equal(np.asarray(getattr(a, f)), np.asarray(getattr(b, f))) for f in FIELDS)  # fmt: skip


# sha256 (first 16 hex digits) of the int32 bytes of X, y, zq: N = 500, key 11, recorded with the
# sampler of commit c580ee7 (one jitted program, before the chain was split out)
PINNED = [
    ({}, "040b16452e3d0e3a"),
    pytest.param({"L": 20, "burn_in": 3, "start": "uniform"}, "1cc40935a3a25ae3", marks=pytest.mark.slow),
    pytest.param({"parents": (1, 3), "alpha": 0.5, "L": 25}, "0566c70865c48560", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("kw, digest", PINNED, ids=["default", "uniform-burn", "parents13"])
def test_samples_are_the_samples_before(kw, digest):
    s = sample(DataConfig(**kw), 500, key=jax.random.key(11), dtype=jnp.float64)
    raw = b"".join(np.ascontiguousarray(np.asarray(getattr(s, f), np.int32)).tobytes() for f in ("X", "y", "zq"))
    assert hashlib.sha256(raw).hexdigest()[:16] == digest


@pytest.mark.parametrize("start", ["stationary", pytest.param("uniform", marks=pytest.mark.slow)])
def test_a_longer_chain_holds_every_shorter_sample(start):
    """One chain drawn for more steps than the longest of two (L, burn_in) gives each one's own sample
    bit for bit, and so does ``sample(…, steps=…)`` with more steps than needed."""
    key = jax.random.key(7)
    cfgs = [DataConfig(L=20, burn_in=0, start=start), DataConfig(L=37, burn_in=2, start=start)]
    T = max(chain_steps(c) for c in cfgs) + 13
    chain = draw_chain(cfgs[0], 300, key=key, steps=T)
    assert chain.tokens.shape == (300, cfgs[0].m + T)
    for c in cfgs:
        ref = sample(c, 300, key=key)
        assert _same(ref, sample_from_chain(chain, c)), c
    c = cfgs[-1]
    assert _same(sample(c, 300, key=key), sample(c, 300, key=key, steps=T))
    with pytest.raises(ValueError, match=r"steps must be at least burn_in \+ L \+ 1 - p_k = 38, got 37"):
        sample(c, 300, key=key, steps=37)


@pytest.mark.slow
@pytest.mark.parametrize("parents, alpha, kernel", [((1,), 0.1, None), ((2, 5), 0.3, None),
                                                    ((1,), 0.1, [[0.9, 0.1, 0.0], [0.2, 0.3, 0.5], [0.3, 0.3, 0.4]])])
def test_prefix_other_data(parents, alpha, kernel):
    key = jax.random.key(3)
    cfgs = [DataConfig(parents=parents, alpha=alpha, kernel=kernel, L=L, burn_in=b) for L in (6, 41) for b in (0, 2)]
    chain = draw_chain(cfgs[0], 200, key=key, steps=max(chain_steps(c) for c in cfgs) + 5)
    for c in cfgs:
        assert _same(sample(c, 200, key=key), sample_from_chain(chain, c)), c


TINY = gflow.Config().replace(data={"L": 20}, estimator={"N": 200})


@pytest.mark.slow
def test_bank_gives_make_losss_sample():
    cfgs = [TINY.replace(data={"L": L}) for L in (20, 27)]
    bank = SampleBank(cfgs)
    assert bank.steps_for(cfgs[0]) == bank.steps_for(cfgs[1]) == chain_steps(cfgs[1].data)
    for c in cfgs:
        loss_bank, loss = bank.loss(c), gflow.make_loss(c.data, c.model, c.estimator)
        assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(loss_bank.feats), jax.tree.leaves(loss.feats)))
    assert len(bank.chains) == 1


@pytest.mark.parametrize("grid", [["data.L=20,31"], pytest.param(["data.L=20,31", "data.burn_in=0,2"],
                                                                  marks=pytest.mark.slow)], ids=["L", "L-burn_in"])
def test_a_grid_over_L_draws_one_chain_and_reproduces_gflow_theory(tmp_path, monkeypatch, grid):
    draws, compiles = [], []
    real = gflow.runs._samples.draw_chain
    monkeypatch.setattr(gflow.runs._samples, "draw_chain", lambda *a, **k: draws.append(k["steps"]) or real(*a, **k))

    def listen(event, duration, **kw):
        if event == "/jax/core/compile/backend_compile_duration" and "_chain" in kw.get("fun_name", ""):
            compiles.append(kw["fun_name"])

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        res = run_phase(TINY, grid, tmp_path / "ph", n_pi=200, plot=False)
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    longest = max(chain_steps(c.data) for _, c in gflow.runs.sweep_points(TINY, grid))
    assert draws == [longest] and len(compiles) <= 1  # one chain, for the longest point
    for row, (_, cfg) in zip(res.rows, gflow.runs.sweep_points(TINY, grid)):
        sc = cfg.schedule
        th = gflow.theory_report(cfg.data, cfg.model, cfg.estimator, cfg.init, n_pi=200, eta_C=sc.eta_C, delta=sc.delta)
        sel = th.laws[th.argmax_J]
        assert row["stage1_duration"] == th.duration.t
        assert (row["C_star"], row["window_lo"], row["window_hi"], row["a_star"], row["limit_loss"]) == (
            sel.C_star, sel.window[0], sel.window[1], sel.a_star, sel.limit_loss)  # fmt: skip
        iJ = th.sets.index(th.argmax_J)
        jJ = int(np.argsort(-th.rates.J, kind="stable")[1])
        assert row["J_gap"] == th.rates.J[iJ] - th.rates.J[jJ] and row["J_gap_se"] == th.rates.diff_se[iJ, jJ]
