"""Tests of gflow.theory._theory (docs/theory/mathematics.md §M6) against truth: brute-force enumeration,
closed forms for kernels with known structure, the model's own derivatives,
finite differences, and Monte Carlo trends outside their standard errors."""

import itertools
import json
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gflow.config import Config
from gflow.core import EstimatorConfig, InitConfig, ModelConfig, Params, features, init_params, make_loss
from gflow.core._data import DataConfig, sample
from gflow.theory._theory import (
    LAW_COVERAGE,
    Theory,
    chi2_mi,
    covers,
    dlogc_dt,
    first_order_slope,
    format_theory,
    gih_counts,
    limit_loss,
    log_ratio_slope,
    make_gih,
    modified_chi2_ranking,
    predicted_stage1_duration,
    stage1_rates,
    stage3_law,
    theory_report,
)

# A generic d=2 kernel on parents (1, 2); row z = 2 z1 + z2 (z1 = x_{l-1}).
K_GENERIC = np.array([[0.8, 0.2], [0.3, 0.7], [0.6, 0.4], [0.1, 0.9]])
# A kernel that depends on x_{l-2} only: π(e | z1, z2) = Q(z2, e).
Q2 = np.array([[0.9, 0.1], [0.25, 0.75]])
K_Z2 = np.array([Q2[z2] for z1 in range(2) for z2 in range(2)])

# A d=2 kernel whose every offset set is informative, for the J -> Ĩ trend.
K_STRONG = np.array([[0.85, 0.15], [0.6, 0.4], [0.3, 0.7], [0.1, 0.9]])

ALL_SETS_3 = tuple(S for r in range(4) for S in itertools.combinations((1, 2, 3), r))


# PopulationLoss.__call__ and .grad run op by op; jitted they compile once.
_value = eqx.filter_jit(lambda loss, p: loss(p))
_grad = eqx.filter_jit(lambda loss, p: loss.grad(p))


@pytest.fixture(scope="module")
def loss_d3():
    """The estimator shared by the Stage I and Stage III tests (one compile):
    d=3, Dirichlet(0.1), parents (1, 2), L=40, TF(3, 3, 3, 2), N=300."""
    return make_loss(*_d3_configs("log"))


# ---------------------------------------------------------------------------
# §6.1 modified χ²-MI
# ---------------------------------------------------------------------------


def _brute_force_mi(kernel, parents, d, S_list, W):
    """Ĩ and χ²-MI by plain loops over all windows: stationary law of the
    window chain by an eigenvector (not GTH), window probabilities by the
    chain rule, then the marginal on (z, e) accumulated window by window."""
    m = max(parents)
    states = list(itertools.product(range(d), repeat=m))
    T = np.zeros((len(states), len(states)))
    for i, s in enumerate(states):
        z = 0
        for p in parents:
            z = z * d + s[m - p]
        for e in range(d):
            T[i, states.index(s[1:] + (e,))] += kernel[z][e]
    vals, vecs = np.linalg.eig(T.T)
    v = np.real(vecs[:, np.argmin(abs(vals - 1))])
    mu_m = {s: v[i] / v.sum() for i, s in enumerate(states)}
    prob = {}
    for win in itertools.product(range(d), repeat=W):
        p = mu_m[win[:m]]
        for t in range(m, W):
            z = 0
            for q in parents:
                z = z * d + win[t - q]
            p *= kernel[z][win[t]]
        prob[win] = p
    out_I, out_chi = [], []
    for S in S_list:
        joint = {}
        for win, p in prob.items():
            key = (tuple(win[W - 1 - h] for h in S), win[W - 1])
            joint[key] = joint.get(key, 0.0) + p
        mu_z, mu_e = {}, {}
        for (z, e), p in joint.items():
            mu_z[z] = mu_z.get(z, 0.0) + p
            mu_e[e] = mu_e.get(e, 0.0) + p
        It = chi = 0.0
        for z, pz in mu_z.items():
            inner = sum((joint[(z, e)] / pz) ** 2 / mu_e[e] for e in range(d)) - 1.0
            It += pz**2 * inner
            chi += pz * inner
        out_I.append(It)
        out_chi.append(chi)
    return np.array(out_I), np.array(out_chi)


