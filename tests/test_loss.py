"""The Monte Carlo population loss, its gradient and standard errors (docs/theory/mathematics.md §M3, §M5).

Truth: the exact population loss of small fixed-kernel problems, computed by
enumerating every sequence with its exact probability and running the
reference per-position forward map (tests/helpers.py, ``exact_problem``);
central finite differences; invariances of the model; the spread of the
estimate over independent samples.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    EXACT_CFGS,
    PRIOR_CFG,
    PRIOR_N,
    chi2_quantile,
    exact_problem,
    loss_per_sequence,
    loss_stats,
    loss_value,
    loss_value_and_grad,
    naive_forward,
    prior_loss,
    prior_sample,
    random_params,
    tree_allclose,
)
from jax.flatten_util import ravel_pytree

import gflow

_MODEL = gflow.ModelConfig(M=3, H=3, D=2)

# ---------------------------------------------------------------------------
# Exactness against enumeration (fixed kernels, d = 2)
# ---------------------------------------------------------------------------

_EXACT_CFGS = EXACT_CFGS
_EXACT_PARAMS = random_params(jax.random.key(42), _MODEL, a=2.0)


@functools.cache
def _exact(name, kind="log"):
    """Exact loss, the per-sequence variance of ℓ_RB and the exact gradient, at θ."""
    ex, grad = exact_problem(_EXACT_CFGS[name], _MODEL, _EXACT_PARAMS, kind=kind)
    return dict(ex, grad=grad)


def _grad_within(st, exact_grad, k):
    """Every gradient component within k reported standard errors."""
    g, se, ex = (ravel_pytree(t)[0] for t in (st.grad, st.grad_se, exact_grad))
    z = np.abs(np.asarray(g - ex)) / np.maximum(np.asarray(se), 1e-300)
    return bool(np.all((z < k) | (np.abs(np.asarray(g - ex)) < 1e-13))), z.max()


# Two sample sizes for the trigram (and many more in the convergence test
# below), one for the other problems; the positions layout on the trigrams
# (the bigram's would need one more compilation for its L).
_EXACT_CASES = [
    ("bigram-stationary", "counts", (2000,)),
    ("trigram-stationary", "counts", (500, 2000)),
    ("trigram-uniform", "counts", (2000,)),
    ("trigram-stationary", "positions", (2000,)),
    ("trigram-uniform", "positions", (2000,)),
]


@pytest.mark.parametrize("name, layout, sizes", _EXACT_CASES, ids=[f"{n}-{x}" for n, x, _ in _EXACT_CASES])
def test_monte_carlo_matches_exact_enumeration(name, layout, sizes):
    """L̂_N (Rao–Blackwellised) is within 4 SE of the exact population loss
    E[-log(ŷ_y + ε)] (which uses the actual target y); the reported SE is the
    exact sd(ℓ_RB)/√N; the gradient is within 4.5 SE of the exact gradient."""
    cfg = _EXACT_CFGS[name]
    ex = _exact(name)
    assert abs(ex["loss"] - ex["loss_rb"]) < 1e-12  # E[ℓ | X] = ℓ_RB (the enumerator's own check)
    for N in sizes:
        f = gflow.make_loss(cfg, _MODEL, gflow.EstimatorConfig(N=N, seed=N, layout=layout))
        st = loss_stats(f, _EXACT_PARAMS)
        assert abs(float(st.loss) - ex["loss"]) < 4 * float(st.loss_se), (N, st.loss, ex["loss"])
        true_se = np.sqrt(ex["var_rb"] / N)
        assert 0.75 < float(st.loss_se) / true_se < 1.3
        assert abs(float(st.unseen) - ex["unseen"]) < 4 * np.sqrt(ex["unseen"] / N)  # unseen mass in [0, 1]
    ok, zmax = _grad_within(st, ex["grad"], 4.5)
    assert ok, zmax
    if name.startswith("trigram"):
        # power: the other start law's exact loss is far outside these bounds
        other = _exact("trigram-uniform" if name.endswith("stationary") else "trigram-stationary")
        assert abs(other["loss"] - ex["loss"]) > 8 * float(st.loss_se)


@pytest.mark.slow
def test_monte_carlo_ce_on_probs_matches_exact_enumeration():
    """The same for the reference simulations' loss -log softmax(ŷ)_y."""
    name = "trigram-stationary"
    ex = _exact(name, "ce_on_probs")
    assert abs(ex["loss"] - ex["loss_rb"]) < 1e-12
    est = gflow.EstimatorConfig(N=2000, seed=2000, loss="ce_on_probs")
    f = gflow.make_loss(_EXACT_CFGS[name], _MODEL, est)
    st = loss_stats(f, _EXACT_PARAMS)
    assert abs(float(st.loss) - ex["loss"]) < 4 * float(st.loss_se)
    assert 0.75 < float(st.loss_se) / np.sqrt(ex["var_rb"] / 2000) < 1.3
    ok, zmax = _grad_within(st, ex["grad"], 4.5)
    assert ok, zmax
    assert abs(ex["loss"] - _exact(name)["loss"]) > 0.1  # a different loss


