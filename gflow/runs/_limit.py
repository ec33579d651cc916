"""The paper's limits, decided by finite-size scaling (``gflow limit``, docs/results/limits.md).

The paper's statements are asymptotic: L → ∞ (and, for the Stage I rates, a one-hot
copier, w₊ → ∞), or τ → ∞ within a run. One run measures each at one size, where it
can hold only approximately; :func:`run_limit` measures each at a grid of sizes, with its
Monte Carlo standard error over R independent replicates per size, fits scaling models
(:func:`gflow._util._scaling.fit_scaling`), extrapolates to the limit with a 95 % interval and
decides the claim.

**The grid.** One or two axes: ``data.L`` (the context length) and ``init.w_plus`` (the
copier's initial sharpness w₊), each with at least three distinct values. Every point runs R
replicates (:func:`gflow.runs.run_replicates`: ``estimator.seed = seed + r``, the same seeds
at every size, hence the same chains: a sample at L is the prefix of the one at a larger L),
through the executors, each replicate checked (:mod:`gflow.checks`). Theory-only claims
are computed on the same samples in this process.

**The scaling models.** ``q(L) = q∞`` (constant), ``q∞ + b/L``, ``q∞ + b/√L`` and
``q∞ + b/ln L``; with a ``init.w_plus`` axis each adds ``c·(1 − λ_w)``, λ_w = s^{2|S*|} the
initial copier's contrast (s = 1/(1 + (M−1)e^{w₋−w₊}) a head's mass on its own offset: to first
order J(S) at a blurred copier is λ_w times its one-hot value), and with ``init.w_plus`` alone
the models are ``q∞`` and ``q∞ + c·(1 − λ_w)``. Weighted least squares (weights 1/SE²), the model chosen by
AIC among those whose χ² p-value is ≥ 0.01; when none fits, the claim is undecided. A
size's SE, estimated from its R replicates, enters the fit scaled by t_{R−1}/1.96 (1.62 at
R = 4), so that its ± 1.96·SE is the Student-t 95 % interval of its mean. The sizes share
their samples: replicate r is the same N chains at every L (gflow's sample at L is the
first L + 1 tokens of the one at a larger L, for the same seed), so their errors are correlated;
the limit's SE is therefore the spread of the R limits that the chosen fit's linear estimator
gives on each replicate's own curve q_r(L) (Student-t), and the χ² that decides whether a
model fits, which treats the sizes as independent, is lenient (the shared part cancels in the
residuals). The
interval is the chosen model's; another model that fits within ΔAIC ≤ 2 of it and reaches a
different verdict makes the claim undecided (the extrapolation would be the model's, not the
data's).

**The claims** (:data:`CLAIMS`; q is measured on each replicate, its SE over the replicates):

- ``stage1_winner``: Stage I selects S* = argmax Ĩ. q = J(S*) − max_{S≠S*} J(S) at the run's
  initial copier (the finite-size rates the flow follows); claim q∞ > 0, and the flows at the
  largest size select S*.
- ``stage1_rate``: J(S*) → Ĩ(S*) (one-hot copier, L → ∞). q = J(S*) at a one-hot copier
  (w₊ = 40: the off-target softmax mass e^{−40} is below float64's resolution), or at the
  point's w₊ when w₊ is an axis (its limit then taken by the fit). Claim q∞ = Ĩ(S*) (its SE
  over the prior's kernels added), resolved to 10 % of Ĩ(S*).
- ``stage1_gap``: the same for the gap J(S*) − J(R) against Ĩ(S*) − Ĩ(R), R the Ĩ runner-up:
  the report's Stage I slope row against Ĩ, whose slope is 4a₀η_C/‖C‖² times this gap.
- ``stage2_one_hot``: the copier becomes one-hot (1 − s^(h)_h → 0 as τ → ∞). q = the
  smallest exponent β of 1 − s^(h)_h ∝ τ^{−β} over the selected heads (the report's Stage II
  rows); claim q∞ > 0.
- ``stage3_slope``: a(τ) = log τ + O(1). q = the slope of a against log τ in the GIH window
  (the report's paper row); claim q∞ = 1, resolved to ± 0.25.
- ``stage3_a``: the flow ends at the GIH of S*'s a*. q = λ·a_end/a*(S*) − 1, λ =
  (c_{S*}/Σc)·Π_{h∈S*}(s^(h)_h)² the contrast at the end (to first order the model is the GIH
  with a shrunk to λa, whose zero is a*/λ: a staged run freezes the copier at s = 1 − δ, a
  shift no L removes); claim q∞ = 0, resolved to ± 0.05.
- ``stage3_loss``: the limit is the GIH of S*. q = L̂_end − inf_a L_GIH(S*) on the run's
  sample; claim q∞ = 0, resolved to ± 0.01 nats.

**The verdict.** For a claim ``q∞ = v`` with resolution r (an equivalence test): with the
interval ``I = q∞ ± 1.96·√(SE² + SE_v²)``, *consistent* when I lies inside ``[v − r, v + r]``,
*inconsistent* when I lies wholly outside it, else *undecided* (the interval too wide, or
astride the band's edge). For ``q∞ > 0``: consistent when
the interval lies above 0, inconsistent when below, else undecided. Undecided also when no
scaling model fits or no run measured the quantity.

**Folder.** ``OUT/points/<k>_<field>=<value>/rep000…`` (ordinary replicate folders),
``OUT/limit.json``, ``OUT/limit.md``, ``OUT/figures/limit_<claim>.png``. ``resume`` reuses
the complete replicates and computes the rest.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from .._util import (
    L_TERMS,
    Z95,
    ScalingFit,
    atomic_write_json,
    atomic_write_text,
    fit_scaling,
    jsonable,
    mean_se,
    t95,
)
from ..config import Config
from ..core import init_params, make_loss, subset_label
from ..theory import Theory, modified_chi2_ranking, stage1_rates
from ..trajectory import Trajectory, load, selected_set
from ._replicates import RUN_DIR, run_replicates
from ._sweep import parse_param, point_dirname, sweep_points

AXES = ("data.L", "init.w_plus")
ONE_HOT_W_PLUS = 40.0
MIN_SIZES = 3
AIC_CLOSE = 2.0


@dataclasses.dataclass(frozen=True)
class Claim:
    """One paper claim as ``gflow limit`` decides it (module docstring)."""

    key: str
    statement: str
    quantity: str
    kind: str  # "eq": q∞ = value; "gt": q∞ > 0
    flow: bool  # measured on the flows (else on the samples alone)
    resolution: float = math.nan  # "eq": the largest 95 % half-width that decides
    relative: bool = False  # the resolution is relative to |value|
    value: float = 0.0  # "eq": the claimed limit (the Stage I claims': Ĩ's, from the ranking)


CLAIMS = (
    Claim("stage1_winner", "Stage I selects S* = argmax Ĩ", "J(S*) − max_{S≠S*} J(S) at the run's initial copier",
          "gt", False),
    Claim("stage1_rate", "J(S*) → Ĩ(S*) (one-hot copier, L → ∞)", "J(S*) at a one-hot copier", "eq", False, 0.1,
          True),
    Claim("stage1_gap", "J(S*) − J(R) → Ĩ(S*) − Ĩ(R), R the Ĩ runner-up (the Stage I slope against Ĩ)",
          "J(S*) − J(R) at a one-hot copier", "eq", False, 0.1, True),
    Claim("stage2_one_hot", "the copier becomes one-hot: 1 − s^(h)_h → 0 as τ → ∞",
          "min over the selected heads of β, 1 − s^(h)_h ∝ τ^(−β)", "gt", True),
    Claim("stage3_slope", "a(τ) = log τ + O(1): slope 1 against log τ", "slope of a vs log τ in the GIH window",
          "eq", True, 0.25, value=1.0),
    Claim("stage3_a", "Stage III ends at the GIH of S*'s a*", "λ·a_end / a*(S*) − 1 (λ the contrast at the end)", "eq",
          True, 0.05),
    Claim("stage3_loss", "the limit is the GIH of S* (loss → inf_a L_GIH)", "L̂_end − inf_a L_GIH(S*)", "eq", True,
          0.01),
)  # fmt: skip


def copier_contrast(w_plus: float, w_minus: float, M: int, k: int) -> float:
    """λ_w = s^{2k}, the initial copier's contrast for a set of k heads: s = 1/(1 + (M−1)e^{w₋−w₊}) the
    softmax mass of a head on its own offset when it starts at w₊ there and w₋ on the other M − 1."""
    return (1.0 / (1.0 + (M - 1) * math.exp(w_minus - w_plus))) ** (2 * k)


def _feature_models(axes: tuple[str, ...], *, w_minus: float = 0.1, M: int = 3, k: int = 2) -> list[tuple[str, list]]:
    """The candidate scaling models for the grid's axes (module docstring); the w₊ term's
    variable is 1 − λ_w (:func:`copier_contrast` of the initial copier, `k` the heads of S*)."""
    forms = [("", [])] + [(f" + {t}", [lambda p, x=x: float(x(p["data.L"]))]) for t, (_, x) in L_TERMS.items()]
    if "data.L" not in axes:
        forms = forms[:1]
    if "init.w_plus" in axes:
        lam = lambda p: 1.0 - copier_contrast(p["init.w_plus"], w_minus, M, k)  # noqa: E731
        forms = [(f + " + c·(1 − λ_w)", fs + [lam]) for f, fs in forms]
    return [("q∞" + f, fs) for f, fs in forms]


def limit_grid(config: Config, params) -> tuple[tuple[str, ...], list[tuple[dict, Config]]]:
    """The grid of ``gflow limit``, validated before any compute: ``(axes, [(point, config)])``.

    **Raises:** ``ValueError`` naming the problem: a field that is no scaling axis (the axes are
    ``data.L`` and ``init.w_plus``), a non-numeric value, fewer than three distinct values on an
    axis, an L at or below the largest parent offset or head (the claims' sets would not fit
    in the context), a w₊ ≤ 0, a model member or data kind the paper's claims do not cover.
    """
    pairs = [parse_param(p) if isinstance(p, str) else (p[0], list(p[1])) for p in params]
    if not pairs:
        raise ValueError("gflow limit needs a scaling axis: --param data.L=V1,V2,V3[,...] (and/or init.w_plus=...)")
    for field, vals in pairs:
        if field not in AXES:
            raise ValueError(f"{field}: not a scaling axis; gflow limit takes the limit in {' and '.join(AXES)}")
        bad = [v for v in vals if isinstance(v, bool) or not isinstance(v, (int, float))]
        if bad:
            raise ValueError(f"{field}: the scaling axis takes numbers, got {bad[0]!r}")
        if len(set(vals)) < MIN_SIZES:
            raise ValueError(f"{field}: a limit needs at least {MIN_SIZES} distinct sizes, got {len(set(vals))} "
                             f"({', '.join(str(v) for v in vals)})")  # fmt: skip
    if config.model.member != "paper" or config.data.kind != "ngram":
        raise ValueError(f"gflow limit decides the paper's claims for model.member = 'paper' on data.kind = 'ngram', "
                         f"got model.member = {config.model.member!r}, data.kind = {config.data.kind!r}")  # fmt: skip
    points = sweep_points(config, pairs)
    floor = max(max(config.data.parents), config.model.H)
    for point, cfg in points:
        if cfg.data.L <= floor:
            raise ValueError(f"data.L = {cfg.data.L}: at or below the largest parent offset or head ({floor}); "
                             "the claims' parent sets would not fit in the context")  # fmt: skip
        if cfg.init.w_plus <= 0:
            raise ValueError(f"init.w_plus = {cfg.init.w_plus}: the scaling axis w₊ must be > 0")
    return tuple(f for f, _ in pairs), points


def _complete(folder: Path, R: int) -> list[tuple[Path, Trajectory]] | None:
    """The R replicate folders of a size and their trajectories when every one holds a complete,
    checked run (resume reuses them as they are, without integrating or checking again), else
    ``None``."""
    out = []
    for d in (folder / RUN_DIR.format(r) for r in range(R)):
        if not (d / "report.json").exists():
            return None
        try:
            tr = load(d)
        except (OSError, ValueError):
            return None
        if tr.status != "complete":
            return None
        out.append((d, tr))
    return out


def _saved_point(folder: Path, cfg: Config, R: int) -> dict | None:
    """A size's saved theory-only values and its cost (``limit_point.json``), if computed for this
    configuration and R; its ``wall`` is the time the size took when it was computed."""
    try:
        saved = json.loads((folder / "limit_point.json").read_text())
    except (OSError, ValueError):
        return None
    return saved if saved.get("R") == R and saved.get("config") == jsonable(cfg.to_dict()) else None


def _row(report: dict | None, prefix: str) -> list[dict]:
    return [r for r in (report or {}).get("rows", []) if r["name"].startswith(prefix)]


def _num(x) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else math.nan


def _flow_values(folder: Path, tr: Trajectory, S_star) -> dict[str, float]:
    """The flow claims' q of one replicate folder and its trajectory `tr` (NaN where the run or its
    report lacks it)."""
    nan = dict.fromkeys(("stage2_one_hot", "stage3_slope", "stage3_a", "stage3_loss"), math.nan)
    rep_path, th_path = folder / "report.json", folder / "theory.json"
    if not (rep_path.exists() and th_path.exists()):
        return nan
    report = json.loads(rep_path.read_text())
    th = Theory.from_json(json.loads(th_path.read_text()))
    out = dict(nan)
    betas = [_num(r["measured"]) for r in _row(report, "II: exponent β of")]
    if betas:
        out["stage2_one_hot"] = min(betas)
    slope = _row(report, "III: slope of a vs log τ in window (paper: 1)")
    if slope:
        out["stage3_slope"] = _num(slope[0]["measured"])
    law = th.laws.get(tuple(S_star))
    if law is not None and tr.status == "complete":
        if law.a_star is not None:  # the model is the GIH with a shrunk to λa: its zero a*/λ
            S = tuple(S_star)
            lam = float(tr.c_frac[-1][tr.subsets.index(S)]) * math.prod(
                float(tr.s[-1][h - 1, tr.config.model.own_offset_index(h)]) ** 2 for h in S)
            out["stage3_a"] = lam * float(tr.a[-1]) / law.a_star - 1.0
        out["stage3_loss"] = float(tr.loss[-1]) - law.limit_loss
    return out


def _sample_values(cfg: Config, S_star, R_set, sets, axes) -> dict[str, float]:
    """The theory-only claims' q on one replicate's sample (its own ``estimator.seed``)."""
    loss = make_loss(cfg.data, cfg.model, cfg.estimator)
    i, j = sets.index(tuple(S_star)), sets.index(tuple(R_set))
    J = np.asarray(stage1_rates(loss, init_params(cfg.model, cfg.init, d=cfg.data.d, L=cfg.data.L).first_layer).J)
    hot = cfg.init if "init.w_plus" in axes else cfg.replace(init={"w_plus": ONE_HOT_W_PLUS}).init
    J1 = np.asarray(stage1_rates(loss, init_params(cfg.model, hot, d=cfg.data.d, L=cfg.data.L).first_layer).J)
    others = np.delete(J, i)
    return {"stage1_winner": float(J[i] - others.max()), "stage1_rate": float(J1[i]),
            "stage1_gap": float(J1[i] - J1[j])}  # fmt: skip


@dataclasses.dataclass
class LimitResult:
    """What :func:`run_limit` measured and decided: `claims` (one dict per claim: the claim, the
    per-size means and SEs, the chosen fit and every candidate, the limit's interval, the
    verdict and its reason), `points` (per size: the point, its replicates' selected sets, the
    wall time), `axes`, `wall`, `files`."""

    axes: tuple[str, ...]
    points: list[dict]
    claims: list[dict]
    ranking: dict
    wall: float
    files: list[Path] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict:
        return jsonable({"axes": list(self.axes), "points": self.points, "claims": self.claims,
                         "ranking": self.ranking, "wall": self.wall})  # fmt: skip

    def table(self) -> str:
        """One line per claim: the claim's value, the limit with its 95 % interval, the model, the verdict."""
        lines = ["| claim | paper | limit (95 % interval) | scaling model (p) | verdict |", "|---|---|---|---|---|"]
        for c in self.claims:
            fit = c["fit"]
            lim = "—" if fit is None else f"{fit['limit']:.4g} [{fit['interval'][0]:.4g}, {fit['interval'][1]:.4g}]"
            model = "—" if fit is None else f"{fit['model']} ({fit['p']:.2g})"
            want = "> 0" if c["kind"] == "gt" else f"{c['value']:.4g}"
            lines.append(f"| {c['key']}: {c['statement']} | {want} | {lim} | {model} | {c['verdict']} |")
        return "\n".join(lines)


