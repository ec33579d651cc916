"""The check report: every law of README §M6 and §M8.1 against a run (README §M7).

:func:`check` compares a :class:`~gflow.trajectory.Trajectory` with its
:class:`~gflow.theory.Theory` and returns a :class:`Report`, one :class:`Row`
per prediction: ``name, claim, predicted, measured, tolerance, passed``.
:func:`check_run` does the same for a run folder and writes ``report.json``
and ``report.md`` (and ``theory.json`` through
:func:`~gflow.theory.load_or_compute`).

**Claims and verdicts** (README §M8.1). Every row names its claim:

- ``"paper"``: the paper's asymptotic statements: Stage I selects
  ``S* = argmax Ĩ``; ``a`` grows like ``log t`` (slope 1); the Ĩ-based rates
  (informational: Ĩ is J's limit for a one-hot copier and ``L → ∞``).
- ``"finite"``: gflow's finite-size laws on the run's own sample and
  initialisation: ``argmax J``, the J log-ratio slopes, the predicted Stage I
  duration, the Stage II softmax law, and the GIH law of the set Stage I
  *selected* (the force ``F(a)``, ``a*``, the limit loss).
- ``"exact"``: identities of the flow: a finite trajectory, ``‖C‖`` conserved,
  the event conditions.

:attr:`Report.verdict` is ``{"gflow": …, "paper": …}``: ``gflow`` fails when a
decided finite or exact row fails (the flow disagrees with its own theory: a
bug or an unresolved numerical problem), ``paper`` folds the decided paper
rows (its failure is a scientific result, not a bug). ``gflow check`` exits 1
only on a gflow failure. Stage II and III rows use the selected set; when it
is not ``S*``, an informational row shows the GIH law of ``S*`` beside it.

**Undecided rows** (``passed`` None, tolerance ``"info: …"``): informational
rows; rows whose law does not cover the run's options (README §M8.7:
:data:`~gflow.theory.LAW_COVERAGE`, e.g. the Stage I linearisation for
``norm="layer"``); rows the run cannot decide (a stage cut by its duration,
too few saved points); and **vacuous** rows: each row carries a plausible
wrong measurement (the other set, ``a + 1``, a slope × 1.5, …) and is decided
only if its tolerance rejects it.

**What is compared with what.** The theory is computed on the run's own
sample (same seed), so flow and predictions share their common random numbers;
SEs in tolerances are *paired* SEs over the sequences, at ``k_se`` (4). For
Stages II and III the frozen copier/selector is not exactly one-hot; the
*contrast* ``λ = (c_S/Σc) Π_{h∈S} (s^(h)_h)²`` (:func:`contrast`) is the
weight with which the model's kernel reads the GIH's match indicator, so to
first order the model is the GIH with ``a`` shrunk to ``λa``: its force
``λF(λa)``, its zero ``a*/λ``, its limit loss unchanged. ``|λF(λa) − F(a)|``
and ``a*|1/λ − 1|`` are the Stage III tolerances. The rows, their tolerances
and wrong answers are documented in the row functions below.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._fit import linear_fit, log_slope, power_exponent
from ._gih import _gih_dforce, _gih_force, _gih_force_per_seq, _gih_ode, make_gih
from ._io import atomic_write_json, atomic_write_text, rows_of_stage
from ._io import jsonable as _jsonable
from ._report import Report, Row, decided_row
from .loss import PopulationLoss, make_loss
from .model import Params, subset_label
from .theory import Theory, load_or_compute, predicted_stage1_duration, selected_set, theory_report
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

# A plausible wrong ‖C‖² drift: 0.1 %, what an explicit scheme that does not
# conserve ‖C‖ accumulates over a Stage I of a few hundred moderate steps.
_WRONG_NORM_DRIFT = 1e-3

_ = _jsonable  # re-exported: replicates.py imports checks._jsonable


def contrast(s, c_frac, S, sets) -> float:
    """The contrast ``λ = (c_S/Σc)·Π_{h∈S} (s^(h)_h)²`` of the model's kernel
    on the GIH's match indicator on offsets S (see the module docstring).
    ``λ = 1`` exactly when the copier is one-hot on S and ``c = e_S``.

    `s` is the copier attention ``(H, M)``, `c_frac` ``c/Σc`` in the order of `sets`.
    """
    S = tuple(S)
    lam = float(np.asarray(c_frac)[list(sets).index(S)])
    for h in S:
        lam *= float(np.asarray(s)[h - 1, h - 1]) ** 2
    return lam


@eqx.filter_jit
def _model_force_per_seq(loss: PopulationLoss, w, C, a):
    """``−∂ℓ_n/∂a`` for every sequence at θ = (w, C, a)."""
    f = lambda aa: loss.per_sequence(Params(w=w, C=C, a=aa))
    return -jax.jvp(f, (a,), (jnp.ones_like(a),))[1]


@eqx.filter_jit
def _model_loss_per_seq(loss: PopulationLoss, w, C, a):
    return loss.per_sequence(Params(w=w, C=C, a=a))


def _se(x) -> float:
    x = np.asarray(x, np.float64)
    return float(np.std(x, ddof=1) / math.sqrt(x.size)) if x.size > 1 else 0.0


def _label(S) -> str:
    return "—" if S is None else subset_label(tuple(S))


def _away(measured: float, ref: float, by: float) -> float:
    """``measured`` moved by `by` away from `ref` (a wrong answer that cannot
    come back inside a tolerance centred on `ref`)."""
    return float(measured) + (by if float(measured) >= float(ref) else -by)


# ---------------------------------------------------------------------------
# The context every row reads
# ---------------------------------------------------------------------------


class _Ctx:
    def __init__(self, traj: Trajectory, theory: Theory, loss: PopulationLoss, k_se: float):
        self.traj, self.th, self.loss, self.k_se = traj, theory, loss, float(k_se)
        self.cfg = traj.config
        self.sets = traj.subsets
        self.nS = len(self.sets)
        self.joint = self.cfg.schedule.kind == "joint"
        self.gd = self.cfg.solver.is_gd
        self.delta = self.cfg.schedule.delta
        self.S_star, self.argmax_J = theory.S_star, theory.argmax_J
        self.selected = selected_set(traj)
        self.rows: list[Row] = []
        self.skipped: list[str] = []
        self.notes: list[str] = []
        self._gih: dict = {}

    def gih(self, S):
        S = tuple(S)
        if S not in self._gih:
            self._gih[S] = make_gih(self.loss, S)
        return self._gih[S]

    def stage(self, name: str):
        return next((r for r in self.traj.stages if r.name == name), None)

    def rows_of(self, name: str) -> np.ndarray:
        return rows_of_stage(self.traj.stage, name)

    def outside(self, law: str) -> str | None:
        """Why `law` does not cover the run's options (``None`` if it does)."""
        ok, why = self.th.covers(law, self.cfg)
        return None if ok else f"not covered by the {law} law: {why}"

    def add(self, row: Row) -> None:
        self.rows.append(row)

    def info(self, name, predicted, measured, why, claim) -> None:
        self.rows.append(Row(name, predicted, measured, f"info: {why}", None, claim))

    def skip(self, what: str, why: str) -> None:
        self.skipped.append(f"{what}: {why}")