def test_monte_carlo_error_shrinks_like_inverse_sqrt_N():
    """The error of the mean over b sequences, standardised by the exact
    sd(ℓ_RB)/√b, is N(0, 1): over 16 independent samples of 2000 sequences
    cut into blocks, the mean squared standardised error is within χ² bounds
    at every block size, and the RMS error has log-log slope -1/2."""
    name = "trigram-stationary"
    ex = _exact(name)
    sd = np.sqrt(ex["var_rb"])
    ls = np.concatenate(
        [
            np.asarray(
                loss_per_sequence(
                    gflow.make_loss(_EXACT_CFGS[name], _MODEL, gflow.EstimatorConfig(N=2000, seed=100 + r)),
                    _EXACT_PARAMS,
                )
            )
            for r in range(16)
        ]
    )
    sizes = np.array([125, 500, 2000, 8000])
    rms = []
    for b in sizes:
        err = ls.reshape(-1, b).mean(1) - ex["loss"]
        nb = len(err)
        msz = np.mean((err / (sd / np.sqrt(b))) ** 2)
        lo, hi = chi2_quantile(1e-4, nb) / nb, chi2_quantile(1 - 1e-4, nb) / nb
        assert lo < msz < hi, (b, msz, lo, hi)
        rms.append(np.sqrt(np.mean(err**2)))
    slope = np.polyfit(np.log(sizes), np.log(rms), 1)[0]
    assert -0.75 < slope < -0.25, slope
    z = (ls.mean() - ex["loss"]) / (sd / np.sqrt(len(ls)))
    assert abs(z) < 4, z


# ---------------------------------------------------------------------------
# Gradients, layouts, invariances (Dirichlet prior, d = 3, trigram, L = 20)
# ---------------------------------------------------------------------------


def _theta(seed=7, model=_MODEL):
    return random_params(jax.random.key(seed), model, a=1.5)


@pytest.mark.parametrize("norm", ["sum", "layer"])
@pytest.mark.parametrize("layout", ["counts", "positions"])
def test_gradient_matches_finite_differences(layout, norm):
    """∇L̂ (reverse mode) equals central differences, float64, relative 1e-6,
    for every component of w, C and a."""
    model = gflow.ModelConfig(M=3, H=3, D=2, norm=norm)
    f = prior_loss(0, layout, norm)
    p = _theta(model=model)
    _, g = loss_value_and_grad(f, p)
    flat, unravel = ravel_pytree(p)
    flat = np.asarray(flat)
    gflat = np.asarray(ravel_pytree(g)[0])

    def value(x):
        return float(loss_value_and_grad(f, unravel(jnp.asarray(x)))[0])

    fd = np.zeros_like(gflat)
    for i in range(flat.size):
        # h balances truncation (h^2 |f'''| ~ 1e-10) and rounding (1e-16 L/h ~ 1e-11)
        e = np.zeros_like(flat)
        e[i] = h = 1e-5 * max(1.0, abs(flat[i]))
        fd[i] = (value(flat + e) - value(flat - e)) / (2 * h)
    scale = np.abs(fd).max()
    assert scale > 1e-3
    np.testing.assert_allclose(gflat, fd, rtol=1e-6, atol=1e-9 * scale)


