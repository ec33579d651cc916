"""``gflow limit``: the scaling fits against closed forms, the verdict rules, the grid's bad input
(exit 2 before any compute), and the claims' values against their independent computation."""

import json
import math

import numpy as np
import pytest

import gflow
from gflow._util._scaling import Z95, ScalingFit, chi2_sf, fit_scaling, t95, wls
from gflow.cli import main
from gflow.runs._limit import CLAIMS, ONE_HOT_W_PLUS, _feature_models, copier_contrast, decide, limit_grid

# χ² quantiles at 95 % (to 15 digits) and at 99 %: P(χ²_k ≥ x) is 0.05 and 0.01
_Q95 = {1: 3.841458820694124, 2: 5.991464547107979, 3: 7.814727903251178, 4: 9.487729036781154,
        5: 11.070497693516351}  # fmt: skip
_Q99 = {1: 6.6348966010212145, 2: 9.21034037197618, 3: 11.344866730144373}


@pytest.mark.parametrize("k", sorted(_Q95))
def test_chi2_survival_function_at_known_quantiles(k):
    assert chi2_sf(_Q95[k], k) == pytest.approx(0.05, abs=1e-13)
    if k in _Q99:
        assert chi2_sf(_Q99[k], k) == pytest.approx(0.01, abs=1e-13)
    assert chi2_sf(0.0, k) == 1.0


@pytest.mark.parametrize("dof, q", [(1, 12.706204736), (3, 3.182446305), (12, 2.178812830), (25, 2.059538553),
                                    (40, 2.021075390), (120, 1.979930405), (1000, 1.962339081)])  # fmt: skip
def test_student_t_quantile_within_its_stated_accuracy(dof, q):
    """Exact 97.5 % quantiles (the tabulated ones to 1e-9; between and beyond, within 1e-3)."""
    assert t95(dof) == pytest.approx(q, abs=1e-3)
    with pytest.raises(ValueError, match="degrees of freedom"):
        t95(0)


def test_chi2_survival_function_rejects_bad_degrees_of_freedom():
    for k in (0, -1, 1.5):
        with pytest.raises(ValueError, match="degrees of freedom"):
            chi2_sf(1.0, k)


def test_wls_matches_the_closed_form_of_a_weighted_line():
    """β and cov β of y = α + βx against the normal equations written out by hand."""
    x = np.array([0.02, 0.01, 0.005, 0.0025])
    y = np.array([1.3, 1.17, 1.08, 1.05])
    se = np.array([0.02, 0.03, 0.01, 0.05])
    w = 1 / se**2
    S, Sx, Sxx, Sy, Sxy = w.sum(), (w * x).sum(), (w * x * x).sum(), (w * y).sum(), (w * x * y).sum()
    det = S * Sxx - Sx**2
    alpha, beta = (Sxx * Sy - Sx * Sxy) / det, (S * Sxy - Sx * Sy) / det
    b, cov, chi2 = wls(np.column_stack([np.ones(4), x]), y, se)
    np.testing.assert_allclose(b, [alpha, beta], rtol=1e-12)
    np.testing.assert_allclose(cov, np.array([[Sxx, -Sx], [-Sx, S]]) / det, rtol=1e-12)
    assert chi2 == pytest.approx(float(np.sum(w * (y - alpha - beta * x) ** 2)), rel=1e-12)


def _pts(Ls):
    return [{"data.L": L} for L in Ls]


@pytest.mark.parametrize("form, f", [("b/L", lambda L: 1 / L), ("b/√L", lambda L: L**-0.5),
                                     ("b/ln L", lambda L: 1 / math.log(L))])  # fmt: skip
