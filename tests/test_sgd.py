"""Online SGD (gflow/sgd.py) and its diffusion limit (gflow/sde.py): docs/theory/mathematics.md §M8.6.

Every check is on a tiny problem (d = 3, L = 20, N = 200): exact equalities with
gradient descent, the one-step covariance η²ΛΣΛ/B against Monte Carlo over many
seeds, and the mean over seeds against the flow within standard errors.
"""

from __future__ import annotations

import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

import gflow
from gflow.dynamics._sde import SDEConfig, gradient_covariance, sde
from gflow.dynamics._sgd import SGDConfig, sgd

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


# -- the fresh-sequence sampler of online SGD (gflow.core._data.sample_fast) --------------------------


def _z_scores(count, n, p):
    """|count/n − p| in binomial standard errors (n trials, probability p)."""
    se = np.sqrt(p * (1 - p) / n)
    return np.abs(count / n - p) / np.where(se > 0, se, 1.0)


@pytest.mark.parametrize("parents, start, burn_in", [((1, 2), "uniform", 0), ((1, 3), "stationary", 2)])
def test_fresh_sampler_transitions_match_the_kernel(parents, start, burn_in):
    """With a fixed kernel (d = 3, two parents) every empirical transition frequency
    #(z → e)/#z of 4000 sequences of length 60 is within 4.5 binomial standard errors of
    π(e|z) (docs/theory/mathematics.md §M1), a zero-probability transition never occurs, cond is π(·|z_q), and
    the first window's frequencies are within 4.5 SE of the start law (uniform, or the
    window chain's exact stationary law, which burn-in preserves)."""
    import jax

    from gflow.core._data import DataConfig, sample_fast, stationary_window

    pi = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8], [1 / 3, 1 / 3, 1 / 3], [0.5, 0.0, 0.5], [0.05, 0.9, 0.05],
                   [0.2, 0.3, 0.5], [0.0, 1.0, 0.0], [0.6, 0.4, 0.0], [0.25, 0.25, 0.5]])  # fmt: skip
    cfg = DataConfig(d=3, parents=parents, L=60, start=start, burn_in=burn_in, kernel=pi)
    s = jax.jit(lambda k: sample_fast(cfg, 4000, k))(jax.random.key(3))
    full = np.concatenate([np.asarray(s.X), np.asarray(s.y)[:, None]], axis=1)
    m = parents[-1]
    p1, p2 = parents
    # z = x_{l-p1}·d + x_{l-p2} (first parent most significant)
    z = 3 * full[:, m - p1 : full.shape[1] - p1] + full[:, m - p2 : full.shape[1] - p2]
    e = full[:, m:]
    cnt = np.zeros((9, 3))
    np.add.at(cnt, (z.ravel(), e.ravel()), 1)
    n = cnt.sum(1, keepdims=True)
    assert n.min() > 500
    assert np.all(cnt[pi == 0] == 0)
    assert np.max(_z_scores(cnt, n, pi)) < 4.5
    np.testing.assert_array_equal(np.asarray(s.cond), pi[np.asarray(s.zq)])
    code = (full[:, :m] * 3 ** np.arange(m - 1, -1, -1)).sum(1)
    first = np.bincount(code, minlength=3**m)
    law = np.full(3**m, 3.0**-m) if start == "uniform" else np.asarray(stationary_window(pi, cfg))
    assert np.max(_z_scores(first, first.sum(), law)) < 4.5


