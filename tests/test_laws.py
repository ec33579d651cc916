"""Laws per model (gflow.theory._laws; docs/theory/mathematics.md §M8.7): Stage I rates for either norm,
the GIH of both norms, the ce_on_probs GIH law and its tail."""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gflow
from gflow.config import from_dict
from gflow.core import _paper as gmodel
from gflow.core._loss import StageLoss, make_loss
from gflow.core._model import Params, init_params
from gflow.dynamics._solve import VectorField
from gflow.theory import _laws as laws
from gflow.theory._theory import make_gih, stage1_rates


def _setup(norm, *, L=20, N=400, parents=(1, 2), loss="log", layout="auto", member="paper", **init):
    cfg = from_dict({"data": {"d": 3, "L": L, "parents": list(parents)}, "model": {"norm": norm, "member": member},
                     "estimator": {"N": N, "loss": loss, "layout": layout}, "init": init})  # fmt: skip
    return cfg, make_loss(cfg.data, cfg.model, cfg.estimator), init_params(cfg.model, cfg.init, d=3, L=L)


def _rates_and_short_flow(loss, p, eta=2.5, h=1e-4):
    """The exact Stage I rates at t = 0 (η_C = `eta`) and the flow's own rate differences
    d/dt log(c_S²/c_S'²), by Richardson-extrapolated finite differences (O(h²)) of a Tsit5
    integration of Stage I's vector field to t = h and 2h at rtol 1e-13."""
    ex = laws.stage1_rates_exact(loss, p, rate=eta)
    vf = VectorField(stage_loss=StageLoss(loss, p, ("C",)), scale={"C": jnp.asarray(eta)})
    sol = diffrax.diffeqsolve(diffrax.ODETerm(vf), diffrax.Tsit5(), 0.0, 2 * h, h / 8, {"C": p.C},
                              saveat=diffrax.SaveAt(ts=[h, 2 * h]),
                              stepsize_controller=diffrax.PIDController(rtol=1e-13, atol=1e-16))  # fmt: skip
    logc = lambda C: np.log(np.asarray(C, np.float64) ** 2)
    l0, l1, l2 = logc(p.C), logc(sol.ys["C"][0]), logc(sol.ys["C"][1])
    r_fd = (4 * l1 - l2 - 3 * l0) / (2 * h)
    return ex, r_fd[:, None] - r_fd[None, :]


@pytest.mark.parametrize("norm", [pytest.param("sum", marks=pytest.mark.slow), "layer"])
def test_stage1_rates_equal_flow_at_t0(norm):
    """The exact rates d/dt log(c_S/c_S') at t = 0 equal the flow's own, measured by
    Richardson-extrapolated finite differences of a very short integration of the
    flow's vector field (Stage I, η_C = 2.5)."""
    _cfg, loss, p = _setup(norm)
    ex, diff_fd = _rates_and_short_flow(loss, p)
    scale = np.max(np.abs(ex.diff))
    assert np.max(np.abs(diff_fd - ex.diff)) < 1e-6 * scale
    # the paired SEs are those of per-sequence differences: positive off the diagonal
    assert np.all(ex.diff_se[~np.eye(len(ex.sets), dtype=bool)] > 0)


@pytest.mark.parametrize("member", ["residual"] + [pytest.param(m, marks=pytest.mark.slow) for m in ("linear_output", "token")])
def test_member_stage1_rates_equal_flow_at_t0(member):
    """Any member: the rates d/dt log(c_S²/c_S'²) at t = 0 that gflow computes from the member's
    own loss (its G, :func:`stage1_rates_exact`) equal the member's own flow, measured by
    Richardson-extrapolated finite differences of a very short integration (Stage I moves C,
    η_C = 2.5; d = 3, L = 20, N = 400). Measured: 2.5·10⁻¹¹ (residual), 1.7·10⁻¹¹
    (linear_output), 3.5·10⁻¹¹ (token) of the largest rate difference."""
    cfg, loss, p = _setup("sum", member=member)
    assert gflow.core.member_of(cfg.model).stage_moves["I"] == ("C",)
    ex, diff_fd = _rates_and_short_flow(loss, p)
    scale = np.max(np.abs(ex.diff))
    assert scale > 1.0  # the sets' rates differ: a comparison that can fail
    assert np.max(np.abs(diff_fd - ex.diff)) < 1e-6 * scale