def decide(claim: Claim, fit: ScalingFit | None, value: float, value_se: float, *, flows_ok: bool | None = None
           ) -> tuple[str, str]:  # fmt: skip
    """A claim's verdict and reason from its chosen fit (module docstring)."""
    if fit is None:
        return "undecided", "no scaling model could be fitted (too few sizes with a measurement)"
    if not fit.fits:
        return "undecided", f"no scaling model fits (the best, {fit.model}, has χ² = {fit.chi2:.3g} on {fit.dof} dof, p = {fit.p:.2g})"
    lo, hi = fit.interval
    if claim.kind == "gt":
        if hi < 0:
            return "inconsistent", f"the limit's interval [{lo:.4g}, {hi:.4g}] lies below 0"
        if lo <= 0:
            return "undecided", f"the limit's interval [{lo:.4g}, {hi:.4g}] contains 0"
        if flows_ok is False:
            return "undecided", "the limit is > 0 but a flow at the largest size selected another set"
        return "consistent", f"the limit's interval [{lo:.4g}, {hi:.4g}] lies above 0"
    half = Z95 * math.sqrt(fit.limit_se**2 + value_se**2)
    res = claim.resolution * (abs(value) if claim.relative else 1.0)
    lo, hi = fit.limit - half, fit.limit + half
    band = f"the claim's band {value:.4g} ± {res:.3g}"
    if hi < value - res or lo > value + res:
        return "inconsistent", f"the limit's interval [{lo:.4g}, {hi:.4g}] lies outside {band}"
    if lo >= value - res and hi <= value + res:
        return "consistent", f"the limit's interval [{lo:.4g}, {hi:.4g}] lies inside {band}"
    return "undecided", f"the limit's interval [{lo:.4g}, {hi:.4g}] overlaps {band} without lying inside it"