def test_fit_scaling_recovers_the_limit_of_exact_data_and_its_model(form, f):
    """q = 0.3 + 2 f(L) without noise: the chosen model is f's (χ² = 0), its limit 0.3, and the
    constant model does not fit."""
    Ls = [50, 100, 200, 400]
    q = [0.3 + 2 * f(L) for L in Ls]
    chosen, every = fit_scaling(_pts(Ls), q, [1e-3] * 4, _feature_models(("data.L",)))
    assert chosen.model == f"q∞ + {form}" and chosen.fits
    assert chosen.limit == pytest.approx(0.3, abs=1e-10) and chosen.coef[1] == pytest.approx(2, rel=1e-9)
    assert chosen.chi2 < 1e-12
    const = next(x for x in every if x.model == "q∞")
    assert not const.fits and len(every) == 4


def test_fit_scaling_widens_the_interval_by_the_birge_ratio():
    """Scatter beyond the stated SE: the limit's SE is √(χ²/dof) times the WLS one."""
    Ls = [50, 100, 200, 400, 800]
    q = np.array([0.3 + 2 / L for L in Ls]) + np.array([0.01, -0.01, 0.01, -0.01, 0.01])
    se = np.full(5, 1e-3)
    fit, _ = fit_scaling(_pts(Ls), q, se, [("q∞ + b/L", [lambda p: 1 / p["data.L"]])])
    A = np.column_stack([np.ones(5), 1 / np.array(Ls, float)])
    _, cov, chi2 = wls(A, q, se)
    assert chi2 / 3 > 1
    assert fit.limit_se == pytest.approx(math.sqrt(cov[0, 0] * chi2 / 3), rel=1e-12)
    assert fit.interval == pytest.approx((fit.limit - Z95 * fit.limit_se, fit.limit + Z95 * fit.limit_se))


def test_fit_scaling_over_shared_samples_takes_the_limits_se_from_the_replicates():
    """Replicates that share their draw across sizes (a common offset c_r at every L): the limit is
    the mean curve's, its SE the spread of the per-replicate limits of the same linear estimator
    (times t_{R−1}/1.96), here the offsets' spread; the WLS SE of the means, which treats the
    sizes as independent, is not."""
    Ls = [50, 100, 200, 400]
    rng = np.random.default_rng(0)
    c = np.array([0.05, -0.03, 0.02, -0.04])  # each replicate's shared offset
    reps = np.array([[0.3 + 2 / L + cr + 1e-4 * rng.standard_normal() for L in Ls] for cr in c])
    mean, se = reps.mean(0), reps.std(0, ddof=1) / 2
    model = [("q∞ + b/L", [lambda p: 1 / p["data.L"]])]
    shared, _ = fit_scaling(_pts(Ls), mean, se, model, replicates=reps)
    alone = [fit_scaling(_pts(Ls), r, se, model)[0].limit for r in reps]
    assert shared.limit == pytest.approx(float(np.mean(alone)), abs=1e-12)
    assert shared.limit_se == pytest.approx(np.std(alone, ddof=1) / 2 * t95(3) / Z95, rel=1e-9)
    assert shared.limit_se == pytest.approx(np.std(c, ddof=1) / 2 * t95(3) / Z95, rel=0.02)
    with pytest.raises(ValueError, match="replicates: at least 2"):
        fit_scaling(_pts(Ls), mean, se, model, replicates=np.full((3, 4), np.nan))


def test_fit_scaling_with_a_w_plus_axis_separates_the_two_limits():
    """q = 1 + 3/L − 0.5 (1 − λ_w(w₊)) on a 3 × 3 grid: the model with both terms, limit 1; λ_w
    of a head starting at w₊ = w₋ is (1/M)^{2k}."""
    assert copier_contrast(0.1, 0.1, 3, 2) == pytest.approx(3.0**-4, rel=1e-14)
    assert copier_contrast(60.0, 0.1, 3, 2) == pytest.approx(1.0, abs=1e-20)
    pts = [{"data.L": L, "init.w_plus": w} for L in (20, 40, 80) for w in (1.0, 2.0, 4.0)]
    q = [1 + 3 / p["data.L"] - 0.5 * (1 - copier_contrast(p["init.w_plus"], 0.1, 3, 2)) for p in pts]
    chosen, _ = fit_scaling(pts, q, [1e-4] * 9, _feature_models(("data.L", "init.w_plus")))
    assert chosen.model == "q∞ + b/L + c·(1 − λ_w)"
    np.testing.assert_allclose(chosen.coef, [1, 3, -0.5], atol=1e-9)