def test_residual_token_component_stage3_force_is_the_gih_law():
    """The generic Stage III force F(a) = −∂L̂(θ, a)/∂a, by automatic differentiation of a member's
    own loss (the one the report's member-law rows use), against a closed form: the residual
    member's set {0,2} (the residual stream's token component reads offset 1, head 2 offset 2),
    with one-hot copiers (gap 1000) and c = e_S, is the GIH of offsets {1,2}, whose force the paper
    gives in closed form. Measured: 1.4·10⁻¹⁴ on a ∈ [0, 12] (d = 3, L = 20, N = 400); the GIH of
    {2} alone, the answer a model without the token component would give, is far off."""
    from gflow.checks._base import model_force_grid
    from gflow.theory import gih_force

    cfg, loss, _ = _setup("sum", member="residual")
    p = _onehot_params(cfg.model, (0, 2), 1000.0, 0.0)  # head h on offset h, c = e_{0,2}
    ag = jnp.linspace(0.0, 12.0, 13)
    F = np.asarray(model_force_grid(loss, p.w, p.C, ag))
    gih = np.asarray(gih_force(make_gih(loss, (1, 2)), ag))
    assert np.max(np.abs(F - gih)) < 1e-12 * np.max(np.abs(gih))
    other = np.asarray(gih_force(make_gih(loss, (2,)), ag))
    assert np.max(np.abs(F - other)) > 1e-3


@pytest.mark.slow
def test_linear_output_is_a_one_temperature_model_along_its_flow():
    """The ``linear_output`` member's closed form (its docstring): ``p = softmax(W_O ŷ_att)`` with
    ``ŷ_att`` a probability vector, so adding ``β11ᵀ`` to W_O adds β to every logit and changes
    nothing: (i) the gradient in W_O sums to 0 over its entries at every saved time, so the flow
    conserves that sum (d at the start ``W_O = I``); (ii) with the relabelling average
    (``estimator.relabel``: the loss is symmetric under permutations of the tokens) W_O stays in
    span{I, 11ᵀ}; together, ``W_O(t) = I + (ω(t) − 1)(I − 11ᵀ/d)`` exactly, one temperature
    ω = diagonal − off-diagonal. Measured (d = 3, L = 12, N = 100, staged, Stage III to τ = 200):
    the entries' spreads and the sum's drift ≤ 10⁻¹⁴, ω 1 → 4.2 (off-diagonal −1.06); the same
    flow without the relabelling spreads the diagonal by 0.2 and the off-diagonal by 0.9 (at
    L = 20, N = 200: a test that can fail)."""
    cfg = gflow.Config().replace(model={"member": "linear_output"}, data={"L": 12},
                                 estimator={"N": 100, "relabel": True}, schedule={"durations": [1000.0, 1e10, 200.0]})  # fmt: skip
    tr = gflow.integrate(cfg)
    assert tr.status == "complete"
    O = np.asarray(tr.array("x_O")).reshape(-1, 3, 3)
    g = np.asarray(tr.array("grad_x_O")).reshape(-1, 3, 3)
    off = ~np.eye(3, dtype=bool)
    diag = np.stack([np.diag(o) for o in O])
    assert np.max(np.abs(g.sum((1, 2)))) <= 1e-12 * np.max(np.abs(g))
    offd = O[:, off]
    assert np.max(diag.max(1) - diag.min(1)) < 1e-12 and np.max(offd.max(1) - offd.min(1)) < 1e-12
    assert np.max(np.abs(O.sum((1, 2)) - 3.0)) < 1e-12  # the sum of the entries, conserved
    omega = diag[:, 0] - offd[:, 0]
    np.testing.assert_allclose(O, np.eye(3) + (omega - 1)[:, None, None] * (np.eye(3) - 1 / 3), atol=1e-12)
    assert omega[0] == 1.0 and omega[-1] > 2.0  # ω moved: the form is not the trivial one