# ---------------------------------------------------------------------------
# Exact: the trajectory is finite
# ---------------------------------------------------------------------------


def _row_finite(ctx: _Ctx) -> None:
    """Every saved number of the trajectory (t, w, C, a, loss) is finite (exact).
    Wrong answer: a trajectory with a NaN."""
    tr = ctx.traj
    arrays = {"t": tr.ts, "w": tr.w, "C": tr.C, "a": tr.a, "loss": tr.loss}
    bad = [k for k, v in arrays.items() if not np.all(np.isfinite(np.asarray(v, np.float64)))]
    ctx.add(
        decided_row(
            "trajectory finite (t, w, C, a, loss)", True, not bad,
            "exact" + (f"; non-finite in {', '.join(bad)}" if bad else ""),
            claim="exact", rule=("true",), wrong=False,
        )
    )


# ---------------------------------------------------------------------------
# Stage I (README §M6.1, §M6.2, §M8.1)
# ---------------------------------------------------------------------------


def _stage1_end(ctx: _Ctx):
    """(record, saved rows, index of the last row, where) of Stage I (or of the joint run)."""
    name = "joint" if ctx.joint else "I"
    rec, idx = ctx.stage(name), ctx.rows_of(name)
    if rec is None or idx.size == 0:
        return None
    return rec, idx, int(idx[-1]), "end of run" if ctx.joint else "end of Stage I"


def _within(values, diff_se, top: int, k: float = 3.0) -> list[int]:
    """Indices within `k` paired SE of ``values[top]`` (the top included; exact ties too)."""
    out = []
    for i in range(len(values)):
        gap = values[top] - values[i]
        if i == top or gap <= k * diff_se[top, i] or gap <= 1e-9 * abs(values[top]):
            out.append(i)
    return out


def _winner_row(ctx: _Ctx, name, predicted_S, admissible, claim, law, how) -> None:
    """A winner row: the set with the largest c/Σc at the end of Stage I is one of
    `admissible` (rule "in"). Wrong answer: the set with the second largest c/Σc
    (swap the selected set)."""
    st = _stage1_end(ctx)
    rec, _, end, where = st
    frac = ctx.traj.c_frac[end]
    order = np.argsort(-frac, kind="stable")
    measured = _label(ctx.sets[int(order[0])])
    wrong = _label(ctx.sets[int(order[1])]) if ctx.nS > 1 else None
    labels = tuple(_label(ctx.sets[i]) for i in admissible)
    tol = how if len(labels) == 1 else f"close call: any of {', '.join(labels)} (≤ 3 paired SE below the top)"
    why = ctx.outside(law)
    if ctx.joint:
        why = why or "joint schedule: the laws are for the staged flow's winner"
    elif not rec.complete:
        why = why or "Stage I did not complete"
    if ctx.nS < 2:
        why = why or "𝒮 has a single set"
    ctx.add(
        decided_row(
            f"{name} at {where}", _label(predicted_S), measured, tol,
            claim=claim, rule=("in", labels), wrong=wrong, why_not=why,
        )
    )


def _rows_winner(ctx: _Ctx, claimed_S_star) -> None:
    """Paper: the winner is ``S* = argmax Ĩ`` (a close call admits every set within
    3 paired SE of the top). Finite: the winner is ``argmax J`` (same rule on J's
    paired SEs)."""
    rk, rt = ctx.th.ranking, ctx.th.rates
    if claimed_S_star is None:
        top = ctx.sets.index(rk.S_star)
        adm = _within(rk.Itilde, rk.diff_se, top) if rk.close_call else [top]
        sig = f"{rk.gap / rk.gap_se:.1f} paired SE" if rk.gap_se > 0 else "exact"
        _winner_row(ctx, "I: winner argmax c/Σc = S* (argmax Ĩ)", rk.S_star, adm, "paper", "paper",
                    f"exact (Ĩ gap to the runner-up: {sig})")  # fmt: skip
    else:
        S = tuple(int(h) for h in claimed_S_star)
        _winner_row(ctx, "I: winner argmax c/Σc = S* (argmax Ĩ)", S, [ctx.sets.index(S)], "paper", "paper",
                    "exact (claimed S*, not the theory's)")  # fmt: skip
    iJ = ctx.sets.index(ctx.argmax_J)
    adm = _within(rt.J, rt.diff_se, iJ)
    _winner_row(ctx, "I: winner argmax c/Σc = argmax J", ctx.argmax_J, adm, "finite", "stage1",
                "exact (J gap to the runner-up > 3 paired SE)")  # fmt: skip