# The norm changes κ and the loss kind only the last step, independently:
# three of the four combinations exercise every code path (the fourth is slow).
@pytest.mark.parametrize(
    "norm, kind",
    [
        ("sum", "log"),
        ("layer", "log"),
        ("sum", "ce_on_probs"),
        pytest.param("layer", "ce_on_probs", marks=pytest.mark.slow),
    ],
)
def test_layouts_agree(norm, kind):
    """counts, positions and sparse give the same loss, gradient, standard errors and
    unseen mass to rounding (the same sample: all drawn from the seed)."""
    fc = prior_loss(0, "counts", norm, kind)
    fp = prior_loss(0, "positions", norm, kind)
    np.testing.assert_array_equal(np.asarray(fp.feats.X), np.asarray(prior_sample(0).X))
    p = _theta(model=gflow.ModelConfig(M=3, H=3, D=2, norm=norm))
    sc, sp = loss_stats(fc, p), loss_stats(fp, p)
    assert tree_allclose(sc, sp, rtol=1e-10, atol=1e-14)
    assert tree_allclose(loss_stats(prior_loss(0, "sparse", norm, kind), p), sp, rtol=1e-10, atol=1e-14)
    assert np.isfinite(float(sc.loss)) and float(sc.loss_se) > 0
    assert float(ravel_pytree(sc.grad_se)[0].min()) > 0


# L < M: the query's window (x_2, x_1, pad) is padded. N and M as in the
# prior problem, so the counts layout reuses its compilation.
_SHORT_KERNEL = np.array([[0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.3, 0.1, 0.6]])
_SHORT_CFG = gflow.DataConfig(d=3, parents=(1,), L=2, kernel=_SHORT_KERNEL)


@pytest.mark.parametrize("norm", ["sum", "layer"])
def test_short_context_padding(norm):
    """L < M: the layouts agree, and (norm="sum") the estimate matches the
    exact loss (3^3 sequences enumerated)."""
    model = gflow.ModelConfig(M=3, H=3, D=2, norm=norm)
    p = random_params(jax.random.key(3), model, a=2.5)
    est = dict(N=PRIOR_N, seed=5)
    fc = gflow.make_loss(_SHORT_CFG, model, gflow.EstimatorConfig(**est, layout="counts"))
    fp = gflow.make_loss(_SHORT_CFG, model, gflow.EstimatorConfig(**est, layout="positions"))
    fs = gflow.make_loss(_SHORT_CFG, model, gflow.EstimatorConfig(**est, layout="sparse"))
    sc, sp = loss_stats(fc, p), loss_stats(fp, p)
    assert tree_allclose(sc, sp, rtol=1e-10, atol=1e-14)
    assert tree_allclose(loss_stats(fs, p), sp, rtol=1e-10, atol=1e-14)
    if norm == "layer":
        return
    ex, grad = exact_problem(_SHORT_CFG, model, p)
    assert abs(float(sc.loss) - ex["loss"]) < 4 * float(sc.loss_se)
    ok, zmax = _grad_within(sc, grad, 4.5)
    assert ok, zmax