def test_small_a_rates_sum_norm_are_the_J_linearisation():
    """norm="sum": 2 a η_C ∂G/∂C_S / C_S differences = 4 a η_C (J(S) − J(S'))/‖C‖², to rounding."""
    _cfg, loss, p = _setup("sum")
    a, eta = 0.01, 1.7
    sm = laws.stage1_rates_small_a(loss, p.w, p.C, a, rate=eta)
    J = stage1_rates(loss, p.w).J
    lin = 4 * a * eta * (J[:, None] - J[None, :]) / float(jnp.sum(p.C**2))
    np.testing.assert_allclose(sm.diff, lin, rtol=1e-10, atol=1e-12 * np.abs(lin).max())


def test_full_member_rates_of_sets_outside_the_normaliser_are_their_linear_coefficients():
    """The Full model (norm="sum") normalises κ by the sets without the token component, so a
    set holding it has no c = e_S (Σc = 0; J was NaN and `gflow theory` failed). Its J is its
    coefficient in G(c) = −∂L̂/∂a|_{a=0} = Σ_S c_S J(S) / Σ_{S∌0} c_S: checked against G computed
    directly at a random C that weights every set (to 10⁻¹⁰ relative), and those J vanish (the
    token sets' kernel is the 10⁻²⁴ floor). The small-a Stage I flow selects argmax G."""
    _cfg, loss, p = _setup("sum", member="full", N=200)
    rates = stage1_rates(loss, p.first_layer)
    assert np.all(np.isfinite(rates.J))
    norm = np.asarray(gflow.core.member_of(loss.model).normalising())
    assert not norm.all() and np.all(np.abs(rates.J[~norm]) < 1e-12)
    C = jax.random.uniform(jax.random.key(3), (len(rates.sets),), jnp.float64, 0.2, 1.0)
    mean_loss = lambda a: jnp.mean(loss.per_sequence(Params.assemble(p.first_layer, C, a)))
    G = -float(jax.grad(mean_loss)(jnp.zeros((), jnp.float64)))
    c = np.asarray(C, np.float64) ** 2
    np.testing.assert_allclose(G, float(c @ rates.J / c[norm].sum()), rtol=1e-10)
    # the small-a flow of a·G reaches its event on the shares over the normalising sets (over every
    # set it could not: the token sets' C stays frozen at a zero gain, and the check's Stage I rows
    # of a Full run integrated it to τ = 10⁸); its winner is argmax G, the linear G's vertex
    pred = laws.predict_selection(loss, p.first_layer, p.C, 0.01)
    assert pred.selected == rates.sets[int(np.argmax(rates.J))]
    assert pred.c_frac.max() == pytest.approx(0.99, abs=1e-6) and np.all(pred.c_frac[~norm] == 0)


def test_small_a_rates_layer_norm_first_order_in_a():
    """norm="layer": exact rates − small-a rates = O(a²) (rates are O(a)): the relative gap
    falls 10× when a falls 10×; and the layer-norm rates are not the J linearisation."""
    gaps = []
    for a0 in (1e-2, 1e-3):
        _cfg, loss, p = _setup("layer", a0=a0)
        ex = laws.stage1_rates_exact(loss, p)
        sm = laws.stage1_rates_small_a(loss, p.w, p.C, a0)
        gaps.append(np.max(np.abs(ex.diff - sm.diff)) / np.max(np.abs(ex.diff)))
    order = np.log10(gaps[0] / gaps[1])
    assert 0.9 < order < 1.1, gaps
    J = stage1_rates(loss, p.w).J
    lin = 4 * 1e-3 * (J[:, None] - J[None, :]) / float(jnp.sum(p.C**2))
    assert np.max(np.abs(lin - sm.diff)) > 0.05 * np.max(np.abs(sm.diff))


def test_selector_gain_sum_norm_is_linear_in_c():
    """G(c) = Σ (c_S/Σc) J(S) for norm="sum", at a random C."""
    _cfg, loss, p = _setup("sum")
    C = jnp.asarray(np.random.default_rng(0).uniform(0.1, 1.0, p.C.shape))
    G, _ = laws.selector_gain(loss, p.w, C)
    J = stage1_rates(loss, p.w).J
    c = np.asarray(C) ** 2
    assert abs(G - float(np.dot(c / c.sum(), J))) < 1e-12 * abs(G)