def _fit(limit, se, p=0.5):
    return ScalingFit("q∞ + b/L", (limit, 1.0), limit, se, 1.0, 2, p, 5.0)


@pytest.mark.parametrize("limit, se, verdict", [
    (1.05, 0.05, "consistent"),     # interval [0.952, 1.148] inside 1 ± 0.25
    (1.60, 0.05, "inconsistent"),   # [1.502, 1.698] wholly above 1.25
    (1.20, 0.05, "undecided"),      # [1.102, 1.298] astride 1.25
    (1.00, 0.20, "undecided"),      # [0.608, 1.392]: too wide
])  # fmt: skip
def test_decide_is_an_equivalence_test_on_the_claims_band(limit, se, verdict):
    slope = next(c for c in CLAIMS if c.key == "stage3_slope")
    assert decide(slope, _fit(limit, se), 1.0, 0.0)[0] == verdict


def test_decide_for_a_positive_limit_and_when_nothing_fits():
    winner = next(c for c in CLAIMS if c.key == "stage1_winner")
    assert decide(winner, _fit(0.02, 0.005), 0.0, 0.0)[0] == "consistent"
    assert decide(winner, _fit(-0.02, 0.005), 0.0, 0.0)[0] == "inconsistent"
    assert decide(winner, _fit(0.005, 0.005), 0.0, 0.0)[0] == "undecided"
    assert decide(winner, _fit(0.02, 0.005), 0.0, 0.0, flows_ok=False)[0] == "undecided"
    verdict, why = decide(winner, _fit(0.02, 0.005, p=1e-4), 0.0, 0.0)
    assert verdict == "undecided" and "no scaling model fits" in why
    # the claim's own SE (Ĩ over the prior's kernels) widens the interval
    rate = next(c for c in CLAIMS if c.key == "stage1_rate")
    assert decide(rate, _fit(0.18, 0.001), 0.181, 0.0)[0] == "consistent"
    assert decide(rate, _fit(0.18, 0.001), 0.181, 0.01)[0] == "undecided"


@pytest.mark.parametrize("params, match", [
    (["data.L=50,100"], "at least 3 distinct sizes"),
    (["data.L=50,50,100"], "at least 3 distinct sizes"),
    (["data.L=2,50,100"], "data.L = 2: at or below the largest parent offset or head"),
    (["data.L=50,100,abc"], "data.L: the scaling axis takes numbers"),
    (["estimator.N=100,200,400"], "estimator.N: not a scaling axis"),
    (["init.w_plus=-1,2,3"], "init.w_plus = -1.0: the scaling axis w₊ must be > 0"),
])  # fmt: skip
def test_limit_refuses_a_bad_grid_before_any_compute(tmp_path, capsys, params, match):
    with pytest.raises(ValueError, match=match):
        limit_grid(gflow.Config(), params)
    argv = ["limit", "--out", str(tmp_path / "x")] + [a for p in params for a in ("--param", p)]
    assert main(argv) == 2
    assert match.split(":")[0] in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_limit_refuses_a_member_the_paper_does_not_cover():
    with pytest.raises(ValueError, match="model.member = 'residual'"):
        limit_grid(gflow.Config().replace(model={"member": "residual"}), ["data.L=10,20,40"])


@pytest.fixture(scope="module")
def theory_only_limit(tmp_path_factory):
    out = tmp_path_factory.mktemp("limit")
    cfg = gflow.Config().replace(estimator={"N": 300})
    res = gflow.runs.run_limit(cfg, ["data.L=10,20,40"], out=out, R=2, flows=False, n_pi=200, plot=False)
    return cfg, out, res