@pytest.mark.parametrize("alpha", [0.1, 2.0])
def test_fresh_sampler_kernels_are_dirichlet(alpha):
    """The kernels' rows are Dirichlet(α·1_d) (docs/theory/mathematics.md §M1): over 3000 × 9 rows (d = 3),
    P(π_e ≤ t) equals the Beta(α, 2α) distribution function at several t within 4.5
    binomial standard errors, and E π_e², E π_0 π_1 their closed forms
    α(α+1)/(3α(3α+1)) and α²/(3α(3α+1)) within 4.5 SE; α = 0.1 uses the GS sampler,
    α = 2 Marsaglia–Tsang. A traced α (the general sampler) gives the same law."""
    import jax
    import jax.numpy as jnp
    from scipy import stats

    from gflow.core._data import DataConfig, _log_gamma_mt, sample_fast

    cfg = DataConfig(d=3, alpha=alpha, L=4, start="uniform")
    pi = np.asarray(jax.jit(lambda k: sample_fast(cfg, 3000, k))(jax.random.key(5)).pi).reshape(-1, 3)
    lg = np.asarray(jax.jit(lambda k, a: _log_gamma_mt(k, a, 3 * 27000, jnp.float64))(jax.random.key(6), alpha))
    g = np.exp(lg.reshape(-1, 3))
    for p in (pi, g / g.sum(1, keepdims=True)):
        assert np.all(p >= 0) and np.allclose(p.sum(1), 1.0, atol=1e-12)
        x = p.ravel()
        for t in (1e-6, 1e-2, 0.2, 0.5, 0.9):
            want = stats.beta(alpha, 2 * alpha).cdf(t)
            assert _z_scores((x <= t).sum(), x.size, want) < 4.5, (t, (x <= t).mean(), want)
        norm = 3 * alpha * (3 * alpha + 1)
        for v, want in ((p**2, alpha * (alpha + 1) / norm), (p[:, 0] * p[:, 1], alpha**2 / norm)):
            v = v.ravel()
            assert abs(v.mean() - want) < 4.5 * v.std() / np.sqrt(v.size), (v.mean(), want)


def test_fresh_count_features_equal_the_loss_features():
    """The flat count features of SGD's fresh batches are exactly :func:`gflow.core.features`
    (layout "counts"), for aligned and shifted windows."""
    import jax

    from gflow.core import ModelConfig, count_features_flat, features
    from gflow.core._data import DataConfig, sample_fast

    s = sample_fast(DataConfig(d=3, L=30), 50, jax.random.key(0))
    for model in (ModelConfig(), ModelConfig(M=2, H=2, windows="shifted")):
        want = features(s, model, layout="counts")
        got = count_features_flat(s.X.T, 30, s.cond, model.span, want.counts.dtype)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("est", [{}, {"layout": "positions"}, {"target": "drawn"}])
