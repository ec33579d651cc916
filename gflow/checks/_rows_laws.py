"""Report rows from the laws per model (:mod:`gflow.theory._laws`; docs/theory/mathematics.md §M8.7).

- Stage I for a run the sum-norm linearisation does not cover (``norm =
  "layer"``): the rates at t = 0 and the selected set from the model's own
  ``G(c) = −∂L̂/∂a|_{a=0}`` (law ``"stage1_model"``);
- stages that ended ``"steady"`` and, for Stage II, whether the one-hot copier
  of the selected set attracts (law ``"stage2_vertex"``; informational);
- ``loss = "ce_on_probs"`` with no finite zero of F: the approach of L̂ to its
  limit, exponent −1 in τ (law ``"gih_tail"``).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from .._util import linear_fit
from ..core import Params
from ..theory import (
    LAW_COVERAGE,
    copier_vertex_gradient,
    covers,
    gih_tail,
    predict_selection,
    stage1_rates_exact,
    stage1_rates_small_a,
)
from ._base import Ctx, set_label
from ._report import decided_row
from ._rows_stage1 import early_log_shares, stage1_end

#: Saved rows of Stage I (evenly spaced) at which the small-a rates are compared with the exact ones.
STAGE1_EPS_ROWS = 9


def _outside(ctx: Ctx, law: str) -> str | None:
    cov = ctx.th.coverage.get(law, LAW_COVERAGE[law])
    ok, why = covers(cov, ctx.cfg)
    return None if ok else f"not covered by the {law} law: {why}"


def rows_laws(ctx: Ctx) -> None:
    """Every row of this module that applies to the run."""
    if not ctx.joint and stage1_end(ctx) is not None and ctx.outside("stage1") and not _outside(ctx, "stage1_model"):
        _rows_stage1_model(ctx)
    _rows_steady(ctx)
    if not _outside(ctx, "gih_tail"):
        _row_ce_approach(ctx)


# ---------------------------------------------------------------------------
# Stage I for any norm
# ---------------------------------------------------------------------------


def _rows_stage1_model(ctx: Ctx) -> None:
    """Finite (law "stage1_model"): (i) the early slopes of ``log(c_A/c_S)``
    (least squares over the saved times while ``max c/Σc < 2/|𝒮|``) against the
    exact rates at t = 0 on the run's sample (:func:`gflow.theory.stage1_rates_exact`).
    The least-squares slope is a positively weighted average of the flow's
    instantaneous rates over the fitted times, so the tolerance is the largest
    change of the exact rate over them (from the stored gradient) plus
    ``1e-9`` relative. A GD run (``solver.method = "gd"``) is held to GD's own rate: C is multiplied by
    ``1 + η r/2`` a step (r: the rate of log c), so log c grows by ``(2/η) log(1 + η r/2)`` per unit
    time, below the flow's r by about ``η r²/4`` (a Full run at η = 4·10⁻⁴ is 0.1 % off the flow's
    rates, 20 times the tolerance). Wrong answer: the measured slope × 1.5. (ii) The winner:
    the set the small-a flow of a·G selects (:func:`gflow.theory.predict_selection`);
    wrong answer: the runner-up at the end of Stage I."""
    tr, sets = ctx.traj, ctx.sets
    rec, idx, end, where = stage1_end(ctx)
    C0 = np.asarray(tr.C[0], np.float64)
    if ctx.nS < 2 or np.any(C0 == 0):
        ctx.skip("Stage I rates (model's G)", "a single set, or some C_S = 0 at t = 0")
        return
    eta = float(ctx.cfg.schedule.eta_C)
    dt = ctx.loss.eps.dtype
    p0 = Params.from_blocks({**{b: jnp.asarray(v, dt) for b, v in tr.state(0).items()}, "C": jnp.asarray(C0, dt)})
    pred = predict_selection(ctx.loss, p0.first_layer, p0.C, float(tr.a[0]), rate=eta, delta=ctx.delta)
    ex = stage1_rates_exact(ctx.loss, p0, rate=eta)
    iA = sets.index(pred.selected) if pred.selected is not None else int(np.argmax(ex.r))
    # (i) the slopes
    pts, t, lf = early_log_shares(ctx, idx)
    others = [j for j in range(ctx.nS) if j != iA and np.all(np.isfinite(lf[:, j]))]
    meas = np.array([linear_fit(t, lf[:, iA] - lf[:, j])[0] for j in others])
    r_pts = -2.0 * eta * np.asarray(tr.grad_C[pts], np.float64) / np.asarray(tr.C[pts], np.float64)
    r0 = np.asarray(ex.r, np.float64)
    if ctx.cfg.solver.is_gd:  # GD's own rate: C ← C(1 + η r/2) a step, so log c grows by (2/η) log(1 + η r/2) per time
        h = float(ctx.cfg.solver.eta)
        r_pts, r0 = (2.0 / h) * np.log1p(0.5 * h * r_pts), (2.0 / h) * np.log1p(0.5 * h * r0)
    preds = np.array([r0[iA] - r0[j] for j in others])
    var = np.array([np.max(np.abs((r_pts[:, iA] - r_pts[:, j]) - (r0[iA] - r0[j]))) for j in others])
    tols = var + 1e-9 * np.abs(preds) + 1e-12
    keep = np.abs(0.5 * meas) > tols
    lab = set_label(sets[iA])
    if keep.any():
        ctx.add(
            decided_row(
                f"I: slopes of log(c_{lab}/c_S) vs the exact rates at t = 0 (model's own G, any norm)",
                [float(x) for x in preds[keep]], [float(x) for x in meas[keep]],
                f"change of the exact rate over the fitted times (max {tols[keep].max():.3g}); "
                f"{int((~keep).sum())} of {len(others)} pairs left out (tolerance would not reject × 1.5)",
                claim="finite", rule=("abs", preds[keep], tols[keep]), wrong=1.5 * meas[keep],
            )
        )  # fmt: skip
    # (iii) the duration: the small-a flow's event time; its rates are within a relative ε of the flow's
    # exact ones along Stage I, which moves the crossing by ≲ ε of it (factor 2 for safety). ε is the
    # largest relative error of the pairwise rates (A, S) at up to STAGE1_EPS_ROWS saved rows of Stage I,
    # over the sets S that still hold a share ≥ δ/|𝒮| there (the ones whose decay the event waits for):
    # it grows along the stage as c concentrates (0.026 at t = 0 to 0.060 at the event on a residual run at
    # parents (1, 3), d = 3, L = 20, N = 300, whose duration missed 2ε(0)·t_pred by 10 %).
    if pred.selected is not None and rec.ended_by == "event":
        eps = 0.0
        rows = np.unique(idx[np.linspace(0, idx.size - 1, min(STAGE1_EPS_ROWS, idx.size)).round().astype(int)])
        for i in rows.tolist():
            Ci = np.asarray(tr.C[i], np.float64)
            live = np.asarray(tr.c_frac[i], np.float64) >= ctx.delta / ctx.nS
            sm = stage1_rates_small_a(ctx.loss, p0.first_layer, jnp.asarray(Ci, dt), float(tr.a[0]), rate=eta)
            g = -2.0 * eta * np.asarray(tr.grad_C[i], np.float64) / Ci
            for j in others:
                if sm.diff[iA, j] != 0 and (live[j] or i == int(idx[0])):
                    eps = max(eps, abs((g[iA] - g[j]) / sm.diff[iA, j] - 1.0))
        measured = float(rec.t1 - rec.t0)
        tol = 2.0 * eps * pred.duration
        ctx.add(
            decided_row(
                "I: Stage I duration (small-a flow of a·G) vs event time", pred.duration, measured,
                f"2ε·t_pred = {tol:.3g} (ε = {eps:.2g}: small-a vs exact rates, max over {rows.size} rows of Stage I)",
                claim="finite", rule=("abs", pred.duration, tol), wrong=1.5 * measured,
            )
        )  # fmt: skip
    # (ii) the winner
    frac = tr.c_frac[end]
    order = np.argsort(-frac, kind="stable")
    why = None if rec.complete else "Stage I did not complete"
    if pred.selected is None:
        why = why or "the small-a flow of a·G does not reach 1 − δ"
    ctx.add(
        decided_row(
            f"I: winner argmax c/Σc = the set the small-a flow of a·G selects, at {where}",
            set_label(pred.selected), set_label(sets[int(order[0])]),
            f"exact (small-a flow reaches 1 − δ at t ≈ {pred.duration:.4g}; ranking of the rates at t = 0: "
            f"{', '.join(set_label(S) for S in pred.ranking_t0[:3])}, …)",
            claim="finite", rule=("in", (set_label(pred.selected),)), wrong=set_label(sets[int(order[1])]), why_not=why,
        )
    )  # fmt: skip


# ---------------------------------------------------------------------------
# Stages that settled short of their event
# ---------------------------------------------------------------------------


def _rows_steady(ctx: Ctx) -> None:
    """Informational: which stage ended "steady", where; for Stage II, the
    directional derivatives ``g_i`` of L̂ at the one-hot copier of the selected
    set (:func:`gflow.theory.copier_vertex_gradient`, at the run's C and a):
    the vertex attracts iff every ``g_i > 0``."""
    tr = ctx.traj
    for rec in tr.stages:
        if rec.ended_by != "steady":
            continue
        i = int(np.searchsorted(tr.ts, rec.t1 * (1 - 1e-12)))
        i = min(i, len(tr.ts) - 1)
        if rec.name == "I":
            ctx.info("I: settled short of its event (steady)", f"c/Σc ≥ {1 - ctx.delta:g}",
                     float(np.max(tr.c_frac[i])), f"Stage I ended steady at t = {rec.t1:.4g}", "finite")  # fmt: skip
            continue
        heads = tuple(rec.selected or ())
        if not heads:
            continue
        p = Params.from_blocks({b: jnp.asarray(v) for b, v in tr.state(i).items()})
        vg = copier_vertex_gradient(ctx.loss, p, heads)
        s = np.asarray(tr.s[i])
        att = ", ".join(
            f"head {h}: s = {np.array2string(s[h - 1], precision=4)}, g = {np.array2string(vg.g[h], precision=3)}"
            f" (±{np.array2string(vg.g_se[h], precision=2)}), vertex {'attracts' if vg.attracting[h] else 'repels'}"
            for h in heads
        )
        ctx.info("II: settled short of its event (steady)", f"s^(h)_h ≥ {1 - ctx.delta:g}",
                 float(min(s[h - 1, h - 1] for h in heads)),
                 f"Stage II ended steady at t = {rec.t1:.4g}; {att} (law stage2_vertex: a result about the "
                 "model, not a failure of the flow)", "finite")  # fmt: skip


# ---------------------------------------------------------------------------
# ce_on_probs: the approach when a* = ∞
# ---------------------------------------------------------------------------


def _fit_power(tau, L):
    """Least squares ``L ≈ L∞ + B τ^{−p}`` (p on a grid, then refined): returns p."""
    tau, L = np.asarray(tau, np.float64), np.asarray(L, np.float64)

    def resid(p):
        x = tau ** (-p)
        B, L_inf, _ = linear_fit(x, L)  # L ≈ L∞ + B·τ^(−p) is a line in τ^(−p)
        return float(np.sum((L_inf + B * x - L) ** 2))

    grid = np.linspace(0.2, 3.0, 281)
    r = [resid(p) for p in grid]
    k = int(np.argmin(r))
    lo, hi = grid[max(k - 1, 0)], grid[min(k + 1, grid.size - 1)]
    for _ in range(60):
        m1, m2 = lo + (hi - lo) / 3, hi - (hi - lo) / 3
        if resid(m1) < resid(m2):
            hi = m2
        else:
            lo = m1
    return 0.5 * (lo + hi)


def _row_ce_approach(ctx: Ctx) -> None:
    """Finite (law "gih_tail", ``loss = "ce_on_probs"``): when the selected set's
    GIH has no finite zero of F (``a* = ∞``) and ``K = lim e^a F > 0``, Stage III
    approaches its limit as ``L̂ − L∞ ≈ 1/(η_a λ² τ)`` (docs/theory/mathematics.md §M8.7: with the
    model's contrast λ, ``F_model(a) ≈ λK e^{−λa}``, so ``e^{λa} ≈ η_a λ² K τ``
    and ``L̂ − L∞ ≈ K e^{−λa}``): the exponent of τ is −1 whatever K and λ.
    Measured: ``L∞ + Bτ^{−p}`` fitted by least squares to the last decade of
    Stage III; predicted p = 1, tolerance [0.8, 1.25] (the O(e^{−λa}) corrections
    at the a reached). Wrong answer: p = 0.5."""
    S = ctx.selected
    rec = ctx.stage("III")
    if ctx.joint or S is None or rec is None or ctx.cfg.estimator.positions != "last":
        return
    idx = ctx.rows_of("III")
    law = ctx.th.law(S)
    tail = gih_tail(ctx.gih(S))
    name = "III: exponent p of L̂ − L∞ ~ τ^(−p) (ce_on_probs, a* = ∞)"
    if law.a_star is not None or not tail.K > 0:
        ctx.info(name, "—", "—", f"the GIH of {set_label(S)} has a finite zero a* (K = {tail.K:.3g}): not this law",
                 "finite")  # fmt: skip
        return
    tau = np.asarray(ctx.traj.ts[idx], np.float64) - rec.t0
    L = np.asarray(ctx.traj.loss[idx], np.float64)
    ok = tau > 0
    tau, L = tau[ok], L[ok]
    why = None
    if tau.size < 6 or tau[-1] < 10 * tau[0]:
        why = "Stage III too short for a fit over a decade"
    late = tau >= tau[-1] / 10 if tau.size else ok
    p = _fit_power(tau[late], L[late]) if why is None and late.sum() >= 6 else math.nan
    if why is None and not math.isfinite(p):
        why = "fewer than 6 saved points in the last decade"
    ctx.add(
        decided_row(
            name, 1.0, float(p), f"[0.8, 1.25]; K = lim e^a F = {tail.K:.3g} > 0, no zero of F on [0, {law.a_grid[-1]:g}]",
            claim="finite", rule=("interval", 0.8, 1.25), wrong=0.5, why_not=why,
        )
    )  # fmt: skip