def _row_concentration(ctx: _Ctx) -> None:
    """Exact: the selected set's c/Σc is ≥ 1 − δ at the end of Stage I (the event,
    located to ``1e-9``). Wrong answer: the largest c/Σc of another set."""
    rec, _, end, where = _stage1_end(ctx)
    frac = ctx.traj.c_frac[end]
    i = int(np.argmax(frac))
    others = np.delete(frac, i)
    thr = 1.0 - ctx.delta
    why = None
    if ctx.joint:
        why = "joint schedule has no Stage I event"
    elif rec.ended_by != "event":
        why = f"Stage I ended by {rec.ended_by}, before its event"
    ctx.add(
        decided_row(
            f"I: c/Σc of the selected set at {where}", f"≥ {thr:g} on {_label(ctx.sets[i])}", float(frac[i]),
            f"≥ 1−δ = {thr:g} (event; slack {_EVENT_SLACK:g})",
            claim="exact", rule=("ge", thr - _EVENT_SLACK),
            wrong=float(others.max()) if others.size else None, why_not=why,
        )
    )


def _measured_slopes(ctx: _Ctx, idx, iA: int):
    """d/dt log(c_A/c_S) for every S: least squares over early Stage I (saved
    times while ``max c/Σc < 2/|𝒮|``, where c is near uniform), or, for a joint
    run, the instantaneous rates at t = 0 from the stored gradient
    (``d log c_S/dt = −2 η_C ∂L̂/∂C_S / C_S``, exact at t = 0)."""
    tr = ctx.traj
    if ctx.joint:
        C0 = np.asarray(tr.C[0], np.float64)
        g = -2.0 * float(ctx.cfg.schedule.eta_C) * np.asarray(tr.grad_C[0], np.float64) / C0
        return g[iA] - g, "t = 0"
    fr = tr.c_frac[idx]
    early = fr.max(1) < 2.0 / ctx.nS
    pts = idx[early] if early.sum() >= 3 else idx[: min(5, idx.size)]
    lf = np.log(tr.c_frac[pts])
    t = tr.ts[pts]
    return np.array([linear_fit(t, lf[:, iA] - lf[:, j])[0] if j != iA else 0.0 for j in range(ctx.nS)]), "early"


def _rows_slopes(ctx: _Ctx) -> None:
    """Finite: ``d/dt log(c_A/c_S) = 4 a₀ η_C (J(A) − J(S))/‖C‖²`` (A = argmax J;
    one row for the J runner-up, one for every S), tolerance ``k_se`` paired SE
    of J; wrong answer: the measured slope × 1.5. Pairs whose tolerance
    would not reject that are left out of the every-S row (and counted). Paper
    (informational): the same with Ĩ in place of J."""
    st = _stage1_end(ctx)
    tr, rt = ctx.traj, ctx.th.rates
    C0 = np.asarray(tr.C[0], np.float64)
    if ctx.nS < 2:
        ctx.skip("Stage I rates", "𝒮 has a single set")
        return
    if np.any(C0 == 0):
        ctx.skip("Stage I rates", "some C_S = 0 at t = 0: those c_S never move, log-ratios are undefined")
        return
    k = 4.0 * float(tr.a[0]) * float(ctx.cfg.schedule.eta_C) / float(np.sum(C0**2))
    iA = ctx.sets.index(ctx.argmax_J)
    slopes, how = _measured_slopes(ctx, st[1], iA)
    J, Jd = rt.J, rt.diff_se
    iR = int(np.argsort(-J, kind="stable")[1])
    why = ctx.outside("stage1")
    lab = f"log(c_{_label(ctx.argmax_J)}/c_{_label(ctx.sets[iR])})"
    pred, tol = k * (J[iA] - J[iR]), ctx.k_se * k * Jd[iA, iR]
    ctx.add(
        decided_row(
            f"I: slope of {lab} (J, {how})", pred, float(slopes[iR]), tol,
            claim="finite", rule=("abs", pred, tol), wrong=1.5 * float(slopes[iR]), why_not=why,
        )
    )
    others = [j for j in range(ctx.nS) if j != iA]
    preds = np.array([k * (J[iA] - J[j]) for j in others])
    tols = np.array([ctx.k_se * k * Jd[iA, j] for j in others])
    meas = slopes[others]
    keep = np.abs(0.5 * meas) > tols
    if keep.any():
        ctx.add(
            decided_row(
                f"I: slopes of log(c_{_label(ctx.argmax_J)}/c_S), every S ≠ argmax J ({how})",
                [float(x) for x in preds[keep]], [float(x) for x in meas[keep]],
                f"{ctx.k_se:g} paired SE each (max {tols[keep].max():.3g}); {int((~keep).sum())} of "
                f"{len(others)} pairs left out (their tolerance would not reject a slope × 1.5)",
                claim="finite", rule=("abs", preds[keep], tols[keep]), wrong=1.5 * meas[keep], why_not=why,
            )
        )
    It = ctx.th.ranking.Itilde
    ctx.info(f"I: slope of {lab} (Ĩ: one-hot, L→∞ limit)", k * (It[iA] - It[iR]), float(slopes[iR]),
             "Ĩ is J's limit for a one-hot copier and L → ∞, not its value at finite w₊, L", "paper")  # fmt: skip