def _mean_se(v) -> tuple[float, float, int]:
    """Mean, SE and count of the finite values (SE NaN for fewer than two: no spread to measure)."""
    x = [y for y in v if math.isfinite(y)]
    if not x:
        return math.nan, math.nan, 0
    m, se = mean_se(x)
    return float(m), float(se) if len(x) > 1 else math.nan, len(x)


def run_limit(
    config: Config = Config(),
    params=(),
    *,
    out: str | Path,
    R: int = 4,
    flows: bool = True,
    n_pi: int = 2000,
    resume: bool = False,
    overwrite: bool = False,
    executor=None,
    verbose: bool = False,
    plot: bool = True,
) -> LimitResult:
    """Decide the paper's asymptotic claims by finite-size scaling (module docstring).

    - `params`: the axes, as for :func:`gflow.runs.sweep_points` (``--param`` strings or
      ``(field, values)``): ``data.L`` and/or ``init.w_plus``, three sizes or more each.
    - `R`: replicates per size (≥ 2: a standard error over them).
    - `flows`: integrate and check the flows (else the theory-only claims alone; the flow
      claims are undecided, "not run").
    - `n_pi`: the prior kernels of the Ĩ ranking (S*, the runner-up R, and Ĩ's SE).
    - `resume`, `overwrite`: replicate folders already in `out` are reused (complete ones) or
      continued, or replaced; without either, a folder holding runs is refused.

    **Raises:** ``ValueError`` before any compute for a bad grid (:func:`limit_grid`), R < 2,
    or an existing `out` with runs without `resume`/`overwrite`.
    """
    axes, points = limit_grid(config, params)
    if isinstance(R, bool) or not isinstance(R, (int, np.integer)) or R < 2:
        raise ValueError(f"replicates: at least 2 per size (a standard error over them), got {R!r}")
    out = Path(out)
    if (out / "points").exists() and not (resume or overwrite):
        raise ValueError(f"{out} holds a limit's runs already: --resume reuses them, --overwrite replaces them")
    t0 = time.perf_counter()
    sets = config.model.subsets
    import jax

    rank = modified_chi2_ranking(config.data, sets, n_pi=n_pi, key=jax.random.key(0))
    It = np.asarray(rank.Itilde)
    S_star = tuple(rank.S_star)
    order = [sets[k] for k in np.argsort(-It, kind="stable") if sets[k] != S_star]
    R_set = order[0]
    i, j = sets.index(S_star), sets.index(R_set)
    values = {"stage1_rate": (float(It[i]), float(rank.Itilde_se[i])),
              "stage1_gap": (float(It[i] - It[j]), float(rank.diff_se[i, j]))}  # fmt: skip
    per_point = []
    for k, (point, cfg) in enumerate(points):
        tp = time.perf_counter()
        folder = out / "points" / point_dirname(k, point)
        q: dict[str, list[float]] = {c.key: [] for c in CLAIMS}
        selected = []
        saved = _saved_point(folder, cfg, R) if resume else None
        if flows:
            runs = _complete(folder, R) if resume else None
            if runs is None:  # integrate (resume: continue) the replicates; else reuse them as they are
                reps = run_replicates(cfg, R, out=folder, resume=resume, overwrite=overwrite, check=True,
                                      verbose=verbose, executor=executor)  # fmt: skip
                runs = [(Path(d), tr) for d, tr in zip(reps.dirs, reps.trajectories)]
                saved = None
            for d, tr in runs:
                sel = selected_set(tr)
                selected.append(None if sel is None else list(sel))
                for key, v in _flow_values(d, tr, S_star).items():
                    q[key].append(v)
        if saved is None:
            sample_q = {}
            for r in range(R):
                cr = cfg.replace(estimator={"seed": int(cfg.estimator.seed) + r})
                for key, v in _sample_values(cr, S_star, R_set, sets, axes).items():
                    sample_q.setdefault(key, []).append(v)
            saved = {"config": cfg.to_dict(), "R": R, "sample_q": sample_q, "wall": time.perf_counter() - tp}
            folder.mkdir(parents=True, exist_ok=True)
            atomic_write_json(folder / "limit_point.json", jsonable(saved))
        for key, v in saved["sample_q"].items():
            q[key].extend(v)
        stats = {key: _mean_se(v) for key, v in q.items()}
        per_point.append({"point": dict(point), "dir": str(folder.relative_to(out)), "selected": selected,
                          "q": q, "mean": {k_: s[0] for k_, s in stats.items()},
                          "se": {k_: s[1] for k_, s in stats.items()}, "n": {k_: s[2] for k_, s in stats.items()},
                          "wall": float(saved["wall"])})  # fmt: skip
        if verbose:
            took = time.perf_counter() - tp
            print(f"  size {k + 1}/{len(points)} {point}: {took:.1f} s" + (f" (reused; computed in {saved['wall']:.1f} s)"
                  if took < 0.5 * saved["wall"] else ""), flush=True)  # fmt: skip
    claims = _decide_all(config, axes, per_point, values, S_star, flows)
    res = LimitResult(axes=axes, points=per_point, claims=claims, wall=time.perf_counter() - t0,
                      ranking={"sets": [subset_label(S) for S in sets], "Itilde": It.tolist(),
                               "Itilde_se": np.asarray(rank.Itilde_se).tolist(), "S_star": subset_label(S_star),
                               "runner_up": subset_label(R_set), "n_pi": int(rank.n_pi)})  # fmt: skip
    w_minus, M = float(config.init.w_minus), int(config.model.M)
    res.files = _write(res, out, plot=plot, contrast=lambda w: copier_contrast(w, w_minus, M, len(S_star)))
    return res


