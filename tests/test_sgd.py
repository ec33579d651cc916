"""Online SGD (gflow/sgd.py) and its diffusion limit (gflow/sde.py): README §M8.6.

Every check is on a tiny problem (d = 3, L = 20, N = 200): exact equalities with
gradient descent, the one-step covariance η²ΛΣΛ/B against Monte Carlo over many
seeds, and the mean over seeds against the flow within standard errors.
"""

from __future__ import annotations

import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

import gflow
from gflow.sde import SDEConfig, gradient_covariance, sde
from gflow.sgd import SGDConfig, sgd

CFG = gflow.Config().replace(
    data={"L": 20}, estimator={"N": 200}, init={"a0": 1.0},
    schedule={"kind": "joint", "t1": 2.0, "eta_w": 1.0, "eta_C": 1.0, "eta_a": 1.0},
    solver={"save_per_decade": 1},
)  # fmt: skip


@pytest.fixture(scope="module")
def loss():
    return gflow.make_loss(CFG.data, CFG.model, CFG.estimator)


def _flat(run, i):
    """θ of every seed at saved index i, flattened in ravel_pytree order (a, C, w)."""
    return np.stack([ravel_pytree(gflow.Params(w=run.w[r, i], C=run.C[r, i], a=run.a[r, i]))[0]
                     for r in range(run.a.shape[0])])  # fmt: skip


def test_full_batch_sgd_is_gd(loss):
    """B = N, batches without replacement from the fixed sample: each step is one epoch
    and equals one GD step (same θ to rounding), for every seed."""
    gd = gflow.integrate(CFG.replace(schedule={"t1": 0.3}, solver={"method": "gd", "eta": 0.1}), loss=loss)
    run = sgd(CFG, SGDConfig(eta=0.1, batch=200, steps=3, seeds=2, sampling="fixed"), loss=loss)
    np.testing.assert_allclose(run.ts, [0.0, 0.1, 0.2, 0.3])
    for r in range(2):
        np.testing.assert_allclose(run.a[r, -1], gd.a[-1], rtol=1e-13)
        np.testing.assert_allclose(run.C[r, -1], gd.C[-1], rtol=1e-12, atol=1e-16)
        np.testing.assert_allclose(run.w[r, -1], gd.w[-1], rtol=1e-13)
    np.testing.assert_allclose(run.loss[0, -1], gd.loss[-1], rtol=1e-12)


def _var_se(x):
    """Sample variance of each column and its standard error sqrt((m4 − s⁴)/R)."""
    xc = x - x.mean(0)
    v = (xc**2).mean(0)
    return v, np.sqrt(np.maximum((xc**4).mean(0) - v**2, 0) / len(x))


@pytest.mark.slow
def test_one_step_covariance(loss):
    """One step from θ₀ over R = 1500 seeds: Var(θ₁ − θ₀) = η²/B · ΛΣΛ for the SME
    (Euler–Maruyama with dt = η: (η/B)·dt·Σ) and, for SGD drawing B of the N sample
    sequences without replacement, η²/B · (N−B)/(N−1) · Σ; each coordinate within
    4.5 Monte Carlo standard errors of its variance, and the mean increment equals the
    gradient step −ηΛ∇L̂ within 4.5 SE."""
    eta, B, R = 0.1, 10, 1500
    cfg = CFG.replace(schedule={"eta_w": 0.5, "eta_C": 2.0})
    p0 = gflow.init_params(cfg.model, cfg.init)
    th0, _ = ravel_pytree(p0)
    lam = ravel_pytree(gflow.Params(w=np.full((3, 3), 0.5), C=np.full(7, 2.0), a=np.asarray(1.0)))[0]
    Sig = np.asarray(gradient_covariance(loss, p0))
    g = np.asarray(ravel_pytree(loss.grad(p0))[0])
    sigma_diag = lam**2 * np.diag(Sig)
    N = loss.N
    for name, run, want in (
        ("sde", sde(cfg, SDEConfig(eta=eta, batch=B, t1=eta, dt=eta, seeds=R, save_per_decade=1), loss=loss),
         eta**2 / B * sigma_diag),
        ("sgd", sgd(cfg, SGDConfig(eta=eta, batch=B, steps=1, seeds=R, sampling="fixed", save_per_decade=1),
                    loss=loss), eta**2 / B * (N - B) / (N - 1) * sigma_diag),
    ):  # fmt: skip
        assert run.ts[-1] == pytest.approx(eta)
        inc = _flat(run, -1) - np.asarray(th0)
        v, se = _var_se(inc)
        moving = want > 1e-14
        assert moving.sum() >= 10, name
        z = np.abs(v - want)[moving] / se[moving]
        assert np.all(z < 4.5), (name, z)
        # no noise in coordinates with zero gradient variance
        np.testing.assert_allclose(v[~moving], 0.0, atol=1e-20)
        m_se = np.sqrt(v / R)
        zm = np.abs(inc.mean(0) + eta * lam * g)[moving] / m_se[moving]
        assert np.all(zm < 4.5), (name, zm)