def _row_norm(ctx: _Ctx) -> None:
    """Exact: ‖C‖² is conserved in Stage I (L̂ depends on C only through c/Σc, so
    ∇_C L̂ ⟂ C); tolerance the adaptive solver's accumulated local-error budget
    ``2·steps·(rtol + atol·√|𝒮|/‖C‖)``. Wrong answer: a relative drift of 1e-3.
    Informational for gradient descent (explicit Euler grows ‖C‖² by η²‖∇_C L̂‖²)."""
    rec, idx, _, _ = _stage1_end(ctx)
    n2 = np.sum(np.asarray(ctx.traj.C[idx], np.float64) ** 2, axis=1)
    if n2[0] == 0:
        ctx.skip("‖C‖² conserved", "C = 0 at the start")
        return
    drift = float(np.max(np.abs(n2 / n2[0] - 1.0)))
    name = "I: ‖C‖² conserved (relative change)"
    if ctx.gd:
        ctx.info(name, 0.0, drift, "explicit Euler grows ‖C‖² by η²‖∇_C L̂‖² per step", "exact")
        return
    sc = ctx.cfg.solver
    tol = 2.0 * max(int(rec.steps), 1) * (sc.rtol + sc.atol * math.sqrt(ctx.nS) / math.sqrt(n2[0]))
    ctx.add(decided_row(name, 0.0, drift, tol, claim="exact", rule=("le", tol), wrong=drift + _WRONG_NORM_DRIFT))


def _rate_error(ctx: _Ctx, rows, iA: int, k: float) -> float:
    """The largest relative error of the linearised pairwise rates
    ``k (J(A) − J(S))`` against the flow's exact ``d/dt log(c_A/c_S) =
    −2 η_C (∂L̂/∂C_A/C_A − ∂L̂/∂C_S/C_S)`` (stored gradient) at the given saved rows."""
    tr, J = ctx.traj, ctx.th.rates.J
    eta = float(ctx.cfg.schedule.eta_C)
    worst = 0.0
    for i in rows:
        C = np.asarray(tr.C[i], np.float64)
        g = -2.0 * eta * np.asarray(tr.grad_C[i], np.float64) / C
        for j in range(ctx.nS):
            if j == iA:
                continue
            lin = k * (J[iA] - J[j])
            worst = max(worst, abs((g[iA] - g[j]) / lin - 1.0) if lin != 0 else math.inf)
    return worst


def _row_duration(ctx: _Ctx) -> None:
    """Finite: the linearised Stage I's duration (README §M8.1,
    :func:`~gflow.theory.predicted_stage1_duration` with the run's c(0), a₀, η_C,
    δ) against the event time of Stage I. Tolerance ``2 ε t_pred``, ε the
    largest relative error of the linearised pairwise rates against the flow's
    exact rates (stored gradient) at the start and the end of Stage I: every
    log-ratio then runs at ``(1 ± ε)`` times its predicted speed, which moves
    the crossing by at most ``ε/(1 − ε)`` of it (factor 2: the error between the
    two ends is not measured). Wrong answer: the event time × 1.5."""
    st = _stage1_end(ctx)
    rec, idx, end, _ = st
    tr = ctx.traj
    name = "I: Stage I duration (linearised Stage I) vs event time"
    C0 = np.asarray(tr.C[0], np.float64)
    if ctx.joint:
        ctx.skip(name, "joint schedule has no Stage I event")
        return
    if ctx.nS < 2 or np.any(C0 == 0):
        ctx.skip(name, "a single set, or some C_S = 0 at t = 0")
        return
    eta = float(ctx.cfg.schedule.eta_C)
    du = predicted_stage1_duration(ctx.th.rates.J, C0**2, float(tr.a[0]), ctx.delta, eta_C=eta, sets=ctx.sets)
    measured = float(rec.t1 - rec.t0)
    why = ctx.outside("stage1")
    if rec.ended_by != "event":
        why = why or f"Stage I ended by {rec.ended_by}, not by its event"
    if not math.isfinite(du.t):
        ctx.info(name, "∞", measured, "the linearised Stage I never reaches 1 − δ (a tie for the top J)", "finite")
        return
    eps = _rate_error(ctx, [int(idx[0]), end], du.index, du.rate)
    tol = 2.0 * eps * du.t
    ctx.add(
        decided_row(
            name, du.t, measured, tol if why else f"2ε·t_pred = {tol:.3g} (ε = {eps:.2g}: rate error; set {_label(du.S)})",
            claim="finite", rule=("abs", du.t, tol), wrong=_away(measured, du.t, 0.5 * measured), why_not=why,
        )
    )


# ---------------------------------------------------------------------------
# Stage II (README §M6.3)
# ---------------------------------------------------------------------------


def _stage2(ctx: _Ctx):
    if ctx.joint:
        ctx.skip("Stage II rows", "joint schedule (no Stage II)")
        return None
    rec, idx = ctx.stage("II"), ctx.rows_of("II")
    if rec is None or idx.size == 0:
        ctx.skip("Stage II rows", "the run has no saved Stage II")
        return None
    heads = tuple(rec.selected or ())
    if not heads:
        ctx.skip("Stage II rows", "Stage I selected the empty set: no head to concentrate")
        return None
    return rec, idx, heads


def _rows_stage2_events(ctx: _Ctx, rec, idx, heads) -> None:
    """Exact: for each head h of the selected set, s^(h)_h ≥ 1 − δ at the end of
    Stage II (the event). Wrong answer: the head's largest weight on another offset."""
    s = ctx.traj.s[int(idx[-1])]
    thr = 1.0 - ctx.delta
    for h in heads:
        v = float(s[h - 1, h - 1])
        other = float(np.delete(s[h - 1], h - 1).max()) if s.shape[1] > 1 else None
        why = None if rec.ended_by == "event" or v >= thr - _EVENT_SLACK else f"Stage II ended by {rec.ended_by}"
        ctx.add(
            decided_row(
                f"II: s^({h})_{h} at end of Stage II", f"≥ {thr:g}", v, f"≥ 1−δ = {thr:g} (event; slack {_EVENT_SLACK:g})",
                claim="exact", rule=("ge", thr - _EVENT_SLACK), wrong=other, why_not=why,
            )
        )


