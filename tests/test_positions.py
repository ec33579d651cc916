"""Loss at every position (``estimator.positions = "all"``): the targets against the sampler's own
conditional laws, the Edelman member's loss against their minimal model run on every prefix, its
gradient against central differences, the unseen mass against a per-prefix loop, and the
refusals (member, layout, data kind) before any compute."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gflow.config import from_dict
from gflow.core import DataConfig, ModelConfig, init_params, loss_targets, make_loss, sample
from gflow.core._loss import EstimatorConfig
from tests.test_kinds import _edelman_reference

jax.config.update("jax_enable_x64", True)

EDELMAN = ModelConfig(member="edelman", H=1, D=1, M=1)


def _est(**kw):
    return EstimatorConfig(**{"N": 30, "seed": 2, "loss": "ce_on_probs", "eps": 0.0, "positions": "all", **kw})


@pytest.mark.parametrize("parents", [[1], [1, 2], [2]])
def test_every_position_targets_are_the_next_tokens_laws(parents):
    """Row t of the expected target is ``π(·|z_{t+1})``: the drawn next token minus it has mean 0
    at every position (within 4.5 SE at N = 20,000), the last row is the sample's ``π(·|z_q)``, the
    positions whose next token lacks a parent in the context carry no weight, the rows sum to 1."""
    data = DataConfig(d=3, parents=parents, alpha=1.0, L=8)
    smp = sample(data, 20_000, key=jax.random.key(5))
    T = np.asarray(loss_targets(smp, data, _est()))  # (N, L, d), weighted
    valid = np.arange(1, 9) >= max(parents)
    w = 1.0 / valid.sum()
    assert np.all(T[:, ~valid] == 0) and np.allclose(T.sum((1, 2)), 1.0, rtol=1e-13)
    np.testing.assert_allclose(T[:, -1] / w, np.asarray(smp.cond), rtol=1e-13)
    nxt = np.concatenate([np.asarray(smp.X)[:, 1:], np.asarray(smp.y)[:, None]], axis=1)
    resid = np.eye(3)[nxt][:, valid] - T[:, valid] / w  # (N, #valid, d)
    z = resid.mean(0) / (resid.std(0, ddof=1) / np.sqrt(len(resid)))
    assert np.max(np.abs(z)) < 4.5
    drawn = np.asarray(loss_targets(smp, data, _est(target="drawn")))
    np.testing.assert_array_equal(drawn[:, valid] / w, np.eye(3)[nxt][:, valid])


def test_edelman_every_position_is_their_model_on_every_prefix():
    """The per-sequence loss is the mean over t of their minimal model's last-token loss on the
    prefix ``x_1..x_t`` (offset weights ``v_0..v_{t−1}``) against ``π(·|x_t)``."""
    L = 10
    data = DataConfig(d=3, parents=[1], alpha=1.0, L=L)
    loss = make_loss(data, EDELMAN, _est())
    rng = np.random.default_rng(1)
    v, W = rng.normal(size=L), rng.normal(size=(3, 3))
    p = init_params(EDELMAN, d=3, L=L).with_blocks({"v": jnp.asarray(v), "W": jnp.asarray(W)})
    smp = sample(data, 30, key=jax.random.key(2))
    X, y, pi = np.asarray(smp.X), np.asarray(smp.y), np.asarray(smp.pi)
    full = np.concatenate([X, y[:, None]], axis=1)
    want = [np.mean([_edelman_reference(v[: t + 1], W, X[n, : t + 1], pi[n, full[n, t]]) for t in range(L)])
            for n in range(30)]  # fmt: skip
    np.testing.assert_allclose(np.asarray(loss.per_sequence(p)), want, rtol=1e-12)
    # at the last position only, the last term
    last = make_loss(data, EDELMAN, _est(positions="last"))
    want_last = [_edelman_reference(v, W, X[n], pi[n, full[n, L - 1]]) for n in range(30)]
    np.testing.assert_allclose(np.asarray(last.per_sequence(p)), want_last, rtol=1e-12)


def test_edelman_every_position_gradient_is_central_differences():
    data = DataConfig(d=3, parents=[1], alpha=1.0, L=9)
    loss = make_loss(data, EDELMAN, _est(N=40))
    rng = np.random.default_rng(3)
    p = init_params(EDELMAN, d=3, L=9).with_blocks({"v": jnp.asarray(rng.normal(size=9)),
                                                     "W": jnp.asarray(rng.normal(size=(3, 3)))})  # fmt: skip
    g = loss.grad(p)
    h = 1e-6
    for block, idx in (("v", (0,)), ("v", (4,)), ("W", (1, 2)), ("W", (0, 0))):
        x = np.asarray(p.get(block)).copy()
        xp, xm = x.copy(), x.copy()
        xp[idx] += h
        xm[idx] -= h
        fd = (float(loss(p.with_blocks({block: jnp.asarray(xp)}))) - float(loss(p.with_blocks({block: jnp.asarray(xm)})))) / (2 * h)
        assert abs(float(np.asarray(g.get(block))[idx]) - fd) <= 1e-7 * max(1.0, abs(fd))


def test_unseen_mass_at_every_position_is_the_prefix_loop():
    data = DataConfig(d=3, parents=[1], alpha=0.3, L=6)
    loss = make_loss(data, EDELMAN, _est(N=50))
    smp = sample(data, 50, key=jax.random.key(2))
    T = np.asarray(loss_targets(smp, data, _est()))
    X = np.asarray(smp.X)
    want = np.mean([sum(T[n, t, e] for t in range(6) for e in range(3) if e not in X[n, : t + 1]) for n in range(50)])
    assert abs(float(loss.unseen()) - want) <= 1e-14


def test_every_position_refusals_name_the_key():
    with pytest.raises(ValueError, match=r"estimator\.positions must be one of \('last', 'all', 'outputs'\)"):
        EstimatorConfig(positions="every")
    with pytest.raises(ValueError, match=r"estimator\.positions = 'all' needs a member .*\('bietti', 'edelman'\)"):
        from_dict({"estimator": {"positions": "all"}})
    with pytest.raises(ValueError, match=r"estimator\.layout = 'positions'"):
        make_loss(DataConfig(d=3, parents=[1], L=8), EDELMAN, _est(layout="counts"))
    with pytest.raises(ValueError, match=r"not defined for data\.kind = 'graph'"):
        from_dict({"data": {"kind": "graph", "parents": [1], "L": 8},
                   "model": {"member": "edelman", "H": 1, "D": 1, "M": 1},
                   "estimator": {"positions": "all", "loss": "ce_on_probs"}})  # fmt: skip


# -- Edelman et al.'s strategies, the model's predictions, the ladder at every position -------------


def _loop_strategies(x, d):
    """Their ``ngram(inp, d, n)`` at the last token of the prefix x (n = 1, 2) and uniform, by loops."""
    uni = np.ones(d)
    for e in x:
        uni[e] += 1
    big = np.ones(d)
    for s in range(len(x) - 1):
        if x[s] == x[-1]:
            big[x[s + 1]] += 1
    return np.full(d, 1 / d), uni / uni.sum(), big / big.sum()


def test_strategies_are_their_add_one_ngrams_at_every_prefix():
    from gflow.theory import strategy_predictions

    X = np.random.default_rng(0).integers(0, 3, size=(5, 9))
    S = strategy_predictions(X, 3, every=True)
    for n in range(5):
        for t in range(9):
            for k, want in enumerate(_loop_strategies(X[n, : t + 1], 3)):
                np.testing.assert_allclose(S[k, n, t], want, rtol=1e-14)
    np.testing.assert_array_equal(strategy_predictions(X, 3), S[:, :, -1])


def test_model_predictions_are_the_models_outputs():
    """``exp(−∂ℓ/∂target)`` is the model's distribution: Edelman's softmax at every prefix (their
    model, transcribed), the paper's ŷ + ε (``naive_forward``) in the counts layout."""
    from gflow.core import ModelConfig as MC
    from gflow.theory import model_predictions
    from tests.helpers import naive_forward

    L = 8
    data = DataConfig(d=3, parents=[1], alpha=1.0, L=L)
    loss = make_loss(data, EDELMAN, _est(N=6))
    rng = np.random.default_rng(4)
    v, W = rng.normal(size=L), rng.normal(size=(3, 3))
    p = init_params(EDELMAN, d=3, L=L).with_blocks({"v": jnp.asarray(v), "W": jnp.asarray(W)})
    P = model_predictions(loss, p)
    X = np.asarray(sample(data, 6, key=jax.random.key(2)).X)
    E = np.eye(3)
    for n in range(6):
        for t in range(L):
            pos = np.arange(t + 1)[:, None] - np.arange(t + 1)[None, :]
            att = np.where(pos >= 0, v[np.clip(pos, 0, None)], -np.inf)
            att = np.exp(att - att.max(-1, keepdims=True))
            h = (att / att.sum(-1, keepdims=True)) @ E[X[n, : t + 1]]
            lg = (E[X[n, t]] @ W @ h.T) @ E[X[n, : t + 1]]
            np.testing.assert_allclose(P[n, t], np.exp(lg) / np.exp(lg).sum(), rtol=1e-10)
    paper = MC()
    pdata = DataConfig(d=3, L=12)
    ploss = make_loss(pdata, paper, EstimatorConfig(N=5, seed=1, eps=1e-3))
    pp = init_params(paper, d=3, L=12)
    pp = pp.with_blocks({"a": jnp.asarray(2.0), "C": jnp.asarray(rng.normal(size=np.shape(pp.C)))})
    Q = model_predictions(ploss, pp)
    Xp = np.asarray(sample(pdata, 5, key=jax.random.key(1)).X)
    for n in range(5):
        _, yhat = naive_forward(pp.w, pp.C, pp.a, Xp[n], 3, paper.D, "sum")
        np.testing.assert_allclose(Q[n], (yhat + 1e-3) / (yhat + 1e-3).sum(), rtol=1e-10)


