"""GD's central flow (solver.method = "central", gflow.dynamics._central): the complementarity
problem, the third-derivative vectors, the flow below the edge, and the central flow against GD
past it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gflow
from gflow.config import Config
from gflow.core import StageLoss, init_params, make_loss

# the flow's default data at a small size, with a joint schedule: λ_max(ΛH) rises from 4 to about
# 480 by t ≈ 20, so GD at η = 0.1 (edge 20) reaches the edge at t ≈ 0.55
SMALL = dict(data={"L": 20}, estimator={"N": 300}, schedule={"kind": "joint", "t1": 20.0})


def _gram(D, lam):
    return np.einsum("ijn,n,kln->ijkl", D, lam, D)


def test_sdcp_one_eigenvalue_is_the_closed_form():
    for A, B in ((-0.3, 2.0), (0.4, 2.0), (-1e-3, 5e-2)):
        X = gflow.solve_sdcp(jnp.array([[A]]), jnp.array(B).reshape(1, 1, 1, 1))
        assert float(X[0, 0]) == pytest.approx(max(0.0, -2 * A / B), rel=1e-15, abs=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sdcp_two_eigenvalues_satisfy_the_complementarity(seed):
    """X ⪰ 0, M = A + ½B[X] ⪰ 0 and ⟨X, M⟩ = 0, for a Gram operator B of random vectors D_ij."""
    rng = np.random.default_rng(seed)
    n = 7
    D = rng.normal(size=(2, 2, n))
    D = 0.5 * (D + D.transpose(1, 0, 2))
    B = _gram(D, rng.uniform(0.5, 2.0, n))
    A = rng.normal(size=(2, 2))
    A = 0.5 * (A + A.T) - 0.5 * np.eye(2) * seed  # seed 0: mixed signs; 2: both directions pushed
    X = np.asarray(gflow.solve_sdcp(jnp.asarray(A), jnp.asarray(B)))
    M = A + 0.5 * np.einsum("ijkl,kl->ij", B, X)
    scale = np.abs(A).max()
    assert np.linalg.eigvalsh(X).min() >= -1e-12
    assert np.linalg.eigvalsh(M).min() >= -1e-8 * scale
    assert abs(np.sum(X * M)) <= 1e-8 * scale * max(np.abs(X).max(), 1.0)


def test_sdcp_decoupled_directions_are_two_closed_forms():
    """B acting on the diagonal entries only, independently: X = diag(max(0, −2A_ii/B_iiii))."""
    B = np.zeros((2, 2, 2, 2))
    B[0, 0, 0, 0], B[1, 1, 1, 1], B[0, 1, 0, 1], B[1, 0, 1, 0] = 3.0, 0.5, 1.0, 1.0
    A = np.diag([-0.6, 0.2])
    X = np.asarray(gflow.solve_sdcp(jnp.asarray(A), jnp.asarray(B)))
    np.testing.assert_allclose(X, np.diag([0.4, 0.0]), atol=1e-10)


def test_third_derivative_vectors_are_finite_differences_of_hessian_products():
    """∇_θ(u_iᵀ H(θ) u_j) by forward-over-forward-over-reverse against the fourth-order central
    difference of H(θ ± ε u_i) u_j, H(θ ± 2ε u_i) u_j (u held fixed)."""
    from gflow.dynamics._central import _Flat, _third

    cfg = Config().replace(**SMALL)
    loss = make_loss(cfg.data, cfg.model, cfg.estimator)
    p = init_params(cfg.model, cfg.init, d=cfg.data.d, L=cfg.data.L)
    p = p.with_blocks({"C": p.C * jnp.linspace(0.5, 1.5, p.C.shape[0]), "a": jnp.asarray(0.7)})
    moves = ("w", "C", "a")
    sl = StageLoss(loss, p, moves)
    x = {b: p.get(b) for b in moves}
    flat = _Flat.of(x)
    f = lambda v: sl(flat.unravel(v))  # noqa: E731
    v = flat.ravel(x)
    U = jnp.asarray(np.random.default_rng(0).normal(size=(v.shape[0], 2)))
    D = np.asarray(_third(f, v, U, 2))
    hvp = jax.jit(lambda th, u: jax.jvp(jax.grad(f), (th,), (u,))[1])
    eps = 1e-4
    for i in range(2):
        for j in range(2):
            h = lambda s: np.asarray(hvp(v + s * eps * U[:, i], U[:, j]))  # noqa: E731
            fd = (8 * (h(1) - h(-1)) - (h(2) - h(-2))) / (12 * eps)  # fourth order in ε
            np.testing.assert_allclose(D[i, j], fd, rtol=3e-6, atol=1e-9 * np.abs(D[i, j]).max())
    np.testing.assert_allclose(D[0, 1], D[1, 0], rtol=1e-12, atol=1e-14)


@pytest.mark.slow
def test_central_flow_below_the_edge_is_the_flow():
    """At a step whose edge 2/η is never reached the central flow integrates the flow's own field
    (in C, as the flow with joint_coords = "C"): the same trajectory to rounding."""
    cfg = Config().replace(**{**SMALL, "schedule": {"kind": "joint", "t1": 2.0}})
    loss = make_loss(cfg.data, cfg.model, cfg.estimator)
    flow = gflow.integrate(cfg.replace(solver={"joint_coords": "C"}), loss=loss)
    cf = gflow.integrate(cfg.replace(solver={"method": "central", "eta": 1e-3}), loss=loss)
    np.testing.assert_array_equal(flow.ts, cf.ts)
    for b in ("w", "C", "a"):
        np.testing.assert_allclose(getattr(cf, b), getattr(flow, b), rtol=1e-12, atol=1e-14)


def test_central_config_errors_name_the_key():
    with pytest.raises(ValueError, match=r"solver\.eta must be a finite number > 0"):
        Config().replace(solver={"method": "central", "eta": 0.0})
    with pytest.raises(ValueError, match=r"solver\.edge_eigs must be an integer >= 1"):
        Config().replace(solver={"method": "central", "edge_eigs": 0})
    with pytest.raises(ValueError, match=r"'central' cannot be mixed"):
        Config().replace(solver={"method": ["central", "tsit5", "tsit5"]})


@pytest.mark.slow
def test_central_flow_holds_the_edge_and_is_closer_to_gd_than_the_flow():
    """Past the edge (η = 0.1 from t ≈ 0.55): the central flow keeps λ_max(ΛH) at 2/η (its report's
    rows decided and passed) and stays closer to GD's θ than the flow, at GD's iterates t = 1..20."""
    times = [float(t) for t in range(1, 21)]
    cfg = Config().replace(**SMALL, solver={"save_times": times})
    loss = make_loss(cfg.data, cfg.model, cfg.estimator)
    runs = {m: gflow.integrate(cfg.replace(solver={"method": m, "eta": 0.1, "save_times": times}), loss=loss)
            for m in ("tsit5", "gd", "central")}  # fmt: skip

    def theta(tr):
        i = [int(np.flatnonzero(np.isclose(tr.ts, t, rtol=0, atol=1e-9))[0]) for t in times]
        return np.concatenate([tr.w[i].reshape(len(i), -1), tr.C[i], tr.a[i, None]], axis=1)

    gd = theta(runs["gd"])
    d_cf = np.linalg.norm(theta(runs["central"]) - gd, axis=1)
    d_gf = np.linalg.norm(theta(runs["tsit5"]) - gd, axis=1)
    # measured: mean distance 0.0110 (central) against 0.0749 (flow), at t = 20 0.0138 against 0.0919
    assert d_cf.mean() < 0.5 * d_gf.mean(), (d_cf.mean(), d_gf.mean())
    assert d_cf[-1] < 0.5 * d_gf[-1], (d_cf[-1], d_gf[-1])
    rep = gflow.check(runs["central"], loss=loss)
    rows = {r.name: r for r in rep.rows if r.name.startswith("central:")}
    assert rows["central: held eigenvalues at the edge (max |η λ_i/2 − 1|)"].passed is True
    assert rows["central: eigenvalues past the edge all held (max past − held)"].passed is True
    sp = gflow.hessian_spectrum(None, runs["tsit5"], max_times=20)
    assert sp.lam_max.max() > 10 * 20  # the flow itself goes ten times past GD's edge