def test_theory_only_limit_values_are_the_stage1_rates_of_each_replicate(theory_only_limit):
    """Each size's q is J of the replicate's own sample (estimator.seed = seed + r) at the run's
    copier and at a one-hot one, recomputed here by theory_report; the fit is a re-fit of the means."""
    cfg, out, res = theory_only_limit
    js = json.loads((out / "limit.json").read_text())
    sets = cfg.model.subsets
    i = sets.index(tuple(int(h) for h in js["ranking"]["S_star"].strip("{}").split(",")))
    j = sets.index(tuple(int(h) for h in js["ranking"]["runner_up"].strip("{}").split(",")))
    for k, L in ((0, 10), (2, 40)):  # the smallest and the largest size (each recomputation is a theory_report)
        q = js["points"][k]["q"]
        for r in range(2):
            c = cfg.replace(data={"L": L}, estimator={"seed": r})
            J = gflow.theory_report(c, n_pi=10).rates.J
            J1 = gflow.theory_report(c.replace(init={"w_plus": ONE_HOT_W_PLUS}), n_pi=10).rates.J
            assert q["stage1_winner"][r] == pytest.approx(J[i] - np.delete(J, i).max(), rel=1e-10, abs=1e-14)
            assert q["stage1_rate"][r] == pytest.approx(J1[i], rel=1e-10)
            assert q["stage1_gap"][r] == pytest.approx(J1[i] - J1[j], rel=1e-10)
    for c in res.claims:
        if c["fit"] is None:
            assert c["verdict"] == "undecided" and (c["flow"] or "could be fitted" in c["reason"])
            continue
        pts = [s["point"] for s in c["sizes"]]
        se = [s["se"] * t95(s["n"] - 1) / Z95 for s in c["sizes"]]  # Student-t at n = 2 replicates
        fit, _ = fit_scaling(pts, [s["mean"] for s in c["sizes"]], se,
                             [(m, f) for m, f in _feature_models(("data.L",)) if m == c["fit"]["model"]])  # fmt: skip
        assert fit.limit == pytest.approx(c["fit"]["limit"], rel=1e-12)
    assert all(c["verdict"] == "undecided" and "not run" in c["reason"] for c in res.claims if c["flow"])
    assert "| stage1_rate:" in (out / "limit.md").read_text()


def test_limit_resume_and_overwrite_rules(theory_only_limit, tmp_path):
    cfg, out, _ = theory_only_limit
    (tmp_path / "points").mkdir()
    with pytest.raises(ValueError, match="--resume reuses them"):
        gflow.runs.run_limit(cfg, ["data.L=10,20,40"], out=tmp_path, R=2, flows=False)
    with pytest.raises(ValueError, match="replicates: at least 2"):
        gflow.runs.run_limit(cfg, ["data.L=10,20,40"], out=tmp_path / "y", R=1, flows=False)


def test_limit_resume_reuses_a_computed_size(theory_only_limit, monkeypatch):
    """--resume reads each size's saved values (limit_point.json) instead of sampling again, and
    gives the same verdicts and limits."""
    import gflow.runs._limit as lim

    cfg, out, res = theory_only_limit

    def boom(*a, **k):
        raise AssertionError("a saved size was computed again")

    monkeypatch.setattr(lim, "_sample_values", boom)
    again = gflow.runs.run_limit(cfg, ["data.L=10,20,40"], out=out, R=2, flows=False, n_pi=200, plot=False,
                                 resume=True)  # fmt: skip
    assert [c["verdict"] for c in again.claims] == [c["verdict"] for c in res.claims]
    assert [c["fit"] and c["fit"]["limit"] for c in again.claims] == [c["fit"] and c["fit"]["limit"] for c in res.claims]
    assert [p["wall"] for p in again.points] == [p["wall"] for p in res.points]