def test_fresh_batch_features_are_each_seeds_sample(est):
    """SGD's fresh batch for R = 2 seeds (drawn position-major, counted for both seeds in one
    scatter) is, seed by seed, exactly ``features(sample_fast(key_r))``; with target "drawn"
    the target is the one-hot sampled x_{L+1}; ``sample_fast_time_major`` is the same draw
    as ``sample_fast`` in its own layout."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    from gflow.core import features, resolve_layout
    from gflow.core._data import sample_fast, sample_fast_time_major
    from gflow.dynamics._sgd import _fresh_features

    cfg = CFG.replace(data={"L": 20}, estimator=est)
    keys = jax.random.split(jax.random.key(4), 2)
    got = jax.jit(lambda k: _fresh_features(cfg, k, 30))(keys)
    layout = resolve_layout(cfg.estimator.layout, cfg.data.d, cfg.model)
    draw = jax.jit(lambda k: (sample_fast(cfg.data, 30, k), sample_fast_time_major(cfg.data, 30, k)))
    for r in range(2):
        s, (tokens, zq, cond, pi) = draw(keys[r])
        np.testing.assert_array_equal(np.asarray(tokens[:20].T), np.asarray(s.X))
        np.testing.assert_array_equal(np.asarray(tokens[20]), np.asarray(s.y))
        if cfg.estimator.target == "drawn":
            s = eqx.tree_at(lambda t: t.cond, s, jax.nn.one_hot(s.y, 3, dtype=s.cond.dtype))
        want = features(s, cfg.model, layout=layout, dtype=jnp.float64)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_array_equal(np.asarray(a[r]), np.asarray(b))


@pytest.mark.slow
def test_fresh_sgd_is_deterministic(loss):
    """Online SGD (fresh sequences): the same seed gives the same trajectory bit for bit,
    seed r's trajectory does not depend on how many seeds run with it, and different
    seeds differ."""
    sc = dict(eta=0.1, batch=20, steps=5, sampling="fresh", save_per_decade=1)
    r2 = sgd(CFG, SGDConfig(seeds=2, **sc), loss=loss)
    r2b = sgd(CFG, SGDConfig(seeds=2, **sc), loss=loss)
    r3 = sgd(CFG, SGDConfig(seeds=3, **sc), loss=loss)
    for x in ("w", "C", "a", "loss"):
        np.testing.assert_array_equal(getattr(r2, x), getattr(r2b, x))
        np.testing.assert_array_equal(getattr(r2, x), getattr(r3, x)[:2])
    assert r2.a[0, -1] != r2.a[1, -1]


@pytest.mark.slow
def test_sde_sigma_subsample(loss):
    """``sigma_sample = N`` is the default (Σ from the whole sample) bit for bit; a smaller M
    changes the noise only (a different path, same drift: with noise = 0 identical); M > N
    is refused naming the field."""
    sc = dict(eta=0.1, batch=10, t1=0.3, dt=0.1, seeds=2, save_per_decade=1)
    base = sde(CFG, SDEConfig(**sc), loss=loss)
    full = sde(CFG, SDEConfig(sigma_sample=loss.N, **sc), loss=loss)
    sub = sde(CFG, SDEConfig(sigma_sample=50, **sc), loss=loss)
    for x in ("w", "C", "a", "loss"):
        np.testing.assert_array_equal(getattr(base, x), getattr(full, x))
    assert np.all(base.a[:, -1] != sub.a[:, -1])
    quiet = dict(sc, noise=0.0)
    np.testing.assert_array_equal(sde(CFG, SDEConfig(**quiet), loss=loss).a,
                                  sde(CFG, SDEConfig(sigma_sample=50, **quiet), loss=loss).a)  # fmt: skip
    with pytest.raises(ValueError, match=r"sde\.sigma_sample = 201 must be <="):
        sde(CFG, SDEConfig(sigma_sample=201, **sc), loss=loss)
    with pytest.raises(ValueError, match=r"sde\.sigma_sample must be an integer >= 0"):
        SDEConfig(sigma_sample=-1)


def test_method_sgd_routes_to_gflow_sgd(loss, tmp_path):
    """``solver.method = "sgd"``: gflow.dynamics._sgd takes η from solver.eta, ⌈t1/η⌉ steps and the
    saved steps a decade from [solver], B, R and the seed from [sgd] (the same run as the explicit
    SGDConfig), refuses a contradicting SGDConfig naming the fields; gflow.integrate runs it (a
    trajectory with a seed axis: tests/test_methods.py), integrate_batch refuses it (a flow
    integrator), naming gflow run."""
    cfg = CFG.replace(schedule={"t1": 0.25}, solver={"method": "sgd", "eta": 0.1}, sgd={"batch": 50, "seeds": 2})
    run = sgd(cfg, loss=loss)
    assert run.sgd.eta == 0.1 and run.sgd.steps == 3 and run.ts[-1] == pytest.approx(0.3)
    assert run.sgd.batch == 50 and run.sgd.seeds == 2 and run.sgd.save_per_decade == 1
    same = sgd(CFG, SGDConfig(eta=0.1, steps=3, batch=50, seeds=2, save_per_decade=1), loss=loss)
    np.testing.assert_array_equal(run.a, same.a)
    with pytest.raises(ValueError, match=r"solver\.eta = 0\.1 .* sgd\.eta = 0\.2"):
        sgd(cfg, SGDConfig(eta=0.2, steps=3), loss=loss)
    with pytest.raises(ValueError, match=r"gflow\.integrate_batch integrates flows .* `gflow run CONFIG --out DIR`"):
        gflow.integrate_batch([cfg, cfg.replace(estimator={"seed": 1})])
    traj = gflow.integrate(cfg, loss=loss)
    np.testing.assert_array_equal(traj.per_seed["a"], run.a)


def test_method_sde_takes_its_settings_from_the_config(loss):
    """``solver.method = "sde"``: gflow.dynamics._sde takes η, t1 and the saved steps from the
    config, B, R and the seed from [sgd], dt, noise and Σ's sample from [sde] (the same run as the
    explicit SDEConfig); a contradicting SDEConfig is refused naming the fields."""
    cfg = CFG.replace(schedule={"t1": 0.2}, solver={"method": "sde", "eta": 0.1},
                      sgd={"batch": 10, "seeds": 2, "seed": 3}, sde={"dt": 0.05, "sigma_sample": 50})  # fmt: skip
    run = sde(cfg, loss=loss)
    same = sde(CFG, SDEConfig(eta=0.1, t1=0.2, batch=10, seeds=2, seed=3, dt=0.05, sigma_sample=50,
                              save_per_decade=1), loss=loss)  # fmt: skip
    np.testing.assert_array_equal(run.a, same.a)
    assert run.steps[-1] == 4
    with pytest.raises(ValueError, match=r"schedule\.t1 = 0\.2, .* sde\.t1 = 0\.3"):
        sde(cfg, SDEConfig(eta=0.1, t1=0.3), loss=loss)


# -- sgd.shard: the work split over devices ----------------------------------------------------

_SHARD_CHILD = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np, equinox as eqx
jax.config.update("jax_enable_x64", True)
import gflow
from gflow.core._model import init_params
from gflow.dynamics._sgd import SGDConfig, _fresh_features, _scale, sgd

cfg = gflow.config.from_dict(json.loads(sys.argv[1]))
loss = gflow.make_loss(cfg.data, cfg.model, cfg.estimator)
out = {"devices": jax.device_count(), "seeds": {}}
base = dict(eta=0.2, batch=100, steps=4, seeds=4, save_per_decade=1)
for sampling in ("fresh",):
    b = dict(base, sampling=sampling)
    r0, r1 = sgd(cfg, SGDConfig(**b), loss=loss), sgd(cfg, SGDConfig(shard="seeds", **b), loss=loss)
    out["seeds"][sampling] = max(float(np.max(np.abs(getattr(r0, f) - getattr(r1, f)))) for f in ("w", "C", "a", "loss"))
rb = sgd(cfg, SGDConfig(shard="batch", **dict(base, steps=1, seeds=2)), loss=loss)
# by hand, on one device: the mean of device j's gradient on its 50 sequences from fold_in(step key, j)
P0 = init_params(cfg.model, cfg.init)
keys = jax.vmap(lambda r: jax.random.fold_in(jax.random.key(0), r))(jnp.arange(2))
Gs = []
for j in range(2):
    ks = jax.vmap(lambda kk: jax.random.fold_in(jax.random.fold_in(kk, 0), j))(keys)
    F = jax.jit(lambda ks: _fresh_features(cfg, ks, 50))(ks)
    Gs.append(jax.vmap(lambda f: eqx.tree_at(lambda m: m.feats, loss, f).grad(P0))(F))
G = jax.tree.map(lambda a, b: (a + b) / 2, *Gs)
P1 = jax.tree.map(lambda x, s, g: x - 0.2 * s * g, P0, _scale(cfg, jnp.float64), G)
out["batch"] = max(float(np.max(np.abs(np.asarray(getattr(rb, f))[:, -1] - np.asarray(getattr(P1, f)))))
                   for f in ("w", "C", "a"))
out["batch_moved"] = float(np.max(np.abs(rb.a[:, -1] - rb.a[:, 0])))
errors = []
for bad in (dict(base, seeds=3, shard="seeds"), dict(base, batch=101, shard="batch")):
    try:
        sgd(cfg, SGDConfig(**bad), loss=loss)
    except ValueError as e:
        errors.append(str(e))
out["errors"] = errors
print("RESULT " + json.dumps(out))
"""


