"""The check report: every prediction of SPEC §6 against a run (SPEC §7).

:func:`check` compares a :class:`~gflow.trajectory.Trajectory` with the theory
of :mod:`gflow.theory` and returns a :class:`Report`, one :class:`Row` per
prediction: ``name, predicted, measured, tolerance, passed``.
:func:`check_run` does the same for a run folder and writes ``report.json``,
``report.md`` and ``theory.json`` (the theory the plots reuse) next to it.

**Pass, fail, informational.** ``passed`` is ``True`` or ``False`` for a
prediction that the run can confirm or refute, and ``None`` for an
*informational* row: a number worth showing next to the others but which is
not expected to match (the L → ∞ / one-hot-copier limits, the joint
schedule, for which the paper makes no prediction) or which the run cannot
decide (a stage cut by its duration, too few saved points). The row's
tolerance then starts with ``"info"`` and says why. :attr:`Report.passed`
is ``all`` over the rows whose ``passed`` is not ``None``.

**What is compared with what.** The theory is computed on the run's own
sample (same seed: :func:`~gflow.loss.make_loss` is deterministic), so the
flow and its predictions share their common random numbers and agree far
better than their Monte Carlo standard errors; the SEs, when they enter a
tolerance, are *paired* SEs over the sequences (the SE of the per-sequence
difference), i.e. they test the *population* statement at ``k_se`` (4)
standard errors. The other ingredients of the tolerances are the solver's
error budget and, for Stages II and III, the distance of the frozen
copier/selector from the one-hot limit in which the theory is exact, through
the *contrast*

    λ = (c_S*/Σc) · Π_{h∈S*} (s^(h)_h)²,

the weight with which the model's kernel κ_l reads the GIH's match
indicator: κ_l = λ·1{match on S*} + (a background that is nearly the same at
every position, which the softmax ignores) + … . To first order the model in
Stage III is therefore the GIH with its scale ``a`` shrunk to ``λa``: its law
is ``λ F(λa)``, its zero ``a*/λ``, its limit loss unchanged. The λ-rescaled
law brackets the flow's (on the paper's default, the flow's force is ~70% of
the way from ``F(a)`` to ``λF(λa)``), so ``|λF(λa) − F(a)|`` and
``a*(1/λ − 1)`` are the tolerances of the Stage III comparisons.

**Rows** (S* = argmax Ĩ from the theory; S' its runner-up in the Ĩ ranking;
τ = t − t0 of the stage, each stage running on its own clock):

1. Stage I winner: argmax c/Σc at the end of Stage I = S* (a close call of
   the Ĩ ranking admits every set within 3 paired SE of the top), and
   c_S*/Σc ≥ 1 − δ at the end of Stage I (its event).
2. Stage I rates: the slope of log(c_S*/c_S') against t, least squares over
   the early part of Stage I (saved times while ``max_S c_S/Σc < 2/|𝒮|``,
   where the linearisation in a holds and c is still near uniform), against
   ``4 a₀ η_C (J(S*) − J(S'))/‖C‖²`` with J from
   :func:`~gflow.theory.stage1_rates` at the run's initial w; tolerance
   ``4 × paired SE`` of that prediction (J's paired SE; a is frozen at a₀ in
   Stage I and ‖C‖ is conserved, so the prediction is a constant). The same
   for every S against S* (one row), and the Ĩ-based prediction
   (informational: Ĩ is J's limit for a one-hot copier and L → ∞, not its
   value at finite w₊). ‖C‖² conserved: the flow conserves it exactly
   (L̂ depends on C only through c/Σc, so ∇_C L̂ ⟂ C); tolerance the
   adaptive solver's accumulated local-error budget
   ``2·steps·(rtol + atol·√|𝒮|/‖C‖)``.
3. Stage II, for each head h of the selected set: s^(h)_h ≥ 1 − δ at the end
   (the event; 1e-9 for the event's root find), and the exponent β of
   ``1 − s^(h)_h(τ) ~ τ^(−β)`` fitted on the late part of Stage II (the
   saved points with ``1 − s ≤ (1 − s(0))/4``, or the last half if fewer
   than 3), against gflow's one-line softmax argument (not the paper's
   statement): the logit gap u = w_h − w_j obeys du/dτ ≈ K e^{−u}, so
   ``1 − s ≈ A/(B + τ)``, whose log-log slope on ``[τ₁, τ₂]`` lies in
   ``[1 − r, 1]``, ``r = (1 − s(τ₁))/(1 − s(0))``; the tolerance is ``|β − 1| ≤ r``
   (K itself drifts as the copier sharpens, which can push β above the
   constant-K range, hence symmetric); informational when ``r > 1/2`` (1 − s
   has not yet fallen by half: not the asymptotic regime). Heads outside the selected set move
   little: ``max |Δw|`` outside over ``max |Δw|`` inside, predicted 0; their
   gradient is a sum over the sets containing them weighted by c_S/Σc, so
   the ratio is of the order of that mass ``m_out`` over the selected set's
   ``m_in``; tolerance ``10·m_out/m_in`` (an order of magnitude for the
   ratio of per-set sensitivities).
4. Stage III: C* (informational: measured ``max ∂_τ a·e^a``), the slope of a
   against log τ over the saved times with a in the validity window
   (predicted 1, the paper's ``a = log t + O(1)``; tolerance: the slope in
   ``[1/2, 2]``, the factor 2 by which the window lets ``F e^a`` vary), the
   slope predicted by the GIH law itself (informational: integrating
   ``da/dτ = η_a F(a)`` and ``η_a λF(λa)``, fitted on the same times), the
   measured ``∂_τ a·e^a = −η_a ∂_a L̂·e^a`` (stored gradient) against
   ``η_a F(a) e^a`` at every saved time in the window (tolerance pointwise
   ``η_a|λF(λa) − F(a)| e^a + 4 paired SE``), and ``a(τ_end)`` against ``a*``
   (tolerance ``a*|1/λ − 1| + 4 paired SE`` of the zero; only when Stage III
   ran long enough — the GIH law and the flow both settled within a quarter
   of the tolerance — otherwise informational).
5. Limit loss: the flow's loss at the end against ``inf_a L_GIH``;
   tolerance ``4 paired SE`` of the per-sequence difference (to first order
   the model is the GIH with a rescaled a, whose infimum is the same).

**Schedules.** The staged schedule gets every row. A joint run (one stage
"joint") has no Stage I/II/III boundaries: the winner and its concentration
are read at the end of the run and are informational (the paper's
predictions are for the staged flow); the Stage I rates are the
instantaneous rates at t = 0 from the stored gradient (exact at t = 0 for
any schedule, since w and a have not moved yet); ‖C‖² is checked over the
whole run; the Stage II rows are skipped; the Stage III law rows are
informational with τ = t; a(t_end) against a* and the limit loss apply (λ
read at the end). Gradient-descent runs (``solver.method = "gd"``) get the
same rows, except that ‖C‖² conservation is informational (explicit Euler
grows ‖C‖² by ``η²‖∇_C L̂‖²`` per step). Rows that do not apply are listed
in :attr:`Report.skipped` with the reason.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .loss import PopulationLoss, make_loss
from .model import Params, subset_label
from .theory import make_gih, modified_chi2_ranking, theory_report
from .trajectory import Trajectory, load

__all__ = [
    "Report",
    "Row",
    "check",
    "check_run",
    "contrast",
    "linear_fit",
    "log_slope",
    "power_exponent",
]

# Event threshold slack: diffrax locates the event with a Newton root find at
# rtol = atol = 1e-12; the event function at the located time is within
# rounding of 0.
_EVENT_SLACK = 1e-9


# ---------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Row:
    """One prediction of SPEC §6 against the run.

    - `name`: what is compared (unique within a report).
    - `predicted`, `measured`: numbers, short strings (``"{1,2}"``) or short lists.
    - `tolerance`: a number (an absolute bound on ``|measured − predicted|``)
      or a short string saying what is allowed; ``"info: …"`` for an
      informational row.
    - `passed`: ``True``/``False``, or ``None`` for an informational row.
    """

    name: str
    predicted: Any
    measured: Any
    tolerance: Any
    passed: bool | None


def _jsonable(x, *, inf_as_str: bool = True):
    """Plain JSON values: numpy scalars and arrays to Python ones, paths to
    strings, NaN to ``None``, ±∞ to ``"inf"``/``"-inf"`` (or ``None`` with
    ``inf_as_str=False``)."""
    rec = lambda v: _jsonable(v, inf_as_str=inf_as_str)
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        x = float(x)
        if math.isfinite(x):
            return x
        return None if math.isnan(x) or not inf_as_str else ("inf" if x > 0 else "-inf")
    if isinstance(x, np.ndarray):
        return [rec(v) for v in x.tolist()]
    if isinstance(x, (list, tuple)):
        return [rec(v) for v in x]
    if isinstance(x, dict):
        return {str(k): rec(v) for k, v in x.items()}
    if isinstance(x, Path):
        return str(x)
    return x


def _cell(x) -> str:
    if x is None:
        return "—"
    if isinstance(x, (bool, np.bool_)):
        return str(bool(x))
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    if isinstance(x, (float, np.floating)):
        return format(float(x), ".4g")
    if isinstance(x, (list, tuple, np.ndarray)):
        return "[" + ", ".join(_cell(v) for v in x) + "]"
    return str(x)


def _verdict(p) -> str:
    return "info" if p is None else ("PASS" if p else "FAIL")


@dataclasses.dataclass
class Report:
    """The check report of a run (SPEC §7): `rows`, plus `run` (a summary of
    the run), `theory` (a summary of the predictions), `skipped` (checks that
    do not apply, with the reason) and `notes`."""

    rows: list[Row]
    run: dict = dataclasses.field(default_factory=dict)
    theory: dict = dataclasses.field(default_factory=dict)
    skipped: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def passed(self) -> bool:
        """Every non-informational row passed (informational rows, ``passed is
        None``, are ignored)."""
        return all(r.passed for r in self.rows if r.passed is not None)

    @property
    def failed(self) -> list[Row]:
        return [r for r in self.rows if r.passed is False]

    def row(self, name: str) -> Row:
        """The row called `name` (``KeyError`` if there is none)."""
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(f"no row named {name!r}; rows: {[r.name for r in self.rows]}")

    def to_json(self) -> dict:
        """A JSON-serialisable dict: ``"rows"`` (objects with exactly the keys
        name, predicted, measured, tolerance, passed), ``"passed"``, ``"run"``,
        ``"theory"``, ``"skipped"``, ``"notes"``. Non-finite numbers are
        ``None`` (NaN) or ``"inf"``/``"-inf"``."""
        return {
            "rows": [
                {f.name: _jsonable(getattr(r, f.name)) for f in dataclasses.fields(Row)} for r in self.rows
            ],
            "passed": self.passed,
            "run": _jsonable(self.run),
            "theory": _jsonable(self.theory),
            "skipped": list(self.skipped),
            "notes": list(self.notes),
        }

    def _header(self) -> list[str]:
        out = []
        r, t = self.run, self.theory
        if r:
            out.append(
                f"run: {r.get('schedule', '?')} schedule, solver {r.get('method', '?')}, "
                f"status {r.get('status', '?')}; "
                + "; ".join(
                    f"{s['name']}: t ∈ [{s['t0']:.4g}, {s['t1']:.4g}] ended by {s['ended_by']}"
                    for s in r.get("stages", [])
                )
            )
        if t:
            win = t.get("window")
            out.append(
                f"theory: S* = {t.get('S_star')} (close call: {'yes' if t.get('close_call') else 'no'}); "
                f"C* = {_cell(t.get('C_star'))}, window = {_cell(win)}, a* = {_cell(t.get('a_star'))}, "
                f"inf L_GIH = {_cell(t.get('limit_loss'))}"
            )
        n_fail = len(self.failed)
        n_info = sum(r.passed is None for r in self.rows)
        out.append(
            f"verdict: {'PASS' if self.passed else 'FAIL'} "
            f"({len(self.rows) - n_fail - n_info} passed, {n_fail} failed, {n_info} informational)"
        )
        return out

    def to_markdown(self) -> str:
        """The report as a Markdown document with one table."""

        def esc(s: str) -> str:
            return s.replace("|", "\\|")

        out = ["# gflow check report", ""]
        out += [f"- {esc(line)}" for line in self._header()]
        out += ["", "| check | predicted | measured | tolerance | result |", "|---|---|---|---|---|"]
        for r in self.rows:
            cells = [r.name, _cell(r.predicted), _cell(r.measured), _cell(r.tolerance), _verdict(r.passed)]
            out.append("| " + " | ".join(esc(c) for c in cells) + " |")
        if self.skipped:
            out += ["", "Not applicable:", ""] + [f"- {esc(s)}" for s in self.skipped]
        if self.notes:
            out += ["", "Notes:", ""] + [f"- {esc(s)}" for s in self.notes]
        out.append("")
        out.append(
            "Informational rows (result `info`) are shown for comparison and do not count towards "
            "the verdict."
        )
        return "\n".join(out) + "\n"

    def table(self) -> str:
        """A plain-text table for the terminal."""
        head = ("check", "predicted", "measured", "tolerance", "result")
        body = [
            (r.name, _cell(r.predicted), _cell(r.measured), _cell(r.tolerance), _verdict(r.passed))
            for r in self.rows
        ]
        width = [max(len(x[k]) for x in [head] + body) for k in range(5)]
        # a long tolerance string would push the verdict off screen: cap that column
        width[3] = min(width[3], 60)

        def line(cells):
            parts = []
            for k, c in enumerate(cells):
                c = c if len(c) <= width[k] else c[: width[k] - 1] + "…"
                parts.append(c.ljust(width[k]))
            return "  ".join(parts).rstrip()

        out = self._header() + ["", line(head), line(tuple("-" * w for w in width))]
        out += [line(b) for b in body]
        if self.skipped:
            out += ["", "not applicable:"] + [f"  {s}" for s in self.skipped]
        if self.notes:
            out += ["", "notes:"] + [f"  {s}" for s in self.notes]
        return "\n".join(out)

    def __str__(self) -> str:
        return self.table()


# ---------------------------------------------------------------------------
# Fits (public: the plots draw the same lines)
# ---------------------------------------------------------------------------


def linear_fit(x, y) -> tuple[float, float, float]:
    """Ordinary least squares ``y ≈ slope·x + intercept``.

    **Returns:** ``(slope, intercept, se)``, `se` the usual OLS standard error
    of the slope (0 with two points, NaN with fewer).
    """
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    n = x.size
    if n < 2:
        return math.nan, math.nan, math.nan
    xm, ym = x.mean(), y.mean()
    sxx = float(np.sum((x - xm) ** 2))
    if sxx == 0:
        return math.nan, math.nan, math.nan
    slope = float(np.sum((x - xm) * (y - ym)) / sxx)
    icpt = float(ym - slope * xm)
    if n == 2:
        return slope, icpt, 0.0
    resid = y - (slope * x + icpt)
    se = math.sqrt(float(np.sum(resid**2)) / (n - 2) / sxx)
    return slope, icpt, se


def log_slope(tau, a, window=None) -> tuple[float, int]:
    """The slope of ``a`` against ``log τ`` (least squares) over the points
    with ``τ > 0`` and, if `window` ``(lo, hi)`` is given, ``lo ≤ a ≤ hi``
    (SPEC §6.4: the paper's ``a(t) = log t + O(1)`` gives slope 1).

    **Returns:** ``(slope, number of points used)``; the slope is NaN with
    fewer than 2 points.
    """
    tau = np.asarray(tau, np.float64)
    a = np.asarray(a, np.float64)
    m = (tau > 0) & np.isfinite(a) & np.isfinite(tau)
    if window is not None:
        lo, hi = window
        m &= (a >= lo) & (a <= hi)
    n = int(m.sum())
    if n < 2:
        return math.nan, n
    return linear_fit(np.log(tau[m]), a[m])[0], n


def power_exponent(tau, y) -> tuple[float, int]:
    """The exponent β of ``y ~ τ^(−β)``: minus the least-squares slope of
    ``log y`` against ``log τ`` over the points with ``τ > 0`` and ``y > 0``
    (SPEC §6.3).

    **Returns:** ``(β, number of points used)``; NaN with fewer than 2 points.
    """
    tau = np.asarray(tau, np.float64)
    y = np.asarray(y, np.float64)
    m = (tau > 0) & (y > 0) & np.isfinite(tau) & np.isfinite(y)
    n = int(m.sum())
    if n < 2:
        return math.nan, n
    return -linear_fit(np.log(tau[m]), np.log(y[m]))[0], n


def contrast(s, c_frac, S, sets) -> float:
    """The contrast ``λ = (c_S/Σc)·Π_{h∈S} (s^(h)_h)²`` of the model's kernel
    on the GIH's match indicator on offsets S (see the module docstring):
    the weight of the selector on S times, for each head of S, the
    probability that the copier reads offset h in both the query and the key.
    ``λ = 1`` exactly when the copier is one-hot on S and ``c = e_S``.

    `s` is the copier attention ``(H, M)``, `c_frac` ``c/Σc`` in the order of
    `sets`.
    """
    S = tuple(S)
    lam = float(np.asarray(c_frac)[list(sets).index(S)])
    for h in S:
        lam *= float(np.asarray(s)[h - 1, h - 1]) ** 2
    return lam


# ---------------------------------------------------------------------------
# Jitted helpers on the run's estimator and its GIH
# ---------------------------------------------------------------------------


@eqx.filter_jit
def _model_force_per_seq(loss: PopulationLoss, w, C, a):
    """``−∂ℓ_n/∂a`` for every sequence at θ = (w, C, a)."""
    f = lambda aa: loss.per_sequence(Params(w=w, C=C, a=aa))
    return -jax.jvp(f, (a,), (jnp.ones_like(a),))[1]


@eqx.filter_jit
def _model_loss_per_seq(loss: PopulationLoss, w, C, a):
    return loss.per_sequence(Params(w=w, C=C, a=a))


@eqx.filter_jit
def _gih_force(gih, a):
    return jax.vmap(gih.force)(a)


@eqx.filter_jit
def _gih_force_per_seq(gih, a):
    return gih.per_sequence_force(a)


@eqx.filter_jit
def _gih_dforce(gih, a):
    return jax.grad(gih.force)(a)


@eqx.filter_jit
def _gih_ode(gih, a0, lam, rate, ts):
    """``a(τ)`` at `ts` for ``da/dτ = rate·λF(λa)``, ``a(0) = a0`` (λ = 1: the GIH law)."""

    def vf(t, y, args):
        return rate * lam * gih.force(lam * y)

    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(vf),
        diffrax.Tsit5(),
        0.0,
        ts[-1],
        None,
        a0,
        saveat=diffrax.SaveAt(ts=ts),
        stepsize_controller=diffrax.PIDController(rtol=1e-9, atol=1e-12),
        max_steps=100_000,
        throw=False,
    )
    return sol.ys


def _se(x) -> float:
    x = np.asarray(x, np.float64)
    return float(np.std(x, ddof=1) / math.sqrt(x.size)) if x.size > 1 else 0.0


# ---------------------------------------------------------------------------
# check
# ---------------------------------------------------------------------------


class _Ctx:
    """What every group of rows needs."""

    def __init__(self, traj: Trajectory, theory: dict, loss: PopulationLoss, k_se: float):
        self.traj = traj
        self.cfg = traj.config
        self.th = theory
        self.loss = loss
        self.k_se = float(k_se)
        self.sets = traj.subsets
        self.nS = len(self.sets)
        self.joint = self.cfg.schedule.kind == "joint"
        self.gd = self.cfg.solver.is_gd
        self.delta = self.cfg.schedule.delta
        self.S_star = tuple(theory["mi"]["S_star"])
        self.S_gih = tuple(theory["stage3"]["S"])
        self.rows: list[Row] = []
        self.skipped: list[str] = []
        self.notes: list[str] = []
        self._gih = None

    @property
    def gih(self):
        if self._gih is None:
            self._gih = make_gih(self.loss, self.S_gih)
        return self._gih

    def stage(self, name: str):
        return next((r for r in self.traj.stages if r.name == name), None)

    def rows_of(self, name: str) -> np.ndarray:
        idx = {"I": 1, "II": 2, "III": 3, "joint": 0}[name]
        return np.flatnonzero(self.traj.stage == idx)

    def add(self, name, predicted, measured, tolerance, passed):
        self.rows.append(Row(name, predicted, measured, tolerance, None if passed is None else bool(passed)))

    def skip(self, what: str, why: str):
        self.skipped.append(f"{what}: {why}")


def _label(S) -> str:
    return subset_label(tuple(S))


# -- §6.1, §6.2: Stage I ------------------------------------------------------


def _admissible_winners(ctx: _Ctx) -> list[tuple[int, ...]]:
    """Sets within 3 paired SE of the top of the Ĩ ranking (the top included)."""
    mi = ctx.th["mi"]
    if not mi.get("close_call"):
        return [ctx.S_star]
    c = ctx.th["config"]
    rank = modified_chi2_ranking(
        ctx.cfg.data, ctx.sets, n_pi=int(c.get("n_pi", 2000)), key=jax.random.key(int(c.get("pi_seed", 0)))
    )
    top = ctx.sets.index(rank.S_star)
    out = []
    for i, S in enumerate(ctx.sets):
        gap = rank.Itilde[top] - rank.Itilde[i]
        if i == top or gap <= 3.0 * rank.diff_se[top, i] or gap <= 1e-9 * abs(rank.Itilde[top]):
            out.append(S)
    return out


def _stage1_rows(ctx: _Ctx, claimed_S_star) -> None:
    tr, th = ctx.traj, ctx.th
    S_pred = ctx.S_star if claimed_S_star is None else tuple(int(h) for h in claimed_S_star)
    if S_pred not in ctx.sets:
        raise ValueError(f"claimed_S_star {S_pred} is not in the model's 𝒮 = {ctx.sets}")
    rec = ctx.stage("joint" if ctx.joint else "I")
    idx = ctx.rows_of("joint" if ctx.joint else "I")
    if rec is None or idx.size == 0:
        ctx.skip("Stage I rows", "the run has no saved Stage I")
        return
    end = int(idx[-1])
    frac = tr.c_frac[end]
    measured = ctx.sets[int(np.argmax(frac))]
    where = "end of run" if ctx.joint else "end of Stage I"

    # winner
    name = f"I: winner argmax c/Σc at {where} = S*"
    if claimed_S_star is None:
        admissible = _admissible_winners(ctx)
        mi = th["mi"]
        if len(admissible) > 1 or mi.get("close_call"):
            tol = (
                "close call: any of "
                + ", ".join(_label(S) for S in admissible)
                + " (≤ 3 paired SE below the top)"
            )
            pred = _label(S_pred) + " (close call)"
        else:
            gap_se = mi.get("gap_se") or 0.0
            sig = f"{mi['gap'] / gap_se:.1f} paired SE" if gap_se > 0 else "exact"
            tol, pred = f"exact (Ĩ gap to the runner-up: {sig})", _label(S_pred)
        ok = measured in admissible
    else:
        tol, ok, pred = "exact (claimed S*, not the theory's)", measured == S_pred, _label(S_pred)
    if ctx.joint:
        tol, ok = "info: joint schedule, the paper predicts the staged flow's winner", None
    elif not rec.complete:
        tol, ok = "info: Stage I did not complete", None
    ctx.add(name, pred, _label(measured), tol, ok)

    # concentration
    name = f"I: c_S*/Σc at {where}"
    f_pred = float(frac[ctx.sets.index(S_pred)])
    thr = 1.0 - ctx.delta
    ok = f_pred >= thr - _EVENT_SLACK
    tol = f"≥ 1−δ = {thr:g} (event; slack {_EVENT_SLACK:g})"
    if ctx.joint:
        tol, ok = "info: joint schedule has no Stage I event", None
    elif not ok and rec.ended_by != "event":
        tol, ok = f"info: Stage I ended by {rec.ended_by}, before its event", None
    ctx.add(name, f"≥ {thr:g} on {_label(S_pred)}", f_pred, tol, ok)

    # rates
    s1 = th["stage1"]
    J = np.asarray(s1["J"], np.float64)
    Jd = np.asarray(s1["J_diff_se"], np.float64)
    It = np.asarray(th["mi"]["Itilde"], np.float64)
    C0 = np.asarray(tr.C[0], np.float64)
    a0 = float(tr.a[0])
    rate = float(ctx.cfg.schedule.eta_C)
    nC = float(np.sum(C0**2))
    k = 4.0 * a0 * rate / nC  # d/dt log(c_S/c_S') = k (J(S) - J(S'))
    iS = ctx.sets.index(ctx.S_star)
    if ctx.nS < 2:
        ctx.skip("Stage I rates", "𝒮 has a single set")
    elif nC == 0 or np.any(C0 == 0):
        ctx.skip("Stage I rates", "some C_S = 0 at t = 0: those c_S never move, log-ratios are undefined")
    else:
        if ctx.joint:
            # instantaneous rates at t = 0 from the stored gradient:
            # d log c_S/dt = -2 η_C ∂L̂/∂C_S / C_S
            g = -2.0 * rate * np.asarray(tr.grad_C[0], np.float64) / C0
            slopes = g[iS] - g
            how = "J, t = 0"
        else:
            fr = tr.c_frac[idx]
            early = fr.max(1) < 2.0 / ctx.nS
            pts = idx[early] if early.sum() >= 3 else idx[: min(5, idx.size)]
            t = tr.ts[pts]
            lf = np.log(tr.c_frac[pts])
            slopes = np.array(
                [linear_fit(t, lf[:, iS] - lf[:, j])[0] if j != iS else 0.0 for j in range(ctx.nS)]
            )
            how = "J, early Stage I"
        ir = ctx.sets.index(tuple(s1["runner_up"]))  # the runner-up of the Ĩ ranking
        lab = f"log(c_{_label(ctx.S_star)}/c_{_label(ctx.sets[ir])})"
        pred = k * (J[iS] - J[ir])
        tol = ctx.k_se * k * Jd[iS, ir]
        ctx.add(f"I: slope of {lab} ({how})", pred, slopes[ir], tol, abs(slopes[ir] - pred) <= tol)
        others = [j for j in range(ctx.nS) if j != iS]
        preds = np.array([k * (J[iS] - J[j]) for j in others])
        tols = np.array([ctx.k_se * k * Jd[iS, j] for j in others])
        meas = slopes[others]
        ok = bool(np.all(np.abs(meas - preds) <= tols))
        ctx.add(
            f"I: slopes of log(c_S*/c_S), every S ≠ S* in 𝒮 order ({how})",
            [float(x) for x in preds],
            [float(x) for x in meas],
            f"{ctx.k_se:g} paired SE each (max {tols.max():.3g}); max |dev| {np.abs(meas - preds).max():.3g}",
            ok,
        )
        ctx.add(
            f"I: slope of {lab} (Ĩ: one-hot, L→∞ limit)",
            k * (It[iS] - It[ir]),
            slopes[ir],
            "info: Ĩ is J's limit for a one-hot copier and L → ∞, not its value at finite w₊, L",
            None,
        )

    # ‖C‖² conserved
    n2 = np.sum(np.asarray(tr.C[idx], np.float64) ** 2, axis=1)
    if n2[0] == 0:
        ctx.skip("‖C‖² conserved", "C = 0 at the start")
        return
    drift = float(np.max(np.abs(n2 / n2[0] - 1.0)))
    if ctx.gd:
        ctx.add(
            "I: ‖C‖² conserved (relative change)",
            0.0,
            drift,
            "info: explicit Euler grows ‖C‖² by η²‖∇_C L̂‖² per step",
            None,
        )
    else:
        sc = ctx.cfg.solver
        steps = max(int(rec.steps), 1)
        tol = 2.0 * steps * (sc.rtol + sc.atol * math.sqrt(ctx.nS) / math.sqrt(n2[0]))
        ctx.add("I: ‖C‖² conserved (relative change)", 0.0, drift, tol, drift <= tol)


# -- §6.3: Stage II -------------------------------------------------------------


def _stage2_rows(ctx: _Ctx) -> None:
    if ctx.joint:
        ctx.skip("Stage II rows", "joint schedule (no Stage II)")
        return
    rec = ctx.stage("II")
    idx = ctx.rows_of("II")
    if rec is None or idx.size == 0:
        ctx.skip("Stage II rows", "the run has no saved Stage II")
        return
    heads = tuple(rec.selected or ())
    if not heads:
        ctx.skip("Stage II rows", "Stage I selected the empty set: no head to concentrate")
        return
    tr = ctx.traj
    i0 = int(idx[0]) - 1  # Stage II starts from the last state of Stage I
    end = int(idx[-1])
    s = tr.s
    tau = tr.ts[idx] - rec.t0
    thr = 1.0 - ctx.delta
    for h in heads:
        v = float(s[end, h - 1, h - 1])
        ok = v >= thr - _EVENT_SLACK
        tol = f"≥ 1−δ = {thr:g} (event; slack {_EVENT_SLACK:g})"
        if not ok and rec.ended_by != "event":
            tol, ok = f"info: Stage II ended by {rec.ended_by}, before its event", None
        ctx.add(f"II: s^({h})_{h} at end of Stage II", f"≥ {thr:g}", v, tol, ok)
    for h in heads:
        y = 1.0 - s[idx, h - 1, h - 1]
        y0 = 1.0 - float(s[i0, h - 1, h - 1])
        late = y <= y0 / 4.0
        if late.sum() < 3:
            late = np.zeros_like(late)
            late[idx.size // 2 :] = True
            which = "last half of the saved points"
        else:
            which = "saved points with 1−s ≤ (1−s(0))/4"
        name = f"II: exponent β of 1−s^({h})_{h} ~ τ^(−β)"
        if late.sum() < 3:
            ctx.add(name, 1.0, None, f"info: only {int(late.sum())} saved points in Stage II", None)
            continue
        beta, n = power_exponent(tau[late], y[late])
        r = float(y[late][0] / y0) if y0 > 0 else math.nan
        where = f"{n} pts ({which}), τ ∈ [{tau[late][0]:.3g}, {tau[late][-1]:.3g}]"
        if not r <= 0.5:
            ctx.add(
                name,
                1.0,
                beta,
                f"info: not yet asymptotic, 1−s fell only to {r:.2g} of its start; {where}",
                None,
            )
            continue
        ctx.add(
            name,
            1.0,
            beta,
            f"|β−1| ≤ r = (1−s(τ₁))/(1−s(0)) = {r:.3g}; softmax argument, not the paper; {where}",
            abs(beta - 1.0) <= r,
        )
    outside = [h for h in range(1, ctx.cfg.model.H + 1) if h not in heads]
    if not outside:
        ctx.skip("II: heads outside S", "every head is selected")
        return
    dw = np.abs(np.asarray(tr.w[end]) - np.asarray(tr.w[i0]))
    move_in = max(float(dw[h - 1].max()) for h in heads)
    move_out = max(float(dw[h - 1].max()) for h in outside)
    frac = tr.c_frac[i0]
    m_out = max(sum(float(frac[j]) for j, S in enumerate(ctx.sets) if h in S) for h in outside)
    m_in = float(frac[ctx.sets.index(heads)])
    ratio = move_out / move_in if move_in > 0 else math.inf
    tol = 10.0 * m_out / m_in
    ctx.add(
        f"II: heads outside {_label(heads)} move little (max abs Δw, out/in)",
        0.0,
        ratio,
        tol,
        ratio <= tol,
    )


# -- §6.4, §6.5: Stage III and the limit loss ------------------------------------


def _stage3_rows(ctx: _Ctx) -> None:
    tr, th = ctx.traj, ctx.th
    s3 = th["stage3"]
    name_stage = "joint" if ctx.joint else "III"
    rec = ctx.stage(name_stage)
    idx = ctx.rows_of(name_stage)
    if rec is None or idx.size == 0:
        ctx.skip("Stage III rows", "the run has no saved Stage III")
        ctx.skip("limit loss", "the run has no saved Stage III")
        return
    eta_a = float(ctx.cfg.schedule.eta_a)
    loss, gih = ctx.loss, ctx.gih
    dt = loss.eps.dtype
    if ctx.joint:
        pts = idx[tr.ts[idx] > 0]
        tau = tr.ts[pts]
        a_start = float(tr.a[0])
    else:
        pts = idx
        tau = tr.ts[pts] - rec.t0
        a_start = float(tr.a[int(idx[0]) - 1])
    a = np.asarray(tr.a[pts], np.float64)
    force = -np.asarray(tr.grad_a[pts], np.float64)  # −∂L̂/∂a; ∂_τ a = η_a × this
    end = int(idx[-1])
    lam_end = contrast(tr.s[end], tr.c_frac[end], ctx.S_gih, ctx.sets)
    lam_pts = np.array([contrast(tr.s[i], tr.c_frac[i], ctx.S_gih, ctx.sets) for i in pts])
    info_law = "info: joint schedule, the Stage III law is the staged flow's" if ctx.joint else None
    C_star = s3["C_star"]
    win = s3["window"]
    a_star = s3["a_star"]

    if a.size == 0:
        ctx.skip("Stage III rows", "no saved time after the start")
        return

    # C*: informational
    meas_Fe = force * np.exp(a)
    ctx.add(
        "III: C* = max ∂τa·e^a/η_a",
        C_star,
        float(np.max(meas_Fe)),
        f"info: max over saved times; the model's contrast λ = {lam_end:.4g} < 1 shifts it",
        None,
    )

    # slope of a vs log τ in the window (paper: 1)
    lo, hi = win
    slope, n = log_slope(tau, a, (lo, hi))
    name = "III: slope of a vs log τ in window (paper: 1)"
    if n < 3:
        ctx.add(
            name,
            1.0,
            None if not math.isfinite(slope) else slope,
            f"info: {n} saved times with a in the window [{lo:.3g}, {hi:.3g}]",
            None,
        )
    else:
        ok = 0.5 <= slope <= 2.0
        tol = f"within [1/2, 2]: the window lets F·e^a vary by 2 ({n} pts, a ∈ [{lo:.3g}, {hi:.3g}])"
        if info_law:
            tol, ok = info_law, None
        ctx.add(name, 1.0, slope, tol, ok)

    # the GIH law's own slope, and the λ-rescaled law's (informational)
    inwin = (a >= lo) & (a <= hi) & (tau > 0)
    a_gih = a_lam = None
    if not ctx.joint:
        ts = jnp.asarray(tau, jnp.float64)
        a_gih = np.asarray(
            _gih_ode(gih, jnp.asarray(a_start, jnp.float64), jnp.asarray(1.0), jnp.asarray(eta_a), ts)
        )
        a_lam = np.asarray(
            _gih_ode(gih, jnp.asarray(a_start, jnp.float64), jnp.asarray(lam_end), jnp.asarray(eta_a), ts)
        )
        if inwin.sum() >= 3:
            sg = linear_fit(np.log(tau[inwin]), a_gih[inwin])[0]
            sl = linear_fit(np.log(tau[inwin]), a_lam[inwin])[0]
            ctx.add(
                "III: slope of a vs log τ in window (GIH law, λ-rescaled law)",
                [sg, sl],
                slope,
                f"info: da/dτ = η_a F(a) and η_a λF(λa), λ = {lam_end:.4g}, fitted on the same times",
                None,
            )

    # ∂_τ a·e^a against F(a)·e^a at the saved times in the window
    name = "III: ∂τa·e^a vs η_a F(a)·e^a in window (max rel. dev.)"
    if inwin.sum() == 0:
        ctx.add(name, 0.0, None, "info: no saved time with a in the window", None)
    else:
        k = np.flatnonzero(inwin)
        aj = jnp.asarray(a[k], jnp.float64)
        F = np.asarray(_gih_force(gih, aj), np.float64)
        lamk = lam_pts[k]
        Flam = lamk * np.asarray(_gih_force(gih, jnp.asarray(lamk * a[k])), np.float64)
        pse = []
        for j in k:
            i = int(pts[j])
            fm = _model_force_per_seq(
                loss, jnp.asarray(tr.w[i], dt), jnp.asarray(tr.C[i], dt), jnp.asarray(a[j], dt)
            )
            fg = _gih_force_per_seq(gih, jnp.asarray(a[j], jnp.float64))
            pse.append(_se(np.asarray(fm, np.float64) - np.asarray(fg, np.float64)))
        pse = np.asarray(pse)
        dev = force[k] - F
        tol_abs = np.abs(Flam - F) + ctx.k_se * pse
        rel = np.abs(dev) / np.abs(F)
        rel_tol = tol_abs / np.abs(F)
        ok = bool(np.all(np.abs(dev) <= tol_abs))
        j = int(np.argmax(rel))
        used = float(np.max(np.abs(dev) / tol_abs))
        tol = (
            f"pointwise |λF(λa)−F(a)| + {ctx.k_se:g} paired SE "
            f"(relative {rel_tol.min():.3g}…{rel_tol.max():.3g}, "
            f"λ = {lamk.min():.4g}, {k.size} pts); worst point uses {used:.2f} of it"
        )
        if info_law:
            tol, ok = info_law + f" (λ = {lamk.min():.3g}…{lamk.max():.3g})", None
        ctx.add(name, 0.0, float(rel[j]), tol, ok)

    # a(τ_end) against a*
    name = "III: a at end vs a*"
    a_end = float(tr.a[end])
    too_short = False
    if a_star is None:
        ctx.add(name, "∞ (F > 0 on the grid)", a_end, "info: no finite a* on the theory's grid", None)
    else:
        fm = _model_force_per_seq(
            loss, jnp.asarray(tr.w[end], dt), jnp.asarray(tr.C[end], dt), jnp.asarray(a_star, dt)
        )
        fg = _gih_force_per_seq(gih, jnp.asarray(a_star, jnp.float64))
        slope_F = abs(float(_gih_dforce(gih, jnp.asarray(a_star, jnp.float64))))
        pse = _se(np.asarray(fm, np.float64) - np.asarray(fg, np.float64))
        se_a = pse / slope_F if slope_F > 0 else math.inf
        tol = abs(a_star) * abs(1.0 / lam_end - 1.0) + ctx.k_se * se_a
        settle = tol / 4.0
        flow_moving = float(tau[-1] * eta_a * abs(force[-1]))  # drift of a over one more e-fold of τ
        reasons = []
        if flow_moving > settle:
            reasons.append(f"the flow still moves (τ·∂τa = {flow_moving:.3g})")
        if a_gih is not None and abs(float(a_gih[-1]) - a_star) > settle:
            reasons.append(f"the GIH law has not settled by τ_end (a = {float(a_gih[-1]):.4g})")
        too_short = bool(reasons)
        if reasons:
            ctx.add(name, a_star, a_end, f"info: Stage III too short: {'; '.join(reasons)}", None)
        else:
            ctx.add(name, a_star, a_end, tol, abs(a_end - a_star) <= tol)
        if lam_end <= 0.5:
            ctx.notes.append(
                f"the model at the end is far from the GIH (λ = {lam_end:.3g}): "
                "the Stage III tolerances are loose"
            )

    # limit loss
    name = "limit loss: L̂ at end vs inf_a L_GIH"
    lim = s3["limit_loss"]
    a_lim = s3["a_limit"] if not s3.get("a_limit_is_inf") else math.inf
    lm = np.asarray(
        _model_loss_per_seq(
            loss, jnp.asarray(tr.w[end], dt), jnp.asarray(tr.C[end], dt), jnp.asarray(tr.a[end], dt)
        ),
        np.float64,
    )
    lg = (
        np.asarray(gih.per_sequence_loss_inf(), np.float64)
        if math.isinf(a_lim)
        else np.asarray(gih.per_sequence_loss(jnp.asarray(a_lim, jnp.float64)), np.float64)
    )
    tol = ctx.k_se * _se(lm - lg)
    meas = float(tr.loss[end])
    ok = abs(meas - lim) <= tol
    if too_short and not math.isinf(a_lim):
        ctx.add(name, lim, meas, f"info: Stage III too short ({ctx.k_se:g} paired SE = {tol:.3g})", None)
    else:
        ctx.add(name, lim, meas, tol, ok)


def _theory_summary(th: dict) -> dict:
    mi, s1, s3 = th["mi"], th["stage1"], th["stage3"]
    return {
        "S_star": mi["S_star_label"],
        "close_call": mi["close_call"],
        "Itilde_gap": mi["gap"],
        "Itilde_gap_se": mi["gap_se"],
        "argmax_J": _label(s1["argmax_J"]),
        "C_star": s3["C_star"],
        "window": s3["window"],
        "a_star": s3["a_star"],
        "limit_loss": s3["limit_loss"],
        "limit_loss_se": s3["limit_loss_se"],
        "n_pi": th["config"].get("n_pi"),
    }


def _run_summary(traj: Trajectory) -> dict:
    cfg = traj.config
    return {
        "status": traj.status,
        "schedule": cfg.schedule.kind,
        "method": cfg.solver.method if isinstance(cfg.solver.method, str) else list(cfg.solver.method),
        "n_saved": len(traj.ts),
        "wall_s": traj.wall,
        "stages": [
            {
                "name": s.name,
                "t0": s.t0,
                "t1": s.t1,
                "ended_by": s.ended_by,
                "complete": s.complete,
                "steps": s.steps,
                "rejected": s.rejected,
                "nfev": s.nfev,
                "selected": s.selected,
            }
            for s in traj.stages
        ],
        "final_loss": float(traj.loss[-1]) if len(traj.ts) else None,
        "final_loss_se": float(traj.loss_se[-1]) if len(traj.ts) else None,
    }


def check(
    traj: Trajectory,
    *,
    theory: dict | None = None,
    loss: PopulationLoss | None = None,
    n_pi: int = 2000,
    pi_seed: int = 0,
    claimed_S_star=None,
    k_se: float = 4.0,
) -> Report:
    """Compare a run with every prediction of SPEC §6 (see the module docstring
    for the rows, their tolerances and the informational rows).

    **Arguments:**

    - `traj`: the run (staged, joint or gd; complete or not).
    - `theory`: :func:`~gflow.theory.theory_report`'s dict for the run's
      configuration; computed if ``None`` (with `n_pi`, `pi_seed`).
    - `loss`: the run's estimator (default: ``make_loss`` from the run's
      configuration — the same sample, by its seed).
    - `claimed_S_star`: replace the theory's S* in the Stage I winner and
      concentration rows by this set (a deliberately different prediction:
      the rows then fail unless the run selected it). The other rows keep the
      theory's S*.
    - `k_se`: how many (paired) standard errors the Monte Carlo parts of the
      tolerances allow (4).

    **Returns:** a :class:`Report`.
    """
    t0 = time.perf_counter()
    cfg = traj.config
    if len(traj.ts) == 0:
        raise ValueError("check: the trajectory has no saved time")
    if loss is None:
        loss = make_loss(cfg.data, cfg.model, cfg.estimator)
    if theory is None:
        theory = theory_report(
            cfg.data, cfg.model, cfg.estimator, cfg.init, n_pi=n_pi, pi_seed=pi_seed, loss=loss
        )
    if [tuple(S) for S in theory["sets"]] != list(traj.subsets):
        raise ValueError(
            f"check: the theory's sets {theory['sets']} are not the run's 𝒮 {list(traj.subsets)}"
        )
    ctx = _Ctx(traj, theory, loss, k_se)
    if traj.status != "complete":
        ctx.notes.append(
            f"run status {traj.status!r}: rows of unfinished stages are informational or skipped"
        )
    _stage1_rows(ctx, claimed_S_star)
    _stage2_rows(ctx)
    _stage3_rows(ctx)
    ctx.notes.extend(f"theory: {n}" for n in theory.get("notes", []))
    if cfg.model.norm != "sum":
        ctx.notes.append("norm='layer': the contrast λ is the norm='sum' one, an approximation here")
    ctx.notes.append(f"checks computed in {time.perf_counter() - t0:.1f} s")
    return Report(
        rows=ctx.rows,
        run=_run_summary(traj),
        theory=_theory_summary(theory),
        skipped=ctx.skipped,
        notes=ctx.notes,
    )


# ---------------------------------------------------------------------------
# check_run
# ---------------------------------------------------------------------------


def _run_config_key(cfg, n_pi: int, pi_seed: int) -> dict:
    d = cfg.to_dict()
    return _jsonable(
        {
            "data": d["data"],
            "model": d["model"],
            "estimator": d["estimator"],
            "init": d["init"],
            "n_pi": int(n_pi),
            "pi_seed": int(pi_seed),
        }
    )


def _theory_matches(th: dict, key: dict, cfg) -> bool:
    """Whether a stored theory.json was computed for this run (its data,
    model, estimator, initialisation, n_pi and pi_seed)."""
    if "run_config" in th:
        return th["run_config"] == key
    # a theory.json written by theory_report alone: compare what it records
    try:
        c = th["config"]
        if c["data"].get("fixed_kernel") or cfg.data.kernel is not None:
            return False  # the kernel itself is not recorded
        want = {
            "d": cfg.data.d,
            "parents": list(cfg.data.parents),
            "alpha": cfg.data.alpha,
            "L": cfg.data.L,
            "start": cfg.data.start,
            "burn_in": cfg.data.burn_in,
        }
        ok = all(c["data"].get(k) == v for k, v in want.items())
        ok &= c["model"] == {"M": cfg.model.M, "H": cfg.model.H, "D": cfg.model.D, "norm": cfg.model.norm}
        e = c["estimator"]
        ok &= (e["N"], e["seed"], e["eps"], e["loss"]) == (
            cfg.estimator.N,
            cfg.estimator.seed,
            float(cfg.estimator.eps),
            cfg.estimator.loss,
        )
        i = c["init"]
        ok &= (i["w_plus"], i["w_minus"], i["c0"], i["a0"]) == (
            cfg.init.w_plus,
            cfg.init.w_minus,
            cfg.init.c0,
            cfg.init.a0,
        )
        ok &= (c.get("n_pi"), c.get("pi_seed")) == (key["n_pi"], key["pi_seed"])
        return bool(ok)
    except (KeyError, TypeError, AttributeError):
        return False


def check_run(
    out_dir: str | Path,
    *,
    n_pi: int = 2000,
    pi_seed: int = 0,
    reuse_theory: bool = True,
    write: bool = True,
    loss: PopulationLoss | None = None,
    **kw,
) -> Report:
    """Check the run saved in `out_dir` (SPEC §7) and write its report.

    Loads the run (:func:`gflow.trajectory.load`; ``FileNotFoundError`` for a
    folder without a run), rebuilds its estimator with
    ``make_loss(cfg.data, cfg.model, cfg.estimator)`` (the same seed gives
    the same sample; or pass `loss`), computes the theory
    (:func:`~gflow.theory.theory_report` with the run's configuration and
    initialisation) or, with `reuse_theory`, reuses ``theory.json`` when it
    was computed for the same data, model, estimator, initialisation, `n_pi`
    and `pi_seed`; then :func:`check` (further keywords go to it).

    With `write`, writes ``theory.json`` (the theory dict with a
    ``"run_config"`` key; the plots read its F(a) curve, C*, window, a* and
    L_GIH curve), ``report.json`` (:meth:`Report.to_json`) and ``report.md``
    into `out_dir`.
    """
    out = Path(out_dir)
    traj = load(out)
    cfg = traj.config
    key = _run_config_key(cfg, n_pi, pi_seed)
    theory = None
    tpath = out / "theory.json"
    if reuse_theory and tpath.is_file():
        try:
            th = json.loads(tpath.read_text())
        except (json.JSONDecodeError, OSError):
            th = None
        if isinstance(th, dict) and _theory_matches(th, key, cfg):
            theory = th
    if loss is None:
        loss = make_loss(cfg.data, cfg.model, cfg.estimator)
    fresh = theory is None
    if fresh:
        theory = theory_report(
            cfg.data, cfg.model, cfg.estimator, cfg.init, n_pi=n_pi, pi_seed=pi_seed, loss=loss
        )
        theory["run_config"] = key
    report = check(traj, theory=theory, loss=loss, n_pi=n_pi, pi_seed=pi_seed, **kw)
    report.notes.insert(0, f"theory {'computed' if fresh else 'reused from theory.json'}")
    if write:
        if fresh:
            _write_json(tpath, theory)
        _write_json(out / "report.json", report.to_json())
        (out / "report.md").write_text(report.to_markdown())
    return report


def _write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(".tmp.json")
    tmp.write_text(json.dumps(_jsonable(obj), indent=1, ensure_ascii=False))
    tmp.replace(path)
