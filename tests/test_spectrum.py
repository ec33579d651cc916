"""The Hessian spectrum along a trajectory, GD's stability edge and GD's modified flow
(docs/theory/mathematics.md §M9)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gflow
from gflow.core import StageLoss
from gflow.dynamics import LogC, VectorField, block_scales, coordinate_labels, step_scales

# the issue's small problem: d = 3, L = 20, N = 400, joint
SMALL = gflow.Config().replace(data={"d": 3, "L": 20}, estimator={"N": 400},
                               schedule={"kind": "joint", "t1": 0.2}, solver={"save_per_decade": 2})  # fmt: skip
H, M, NS = 3, 3, 7
P = H * M + NS + 1


@pytest.fixture(scope="module")
def small_loss():
    return gflow.make_loss(SMALL.data, SMALL.model, SMALL.estimator)


def _flat(p):
    return np.concatenate([np.ravel(p.w), np.ravel(p.C), [float(p.a)]])


def _params(x):
    x = jnp.asarray(x)
    return gflow.Params(w=x[: H * M].reshape(H, M), C=x[H * M : -1], a=x[-1])


def _perturbed(seed=0):
    rng = np.random.default_rng(seed)
    p = gflow.init_params(SMALL.model, SMALL.init)
    x = _flat(p)
    x[: H * M] += 0.3 * rng.standard_normal(H * M)
    x[H * M : -1] *= np.exp(0.5 * rng.standard_normal(NS))
    x[-1] = 1.5
    return _params(x)


class _States:
    """Saved states as a trajectory holds them."""

    def __init__(self, ps, stage=None):
        self.ts = np.arange(len(ps), dtype=float)
        self.w = np.stack([np.asarray(p.w) for p in ps])
        self.C = np.stack([np.asarray(p.C) for p in ps])
        self.a = np.array([float(p.a) for p in ps])
        if stage is not None:
            self.stage = np.asarray(stage)


# ---------------------------------------------------------------------------
# The Hessian
# ---------------------------------------------------------------------------


def test_hessian_is_finite_difference_of_gradient(small_loss):
    """Every column of the dense Hessian is the central difference of the gradient."""
    grad = jax.jit(jax.grad(lambda y: small_loss(_params(y))))
    for p in (gflow.init_params(SMALL.model, SMALL.init), _perturbed()):
        Hm = gflow.loss_hessian(small_loss, p)
        x = jnp.asarray(_flat(p))
        h = 1e-5
        fd = np.stack([(np.asarray(grad(x.at[j].add(h))) - np.asarray(grad(x.at[j].add(-h)))) / (2 * h)
                       for j in range(P)], axis=1)  # fmt: skip
        assert np.allclose(Hm, Hm.T, rtol=0, atol=1e-12)
        err = np.max(np.abs(Hm - fd)) / np.max(np.abs(Hm))
        assert err < 1e-6, err
        # and a wrong Hessian (a column off by 1 %) is seen
        bad = Hm.copy()
        bad[:, 10] *= 1.01
        assert np.max(np.abs(bad - fd)) / np.max(np.abs(Hm)) > 1e3 * err


def test_scale_invariance_exact(small_loss):
    """L̂ depends on C only through C/‖C‖: C·∇_C L̂ = 0 and H C̃ = −(0, ∇_C L̂, 0)."""
    for p in (gflow.init_params(SMALL.model, SMALL.init), _perturbed(1)):
        g = small_loss.grad(p)
        C, gC = np.asarray(p.C), np.asarray(g.C)
        assert abs(C @ gC) <= 1e-13 * np.linalg.norm(C) * np.linalg.norm(gC)
        Hm = gflow.loss_hessian(small_loss, p)
        Ct = np.zeros(P)
        Ct[H * M : -1] = C
        want = np.zeros(P)
        want[H * M : -1] = -gC
        assert np.max(np.abs(Hm @ Ct - want)) <= 1e-10 * np.linalg.norm(gC)


def test_quadratic_spectrum_and_gd_edge():
    """On L = ½θᵀAθ the spectrum of Λ^{1/2}AΛ^{1/2} is the known one, and GD diverges just
    above η_c = 2/λ_max and converges just below."""
    rng = np.random.default_rng(3)
    Q, _ = np.linalg.qr(rng.standard_normal((P, P)))
    lam = np.sort(rng.uniform(0.1, 5.0, P))[::-1]
    A = Q @ np.diag(lam) @ Q.T
    quad = lambda p: 0.5 * (lambda x: x @ jnp.asarray(A) @ x)(  # noqa: E731
        jnp.concatenate([jnp.ravel(p.w), p.C, jnp.reshape(p.a, (1,))]))
    p = _perturbed(2)
    assert np.allclose(np.linalg.eigvalsh(gflow.loss_hessian(quad, p))[::-1], lam, rtol=1e-12, atol=1e-12)
    # a joint Λ = diag(η_w, η_C, η_a): the eigenvalues of ΛA
    cfg = SMALL.replace(schedule={"eta_w": 0.5, "eta_C": 2.0, "eta_a": 0.25})
    s = step_scales(cfg, "joint")
    sp = gflow.hessian_spectrum(cfg, _States([p, _perturbed(4)]), loss=quad)
    known = np.sort(np.linalg.eigvals(np.diag(s) @ A).real)[::-1]
    assert sp.eigvals.shape == (2, P)
    assert np.allclose(sp.eigvals[0], known, rtol=1e-10) and np.allclose(sp.eigvals[1], known, rtol=1e-10)
    eta_c = float(sp.eta_c[0])
    assert eta_c == pytest.approx(2.0 / known[0])
    x0 = _flat(p)
    for factor, grows in ((1.02, True), (0.98, False)):
        x = x0.copy()
        for _ in range(3000):
            x = x - factor * eta_c * s * (A @ x)
        ratio = np.linalg.norm(x) / np.linalg.norm(x0)
        assert (ratio > 1e3) if grows else (ratio < 1e-3), (factor, ratio)


def test_spectrum_staged_masks_and_vectors(small_loss):
    """A staged run's Λ is the stage's mask: Stage I's spectrum is η_C times the C-block's,
    Stage II η_w times the w-block's, Stage III η_a ∂²L̂/∂a²; the rest exact zeros; the top
    eigenvectors live in the moving block."""
    cfg = SMALL.replace(schedule={"kind": "staged", "eta_w": 0.5, "eta_C": 2.0, "eta_a": 3.0})
    ps = [_perturbed(5), _perturbed(6), _perturbed(7)]
    sp = gflow.hessian_spectrum(cfg, _States(ps, stage=[1, 2, 3]), loss=small_loss, vectors=2)
    blocks = {"I": (slice(H * M, P - 1), 2.0), "II": (slice(0, H * M), 0.5), "III": (slice(P - 1, P), 3.0)}
    assert list(sp.stage) == ["I", "II", "III"]
    for k, p in enumerate(ps):
        sl, eta = blocks[sp.stage[k]]
        Hm = gflow.loss_hessian(small_loss, p)
        sub = np.linalg.eigvalsh(eta * Hm[sl, sl])[::-1]
        n = sub.size
        ev = sp.eigvals[k]
        assert np.sum(ev == 0.0) >= P - n
        assert np.allclose(np.sort(ev[ev != 0]), np.sort(sub[np.abs(sub) > 0]), rtol=1e-9, atol=1e-14)
        assert sp.lam_max[k] == pytest.approx(max(sub.max(), 0.0), rel=1e-9)
        moving = {"I": "C", "II": "w", "III": "a"}[sp.stage[k]]
        assert sp.top_block[k, 0] == moving
        bw = sp.block_weights[k, 0]
        assert bw[["w", "C", "a"].index(moving)] == pytest.approx(1.0, abs=1e-12)
    assert sp.labels == coordinate_labels(cfg) and sp.labels[H * M] == "C∅" and sp.labels[-1] == "a"


def test_spectrum_seed_axis_and_rows(small_loss):
    """States with a leading seed axis (SGD's runs) give one spectrum per seed; indices select rows."""
    ps = [_perturbed(8), _perturbed(9), _perturbed(10)]

    class Seeds:
        ts = np.arange(3.0)
        w = np.stack([np.stack([np.asarray(p.w) for p in ps])] * 2)
        C = np.stack([np.stack([np.asarray(p.C) for p in ps])] * 2)
        a = np.stack([np.array([float(p.a) for p in ps])] * 2)

    Seeds.C[1] *= 3.0  # the second seed: C scaled, so its C-block eigenvalues scale by 1/9
    sp = gflow.hessian_spectrum(SMALL, Seeds, loss=small_loss, indices=[0, 2])
    assert sp.eigvals.shape == (2, 2, P) and list(sp.index) == [0, 2]
    one = gflow.hessian_spectrum(SMALL, _States([ps[0], ps[2]]), loss=small_loss)
    assert np.allclose(sp.eigvals[0], one.eigvals, rtol=1e-12, atol=1e-15)
    with pytest.raises(ValueError, match="indices"):
        gflow.hessian_spectrum(SMALL, Seeds, loss=small_loss, indices=[5])
    with pytest.raises(ValueError, match="vectors"):
        gflow.hessian_spectrum(SMALL, Seeds, loss=small_loss, vectors=-1)


# ---------------------------------------------------------------------------
# The modified flow
# ---------------------------------------------------------------------------


def test_modified_config_validation():
    assert gflow.Config().replace(solver={"method": "modified", "eta": 0.0}).solver.models_gd
    with pytest.raises(ValueError, match=r"solver\.eta.*> 0"):
        gflow.Config().replace(solver={"method": "gd", "eta": 0.0})
    with pytest.raises(ValueError, match=r"solver\.eta.*>= 0 with solver.method = 'modified'"):
        gflow.Config().replace(solver={"method": "modified", "eta": -0.1})
    with pytest.raises(ValueError, match=r"solver\.method.*'modified' cannot be mixed"):
        gflow.Config().replace(solver={"method": ["modified", "tsit5", "tsit5"]})
    with pytest.raises(ValueError, match=r"solver\.method must be one of .*'modified'"):
        gflow.Config().replace(solver={"method": "modfied"})


def test_modified_field_norm_identity(small_loss):
    """The modified field in θ (and pushed to log|C|): 2C·Ċ = η λ_C² ‖∇_C L̂‖² exactly, and
    the field is −Λg − (η/2)ΛHΛg with the dense Hessian."""
    cfg = SMALL.replace(schedule={"eta_w": 0.7, "eta_C": 0.5, "eta_a": 1.3})
    eta = 0.3
    p = _perturbed(11)
    moves = ("w", "C", "a")
    sl = StageLoss(small_loss, p, moves)
    sc = block_scales(cfg, moves, jnp.float64)
    vf = VectorField(stage_loss=sl, scale=sc, eta_mod=jnp.asarray(eta))
    f = vf.theta_field({"w": p.w, "C": p.C, "a": p.a})
    g = small_loss.grad(p)
    lamC = 0.5
    lhs = 2 * float(jnp.dot(p.C, f["C"]))
    rhs = eta * lamC**2 * float(jnp.sum(g.C**2))
    assert lhs == pytest.approx(rhs, rel=1e-10)
    s = step_scales(cfg, "joint")
    Hm = gflow.loss_hessian(small_loss, p)
    gx = _flat(g)
    want = -s * gx - 0.5 * eta * s * (Hm @ (s * gx))
    assert np.allclose(np.concatenate([np.ravel(f["w"]), f["C"], [float(f["a"])]]), want, rtol=1e-9, atol=1e-14)
    # in log coordinates: dℓ/dt = Ċ/C
    sign, ell = LogC.to_log(np.asarray(p.C))
    vl = VectorField(stage_loss=sl, scale=sc, sign_C=jnp.asarray(sign), eta_mod=jnp.asarray(eta))
    fl = vl(0.0, {"w": p.w, "C": jnp.asarray(ell), "a": p.a}, None)
    assert np.allclose(np.asarray(fl["C"]) * np.asarray(p.C), np.asarray(f["C"]), rtol=1e-12, atol=0)


def test_modified_eta0_is_flow(small_loss):
    """With η = 0 the modified flow is the flow (joint: log coordinates)."""
    flow = gflow.integrate(SMALL, loss=small_loss)
    mod = gflow.integrate(SMALL.replace(solver={"method": "modified", "eta": 0.0}), loss=small_loss)
    assert np.array_equal(flow.ts, mod.ts)
    for b in ("w", "C", "a"):
        assert np.allclose(getattr(mod, b), getattr(flow, b), rtol=1e-13, atol=1e-16)
    # the flow conserves ‖C‖ (within its tolerance); the modified flow at η > 0 does not
    n = np.linalg.norm(mod.C, axis=1)
    assert np.max(np.abs(n / n[0] - 1)) < 1e-7


def test_modified_norm_growth_along_trajectory(small_loss):
    """Along a modified-flow trajectory, ‖C(t)‖² − ‖C(0)‖² = ∫ η λ_C² ‖∇_C L̂‖² dt (GD's
    identity per unit time), within the solver's tolerance; GD grows ‖C‖² the same way."""
    lamC, eta = 0.5, 0.05
    cfg = SMALL.replace(schedule={"eta_C": lamC, "t1": 1.0},
                        solver={"method": "modified", "eta": eta, "save_per_decade": 40, "tau_min": 1e-4,
                                "rtol": 1e-10, "atol": 1e-12})  # fmt: skip
    tr = gflow.integrate(cfg, loss=small_loss)
    n2 = np.sum(tr.C**2, axis=1)
    rate = eta * lamC**2 * np.sum(tr.grad_C**2, axis=1)
    from scipy.interpolate import CubicSpline

    grown = CubicSpline(tr.ts, rate).antiderivative()(tr.ts)
    assert n2[-1] - n2[0] > 1e-3 * n2[0]  # it does grow
    assert np.max(np.abs((n2 - n2[0]) - grown)) < 1e-5 * (n2[-1] - n2[0])
    # a wrong law (without λ_C², or with η/2) is rejected
    assert np.max(np.abs((n2 - n2[0]) - grown / lamC**2)) > 0.1 * (n2[-1] - n2[0])


def _orders(loss, etas, t):
    base = SMALL.replace(schedule={"t1": t}, solver={"save_per_decade": 1})
    tight = {"rtol": 1e-12, "atol": 1e-14, "save_per_decade": 1}
    flow = gflow.integrate(base.replace(solver=tight), loss=loss)
    end = lambda tr: np.concatenate([tr.w[-1].ravel(), tr.C[-1], [tr.a[-1]]])  # noqa: E731
    d_flow, d_mod = [], []
    for eta in etas:
        gd = gflow.integrate(base.replace(solver={"method": "gd", "eta": eta}), loss=loss)
        mod = gflow.integrate(base.replace(solver={**tight, "method": "modified", "eta": eta}), loss=loss)
        assert gd.ts[-1] == pytest.approx(t) and mod.ts[-1] == pytest.approx(t)
        d_flow.append(np.linalg.norm(end(gd) - end(flow)))
        d_mod.append(np.linalg.norm(end(gd) - end(mod)))
    k_flow = np.polyfit(np.log(etas), np.log(d_flow), 1)[0]
    k_mod = np.polyfit(np.log(etas), np.log(d_mod), 1)[0]
    return k_flow, k_mod, d_flow, d_mod


def test_gd_orders_to_flow_and_modified_flow(small_loss):
    """Below the stability edge (η_c ≈ 0.5 here), GD is O(η) from the flow and O(η²) from
    the modified flow."""
    p0 = gflow.init_params(SMALL.model, SMALL.init)
    eta_c = 2.0 / np.linalg.eigvalsh(gflow.loss_hessian(small_loss, p0))[-1]
    etas = [0.2 / 125, 0.2 / 250, 0.2 / 500, 0.2 / 1000]
    assert max(etas) < 0.01 * eta_c
    k_flow, k_mod, d_flow, d_mod = _orders(small_loss, etas, 0.2)
    assert abs(k_flow - 1.0) < 0.05, (k_flow, d_flow)
    assert abs(k_mod - 2.0) < 0.1, (k_mod, d_mod)
    assert all(m < 0.01 * f for m, f in zip(d_mod, d_flow))


@pytest.mark.slow
def test_gd_orders_issue_range(small_loss):
    """The issue's range: η from 4·10⁻⁴ to 5·10⁻⁵ gave orders 1.00 and 2.00."""
    k_flow, k_mod, _, _ = _orders(small_loss, [4e-4, 2e-4, 1e-4, 5e-5], 0.2)
    assert abs(k_flow - 1.0) < 0.03 and abs(k_mod - 2.0) < 0.05, (k_flow, k_mod)


@pytest.mark.slow
def test_modified_staged_eta0_is_flow(small_loss):
    """The staged schedule's modified flow at η = 0 is the staged flow (stages, events)."""
    cfg = SMALL.replace(schedule={"kind": "staged", "durations": [20.0, 2.0, 2.0]})
    flow = gflow.integrate(cfg, loss=small_loss)
    mod = gflow.integrate(cfg.replace(solver={"method": "modified", "eta": 0.0}), loss=small_loss)
    assert [(r.name, r.ended_by) for r in mod.stages] == [(r.name, r.ended_by) for r in flow.stages]
    assert mod.stages[0].ended_by == "event"
    for b in ("w", "C", "a"):
        assert np.allclose(getattr(mod, b), getattr(flow, b), rtol=1e-12, atol=1e-15)
    # at η > 0 Stage I's ‖C‖ grows (the checks' norm row is informational for it)
    mod2 = gflow.integrate(cfg.replace(solver={"method": "modified", "eta": 0.1}), loss=small_loss)
    i = np.flatnonzero(mod2.stage == 1)
    n = np.linalg.norm(mod2.C[i], axis=1)
    assert n[-1] > n[0] * (1 + 1e-4)


# ---------------------------------------------------------------------------
# The run layer and the figure
# ---------------------------------------------------------------------------


def test_run_spectrum_saved_and_drawn(tmp_path, small_loss):
    """A GD run's folder: spectrum.npz computed once and reused; sharpness.png drawn with 2/η."""
    from gflow.figures import plot_sharpness
    from gflow.runs import run_spectrum, saved_spectrum

    cfg = SMALL.replace(schedule={"t1": 1.0}, solver={"method": "gd", "eta": 0.05, "save_per_decade": 3})
    out = tmp_path / "gd"
    tr = gflow.integrate(cfg, out=out, loss=small_loss)
    assert saved_spectrum(out, tr) is None
    sp = run_spectrum(out, tr, max_times=5, loss=small_loss)
    assert (out / "spectrum.npz").is_file() and len(sp.index) == 5 and sp.eta == 0.05
    again = saved_spectrum(out, tr, max_times=5)
    assert again is not None and np.array_equal(again.eigvals, sp.eigvals) and again.eta == 0.05
    assert saved_spectrum(out, tr, max_times=6) is None
    direct = gflow.hessian_spectrum(cfg, tr, loss=small_loss, indices=sp.index)
    assert np.allclose(direct.lam_max, sp.lam_max, rtol=1e-12)
    fig = plot_sharpness(tr, sp)
    ax = fig.axes[0]
    assert any(np.allclose(line.get_ydata(), 2 / 0.05) for line in ax.get_lines())
    # the edge over the whole run: the smallest 2/λ_max and where, drawn and quoted with the method
    k = int(np.argmin(sp.eta_c))
    assert sp.eta_c_min == float(np.min(2 / sp.lam_max)) and sp.where_eta_c_min == (float(sp.ts[k]), "joint")
    title = fig._suptitle.get_text()
    assert "(GD (η = 0.05))" in title and f"min over the run η_c = 2/λ_max = {sp.eta_c_min:.3g}" in title
    assert ax.get_title().startswith("joint GD (η = 0.05)")
    stars = [ln for ln in ax.get_lines() if ln.get_marker() == "*"]
    if sp.ts[k] > 0:
        assert len(stars) == 1 and np.allclose(stars[0].get_ydata(), 2 / sp.eta_c_min) and "(★)" in title
    else:
        assert not stars and "left of the log axis" in title
    from gflow.figures import draw_run

    paths = draw_run(out, tmp_path / "figs", traj=tr, spectrum=saved_spectrum(out, tr))
    assert paths[-1].name == "sharpness.png" and paths[-1].is_file()


@pytest.mark.parametrize("member, layout", [("paper", "positions"),
                                            pytest.param("full", "vectors", marks=pytest.mark.slow)])  # fmt: skip
def test_hessian_vector_products_batched_to_a_memory_budget(monkeypatch, member, layout):
    """A loss without the κ table's second derivatives (the positions layout; the Full model in
    any layout) takes one HVP per moving coordinate: batched to fit the budget (:func:`hvp_batch`,
    from XLA's memory analysis of one compiled HVP), the Hessian is the one of all HVPs at once,
    and its finite differences. (The Full model's case, about 100 HVPs, compiles for a minute.)"""
    from gflow.dynamics import _spectrum as sp

    cfg = gflow.Config().replace(data={"L": 8}, model={"member": member}, estimator={"N": 20, "layout": layout},
                                 schedule={"kind": "joint"})  # fmt: skip
    loss = gflow.make_loss(cfg.data, cfg.model, cfg.estimator)
    p = gflow.init_params(cfg.model, cfg.init, d=cfg.data.d, L=cfg.data.L)
    theta = sp.flatten(p)
    P = theta.shape[0]
    cols = tuple(range(P))
    H, M = p.w.shape
    shapes = tuple((b, tuple(np.shape(p.get(b)))) for b in p.names) if p.x else None
    assert sp.hvp_batch(loss, theta, cols, H, M, shapes, budget=1) == 1
    assert sp.hvp_batch(loss, theta, cols, H, M, shapes, budget=10**15) == P
    at_once = sp.loss_hessian(loss, p)
    monkeypatch.setattr(sp, "HVP_MEMORY", 1)  # one HVP at a time
    one_by_one = sp.loss_hessian(loss, p)
    np.testing.assert_allclose(one_by_one, at_once, rtol=1e-10, atol=1e-12)
    # against central differences of the gradient along one coordinate
    g = jax.grad(lambda x: loss(sp.unflatten(x, H, M, like=None if shapes is None else sp._like(shapes))))
    for j in (P - 1,):
        e = jnp.zeros(P).at[j].set(1e-5)
        fd = (np.asarray(g(theta + e)) - np.asarray(g(theta - e))) / 2e-5
        np.testing.assert_allclose(at_once[:, j], fd, rtol=1e-5, atol=1e-7)


def test_sharpness_by_lanczos_is_the_dense_spectrums_top_eigenvalue():
    """``gflow.dynamics.sharpness`` (what a GD run's report reads): for a loss without the κ table's
    Hessian (absolute positions, the positions layout) its warm-started Lanczos λ_max equals the
    dense spectrum's at every saved state of a short GD run to 1e-10 relative, with LANCZOS_STEPS
    Hessian-vector products per state instead of one per moving coordinate, the same numbers again
    on a second call, and GD's edge 2/λ_max the spectrum's; for the paper's model in the counts
    layout it is the κ table's spectrum exactly. Bad steps and a seed axis are refused by name."""
    from gflow.dynamics import LANCZOS_STEPS, hessian_spectrum, sharpness

    base = {"data": {"d": 3, "L": 12}, "estimator": {"N": 100}, "schedule": {"kind": "joint", "t1": 2.0},
            "solver": {"method": "gd", "eta": 0.05}}  # fmt: skip
    cfg = gflow.Config().replace(model={"member": "absolute"}, **base)
    traj = gflow.integrate(cfg)
    loss = gflow.make_loss(cfg.data, cfg.model, cfg.estimator)
    sh = sharpness(None, traj, loss=loss)
    sp = hessian_spectrum(None, traj, loss=loss)
    n = int(np.count_nonzero(sp.scales[0]))
    assert n > LANCZOS_STEPS and sh.hvps == LANCZOS_STEPS and len(sh.ts) == len(traj.ts) > 5
    np.testing.assert_allclose(sh.lam_max, sp.lam_max, rtol=1e-10)
    np.testing.assert_array_equal(sharpness(None, traj, loss=loss).lam_max, sh.lam_max)
    assert sh.eta_c_min == pytest.approx(sp.eta_c_min, rel=1e-10)
    paper = gflow.Config().replace(**base)
    ptraj = gflow.integrate(paper)
    ploss = gflow.make_loss(paper.data, paper.model, paper.estimator)
    np.testing.assert_array_equal(sharpness(None, ptraj, loss=ploss).lam_max, hessian_spectrum(None, ptraj, loss=ploss).lam_max)
    with pytest.raises(ValueError, match="steps must be an integer >= 2"):
        sharpness(None, traj, loss=loss, steps=1)