@pytest.mark.parametrize("norm", ["sum", "layer"])
def test_invariances(norm):
    """.stats reports the loss and gradient of value_and_grad. L̂ depends on C
    only through its direction: L̂(λC) = L̂(C), ⟨∇_C L̂, C⟩ = 0 and
    ∇_C L̂(λC) = ∇_C L̂(C)/λ; and on each row of w only up to a constant
    (softmax): Σ_i ∂L̂/∂w_hi = 0."""
    f = prior_loss(0, "counts", norm)
    p = _theta(model=gflow.ModelConfig(M=3, H=3, D=2, norm=norm))
    val, g = loss_value_and_grad(f, p)
    # .stats reports the same loss and gradient (the mean of its batch gradients)
    st = loss_stats(f, p)
    assert abs(float(st.loss) - float(val)) < 1e-13
    gflat = np.asarray(ravel_pytree(g)[0])
    np.testing.assert_allclose(np.asarray(ravel_pytree(st.grad)[0]), gflat, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(float(st.grad_norm), np.linalg.norm(gflat), rtol=1e-12)
    C = np.asarray(p.C)
    gC = np.asarray(g.C)
    assert np.linalg.norm(gC) > 1e-4
    assert abs(gC @ C) < 1e-12 * np.linalg.norm(gC) * np.linalg.norm(C)
    np.testing.assert_allclose(np.asarray(g.w).sum(1), 0.0, atol=1e-13 * np.abs(np.asarray(g.w)).max())
    for lam in (1e-2, 7.3):
        q = gflow.Params(w=p.w, C=lam * p.C, a=p.a)
        v2, g2 = loss_value_and_grad(f, q)
        np.testing.assert_allclose(float(v2), float(val), rtol=1e-13)
        np.testing.assert_allclose(np.asarray(g2.C), gC / lam, rtol=1e-9, atol=1e-13 * np.abs(gC).max() / lam)
        np.testing.assert_allclose(np.asarray(g2.w), np.asarray(g.w), rtol=1e-9, atol=1e-14)


def _calibration(cfg, model, p, N, seeds):
    loss, se, grad, gse = [], [], [], []
    for seed in seeds:
        st = loss_stats(gflow.make_loss(cfg, model, gflow.EstimatorConfig(N=N, seed=seed)), p)
        loss.append(float(st.loss))
        se.append(float(st.loss_se))
        grad.append(np.asarray(ravel_pytree(st.grad)[0]))
        gse.append(np.asarray(ravel_pytree(st.grad_se)[0]))
    ratio = np.std(loss, ddof=1) / np.mean(se)
    gratio = np.std(grad, axis=0, ddof=1) / np.mean(gse, axis=0)
    return ratio, gratio


def test_standard_errors_match_spread_over_seeds():
    """The reported SE of the loss and of every gradient component agrees with
    the standard deviation of the estimate over 30 independent samples of
    N = 500 sequences (a ratio within 0.6-1.6: the sd of 30 draws is itself
    uncertain by about 13%)."""
    cfg = _EXACT_CFGS["trigram-stationary"]
    ratio, gratio = _calibration(cfg, _MODEL, _EXACT_PARAMS, 500, range(3000, 3030))
    assert 0.6 < ratio < 1.6, ratio
    assert np.all((0.6 < gratio) & (gratio < 1.6)), gratio


@pytest.mark.slow
def test_standard_errors_match_spread_over_seeds_prior():
    """The same under the paper's Dirichlet(0.1) prior (heavier tails)."""
    ratio, gratio = _calibration(PRIOR_CFG, _MODEL, _theta(), PRIOR_N, range(1000, 1030))
    assert 0.6 < ratio < 1.6, ratio
    assert np.all((0.6 < gratio) & (gratio < 1.6)), gratio


def test_per_sequence_formulas():
    """ℓ_RB = -Σ_e π(e|z_q) log(ŷ_e + ε), the ce_on_probs loss
    -Σ_e π(e|z_q) log softmax(ŷ)_e, and the unseen mass, computed directly
    from the sample with the materialised-feature model."""
    smp = jax.tree.map(np.asarray, prior_sample(0))
    p = _theta()
    ls_log = np.asarray(loss_per_sequence(prior_loss(0, "counts", "sum", "log"), p))
    ls_ce = np.asarray(loss_per_sequence(prior_loss(0, "counts", "sum", "ce_on_probs"), p))
    for n in range(12):
        _, yhat = naive_forward(p.w, p.C, p.a, smp.X[n], PRIOR_CFG.d, _MODEL.D, "sum")
        cond = smp.cond[n]
        np.testing.assert_allclose(ls_log[n], -np.sum(cond * np.log(yhat + 1e-6)), rtol=1e-12, atol=1e-14)
        lsm = yhat - yhat.max() - np.log(np.sum(np.exp(yhat - yhat.max())))
        np.testing.assert_allclose(ls_ce[n], -np.sum(cond * lsm), rtol=1e-12, atol=1e-14)
    seen = np.stack([(smp.X == e).any(1) for e in range(PRIOR_CFG.d)], 1)
    unseen = np.mean(np.sum(smp.cond * ~seen, 1))
    assert unseen > 1e-3  # Dirichlet(0.1) chains often miss a token
    for layout in ("counts", "positions"):
        st = loss_stats(prior_loss(0, layout), p)
        np.testing.assert_allclose(float(st.unseen), unseen, rtol=1e-12)


@pytest.mark.slow
def test_float32_estimator():
    f64 = prior_loss(0, "counts")
    f32 = gflow.make_loss(PRIOR_CFG, _MODEL, gflow.EstimatorConfig(N=PRIOR_N, seed=0, dtype="float32"))
    p = _theta()
    p32 = jax.tree.map(lambda x: x.astype(jnp.float32), p)
    v32 = loss_value(f32, p32)
    assert v32.dtype == jnp.float32
    np.testing.assert_allclose(float(v32), float(loss_value_and_grad(f64, p)[0]), rtol=1e-5)


# ---------------------------------------------------------------------------
# Determinism and configuration errors
# ---------------------------------------------------------------------------


def test_determinism():
    """Same configuration and seed: bit-identical features and loss; an
    explicit key overrides the seed; another seed gives another sample."""
    est = gflow.EstimatorConfig(N=PRIOR_N, seed=0, layout="positions")
    a = gflow.make_loss(PRIOR_CFG, _MODEL, est)
    b = gflow.make_loss(PRIOR_CFG, _MODEL, est)
    c = gflow.make_loss(
        PRIOR_CFG,
        _MODEL,
        gflow.EstimatorConfig(N=PRIOR_N, seed=123, layout="positions"),
        key=jax.random.key(0),
    )
    for x, y in zip(jax.tree.leaves(a.feats), jax.tree.leaves(b.feats)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    np.testing.assert_array_equal(np.asarray(a.feats.X), np.asarray(c.feats.X))
    p = _theta()
    assert float(loss_value_and_grad(a, p)[0]) == float(loss_value_and_grad(b, p)[0])
    d = gflow.make_loss(PRIOR_CFG, _MODEL, gflow.EstimatorConfig(N=PRIOR_N, seed=1, layout="positions"))
    assert not np.array_equal(np.asarray(a.feats.X), np.asarray(d.feats.X))
    assert float(loss_value_and_grad(a, p)[0]) != float(loss_value_and_grad(d, p)[0])


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(N=0), "estimator.N"),
        (dict(N=-5), "estimator.N"),
        (dict(N=10.5), "estimator.N"),
        (dict(seed="a"), "estimator.seed"),
        (dict(eps=-1e-3), "estimator.eps"),
        (dict(eps=float("nan")), "estimator.eps"),
        (dict(eps=float("inf")), "estimator.eps"),
        (dict(loss="mse"), "estimator.loss"),
        (dict(dtype="float16"), "estimator.dtype"),
        (dict(layout="rows"), "estimator.layout"),
    ],
)
def test_estimator_config_errors(kwargs, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        gflow.EstimatorConfig(**kwargs)