def test_chi2_mi_matches_brute_force():
    cfg = DataConfig(d=2, parents=(1, 2), L=10, kernel=K_GENERIC)
    It, chi = chi2_mi(jnp.asarray(K_GENERIC), cfg, ALL_SETS_3)
    bI, bchi = _brute_force_mi(K_GENERIC, (1, 2), 2, ALL_SETS_3, W=4)
    assert float(It[0]) == 0.0 and float(chi[0]) == 0.0  # Ĩ(∅) = 0, exactly
    np.testing.assert_allclose(np.asarray(It), bI, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(np.asarray(chi), bchi, rtol=1e-10, atol=1e-14)
    assert np.all(bI[1:] > 1e-3)  # a non-degenerate example: every set carries information
    # the ranking of a fixed kernel is exact: one evaluation, SE 0
    rank = modified_chi2_ranking(cfg, ALL_SETS_3)
    assert rank.n_pi == 1 and np.all(rank.Itilde_se == 0) and np.all(rank.diff_se == 0)
    np.testing.assert_allclose(rank.Itilde, bI, rtol=1e-10, atol=1e-14)
    assert rank.S_star == ALL_SETS_3[int(np.argmax(bI))]


def test_chi2_mi_known_structure_offset_two():
    """π(e | x_{l-1}, x_{l-2}) = Q(x_{l-2}, e). Then the even and odd
    subsequences are independent chains with kernel Q and stationary law ν, and:

    - x_l ⟂ (x_{l-1}, x_{l-3}): Ĩ(S) = χ²(S) = 0 for every S ∌ 2;
    - μ(e | z_S) = Q(x_{l-2}, e) for every S ∋ 2, so the ordinary χ²-MI ties
      on all of them, = Σ_z ν(z) f(z), f(z) = Σ_e Q(z,e)²/ν(e) − 1;
    - Ĩ({2}) = Σ_z ν(z)² f(z), while the square in Ĩ penalises the extra
      (independent) offsets: Ĩ({1,2}) = Ĩ({2,3}) = (Σ_x ν(x)²) Ĩ({2}), and,
      as (x_{l-3}, x_{l-1}) is a step of the odd chain,
      Ĩ({1,2,3}) = (Σ_{x,y} (ν(x) Q(x,y))²) Ĩ({2}).

    So S* = {2} strictly, and every set without 2 ranks below every set with 2.
    """
    cfg = DataConfig(d=2, parents=(1, 2), L=10, kernel=K_Z2)
    nu = np.array([Q2[1, 0], Q2[0, 1]]) / (Q2[1, 0] + Q2[0, 1])  # two-state chain
    np.testing.assert_allclose(nu @ Q2, nu, rtol=1e-14)
    f = (Q2**2 / nu[None, :]).sum(1) - 1.0
    I2, chi2_true, s2 = float(np.sum(nu**2 * f)), float(np.sum(nu * f)), float(np.sum(nu**2))

    rank = modified_chi2_ranking(cfg, ALL_SETS_3)
    I = dict(zip(ALL_SETS_3, rank.Itilde))
    chi = dict(zip(ALL_SETS_3, rank.chi2))
    for S in ALL_SETS_3:
        if 2 not in S:
            assert abs(I[S]) < 1e-14 and abs(chi[S]) < 1e-14, S
        else:
            assert chi[S] == pytest.approx(chi2_true, rel=1e-12), S
    assert I[(2,)] == pytest.approx(I2, rel=1e-12)
    assert I[(1, 2)] == pytest.approx(s2 * I2, rel=1e-12)
    assert I[(2, 3)] == pytest.approx(s2 * I2, rel=1e-12)
    assert I[(1, 2, 3)] == pytest.approx(np.sum((nu[:, None] * Q2) ** 2) * I2, rel=1e-12)
    assert rank.S_star == (2,)
    assert not rank.close_call and rank.gap == pytest.approx((1 - s2) * I2, rel=1e-10)
    ranked = [rank.sets[i] for i in rank.order]
    n_with = sum(1 for S in ALL_SETS_3 if 2 in S)
    assert all(2 in S for S in ranked[:n_with]) and all(2 not in S for S in ranked[n_with:])


def test_chi2_ranking_ties_and_monte_carlo_error():
    # An i.i.d. chain (every row the same): no set carries information; Ĩ ≡ 0,
    # an exact tie, flagged as a close call.
    iid = np.tile([0.3, 0.7], (4, 1))
    rank = modified_chi2_ranking(DataConfig(d=2, parents=(1, 2), L=10, kernel=iid), ALL_SETS_3)
    assert np.all(np.abs(rank.Itilde) < 1e-14) and rank.close_call

    # Prior average: two independent key draws agree within their SEs, and the
    # paired SE of a gap is below the unpaired one (the draws are shared).
    cfg = DataConfig(d=2, parents=(1, 2), alpha=0.5, L=10)
    sets = ModelConfig(M=3, H=3, D=2).subsets
    r0 = modified_chi2_ranking(cfg, sets, n_pi=400, key=jax.random.key(0))
    r1 = modified_chi2_ranking(cfg, sets, n_pi=400, key=jax.random.key(1))
    z = np.abs(r0.Itilde - r1.Itilde)[1:] / np.hypot(r0.Itilde_se, r1.Itilde_se)[1:]
    assert np.all(z < 4.5), z
    assert np.all(r0.Itilde_se[1:] > 0)
    i, j = r0.order[0], r0.order[1]
    assert r0.diff_se[i, j] < math.hypot(r0.Itilde_se[i], r0.Itilde_se[j])
    diff = r0.samples[:, i] - r0.samples[:, j]
    assert r0.diff_se[i, j] == pytest.approx(np.std(diff, ddof=1) / np.sqrt(400), rel=1e-9)
    assert r0.gap == pytest.approx(np.mean(diff), rel=1e-12)
    assert r0.close_call == (r0.gap <= 3 * r0.diff_se[i, j])


# ---------------------------------------------------------------------------
# §6.2 Stage I rates
# ---------------------------------------------------------------------------


def test_J_is_the_derivative_and_first_order_expansion(loss_d3):
    model = loss_d3.model
    w = init_params(model, InitConfig()).w
    rates = stage1_rates(loss_d3, w)
    nS = len(model.subsets)
    # J(S) is exactly minus the model's own ∂L̂/∂a at a = 0, c = e_S
    for r in (1, 4, 6):
        g = _grad(loss_d3, Params(w=w, C=jnp.eye(nS)[r], a=jnp.asarray(0.0)))
        assert float(-g.a) == pytest.approx(rates.J[r], rel=1e-10, abs=1e-14)
    assert abs(rates.J[0]) < 1e-12  # κ ≡ 1 for ∅: ŷ does not depend on a

    # Generic c: L̂(h) − L̂(0) = −h Σ (c_S/Σc) J(S) + O(h²); the remainder is
    # first order in h, so the error of the slope falls 10x per decade of h.
    C = jnp.asarray(np.linspace(0.2, 1.3, nS) ** 1.5)
    slope = first_order_slope(C**2, rates.J)
    L0 = float(_value(loss_d3, Params(w=w, C=C, a=jnp.asarray(0.0))))
    assert L0 == pytest.approx(rates.L0, rel=1e-12)
    errs = []
    for h in (1e-2, 1e-3, 1e-4):
        Lh = float(_value(loss_d3, Params(w=w, C=C, a=jnp.asarray(h))))
        errs.append(abs((Lh - L0) / h + slope))
    assert errs[0] < 0.1 * abs(slope)
    assert 6 < errs[0] / errs[1] < 14 and 6 < errs[1] / errs[2] < 14, errs


def test_dlogc_dt_matches_the_model_gradient(loss_d3):
    """d/dt log c_S = −2 ∂L̂/∂C_S / C_S at small a equals 4a(J − J̄)/‖C‖² to O(a)."""
    model = loss_d3.model
    w = init_params(model, InitConfig()).w
    rates = stage1_rates(loss_d3, w)
    C = np.linspace(0.2, 1.3, len(model.subsets))
    for a in (1e-3, 1e-4):
        g = _grad(loss_d3, Params(w=w, C=jnp.asarray(C), a=jnp.asarray(a)))
        measured = -2.0 * np.asarray(g.C) / C
        pred = dlogc_dt(rates.J, C, a)
        np.testing.assert_allclose(measured, pred, rtol=20 * a, atol=1e-3 * a * np.abs(pred).max())
    # the pairwise slope is the difference of the per-set rates
    assert log_ratio_slope(rates.J, 4, 2, C, 0.01) == pytest.approx(
        dlogc_dt(rates.J, C, 0.01)[4] - dlogc_dt(rates.J, C, 0.01)[2], rel=1e-12
    )


def test_J_tends_to_Itilde_as_L_grows():
    """With a one-hot copier (w₊ − w₋ = 40) and a fixed kernel, |J(S) − Ĩ(S)|
    shrinks as L = 10, 20, 40, each step by more than 3 Monte Carlo SEs."""
    model = ModelConfig(M=2, H=2, D=2)  # 𝒮 = ∅, {1}, {2}, {1,2}
    w = init_params(model, InitConfig(w_plus=40.0, w_minus=0.0)).w
    gaps, ses = [], []
    for L in (10, 20, 40):
        data = DataConfig(d=2, parents=(1, 2), L=L, kernel=K_STRONG)
        It = modified_chi2_ranking(data, model.subsets).Itilde
        rates = stage1_rates(make_loss(data, model, EstimatorConfig(N=2000, seed=1)), w)
        gaps.append(np.abs(rates.J - It)[1:])
        ses.append(rates.J_se[1:])
    gaps, ses = np.array(gaps), np.array(ses)
    for k in range(2):
        assert np.all(gaps[k] - gaps[k + 1] > 3 * np.hypot(ses[k], ses[k + 1])), gaps
    assert np.all(gaps[2] < 0.5 * gaps[0]), gaps


@pytest.mark.slow
def test_J_minus_Itilde_decays_like_one_over_L():
    """The same one-hot limit further out: |J − Ĩ| over L = 40, 80, 160 has a
    fitted log-log slope near −1 (the O(1/L) finite-context bias; ≈ −0.87
    at these L, still approaching −1)."""
    model = ModelConfig(M=2, H=2, D=2)
    w = init_params(model, InitConfig(w_plus=40.0, w_minus=0.0)).w
    Ls, gaps = (40, 80, 160), []
    for L in Ls:
        data = DataConfig(d=2, parents=(1, 2), L=L, kernel=K_STRONG)
        It = modified_chi2_ranking(data, model.subsets).Itilde
        rates = stage1_rates(make_loss(data, model, EstimatorConfig(N=2000, seed=1)), w)
        gaps.append(np.abs(rates.J - It)[1:])
    slopes = np.polyfit(np.log(Ls), np.log(np.array(gaps)), 1)[0]
    assert np.all((-1.25 < slopes) & (slopes < -0.6)), slopes


# ---------------------------------------------------------------------------
# §6.4 Stage III: the generalized induction head
# ---------------------------------------------------------------------------


def _d3_configs(kind="log"):
    data = DataConfig(d=3, parents=(1, 2), alpha=0.1, L=40)
    model = ModelConfig(M=3, H=3, D=2)
    return data, model, EstimatorConfig(N=300, seed=7, loss=kind, layout="counts")


def test_gih_counts_agree_across_sources_and_with_loops():
    data, model, est = _d3_configs()
    smp = sample(data, est.N, key=jax.random.key(2))
    fc = features(smp, model, layout="counts")
    fp = features(smp, model, layout="positions")
    X = np.asarray(smp.X)
    for S in ((), (1,), (2,), (1, 3), (2, 3)):
        N1, N0 = (np.asarray(x) for x in gih_counts(smp, S))
        for src in (fc, fp):
            a, b = gih_counts(src, S)
            np.testing.assert_array_equal(np.asarray(a), N1)
            np.testing.assert_array_equal(np.asarray(b), N0)
        for n in range(5):
            x = [None] + list(X[n])  # x[j] for j = 1..L; x[j] for j <= 0 is padding
            q = data.L + 1
            ref1 = np.zeros(3)
            ref0 = np.zeros(3)
            for l in range(1, data.L + 1):
                hit = all(l - h >= 1 and x[l - h] == x[q - h] for h in S)
                (ref1 if hit else ref0)[x[l]] += 1
            np.testing.assert_array_equal(N1[n], ref1)
            np.testing.assert_array_equal(N0[n], ref0)


@pytest.mark.parametrize("kind", ["log", "ce_on_probs"])
def test_gih_law_matches_finite_differences_and_the_model(kind):
    data, model, est = _d3_configs(kind)
    loss = make_loss(data, model, est)
    S = (1, 2)
    gih = make_gih(loss, S)
    # one-hot copier: softmax weights off the diagonal are e^{-60} ≈ 1e-26
    w = init_params(model, InitConfig(w_plus=60.0, w_minus=0.0)).w
    C = jnp.zeros(len(model.subsets)).at[model.subsets.index(S)].set(1.0)
    for a in (0.3, 2.0, 5.0, 9.0, 16.0):
        F = float(gih.force(a))
        h = 1e-4 * max(1.0, a)
        fd = (float(gih.loss(a + h)) - float(gih.loss(a - h))) / (2 * h)
        assert F == pytest.approx(-fd, rel=1e-6, abs=1e-10)
        p = Params(w=w, C=C, a=jnp.asarray(a))
        assert float(gih.loss(a)) == pytest.approx(float(_value(loss, p)), rel=1e-10)
        assert F == pytest.approx(-float(_grad(loss, p).a), rel=1e-8, abs=1e-13)


def test_stage3_landmarks_satisfy_their_definitions(loss_d3):
    gih = make_gih(loss_d3, (1, 2))
    law = stage3_law(gih, a_max=30.0, n_grid=301)
    Fe = lambda a: float(gih.force(a)) * math.exp(a)
    # C* is a maximum of F e^a, at least the grid's
    assert law.C_star >= law.Fexp.max() and law.C_star == pytest.approx(Fe(law.a_C_star), rel=1e-12)
    for da in (-1e-2, 1e-2):
        assert Fe(law.a_C_star + da) <= law.C_star
    # the window {F e^a >= C*/2} ends where F e^a = C*/2 (here an interior interval)
    lo, hi = law.window
    assert law.window_is_interval and law.window_clipped == (False, False)
    assert lo < law.a_C_star < hi
    assert Fe(lo) == pytest.approx(law.C_star / 2, rel=1e-8)
    assert Fe(hi) == pytest.approx(law.C_star / 2, rel=1e-8)
    assert Fe(lo - 1e-3) < law.C_star / 2 < Fe(lo + 1e-3)
    assert Fe(hi - 1e-3) > law.C_star / 2 > Fe(hi + 1e-3)
    # a*: a zero of F where it turns negative, the first one on the grid
    assert law.a_star is not None and hi < law.a_star < 30
    assert abs(float(gih.force(law.a_star))) < 1e-9 * np.abs(law.F).max()
    assert float(gih.force(law.a_star - 1e-3)) > 0 > float(gih.force(law.a_star + 1e-3))
    assert np.all(law.F[law.a_grid < law.a_star] > 0)
    assert law.a_star_se is not None and 0 < law.a_star_se < 1
    # the limit loss is the infimum: at a*, below every grid value and L(∞)
    lim = limit_loss(gih, a_grid=law.a_grid)
    assert lim["a"] == pytest.approx(law.a_star) and lim["loss"] <= law.L.min() + 1e-12
    assert lim["loss"] <= limit_loss(gih, a=math.inf)["loss"]
    assert limit_loss(gih, a=law.a_star)["loss"] == pytest.approx(lim["loss"], rel=1e-12)
    assert limit_loss(gih, a=60.0)["loss"] == pytest.approx(law.L_inf, rel=1e-9)


def test_stage3_without_a_finite_zero():
    """A deterministic alternating chain x_l = 1 − x_{l-1}: every match predicts
    the target, so F > 0 for all a (no finite a*) and inf L_GIH is at a → ∞."""
    data = DataConfig(d=2, parents=(1,), L=10, kernel=np.array([[0.0, 1.0], [1.0, 0.0]]))
    model = ModelConfig(M=1, H=1, D=1)
    loss = make_loss(data, model, EstimatorConfig(N=20, seed=0))
    law = stage3_law(make_gih(loss, (1,)), a_max=20.0, n_grid=101)
    assert law.a_star is None and np.all(law.F > 0) and law.window_clipped[1]
    assert math.isinf(law.a_limit) and law.limit_loss == pytest.approx(-math.log1p(1e-6), rel=1e-9)


# ---------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------


def test_theory_report_is_json_and_consistent(loss_d3):
    data, model, est = _d3_configs()
    th = theory_report(data, model, est, InitConfig(), n_pi=200, n_grid=121, loss=loss_d3, S=(3,))
    rep = th.to_json()
    back = json.loads(json.dumps(rep, allow_nan=False))
    mi, s1, s3 = back["mi"], back["stage1"], back["stage3"]
    assert mi["S_star"] in back["sets"] and s3["S"] == mi["S_star"] == list(th.S_star)
    Its = [row["Itilde"] for row in mi["ranking"]]
    assert Its == sorted(Its, reverse=True) and max(mi["Itilde"]) == Its[0]
    assert len(s1["J"]) == len(model.subsets) == len(mi["Itilde"]) == len(s1["dlogc_dt_J"])
    # the reported Stage I rates are those of the run's initial w on its sample
    rates = stage1_rates(loss_d3, init_params(model, InitConfig()).w)
    np.testing.assert_allclose(s1["J"], rates.J, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(th.rates.J, rates.J, rtol=1e-12, atol=1e-15)
    # at init c is uniform, so the predicted d/dt log c_S average to zero
    assert abs(np.mean(s1["dlogc_dt_J"])) < 1e-9 * np.abs(s1["dlogc_dt_J"]).max()
    # the GIH law of S*, of argmax J and of the asked set, each that set's own
    assert set(th.laws) == {th.S_star, th.argmax_J, (3,)}
    for S in th.laws:
        law = stage3_law(make_gih(loss_d3, S), n_grid=121)
        assert th.law(S).C_star == pytest.approx(law.C_star, rel=1e-12)
        assert th.law(S).limit_loss == pytest.approx(law.limit_loss, rel=1e-12)
    assert th.law((3,)).C_star != pytest.approx(th.stage3.C_star, rel=1e-3)
    with pytest.raises(KeyError, match=r"no GIH law for \{2\}"):
        th.law((2,))
    # the predicted Stage I duration from the theory's own J and c(0)
    du = predicted_stage1_duration(th.rates.J, th.C0**2, th.a0, th.delta, eta_C=th.eta_C)
    assert th.duration.t == du.t and th.duration.S == th.argmax_J
    # to_json / from_json round trip: the same numbers, the same JSON
    again = Theory.from_json(back)
    assert json.dumps(again.to_json(), sort_keys=True) == json.dumps(rep, sort_keys=True)
    np.testing.assert_array_equal(again.law((3,)).F, th.law((3,)).F)
    assert again.duration == th.duration and again.S_star == th.S_star
    with pytest.raises(ValueError, match="not a gflow theory"):
        Theory.from_json({"sets": []})
    text = format_theory(th)
    for needle in ("S* = argmax Ĩ", "C* = max F·e^a", "a* (F = 0)", "inf_a L_GIH", mi["S_star_label"],
                   "linearised Stage I", "GIH on S = {3}"):  # fmt: skip
        assert needle in text
    assert format_theory(back) == text


def test_coverage_reads_options_that_may_not_exist_yet():
    cfg = Config()
    # every law covers the paper's default run, except the ce_on_probs tail law (another loss)
    for law in LAW_COVERAGE:
        assert covers(LAW_COVERAGE[law], cfg)[0] == (law != "gih_tail"), law
    ok, why = covers(LAW_COVERAGE["gih_tail"], cfg)
    assert not ok and "estimator.loss = 'log'" in why
    assert covers(LAW_COVERAGE["gih_tail"], cfg.replace(estimator={"loss": "ce_on_probs"})) == (True, "")
    ok, why = covers(LAW_COVERAGE["stage1"], cfg.replace(model={"norm": "layer"}))
    assert not ok and "model.norm = 'layer'" in why and "('sum',)" in why
    ok, why = covers(LAW_COVERAGE["gih_limit"], cfg.replace(estimator={"loss": "ce_on_probs"}))
    assert not ok and "estimator.loss = 'ce_on_probs'" in why
    assert covers(LAW_COVERAGE["gih"], cfg.replace(estimator={"loss": "ce_on_probs"}))[0]

    class Sec:  # a section with an option this gflow does not have yet
        head_norm = True

    class Cfg:
        model = Sec()
        estimator = None

    ok, why = covers({"model.head_norm": (False,), "estimator.target": ("expected",)}, Cfg())
    assert not ok and "model.head_norm = True" in why
    assert covers({"model.windows": ("aligned",), "estimator.target": ("expected",)}, Cfg()) == (True, "")


def test_errors_name_the_offending_value(loss_d3):
    with pytest.raises(ValueError, match=r"exceed the model's window M=3"):
        make_gih(loss_d3, (2, 4))
    with pytest.raises(ValueError, match=r"strictly increasing positive offsets, got \(2, 1\)"):
        make_gih(loss_d3, (2, 1))
    with pytest.raises(ValueError, match=r"set \(1, 2, 3\) is not in the model's 𝒮"):
        stage1_rates(loss_d3, init_params(loss_d3.model).w, sets=[(1, 2, 3)])
    with pytest.raises(ValueError, match="strictly increasing 1-d grid"):
        stage3_law(make_gih(loss_d3, (1,)), a_grid=[0.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="n_pi must be a positive integer, got 0"):
        modified_chi2_ranking(DataConfig(), ModelConfig(), n_pi=0)


# ---------------------------------------------------------------------------
# The linearised Stage I's duration (docs/theory/mathematics.md §M8.1)
# ---------------------------------------------------------------------------


def _linearised_stage1_crossing(J, c0, a0, delta, eta_C, t_end, n=20_000):
    """Integrate the linearised Stage I on C itself (RK4, fixed step):
    dC_S/dt = 2 a₀ η_C C_S (J(S) − Σ_S' (C_S'²/‖C‖²) J(S'))/‖C‖², the gradient flow
    of L₀ − a₀ Σ_S (C_S²/‖C‖²) J(S); return the first t with max c/Σc ≥ 1 − δ
    (linear interpolation between steps) and the index of the set."""
    J = np.asarray(J, float)

    def f(C):
        n2 = np.sum(C**2)
        return 2 * a0 * eta_C * C * (J - np.dot(C**2, J) / n2) / n2

    C = np.sqrt(np.asarray(c0, float))
    h = t_end / n
    prev = None
    for k in range(n + 1):
        p = C**2 / np.sum(C**2)
        g = p.max() - (1 - delta)
        if g >= 0:
            if prev is None:
                return 0.0, int(np.argmax(p))
            return (k - 1 + prev / (prev - g)) * h, int(np.argmax(p))
        prev = g
        k1 = f(C)
        k2 = f(C + h / 2 * k1)
        k3 = f(C + h / 2 * k2)
        k4 = f(C + h * k3)
        C = C + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    return math.inf, -1


def test_stage1_duration_two_sets_closed_form():
    """Two sets: c_S/Σc = 1/(1 + (c_S'(0)/c_S(0)) e^{−k ΔJ t}) reaches 1 − δ at
    t = ‖C‖² log((1−δ)/δ · c_S'(0)/c_S(0)) / (4 a₀ η_C ΔJ)."""
    for J, c0, a0, delta, eta in [
        ([0.3, 0.1], [0.01, 0.01], 0.01, 0.01, 1.0),
        ([0.05, 0.42], [0.02, 0.005], 0.5, 0.03, 2.5),
        ([1.0, 0.0], [1e-4, 3e-4], 0.01, 1e-3, 1.0),
    ]:
        i = int(np.argmax(J))
        j = 1 - i
        n2 = sum(c0)
        want = n2 * math.log((1 - delta) / delta * c0[j] / c0[i]) / (4 * a0 * eta * (J[i] - J[j]))
        got = predicted_stage1_duration(J, c0, a0, delta, eta_C=eta, sets=[(1,), (2,)])
        assert got.t == pytest.approx(want, rel=1e-12)
        assert got.index == i and got.S == ((1,), (2,))[i]
        assert got.rate == pytest.approx(4 * a0 * eta / n2, rel=1e-15)


def test_stage1_duration_matches_the_integrated_linearised_flow():
    """Six sets with distinct J and unequal c(0); then a transient crossing: a
    set with most of the initial mass crosses 1 − δ on its way down although
    another has the larger J; then no crossing at all (top J tied)."""
    rng = np.random.default_rng(3)
    J = rng.uniform(0.0, 0.5, 6)
    c0 = rng.uniform(0.005, 0.02, 6)
    got = predicted_stage1_duration(J, c0, 0.01, 0.01)
    t_ode, i_ode = _linearised_stage1_crossing(J, c0, 0.01, 0.01, 1.0, 1.3 * got.t)
    assert got.index == i_ode == int(np.argmax(J))
    assert got.t == pytest.approx(t_ode, rel=1e-6)

    # transient: set 0 starts at 0.85 of the mass, set 1 has the larger J
    J, c0, delta = [1.0, 1.2, 0.0], [0.85, 0.075, 0.075], 0.13
    got = predicted_stage1_duration(J, c0, 0.25, delta)
    t_ode, i_ode = _linearised_stage1_crossing(J, c0, 0.25, delta, 1.0, 20.0)
    assert got.index == i_ode == 0 and 0 < got.t < 20
    assert got.t == pytest.approx(t_ode, rel=1e-6)
    # a stricter threshold that set 0 never reaches: set 1 crosses, later
    later = predicted_stage1_duration(J, c0, 0.25, 0.05)
    t_ode, i_ode = _linearised_stage1_crossing(J, c0, 0.25, 0.05, 1.0, 200.0)
    assert later.index == i_ode == 1 and later.t == pytest.approx(t_ode, rel=1e-6)

    tie = predicted_stage1_duration([0.3, 0.3, 0.1], [0.01, 0.01, 0.01], 0.01, 0.01)
    assert tie.t == math.inf and tie.S is None and tie.index == -1
    assert predicted_stage1_duration([0.3, 0.1], [0.99, 0.01], 0.01, 0.05).t == 0.0
    with pytest.raises(ValueError, match=r"delta must lie in \(0, 1\), got 1.5"):
        predicted_stage1_duration([0.3, 0.1], [0.5, 0.5], 0.01, 1.5)
    with pytest.raises(ValueError, match="c0 must be finite and > 0"):
        predicted_stage1_duration([0.3, 0.1], [0.5, 0.0], 0.01, 0.1)


def test_ordinary_rankings_tie_the_parents_with_their_supersets():
    """The ordinary χ²-MI and MI of a set holding every parent equal those of its supersets
    (μ(e | z_S) = π(e | parents) for S ⊇ parents) to rounding, strictly exceed every set missing
    a parent, and the winner named is the smallest tied set: the parents, not a superset
    rounding happened to favour. Ĩ instead penalises the superset strictly."""
    from gflow.theory import modified_chi2_ranking

    sets = [(), (1,), (2,), (3,), (1, 2), (1, 3), (2, 3), (1, 2, 3)]
    for parents, d, alpha in (((1, 2), 3, 1.0), ((1,), 2, 0.3)):
        rk = modified_chi2_ranking(DataConfig(d=d, parents=parents, alpha=alpha, L=20), sets, n_pi=300)
        supersets = [S for S in sets if set(parents) <= set(S)]
        for vals in (rk.chi2, rk.mi):
            top = vals[sets.index(tuple(parents))]
            for S in sets:
                if S in supersets:
                    assert abs(vals[sets.index(S)] - top) <= 1e-12 * top
                else:
                    assert vals[sets.index(S)] < top * (1 - 1e-6)
        assert rk.S_chi2 == rk.S_mi == tuple(parents)
        assert rk.chi2_tied == rk.mi_tied == tuple(sorted(supersets, key=len))
        assert rk.S_star == tuple(parents)
        assert rk.Itilde[sets.index((1, 2, 3))] < rk.Itilde[sets.index(tuple(parents))] - 5 * rk.diff_se[
            sets.index((1, 2, 3)), sets.index(tuple(parents))]


def test_theory_text_names_no_winner_when_the_rates_are_flat():
    """A member whose loss at a = 0 does not read C (linear_query, bilinear) has the same rate for
    every set: the theory's text says there is no winner by the rates (not "argmax = ∅", the first
    of a tie) and gives no linearised Stage I duration."""
    import gflow
    from gflow.theory import format_theory

    cfg = Config().replace(data={"L": 20}, estimator={"N": 100})
    th = gflow.theory_report(cfg.data, cfg.model, cfg.estimator, cfg.init, n_pi=50).to_json()
    text = format_theory(th)
    assert "argmax J = {" in text and "linearised Stage I" in text
    th["stage1"]["J"] = [0.25] * len(th["stage1"]["J"])
    flat = format_theory(th)
    assert "argmax J: none — J(S) is the same for every S" in flat and "argmax J = none (flat)" in flat
    assert "linearised Stage I" not in flat