def _decide_all(config, axes, per_point, values, S_star, flows) -> list[dict]:
    models = _feature_models(axes, w_minus=float(config.init.w_minus), M=int(config.model.M), k=len(S_star))
    largest = max(p["point"].get("data.L", 0) for p in per_point)
    out = []
    for c in CLAIMS:
        value, value_se = values.get(c.key, (c.value, 0.0))
        rows = [p for p in per_point if math.isfinite(p["mean"][c.key])]
        pts = [p["point"] for p in rows]
        mean = [p["mean"][c.key] for p in rows]
        # a size's SE is estimated from its n replicates (n − 1 degrees of freedom): scaled by
        # t_{n−1}/z, so that its ± 1.96·SE is the Student-t 95 % interval of its mean
        se = [p["se"][c.key] * t95(p["n"][c.key] - 1) / Z95 if p["n"][c.key] > 1 else 0.0 for p in rows]
        se = [s if math.isfinite(s) else 0.0 for s in se]
        # replicate r is the same N chains at every size (a size's sample is the prefix of a longer
        # one), so the sizes' errors are correlated: the limit's SE is the spread over replicates
        reps = np.array([p["q"][c.key] for p in rows], np.float64).T  # (R, sizes)
        enough = int(np.all(np.isfinite(reps), axis=1).sum()) >= 2 if reps.size else False
        chosen, every = (fit_scaling(pts, mean, se, models, replicates=reps if enough else None)
                         if len(rows) >= MIN_SIZES else (None, []))  # fmt: skip
        flows_ok = None
        if c.key == "stage1_winner" and flows:
            big = [p for p in per_point if p["point"].get("data.L", 0) == largest]
            flows_ok = all(s == list(S_star) for p in big for s in p["selected"])
        if c.flow and not flows:
            verdict, why = "undecided", "the flows were not run (--theory-only)"
        else:
            verdict, why = decide(c, chosen, value, value_se, flows_ok=flows_ok)
            # the models that fit about as well (ΔAIC ≤ 2) must agree, or the extrapolation is the model's
            rivals = [f for f in every if chosen is not None and f.fits and f is not chosen
                      and f.aic - chosen.aic <= AIC_CLOSE]  # fmt: skip
            other = [(f, decide(c, f, value, value_se, flows_ok=flows_ok)[0]) for f in rivals]
            split = [(f, v) for f, v in other if v != verdict]
            if chosen is not None and chosen.fits and split:
                why = (f"the models within ΔAIC ≤ {AIC_CLOSE:g} disagree: {chosen.model} says {verdict}, "
                       + ", ".join(f"{f.model} says {v} (q∞ = {f.limit:.4g})" for f, v in split))  # fmt: skip
                verdict = "undecided"
        out.append({
            **dataclasses.asdict(c), "value": value if c.kind == "eq" else 0.0, "value_se": value_se,
            "sizes": [{"point": p["point"], "mean": p["mean"][c.key], "se": p["se"][c.key], "n": p["n"][c.key]}
                      for p in per_point],
            "fit": None if chosen is None else chosen.to_json(), "candidates": [f.to_json() for f in every],
            "verdict": verdict, "reason": why,
        })  # fmt: skip
    return out