def test_sharded_sgd_on_two_devices():
    """On 2 forced host devices: ``sgd.shard = "seeds"`` gives every seed the trajectory of
    one device to rounding (≤ 1e-13), ``"batch"``'s first
    step is θ₀ − ηΛ times the mean of the two devices' gradients, each on its B/2 sequences
    from ``fold_in(step key, j)`` (computed here by hand on one device; ≤ 1e-15), and R or
    B not a multiple of the device count is an error naming the field."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip()
    env["JAX_PLATFORMS"] = "cpu"
    cfg = CFG.replace(data={"L": 30}, estimator={"N": 200})
    proc = subprocess.run([sys.executable, "-c", _SHARD_CHILD, json.dumps(cfg.to_dict())], env=env,
                          capture_output=True, text=True, timeout=1200)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[len("RESULT ") :])
    assert out["devices"] == 2
    assert max(out["seeds"].values()) < 1e-13, out["seeds"]
    assert out["batch"] < 1e-15 and out["batch_moved"] > 1e-4, out
    assert "sgd.shard = 'seeds' needs sgd.seeds a multiple of the 2 devices, got 3" in out["errors"][0]
    assert "sgd.shard = 'batch' needs sgd.batch a multiple of the 2 devices, got 101" in out["errors"][1]


def test_sgd_shard_settings_are_checked():
    """A bad ``sgd.shard`` names the field and the allowed values; ``"batch"`` needs fresh
    sampling."""
    with pytest.raises(ValueError, match=r"sgd.shard must be one of \('none', 'seeds', 'batch'\), got 'rows'"):
        SGDConfig(shard="rows")
    with pytest.raises(ValueError, match="sgd.shard = 'batch' splits fresh batches: it needs sgd.sampling = 'fresh'"):
        SGDConfig(shard="batch", sampling="fixed")
