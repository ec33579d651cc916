"""The kernels' priors (gflow/core/_priors.py, ``data.prior``): the paper's Dirichlet rows bit for
bit, Edelman et al.'s doubly stochastic and unigram variants against their defining properties and
closed forms, their Bayes rungs against predictives computed here from the tokens, and the refusals."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gflow
import gflow.cli
from gflow.core import sample_kernels
from gflow.core._data import sample, sample_fast, stationary_window
from gflow.theory import loss_ladder, modified_chi2_ranking


def test_dirichlet_prior_is_jax_dirichlet_bit_for_bit():
    """The default prior draws exactly what it drew before the priors were a family."""
    cfg = gflow.DataConfig(L=20)
    key = jax.random.key(3)
    want = jax.random.dirichlet(key, jnp.full((50, cfg.n_configs, cfg.d), cfg.alpha), dtype=jnp.float64)
    np.testing.assert_array_equal(np.asarray(sample_kernels(cfg, 50, key=key)), np.asarray(want))


def test_doubly_stochastic_kernels_are_balanced_with_uniform_stationary_law():
    d = 3
    cfg = gflow.DataConfig(d=d, parents=(1,), prior="doubly_stochastic", alpha=1.0, L=20)
    K = np.asarray(sample_kernels(cfg, 400, key=jax.random.key(1)))
    assert np.abs(K.sum(-1) - 1).max() < 1e-12 and np.abs(K.sum(-2) - 1).max() < 1e-12
    mu = np.asarray(jax.vmap(lambda p: stationary_window(p, cfg))(jnp.asarray(K)))
    assert np.abs(mu - 1.0 / d).max() < 1e-8
    # the balanced law is exchangeable in the tokens: E π(e|z) = 1/d, within 4 standard errors
    mean, se = K.mean(0), K.std(0, ddof=1) / np.sqrt(K.shape[0])
    assert np.all(np.abs(mean - 1.0 / d) < 4 * se)
    # online SGD's sampler draws the same law: balanced too
    Kf = np.asarray(sample_fast(cfg, 200, jax.random.key(2)).pi)
    assert np.abs(Kf.sum(-2) - 1).max() < 1e-12


def test_unigram_kernels_share_one_dirichlet_row():
    d, alpha = 3, 0.5
    cfg = gflow.DataConfig(d=d, prior="unigram", alpha=alpha, L=20)
    K = np.asarray(sample_kernels(cfg, 4000, key=jax.random.key(4)))
    assert np.ptp(K, axis=1).max() == 0.0  # every context's row is the same ρ
    rho = K[:, 0]
    # ρ ~ Dirichlet(α·1): mean 1/d, variance (1/d)(1 − 1/d)/(dα + 1), each within 4 SE
    var = (1 / d) * (1 - 1 / d) / (d * alpha + 1)
    assert np.all(np.abs(rho.mean(0) - 1 / d) < 4 * np.sqrt(var / len(rho)))
    v = ((rho - 1 / d) ** 2).mean(0)
    v_se = ((rho - 1 / d) ** 2).std(0, ddof=1) / np.sqrt(len(rho))
    assert np.all(np.abs(v - var) < 4 * v_se)
    assert np.ptp(np.asarray(sample_fast(cfg, 100, jax.random.key(5)).pi), axis=1).max() == 0.0


def test_unigram_data_gives_every_set_zero_chi2_mi():
    """With one row for every context the tokens are independent of their parents: the modified
    χ²-MI of every set of offsets is 0 (exactly, up to rounding), so no set is preferred."""
    cfg = gflow.DataConfig(prior="unigram", L=20)
    rank = modified_chi2_ranking(cfg, [(1,), (2,), (1, 2), (3,)], n_pi=50)
    assert np.abs(rank.Itilde).max() < 1e-12 and np.abs(rank.chi2).max() < 1e-12


def test_unigram_bayes_rung_is_the_add_alpha_token_count():
    """The Bayes rung of unigram data is (n(e) + α)/(L + dα) over every token of the context,
    computed here from the tokens, and is exact with a stationary start."""
    cfg = gflow.Config().replace(data={"prior": "unigram", "L": 20, "alpha": 0.5}, estimator={"N": 300})
    loss = gflow.make_loss(cfg.data, cfg.model, cfg.estimator)
    smp = sample(cfg.data, cfg.estimator.N, key=jax.random.key(cfg.estimator.seed))
    X, cond = np.asarray(smp.X), np.asarray(smp.cond)
    n = np.stack([(X == e).sum(1) for e in range(cfg.data.d)], 1).astype(float)
    pred = (n + 0.5) / (cfg.data.L + cfg.data.d * 0.5)
    want = -(cond * np.log(pred + cfg.estimator.eps)).sum(1)
    lad = loss_ladder(loss, cfg.data, S=(1, 2), sample=smp)
    np.testing.assert_allclose(lad.values["bayes"], want, rtol=1e-12)
    assert lad.bayes_optimal
    # the paper's prior keeps its context counts and its rule (exact only with a uniform start)
    dcfg = cfg.replace(data={"prior": "dirichlet"})
    assert not loss_ladder(gflow.make_loss(dcfg.data, dcfg.model, dcfg.estimator), dcfg.data, S=(1, 2)).bayes_optimal


@pytest.mark.parametrize(
    "data, match",
    [
        ({"prior": "doubly_stochastic"}, r"needs one parent, data.parents = \[p\], got data.parents = \[1, 2\]"),
        ({"prior": "doubly_stochastic", "parents": [1], "alpha": 0.1}, r"needs data.alpha >= 0.3"),
        ({"prior": "beta"}, r"data.prior must be one of \('dirichlet', 'doubly_stochastic', 'unigram'\)"),
        ({"kind": "tree"}, r"data.kind must be one of \('ngram', 'graph', 'triggers'\)"),
    ],
)
def test_bad_priors_are_refused_naming_the_field(data, match, tmp_path, capsys):
    with pytest.raises(ValueError, match=match):
        gflow.Config().replace(data=data)
    toml = tmp_path / "bad.toml"
    toml.write_text("[data]\n" + "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in data.items()))
    out = tmp_path / "out"
    assert gflow.cli.main(["run", str(toml), "--out", str(out), "--quiet"]) == 2
    assert not out.exists() and "data." in capsys.readouterr().err


def test_a_fixed_kernel_overrides_the_prior():
    pi = np.array([[0.2, 0.8], [0.6, 0.4]])
    cfg = gflow.DataConfig(d=2, parents=(1,), kernel=pi, prior="unigram", L=10)
    np.testing.assert_array_equal(np.asarray(sample_kernels(cfg, 3, key=jax.random.key(0)))[1], pi)