def test_every_position_ladder_against_loops():
    """Oracle, Bayes (prefix counts of the parent configuration), the prefix unigram and the
    strategies, each per sequence against a loop over the prefixes."""
    from gflow.theory import loss_ladder

    L, d, alpha = 7, 3, 0.5
    data = DataConfig(d=d, parents=[1, 2], alpha=alpha, L=L)
    est = _est(N=12, loss="log", eps=1e-6)
    loss = make_loss(data, EDELMAN, est)  # the ladder reads the loss's sample and targets only
    lad = loss_ladder(loss, data, S=(), estimator=est)
    smp = sample(data, 12, key=jax.random.key(2))
    X, y, pi = np.asarray(smp.X), np.asarray(smp.y), np.asarray(smp.pi)
    full = np.concatenate([X, y[:, None]], axis=1)
    ts = [t for t in range(1, L + 1) if t >= 2]  # position t (1-based) predicts x_{t+1}
    for n in range(12):
        oracle = bayes = uni = 0.0
        strat = np.zeros(3)
        for t in ts:
            z = (full[n, t - 1], full[n, t - 2])  # x_{t+1}'s parents: offsets 1, 2
            law = pi[n, z[0] * d + z[1]]
            tgt = law / len(ts)
            cnt = np.zeros(d)
            for s in range(3, t + 1):  # positions s ≤ t whose parents x_{s−1}, x_{s−2} are inside
                if (full[n, s - 2], full[n, s - 3]) == z:
                    cnt[full[n, s - 1]] += 1
            bay = (cnt + alpha) / (cnt.sum() + d * alpha)
            un = np.bincount(full[n, :t], minlength=d) / t
            oracle -= tgt @ np.log(law + 1e-6)
            bayes -= tgt @ np.log(bay + 1e-6)
            uni -= tgt @ np.log(un + 1e-6)
            strat -= [tgt @ np.log(s_ + 1e-6) for s_ in _loop_strategies(full[n, :t], d)]
        np.testing.assert_allclose([lad.values[k][n] for k in ("oracle", "bayes", "unigram")], [oracle, bayes, uni],
                                   rtol=1e-12)  # fmt: skip
        np.testing.assert_allclose([lad.values[k][n] for k in ("uniform", "unigram+1", "bigram+1")], strat, rtol=1e-12)
    assert "gih" not in lad.values and lad.to_json()["a_gih"] is None
    # Edelman's output is logits: with its cross-entropy (ce_on_probs) the rungs' probabilities are
    # still scored with the log loss, the same numbers
    ce = _est(N=12, loss="ce_on_probs", eps=1e-6)
    lad_ce = loss_ladder(make_loss(data, EDELMAN, ce), data, S=(), estimator=ce)
    assert lad_ce.kind == "log"
    for k in ("oracle", "bayes", "unigram", "uniform", "unigram+1", "bigram+1"):
        np.testing.assert_array_equal(lad_ce.values[k], lad.values[k])