# ---------------------------------------------------------------------------
# GIH of both norms
# ---------------------------------------------------------------------------


def _onehot_params(model, S, gap, a, *, w_minus=0.0):
    w = np.full((model.H, model.M), w_minus)
    for h in range(1, model.H + 1):
        w[h - 1, h - 1] = gap
    C = np.zeros(len(model.subsets))
    C[model.subsets.index(tuple(S))] = 1.0
    return Params(w=jnp.asarray(w), C=jnp.asarray(C), a=jnp.asarray(a))


@pytest.mark.parametrize("layout", ["counts", "positions"])
@pytest.mark.parametrize("S", [(), (1,), (2,), (1, 2), (1, 3)])
def test_gih_both_norms_exact_onehot(S, layout):
    """With exactly one-hot copiers (logit gap 1000: the other weights are 0.0 in float64)
    and c = e_S, both norms give the GIH's per-sequence loss, to rounding; at positions
    l ≤ max(S) the layer norm's ‖φ_l‖ = 0 and the code's floor gives κ_l = 0, as the sum norm."""
    out = {}
    for norm in ("sum", "layer"):
        cfg, loss, _ = _setup(norm, layout=layout)
        p = _onehot_params(cfg.model, S, 1000.0, 1.3)
        out[norm] = np.asarray(loss.per_sequence(p))
    gih = make_gih(loss, S)
    ref = np.asarray(gih.per_sequence_loss(1.3))
    np.testing.assert_allclose(out["sum"], ref, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(out["layer"], ref, rtol=1e-12, atol=1e-13)


def test_layer_norm_near_onehot_partial_window_is_a_cosine():
    """For a copier only near one-hot (gap 40, equal small weights), the layer-norm κ_l at
    l ≤ max(S) is the cosine of the partial windows (laws.partial_window_kernel), O(1),
    while the sum norm's tends to 0; on full windows both are the match indicator."""
    model = gflow.core.ModelConfig(norm="layer")
    msum = gflow.core.ModelConfig(norm="sum")
    rng = np.random.default_rng(3)
    checked = 0
    for _ in range(20):
        X = jnp.asarray(rng.integers(0, 3, size=12))
        for S in [(1, 2), (2, 3), (3,)]:
            p = _onehot_params(model, S, 40.0, 0.0)
            G, Gs = gmodel.match_tensors(X, 3, self_match=True)
            kl = np.asarray(gmodel.kappa(p, G, Gs, model))
            ks = np.asarray(gmodel.kappa(p, G, None, msum))
            for ll in range(1, 13):
                if ll <= max(S):
                    pred = laws.partial_window_kernel(np.asarray(X), S, ll, 3)
                    assert abs(kl[ll - 1] - pred) < 1e-12
                    assert abs(ks[ll - 1]) < 1e-15
                    checked += pred > 0
                else:
                    match = float(all(X[12 - h] == X[ll - 1 - h] for h in S))
                    assert abs(kl[ll - 1] - match) < 1e-12 and abs(ks[ll - 1] - match) < 1e-12
    assert checked > 5  # the partial-window cosine is really non-zero somewhere


# ---------------------------------------------------------------------------
# ce_on_probs
# ---------------------------------------------------------------------------


def test_ce_on_probs_gih_force_is_minus_dloss_da():
    """F(a) of the ce_on_probs GIH equals −dL_GIH/da by central differences."""
    _cfg, loss, _ = _setup("sum", loss="ce_on_probs", N=300)
    gih = make_gih(loss, (1, 2))
    assert gih.kind == "ce_on_probs"
    h = 1e-4
    Lf, Ff = eqx.filter_jit(gih.loss), eqx.filter_jit(gih.force)
    for a in (0.0, 1.0, 3.0, 8.0, 15.0):
        fd = -(float(Lf(jnp.asarray(a + h))) - float(Lf(jnp.asarray(a - h)))) / (2 * h)  # error ~ h² F''/6 + 1e-16/h
        F = float(Ff(jnp.asarray(a)))
        assert abs(F - fd) < 1e-6 * abs(F) + 1e-11, (a, F, fd)


@pytest.mark.parametrize("kind,a1", [pytest.param("log", 24.0, marks=pytest.mark.slow), ("ce_on_probs", 12.0)])
def test_gih_tail_constant(kind, a1):
    """K = lim e^a F(a) and L(a) − L_∞ ≈ K e^{−a}: the errors fall like e^{−a}. (For the
    log loss the tail starts only where e^{−a} ≪ ε: tokens absent from the matches
    contribute −p₀(e)/ε to K, which is then negative: F < 0 for all large a.)"""
    _cfg, loss, _ = _setup("sum", loss=kind, N=300)
    gih = make_gih(loss, (1, 2))
    tail = laws.gih_tail(gih)
    Lf, Ff = eqx.filter_jit(gih.loss), eqx.filter_jit(gih.force)
    errF = [abs(np.exp(a) * float(Ff(jnp.asarray(a))) - tail.K) for a in (a1, a1 + 4)]
    errL = [abs(np.exp(a) * (float(Lf(jnp.asarray(a))) - tail.L_inf) - tail.K) for a in (a1, a1 + 4)]
    if kind == "log":  # e^a (L − L_∞) loses e^a·1e-16 to rounding: check F only
        errL = [0.0, 0.0]
    for e in (errF, errL):
        assert e[1] < 3 * np.exp(-4.0) * e[0] + 1e-9 * abs(tail.K)
    assert errF[1] < 1e-3 * abs(tail.K)
    if kind == "ce_on_probs":
        assert tail.K > 0  # at this size F > 0 for all large a: no zero beyond the grid


def test_coverage_of_the_laws():
    """The sum-norm linearisation does not cover norm="layer"; the model's own G does; the
    GIH tail covers ce_on_probs only."""
    from gflow.theory._result import LAW_COVERAGE, covers

    layer = from_dict({"model": {"norm": "layer"}})
    ce = from_dict({"estimator": {"loss": "ce_on_probs"}})
    ok, why = covers(LAW_COVERAGE["stage1"], layer)
    assert not ok and "model.norm" in why and "'layer'" in why
    assert covers(LAW_COVERAGE["stage1_model"], layer)[0]
    assert covers(LAW_COVERAGE["gih_tail"], ce)[0] and not covers(LAW_COVERAGE["gih_tail"], layer)[0]
    assert not covers(LAW_COVERAGE["gih_limit"], ce)[0]


def test_copier_vertex_gradient_is_a_vertex_limit():
    """g at the one-hot copier: the same from logit gaps 40 and 60 (the vertex limit),
    and of the sign of the flow's motion: moving mass off offset h of a head in S*
    changes L̂ by g_i per unit."""
    cfg, loss, p = _setup("layer", parents=(1, 3))
    C = np.asarray(p.C).copy()
    C[cfg.model.subsets.index((1, 3))] = 1.0
    q = Params(w=p.w, C=jnp.asarray(C), a=jnp.asarray(1.0))
    g40 = laws.copier_vertex_gradient(loss, q, (1, 3), gap=40.0)
    g60 = laws.copier_vertex_gradient(loss, q, (1, 3), gap=60.0)
    for h in (1, 3):
        np.testing.assert_allclose(g40.g[h], g60.g[h], rtol=1e-9, atol=1e-14)
    # finite difference on the simplex at the vertex, through softmax's inverse (log)
    h, i = 3, 1
    w = np.asarray(jnp.zeros_like(q.w)) + np.asarray(q.w)
    for hh in (1, 3):
        w[hh - 1] = 0.0
        w[hh - 1, hh - 1] = 60.0
    eps = 1e-6
    s = np.asarray(jax.nn.softmax(jnp.asarray(w), axis=-1))
    s3 = s[h - 1].copy()
    s3[i - 1] += eps
    s3[h - 1] -= eps
    w2 = w.copy()
    w2[h - 1] = np.log(s3)
    L0 = float(loss(Params(w=jnp.asarray(w), C=q.C, a=q.a)))
    L1 = float(loss(Params(w=jnp.asarray(w2), C=q.C, a=q.a)))
    assert abs((L1 - L0) / eps - g60.g[h][i - 1]) < 1e-4 * abs(g60.g[h][i - 1]) + 1e-9



# ---------------------------------------------------------------------------
# Stages that settle short of their event
# ---------------------------------------------------------------------------


def _edge_fixed_point(loss, w_end, C, a, h, i, k):
    """The fixed point of head h's copier on the edge s = x e_i + (1 − x) e_h (offset k ≠ i, h
    at 0): the root in x of ∂L̂/∂s_i − ∂L̂/∂s_h, by bisection; the other heads as in w_end,
    except head 1, put on its vertex (it attracts there)."""

    def g(x):
        w = np.asarray(w_end, np.float64).copy()
        w[0] = 0.0
        w[0, 0] = 60.0
        w[h - 1] = [np.log(x) if j == i - 1 else (np.log(1 - x) if j == h - 1 else -60.0) for j in range(w.shape[1])]
        p = Params(w=jnp.asarray(w), C=jnp.asarray(C), a=jnp.asarray(a))
        gw = np.asarray(jax.grad(loss)(p).w)
        return gw[h - 1, i - 1] / x  # = ∂L̂/∂s_i − Σ_j s_j ∂L̂/∂s_j

    lo, hi = 1e-4, 0.3
    glo = g(lo)
    assert glo < 0 < g(hi)  # mass flows onto offset i near the vertex, off it far from it
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if (g(mid) < 0) == (glo < 0):
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


@pytest.mark.slow
def test_stage2_ends_steady_at_its_interior_fixed_point():
    """norm="layer", parents (1, 3), d = 3, L = 40, N = 2000, Stage II started with
    c_{1,3}/Σc = 0.9995 and δ = 1e-3: head 3's one-hot copier repels (g_1 < 0: mass flows
    to offset 1), so the copier settles on the edge between offsets 3 and 1 short of
    s_3 ≥ 0.999. The stage ends "steady" within a bounded number of evaluations, at the
    edge's fixed point (bisection, independent of the flow) within the steady tolerance
    δ/10 (+ the O(s_2) offset of the face not yet reached)."""
    cfg = from_dict({"data": {"d": 3, "L": 40, "parents": [1, 3]}, "model": {"norm": "layer"},
                     "estimator": {"N": 2000}, "schedule": {"durations": [1e3, 1e10, 1e-3], "delta": 1e-3}})  # fmt: skip
    loss = make_loss(cfg.data, cfg.model, cfg.estimator)
    p = init_params(cfg.model, cfg.init)
    sets = cfg.model.subsets
    C = np.full(len(sets), 0.01)
    C[sets.index((1, 3))] = 0.01 * np.sqrt(0.9995 * (len(sets) - 1) / 0.0005)
    tr = gflow.integrate(cfg, params0=Params(w=p.w, C=jnp.asarray(C), a=p.a), loss=loss)
    st = {s.name: s for s in tr.stages}
    assert st["I"].ended_by == "event" and st["I"].t1 == 0.0
    assert st["II"].ended_by == "steady" and st["II"].selected == (1, 3)
    assert st["II"].nfev < 10_000
    i_end = int(np.searchsorted(tr.ts, st["II"].t1))
    s = np.asarray(tr.s[i_end])
    assert s[2, 2] < 1 - cfg.schedule.delta  # short of the event
    vg = laws.copier_vertex_gradient(loss, Params(w=jnp.asarray(tr.w[i_end]), C=jnp.asarray(C), a=p.a), (1, 3))
    assert vg.attracting[1] and not vg.attracting[3] and vg.g[3][0] < 0
    x_star = _edge_fixed_point(loss, tr.w[i_end], C, float(p.a), 3, 1, 2)
    assert abs(s[2, 0] - x_star) < cfg.schedule.delta / 10 + 2 * s[2, 1], (s[2], x_star)


def test_fit_power_recovers_the_exponent():
    """The approach row's fit L∞ + Bτ^(−p) recovers p on exact data (and not on a log)."""
    from gflow.checks._rows_laws import _fit_power

    tau = np.logspace(3, 4, 13)
    for p in (0.7, 1.0, 1.6):
        assert abs(_fit_power(tau, 0.64 + 3.0 * tau ** (-p)) - p) < 1e-6