def test_sde_without_noise_is_the_flow(loss):
    """noise = 0: Euler–Maruyama is gradient descent with step dt, bit for bit (up to
    rounding), and approaches the flow at first order in dt."""
    gd = gflow.integrate(CFG.replace(schedule={"t1": 0.4}, solver={"method": "gd", "eta": 0.1}), loss=loss)
    run = sde(CFG, SDEConfig(eta=0.1, batch=10, t1=0.4, dt=0.1, seeds=1, noise=0.0), loss=loss)
    np.testing.assert_allclose(run.a[0, -1], gd.a[-1], rtol=1e-13)
    np.testing.assert_allclose(run.C[0, -1], gd.C[-1], rtol=1e-12)
    np.testing.assert_allclose(run.w[0, -1], gd.w[-1], rtol=1e-13)
    flow = gflow.integrate(CFG.replace(solver={"rtol": 1e-10, "atol": 1e-12}), loss=loss)
    th_f = ravel_pytree(gflow.Params(w=flow.w[-1], C=flow.C[-1], a=flow.a[-1]))[0]
    errs = []
    for dt in (0.1, 0.05):
        r = sde(CFG, SDEConfig(eta=0.1, batch=10, t1=2.0, dt=dt, seeds=1, noise=0.0), loss=loss)
        errs.append(np.linalg.norm(_flat(r, -1)[0] - th_f))
    order = np.log(errs[0] / errs[1]) / np.log(2)
    assert 0.85 < order < 1.15, (errs, order)


@pytest.mark.slow
def test_sgd_mean_approaches_flow(loss):
    """Mean over R = 64 seeds of SGD (B = 10 drawn with replacement from the fixed sample,
    c₀ = 0.5) at t = 2 against the flow: at η = 0.0125, a, the selected c_S/Σc and the
    loss are within 4 standard errors of the flow, and the spread over seeds shrinks like
    √η (ratio of standard deviations of a from η = 0.2 to 0.0125 within [2.5, 6.5]; √16 = 4).

    (With random reshuffling, ``sampling = "fixed"``, the noise cancels over each epoch:
    measured spread of a 8e-6 at η = 0.0125 after 8 epochs, so the O(η) discretisation
    bias, 2e-5, is then 21 of its standard errors: that mode is not a diffusion.)"""
    # c₀ = 0.5: at the paper's c₀ = 0.01 the selector's rates (∝ 1/‖C‖²) are in the
    # hundreds, so every η here would be far outside the regime ηλ ≪ 1 where the O(η)
    # expansion holds
    cfg = CFG.replace(init={"c0": 0.5})
    flow = gflow.integrate(cfg.replace(solver={"rtol": 1e-10, "atol": 1e-12}), loss=loss)
    sel = int(np.argmax(flow.c_frac[-1]))
    z, sd = {}, {}
    for eta in (0.2, 0.0125):
        run = sgd(cfg, SGDConfig(eta=eta, batch=10, steps=round(2.0 / eta), seeds=64, sampling="replace",
                                 save_per_decade=1), loss=loss)  # fmt: skip
        assert run.ts[-1] == pytest.approx(2.0)
        z[eta], sd[eta] = [], run.a[:, -1].std(ddof=1)
        for x, f in ((run.a[:, -1], flow.a[-1]), (run.c_frac[:, -1, sel], flow.c_frac[-1, sel]),
                     (run.loss[:, -1], flow.loss[-1])):  # fmt: skip
            z[eta].append(abs(x.mean() - f) / (x.std(ddof=1) / np.sqrt(len(x))))
    assert max(z[0.0125]) < 4, z
    assert 2.5 < sd[0.2] / sd[0.0125] < 6.5, sd