def test_run_strategies_find_edelmans_phases_on_a_short_run(tmp_path):
    """``gflow.strategies`` of a short Edelman run at every position: the KL at t = 0 is the
    uniform model's (W = 0.01 everywhere: near-uniform logits), so the uniform strategy leads
    first; the KLs equal ``strategy_kl`` of the saved θ recomputed here."""
    import gflow
    from gflow.core import Params
    from gflow.theory import strategy_kl

    cfg = from_dict({"data": {"d": 3, "parents": [1], "alpha": 1.0, "L": 12},
                     "model": {"member": "edelman", "H": 1, "D": 1, "M": 1},
                     "schedule": {"kind": "joint", "t1": 5.0},
                     "estimator": {"N": 100, "loss": "ce_on_probs", "eps": 0.0, "positions": "all"}})  # fmt: skip
    traj = gflow.integrate(cfg)
    r = gflow.strategies(traj)
    assert r["phases"][0][0] == "uniform" and r["phases"][0][1] == 0.0
    loss = make_loss(cfg.data, cfg.model, cfg.estimator)
    X = sample(cfg.data, 100, key=jax.random.key(0)).X
    th = Params.from_blocks({b: jnp.asarray(v) for b, v in traj.state(-1).items()})
    want = strategy_kl(loss, th, X)
    for k in ("uniform", "unigram", "bigram"):
        assert r[f"kl_{k}"][-1] == pytest.approx(want[k], rel=1e-12)