def _write(res: LimitResult, out: Path, *, plot: bool, contrast=None) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "limit.json", res.to_json())
    files = [out / "limit.json", out / "limit.md"]
    (out / "figures").mkdir(exist_ok=True)
    if plot:
        from ..figures import plot_limit

        for c in res.claims:
            files.append(plot_limit(c, res.axes, out / "figures" / f"limit_{c['key']}.png", contrast=contrast))
    atomic_write_text(out / "limit.md", limit_markdown(res))
    return files


def limit_markdown(res: LimitResult) -> str:
    """``limit.md``: the verdicts, then every claim's sizes, fit and reason."""
    rk = res.ranking
    lines = [
        "# gflow limit: the paper's asymptotic claims by finite-size scaling", "",
        f"- axes: {', '.join(res.axes)}; sizes: {len(res.points)}; replicates per size: "
        f"{len(next(iter(res.points[0]['q'].values())))}; wall {res.wall:.1f} s",
        f"- S* = argmax Ĩ = {rk['S_star']}, Ĩ runner-up R = {rk['runner_up']} ({rk['n_pi']} prior kernels)", "",
        res.table(), "",
    ]  # fmt: skip
    for c in res.claims:
        lines += [f"## {c['key']}: {c['statement']}", "", f"q = {c['quantity']}. Verdict: **{c['verdict']}**: {c['reason']}.", ""]
        lines += ["| size | q (mean) | SE |", "|---|---|---|"]
        for s in c["sizes"]:
            where = ", ".join(f"{k}={v}" for k, v in s["point"].items())
            lines.append(f"| {where} | {s['mean']:.6g} | {s['se']:.3g} |")
        if c["candidates"]:
            lines += ["", "| model | q∞ | SE | χ² | dof | p | AIC |", "|---|---|---|---|---|---|---|"]
            for f in c["candidates"]:
                lines.append(f"| {f['model']} | {f['limit']:.5g} | {f['limit_se']:.3g} | {f['chi2']:.3g} | {f['dof']} "
                             f"| {f['p']:.3g} | {f['aic']:.3g} |")  # fmt: skip
        lines.append("")
    return "\n".join(lines)


def load_limit(out: str | Path) -> dict[str, Any]:
    """The ``limit.json`` of a ``gflow limit`` folder."""
    return json.loads((Path(out) / "limit.json").read_text())