def _row_beta(ctx: _Ctx, rec, idx, h: int) -> None:
    """Finite (gflow's one-line softmax argument, not the paper): the logit gap
    obeys du/dτ ≈ K e^{−u}, so ``1 − s ≈ A/(B + τ)``, whose log-log slope on
    ``[τ₁, τ₂]`` lies in ``[1 − r, 1]``, ``r = (1 − s(τ₁))/(1 − s(0))``; fitted on
    the saved points with ``1 − s ≤ (1 − s(0))/4`` (or the last half);
    tolerance ``|β − 1| ≤ r`` (K drifts as the copier sharpens: symmetric).
    Undecided when ``r > 1/2`` (not asymptotic yet). Wrong answer: β × 1.5."""
    s, tau = ctx.traj.s, ctx.traj.ts[idx] - rec.t0
    i0 = int(idx[0]) - 1
    y = 1.0 - s[idx, h - 1, h - 1]
    y0 = 1.0 - float(s[i0, h - 1, h - 1])
    late = y <= y0 / 4.0
    which = "saved points with 1−s ≤ (1−s(0))/4"
    if late.sum() < 3:
        late = np.zeros_like(late)
        late[idx.size // 2 :] = True
        which = "last half of the saved points"
    name = f"II: exponent β of 1−s^({h})_{h} ~ τ^(−β)"
    if late.sum() < 3:
        ctx.info(name, 1.0, None, f"only {int(late.sum())} saved points in Stage II", "finite")
        return
    beta, n = power_exponent(tau[late], y[late])
    r = float(y[late][0] / y0) if y0 > 0 else math.nan
    where = f"{n} pts ({which}), τ ∈ [{tau[late][0]:.3g}, {tau[late][-1]:.3g}]"
    why = ctx.outside("stage2")
    if not r <= 0.5:
        why = why or f"not yet asymptotic, 1−s fell only to {r:.2g} of its start; {where}"
    ctx.add(
        decided_row(
            name, 1.0, beta, f"|β−1| ≤ r = (1−s(τ₁))/(1−s(0)) = {r:.3g}; softmax argument, not the paper; {where}",
            claim="finite", rule=("abs", 1.0, r), wrong=1.5 * beta, why_not=why,
        )
    )


def _row_outside(ctx: _Ctx, idx, heads) -> None:
    """Finite: heads outside the selected set move little: ``max |Δw|`` outside
    over inside, predicted 0; their gradient is a sum over the sets containing
    them weighted by c_S/Σc, so the ratio is of the order of that mass
    ``m_out`` over the selected set's ``m_in``: tolerance ``10·m_out/m_in``.
    Wrong answer: a ratio of 1 (outside heads move as much as inside)."""
    tr = ctx.traj
    outside = [h for h in range(1, ctx.cfg.model.H + 1) if h not in heads]
    if not outside:
        ctx.skip("II: heads outside S", "every head is selected")
        return
    i0, end = int(idx[0]) - 1, int(idx[-1])
    dw = np.abs(np.asarray(tr.w[end]) - np.asarray(tr.w[i0]))
    move_in = max(float(dw[h - 1].max()) for h in heads)
    move_out = max(float(dw[h - 1].max()) for h in outside)
    frac = tr.c_frac[i0]
    m_out = max(sum(float(frac[j]) for j, S in enumerate(ctx.sets) if h in S) for h in outside)
    m_in = float(frac[ctx.sets.index(heads)])
    ratio = move_out / move_in if move_in > 0 else math.inf
    tol = 10.0 * m_out / m_in
    ctx.add(
        decided_row(
            f"II: heads outside {_label(heads)} move little (max abs Δw, out/in)", 0.0, ratio, tol,
            claim="finite", rule=("le", tol), wrong=1.0, why_not=ctx.outside("stage2"),
        )
    )


def _rows_stage2(ctx: _Ctx) -> None:
    st = _stage2(ctx)
    if st is None:
        return
    rec, idx, heads = st
    _rows_stage2_events(ctx, rec, idx, heads)
    for h in heads:
        _row_beta(ctx, rec, idx, h)
    _row_outside(ctx, idx, heads)


# ---------------------------------------------------------------------------
# Stage III and the limit loss (README §M6.4, §M6.5), on the selected set's GIH
# ---------------------------------------------------------------------------


class _S3:
    """The saved Stage III points and the selected set's GIH law."""

    def __init__(self, ctx: _Ctx, S, idx, rec):
        tr = ctx.traj
        self.S, self.law, self.gih = S, ctx.th.law(S), ctx.gih(S)
        self.eta_a = float(ctx.cfg.schedule.eta_a)
        if ctx.joint:
            self.pts = idx[tr.ts[idx] > 0]
            self.tau = tr.ts[self.pts]
            self.a_start = float(tr.a[0])
        else:
            self.pts = idx
            self.tau = tr.ts[idx] - rec.t0
            self.a_start = float(tr.a[int(idx[0]) - 1])
        self.a = np.asarray(tr.a[self.pts], np.float64)
        self.force = -np.asarray(tr.grad_a[self.pts], np.float64)  # −∂L̂/∂a; ∂_τ a = η_a × this
        self.end = int(idx[-1])
        self.lam_end = contrast(tr.s[self.end], tr.c_frac[self.end], S, ctx.sets)
        self.lam_pts = np.array([contrast(tr.s[i], tr.c_frac[i], S, ctx.sets) for i in self.pts])
        lo, hi = self.law.window
        self.inwin = (self.a >= lo) & (self.a <= hi) & (self.tau > 0)
        self.a_gih = self.a_lam = None
        if not ctx.joint:
            ts, a0 = jnp.asarray(self.tau, jnp.float64), jnp.asarray(self.a_start, jnp.float64)
            self.a_gih = np.asarray(_gih_ode(self.gih, a0, jnp.asarray(1.0), jnp.asarray(self.eta_a), ts))
            self.a_lam = np.asarray(_gih_ode(self.gih, a0, jnp.asarray(self.lam_end), jnp.asarray(self.eta_a), ts))
        self.joint_why = "joint schedule: the Stage III law is the staged flow's" if ctx.joint else None


def _row_slope_paper(ctx: _Ctx, d: _S3) -> None:
    """Paper: the slope of a against log τ over the saved times with a in the
    selected set's validity window is 1 (``a = log t + O(1)``); allowed
    ``[1/2, 2]``, the factor 2 by which the window lets ``F e^a`` vary. Wrong
    answer: the slope × 2.5 (or ÷ 2.5 below 1), e.g. ``a = (1/3) log t``."""
    lo, hi = d.law.window
    slope, n = log_slope(d.tau, d.a, (lo, hi))
    name = "III: slope of a vs log τ in window (paper: 1)"
    why = ctx.outside("paper") or d.joint_why
    if n < 3:
        why = why or f"{n} saved times with a in the window [{lo:.3g}, {hi:.3g}]"
    wrong = None if not math.isfinite(slope) else (slope * 2.5 if slope >= 1 else slope / 2.5)
    ctx.add(
        decided_row(
            name, 1.0, None if not math.isfinite(slope) else slope,
            f"within [1/2, 2]: the window lets F·e^a vary by 2 ({n} pts, a ∈ [{lo:.3g}, {hi:.3g}])",
            claim="paper", rule=("interval", 0.5, 2.0), wrong=wrong, why_not=why,
        )
    )
    if d.a_gih is not None and d.inwin.sum() >= 3:
        x = np.log(d.tau[d.inwin])
        ctx.info("III: slope of a vs log τ in window (GIH law, λ-rescaled law)",
                 [linear_fit(x, d.a_gih[d.inwin])[0], linear_fit(x, d.a_lam[d.inwin])[0]], slope,
                 f"da/dτ = η_a F(a) and η_a λF(λa), λ = {d.lam_end:.4g}, fitted on the same times", "finite")  # fmt: skip


def _row_force(ctx: _Ctx, d: _S3) -> None:
    """Finite: the measured ``∂_τ a·e^a = −η_a ∂_a L̂·e^a`` (stored gradient)
    against ``η_a F(a) e^a`` at every saved time in the window; pointwise
    tolerance ``|λF(λa) − F(a)| + k_se paired SE``. Measured: the largest
    fraction of its tolerance a point uses (≤ 1 passes). Wrong answer: the
    measured force × 1.5."""
    name = "III: ∂τa vs η_a F(a) in window (largest fraction of tolerance used)"
    if d.inwin.sum() == 0:
        ctx.info(name, "≤ 1", None, "no saved time with a in the window", "finite")
        return
    tr, loss, dt = ctx.traj, ctx.loss, ctx.loss.eps.dtype
    k = np.flatnonzero(d.inwin)
    F = np.asarray(_gih_force(d.gih, jnp.asarray(d.a[k], jnp.float64)), np.float64)
    lamk = d.lam_pts[k]
    Flam = lamk * np.asarray(_gih_force(d.gih, jnp.asarray(lamk * d.a[k])), np.float64)
    pse = []
    for j in k:
        i = int(d.pts[j])
        fm = _model_force_per_seq(loss, jnp.asarray(tr.w[i], dt), jnp.asarray(tr.C[i], dt), jnp.asarray(d.a[j], dt))
        fg = _gih_force_per_seq(d.gih, jnp.asarray(d.a[j], jnp.float64))
        pse.append(_se(np.asarray(fm, np.float64) - np.asarray(fg, np.float64)))
    tol_abs = np.abs(Flam - F) + ctx.k_se * np.asarray(pse)
    used = float(np.max(np.abs(d.force[k] - F) / tol_abs))
    wrong = float(np.max(np.abs(1.5 * d.force[k] - F) / tol_abs))
    rel = tol_abs / np.abs(F)
    why = ctx.outside("gih") or (d.joint_why and d.joint_why + f" (λ = {lamk.min():.3g}…{lamk.max():.3g})")
    ctx.add(
        decided_row(
            name, "≤ 1", used,
            f"pointwise |λF(λa)−F(a)| + {ctx.k_se:g} paired SE (relative {rel.min():.3g}…{rel.max():.3g}, "
            f"λ = {lamk.min():.4g}, {k.size} pts)",
            claim="finite", rule=("le", 1.0), wrong=wrong, why_not=why,
        )
    )


def _row_a_end(ctx: _Ctx, d: _S3) -> bool:
    """Finite: ``a(τ_end)`` against the selected set's ``a*``; tolerance
    ``a*|1/λ − 1| + k_se`` paired SE of the zero (delta method). Undecided
    unless Stage III ran long enough (the flow and the GIH law both settled
    within a quarter of the tolerance). Wrong answer: ``a + 1``.
    **Returns** whether Stage III was too short."""
    name = "III: a at end vs a* (selected set)"
    a_end, a_star = float(ctx.traj.a[d.end]), d.law.a_star
    if a_star is None:
        ctx.info(name, "∞ (F > 0 on the grid)", a_end, "no finite a* on the theory's grid", "finite")
        return False
    tr, dt = ctx.traj, ctx.loss.eps.dtype
    fm = _model_force_per_seq(ctx.loss, jnp.asarray(tr.w[d.end], dt), jnp.asarray(tr.C[d.end], dt), jnp.asarray(a_star, dt))
    fg = _gih_force_per_seq(d.gih, jnp.asarray(a_star, jnp.float64))
    slope_F = abs(float(_gih_dforce(d.gih, jnp.asarray(a_star, jnp.float64))))
    pse = _se(np.asarray(fm, np.float64) - np.asarray(fg, np.float64))
    tol = abs(a_star) * abs(1.0 / d.lam_end - 1.0) + ctx.k_se * (pse / slope_F if slope_F > 0 else math.inf)
    reasons = []
    flow_moving = float(d.tau[-1] * d.eta_a * abs(d.force[-1]))  # drift of a over one more e-fold of τ
    if flow_moving > tol / 4.0:
        reasons.append(f"the flow still moves (τ·∂τa = {flow_moving:.3g})")
    if d.a_gih is not None and abs(float(d.a_gih[-1]) - a_star) > tol / 4.0:
        reasons.append(f"the GIH law has not settled by τ_end (a = {float(d.a_gih[-1]):.4g})")
    why = ctx.outside("gih_limit") or (f"Stage III too short: {'; '.join(reasons)}" if reasons else None)
    ctx.add(decided_row(name, a_star, a_end, tol, claim="finite", rule=("abs", a_star, tol),
                        wrong=_away(a_end, a_star, 1.0), why_not=why))  # fmt: skip
    if d.lam_end <= 0.5:
        ctx.notes.append(f"the model at the end is far from the GIH (λ = {d.lam_end:.3g}): the Stage III tolerances are loose")
    return bool(reasons)


def _row_limit_loss(ctx: _Ctx, d: _S3, too_short: bool) -> None:
    """Finite: the flow's loss at the end against the selected set's
    ``inf_a L_GIH``; tolerance ``k_se`` paired SE of the per-sequence difference
    (to first order the model is the GIH with a rescaled a: the same infimum).
    Wrong answer: the loss moved by half the GIH's gain ``L_GIH(0) − inf L_GIH``
    (a model stuck halfway between the unigram and the induction head)."""
    law, tr, dt = d.law, ctx.traj, ctx.loss.eps.dtype
    lim, a_lim = law.limit_loss, law.a_limit
    lm = np.asarray(_model_loss_per_seq(ctx.loss, jnp.asarray(tr.w[d.end], dt), jnp.asarray(tr.C[d.end], dt),
                                        jnp.asarray(tr.a[d.end], dt)), np.float64)  # fmt: skip
    lg = np.asarray(
        d.gih.per_sequence_loss_inf() if math.isinf(a_lim) else d.gih.per_sequence_loss(jnp.asarray(a_lim, jnp.float64)),
        np.float64,
    )
    tol = ctx.k_se * _se(lm - lg)
    meas = float(tr.loss[d.end])
    why = ctx.outside("gih_limit")
    if too_short and not math.isinf(a_lim):
        why = why or f"Stage III too short ({ctx.k_se:g} paired SE = {tol:.3g})"
    ctx.add(
        decided_row(
            "limit loss: L̂ at end vs inf_a L_GIH (selected set)", lim, meas, tol,
            claim="finite", rule=("abs", lim, tol), wrong=_away(meas, lim, 0.5 * (float(law.L[0]) - lim)), why_not=why,
        )
    )


def _row_S_star_beside(ctx: _Ctx, S) -> None:
    """Informational: when Stage I selected a set other than S*, the GIH law of S*
    (what the paper's S* would give) beside the selected set's."""
    if S == ctx.S_star or ctx.S_star not in ctx.th.laws:
        return
    a, b = ctx.th.law(ctx.S_star), ctx.th.law(S)
    ctx.info(
        f"III: GIH of S* = {_label(ctx.S_star)} (paper) beside the selected {_label(S)}: C*, a*, inf L_GIH",
        [a.C_star, a.a_star, a.limit_loss], [b.C_star, b.a_star, b.limit_loss],
        "what the paper's S* would give; the rows above use the selected set", "paper",
    )  # fmt: skip


def _rows_stage3(ctx: _Ctx) -> None:
    name = "joint" if ctx.joint else "III"
    rec, idx = ctx.stage(name), ctx.rows_of(name)
    S = ctx.selected
    if rec is None or idx.size == 0 or S is None:
        ctx.skip("Stage III rows", "the run has no saved Stage III")
        ctx.skip("limit loss", "the run has no saved Stage III")
        return
    d = _S3(ctx, S, idx, rec)
    if d.a.size == 0:
        ctx.skip("Stage III rows", "no saved time after the start")
        return
    ctx.info("III: C* = max ∂τa·e^a/η_a (selected set)", d.law.C_star, float(np.max(d.force * np.exp(d.a))),
             f"max over saved times; the model's contrast λ = {d.lam_end:.4g} < 1 shifts it", "finite")  # fmt: skip
    _row_slope_paper(ctx, d)
    _row_force(ctx, d)
    too_short = _row_a_end(ctx, d)
    _row_limit_loss(ctx, d, too_short)
    _row_S_star_beside(ctx, S)


# ---------------------------------------------------------------------------
# check, check_run
# ---------------------------------------------------------------------------


def _theory_summary(ctx: _Ctx) -> dict:
    th, S = ctx.th, ctx.selected
    law = th.laws.get(S) if S is not None else None
    rk = th.ranking
    return {
        "S_star": _label(th.S_star),
        "close_call": rk.close_call,
        "Itilde_gap": rk.gap,
        "Itilde_gap_se": rk.gap_se,
        "argmax_J": _label(th.argmax_J),
        "selected": _label(S),
        "stage1_duration": th.duration.t,
        "C_star": None if law is None else law.C_star,
        "window": None if law is None else list(law.window),
        "a_star": None if law is None else law.a_star,
        "limit_loss": None if law is None else law.limit_loss,
        "limit_loss_se": None if law is None else law.limit_loss_se,
        "n_pi": rk.n_pi,
    }


def _run_summary(traj: Trajectory) -> dict:
    cfg = traj.config
    keys = ("name", "t0", "t1", "ended_by", "complete", "steps", "rejected", "nfev", "selected")
    return {
        "status": traj.status,
        "schedule": cfg.schedule.kind,
        "method": cfg.solver.method if isinstance(cfg.solver.method, str) else list(cfg.solver.method),
        "n_saved": len(traj.ts),
        "wall_s": traj.wall,
        "stages": [{k: getattr(s, k) for k in keys} for s in traj.stages],
        "final_loss": float(traj.loss[-1]) if len(traj.ts) else None,
        "final_loss_se": float(traj.loss_se[-1]) if len(traj.ts) else None,
    }


def check(
    traj: Trajectory,
    *,
    theory: Theory | dict | None = None,
    loss: PopulationLoss | None = None,
    n_pi: int = 2000,
    pi_seed: int = 0,
    claimed_S_star=None,
    k_se: float = 4.0,
) -> Report:
    """Compare a run with every law of README §M6 and §M8.1 (see the module
    docstring and the row functions for the rows, their claims and tolerances).

    **Arguments:**

    - `traj`: the run (staged, joint or gd; complete or not).
    - `theory`: the run's :class:`~gflow.theory.Theory` (or its JSON dict);
      computed if ``None`` (with `n_pi`, `pi_seed`). The GIH law of the set Stage I
      selected is added if missing.
    - `loss`: the run's estimator (default: ``make_loss`` of the run's configuration).
    - `claimed_S_star`: replace ``S*`` in the paper's winner row by this set (a
      deliberately different prediction: that row then fails unless the run selected it).
    - `k_se`: how many paired standard errors the Monte Carlo parts of the tolerances allow.

    **Returns:** a :class:`Report`.
    """
    t0 = time.perf_counter()
    cfg = traj.config
    if len(traj.ts) == 0:
        raise ValueError("check: the trajectory has no saved time")
    if loss is None:
        loss = make_loss(cfg.data, cfg.model, cfg.estimator)
    if isinstance(theory, dict):
        theory = Theory.from_json(theory)
    if theory is None:
        sc = cfg.schedule
        theory = theory_report(cfg.data, cfg.model, cfg.estimator, cfg.init, n_pi=n_pi, pi_seed=pi_seed,
                               loss=loss, eta_C=sc.eta_C, delta=sc.delta)  # fmt: skip
    if list(theory.sets) != list(traj.subsets):
        raise ValueError(f"check: the theory's sets {list(theory.sets)} are not the run's 𝒮 {list(traj.subsets)}")
    if claimed_S_star is not None and tuple(int(h) for h in claimed_S_star) not in traj.subsets:
        raise ValueError(f"claimed_S_star {tuple(claimed_S_star)} is not in the model's 𝒮 = {traj.subsets}")
    sel = selected_set(traj)
    if sel is not None:
        theory = theory.with_law(loss, sel)
    ctx = _Ctx(traj, theory, loss, k_se)
    if traj.status != "complete":
        ctx.notes.append(f"run status {traj.status!r}: rows of unfinished stages are undecided or skipped")
    _row_finite(ctx)
    if _stage1_end(ctx) is None:
        ctx.skip("Stage I rows", "the run has no saved Stage I")
    else:
        _rows_winner(ctx, claimed_S_star)
        _row_concentration(ctx)
        _rows_slopes(ctx)
        _row_norm(ctx)
        _row_duration(ctx)
    _rows_stage2(ctx)
    _rows_stage3(ctx)
    ctx.notes.extend(f"theory: {n}" for n in theory.notes)
    ctx.notes.append(f"checks computed in {time.perf_counter() - t0:.1f} s")
    return Report(
        rows=ctx.rows,
        run=_run_summary(traj),
        theory=_theory_summary(ctx),
        skipped=ctx.skipped,
        notes=ctx.notes,
        selected=ctx.selected,
        S_star=theory.S_star,
        argmax_J=theory.argmax_J,
    )


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
    """Check the run saved in `out_dir` and write its report (README §M7).

    Loads the run (:func:`gflow.trajectory.load`; ``FileNotFoundError`` for a
    folder without a run), takes its theory from
    :func:`~gflow.theory.load_or_compute` (``theory.json`` when it belongs to
    the run, else computed on the run's sample; `reuse_theory=False` forces a
    recomputation), then :func:`check` (further keywords go to it). With
    `write`, writes ``theory.json``, ``report.json`` (:meth:`Report.to_json`)
    and ``report.md`` into `out_dir`, each atomically.
    """
    out = Path(out_dir)
    traj = load(out)
    cfg = traj.config
    if loss is None:
        loss = make_loss(cfg.data, cfg.model, cfg.estimator)
    theory, how = load_or_compute(out, traj, n_pi=n_pi, pi_seed=pi_seed, loss=loss, reuse=reuse_theory, write=write)
    report = check(traj, theory=theory, loss=loss, n_pi=n_pi, pi_seed=pi_seed, **kw)
    report.notes.insert(0, f"theory {'computed' if how == 'computed' else 'reused from theory.json'}")
    if write:
        atomic_write_json(out / "report.json", report.to_json())
        atomic_write_text(out / "report.md", report.to_markdown())
    return report