def test_an_integrated_run_stores_the_strategies_kl_at_every_saved_time(tmp_path):
    """A run stores ``kl_uniform``, ``kl_unigram``, ``kl_bigram`` once integrated: one value per
    saved time, equal to the KL recomputed from the saved θ on the run's sample (a trajectory
    without them), through the folder's save and load; ``gflow.strategies`` reads them (the same
    numbers at any stride); appending rows drops them; a damaged file is refused by name."""
    import dataclasses

    import gflow
    from gflow.trajectory import KL_ARRAYS, load, save

    cfg = from_dict({"data": {"d": 3, "parents": [1], "alpha": 1.0, "L": 10},
                     "model": {"member": "edelman", "H": 1, "D": 1, "M": 1},
                     "schedule": {"kind": "joint", "t1": 3.0},
                     "estimator": {"N": 60, "loss": "ce_on_probs", "eps": 0.0, "positions": "all"}})  # fmt: skip
    traj = gflow.integrate(cfg, out=tmp_path / "run")
    T = len(traj.ts)
    assert T > 3 and sorted(traj.kl) == sorted(KL_ARRAYS) and all(v.shape == (T,) for v in traj.kl.values())
    saved = load(tmp_path / "run")
    bare = dataclasses.replace(saved, kl={})
    again = gflow.strategies(bare)  # recomputed from θ
    for k in KL_ARRAYS:
        np.testing.assert_array_equal(saved.kl[k], traj.kl[k])
        np.testing.assert_allclose(again[k], saved.kl[k], rtol=1e-12, atol=1e-15)
    # the uniform strategy's KL at t = 0 is that of near-uniform logits: small, and below the others
    assert saved.kl["kl_uniform"][0] < min(saved.kl["kl_unigram"][0], saved.kl["kl_bigram"][0])
    strided = gflow.strategies(saved, every=2)
    np.testing.assert_array_equal(strided["kl_bigram"], saved.kl["kl_bigram"][sorted(set(range(0, T, 2)) | {T - 1})])
    # appended rows make the stored KL stale: dropped
    row = {k: saved.array(k)[-1:] for k in saved.array_names}
    saved.append(**row)
    assert saved.kl == {}
    # a trajectory whose KL describes other rows (its arrays cut by hand) is saved without it
    cut = dataclasses.replace(traj, kl={k: v[:-1] for k, v in traj.kl.items()})
    save(cut, tmp_path / "cut")
    assert load(tmp_path / "cut").kl == {}
    # a file whose KL arrays do not match its saved times is refused, naming them
    with np.load(tmp_path / "run" / "trajectory.npz") as z:
        arrays = {k: z[k] for k in z.files}
    arrays["kl_uniform"] = arrays["kl_uniform"][:-1]
    np.savez(tmp_path / "run" / "trajectory.npz", **arrays)
    with pytest.raises(ValueError, match="kl_uniform"):
        load(tmp_path / "run")
