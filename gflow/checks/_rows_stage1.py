"""The Stage I rows of the check report (docs/theory/mathematics.md §M6.1, §M6.2, §M8.1) and the
trajectory-finite row; one function per row, its claim, tolerance and wrong
answer in its docstring."""

from __future__ import annotations

import math

import numpy as np

from .._util import linear_fit
from ..theory import predicted_stage1_duration
from ._base import EVENT_SLACK, Ctx, moved_away, set_label
from ._report import decided_row

# A plausible wrong ‖C‖² drift: 0.1 %, what an explicit scheme that does not
# conserve ‖C‖ accumulates over a Stage I of a few hundred moderate steps.
_WRONG_NORM_DRIFT = 1e-3


def row_finite(ctx: Ctx) -> None:
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


def stage1_end(ctx: Ctx):
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


def _winner_row(ctx: Ctx, name, predicted_S, admissible, claim, law, how) -> None:
    """A winner row: the set with the largest c/Σc at the end of Stage I is one of
    `admissible` (rule "in"). Wrong answer: the set with the largest c/Σc at the
    end among those not admissible (a swapped selection); none: vacuous."""
    st = stage1_end(ctx)
    rec, _, end, where = st
    frac = ctx.traj.c_frac[end]
    order = np.argsort(-frac, kind="stable")
    measured = set_label(ctx.sets[int(order[0])])
    labels = tuple(set_label(ctx.sets[i]) for i in admissible)
    wrong = next((set_label(ctx.sets[int(i)]) for i in order if set_label(ctx.sets[int(i)]) not in labels), None)
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
            f"{name} at {where}", set_label(predicted_S), measured, tol,
            claim=claim, rule=("in", labels), wrong=wrong, why_not=why,
        )
    )


def rows_winner(ctx: Ctx, claimed_S_star) -> None:
    """Paper: the winner is ``S* = argmax Ĩ`` (a close call admits every set within
    3 paired SE of the top). Finite: the winner is ``argmax J`` of the run's own
    sample (the flow shares its sample, so no Monte Carlo error enters); a set
    whose J lies within ``2ε (J_max − J_min)`` of the top is admitted too, ε the
    measured relative error of the linearised rates (:func:`_rate_error`)."""
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
    R = ctx.rate
    adm, how = [iJ], f"exact (argmax {R} on the run's own sample)"
    C0 = np.asarray(ctx.traj.C[0], np.float64)
    if ctx.nS > 1 and np.all(C0 != 0):
        # the linearised rates are accurate to a relative ε (measured at both ends of
        # Stage I): a set within 2ε of the J spread below the top could win instead
        st = stage1_end(ctx)
        k = 4.0 * float(ctx.traj.a[0]) * float(ctx.cfg.schedule.eta_C) / float(np.sum(C0**2))
        eps, n0 = _rate_error(ctx, [int(st[1][0]), st[2]], iJ, k)
        spread = float(rt.J[iJ] - np.min(rt.J))
        adm = [j for j in range(ctx.nS) if rt.J[iJ] - rt.J[j] <= 2.0 * eps * spread]
        how = f"exact: argmax {R} on the run's sample (no other set within 2ε = {2 * eps:.2g} of the {R} spread{_left_out(n0)})"
    _winner_row(ctx, f"I: winner argmax c/Σc = argmax {R}", ctx.argmax_J, adm, "finite", "stage1", how)


def row_concentration(ctx: Ctx) -> None:
    """Exact: the selected set's c/Σc is ≥ 1 − δ at the end of Stage I (the event,
    located to ``1e-9``). Wrong answer: the largest c/Σc of another set."""
    rec, _, end, where = stage1_end(ctx)
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
            f"I: c/Σc of the selected set at {where}", f"≥ {thr:g} on {set_label(ctx.sets[i])}", float(frac[i]),
            f"≥ 1−δ = {thr:g} (event; slack {EVENT_SLACK:g})",
            claim="exact", rule=("ge", thr - EVENT_SLACK),
            wrong=float(others.max()) if others.size else None, why_not=why,
        )
    )


def early_log_shares(ctx: Ctx, idx):
    """Early Stage I, where c is near uniform: the saved indices among `idx` while
    ``max c/Σc < 2/|𝒮|`` (the first five when fewer than three), their times and ``log(c/Σc)``
    (−∞ for a set outside the normaliser, which holds no share: the Full model's token sets)."""
    tr = ctx.traj
    early = tr.c_frac[idx].max(1) < 2.0 / ctx.nS
    pts = idx[early] if early.sum() >= 3 else idx[: min(5, idx.size)]
    with np.errstate(divide="ignore"):
        lf = np.log(np.asarray(tr.c_frac[pts], np.float64))
    return pts, np.asarray(tr.ts[pts], np.float64), lf


def _measured_slopes(ctx: Ctx, idx, iA: int):
    """d/dt log(c_A/c_S) for every S: least squares over early Stage I (saved
    times while ``max c/Σc < 2/|𝒮|``, where c is near uniform), or, for a joint
    run, the instantaneous rates at t = 0 from the stored gradient
    (``d log c_S/dt = −2 η_C ∂L̂/∂C_S / C_S``, exact at t = 0)."""
    tr = ctx.traj
    if ctx.joint:
        C0 = np.asarray(tr.C[0], np.float64)
        g = -2.0 * float(ctx.cfg.schedule.eta_C) * np.asarray(tr.grad_C[0], np.float64) / C0
        return g[iA] - g, "t = 0"
    _, t, lf = early_log_shares(ctx, idx)
    ok = np.all(np.isfinite(lf), axis=0)
    return np.array([linear_fit(t, lf[:, iA] - lf[:, j])[0] if j != iA and ok[j] else (0.0 if j == iA else np.nan)
                     for j in range(ctx.nS)]), "early"  # fmt: skip


def rows_slopes(ctx: Ctx) -> None:
    """Finite: ``d/dt log(c_A/c_S) = 4 a₀ η_C (J(A) − J(S))/‖C‖²`` (A = argmax J;
    one row for the J runner-up, one for every S), tolerance ``k_se`` paired SE
    of J; wrong answer: the measured slope × 1.5. Pairs whose tolerance
    would not reject that are left out of the every-S row (and counted). Paper
    (informational): the same with Ĩ in place of J."""
    st = stage1_end(ctx)
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
    lab = f"log(c_{set_label(ctx.argmax_J)}/c_{set_label(ctx.sets[iR])})"
    pred, tol = k * (J[iA] - J[iR]), ctx.k_se * k * Jd[iA, iR]
    ctx.add(
        decided_row(
            f"I: slope of {lab} ({ctx.rate}, {how})", pred, float(slopes[iR]), tol,
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
                f"I: slopes of log(c_{set_label(ctx.argmax_J)}/c_S), every S ≠ argmax {ctx.rate} ({how})",
                [float(x) for x in preds[keep]], [float(x) for x in meas[keep]],
                f"{ctx.k_se:g} paired SE each (max {tols[keep].max():.3g}); {int((~keep).sum())} of "
                f"{len(others)} pairs left out (their tolerance would not reject a slope × 1.5)",
                claim="finite", rule=("abs", preds[keep], tols[keep]), wrong=1.5 * meas[keep], why_not=why,
            )
        )
    It = ctx.th.ranking.Itilde
    L = int(ctx.cfg.data.L)
    ctx.info(f"I: slope of {lab} (Ĩ: one-hot, L→∞ limit)", k * (It[iA] - It[iR]), float(slopes[iR]),
             "Ĩ is J's limit for a one-hot copier and L → ∞, not its value at finite w₊, L: decided in the limit "
             f"by `gflow limit CONFIG --param data.L={L},{2 * L},{4 * L},{8 * L}`", "paper")  # fmt: skip


def row_norm(ctx: Ctx) -> None:
    """Exact: ‖C‖² is conserved in Stage I (L̂ depends on C only through c/Σc, so
    ∇_C L̂ ⟂ C); tolerance the adaptive solver's accumulated local-error budget
    ``2·steps·(rtol + atol·√|𝒮|/‖C‖)``. Wrong answer: a relative drift of 1e-3.
    Informational for gradient descent (explicit Euler grows ‖C‖² by η²‖∇_C L̂‖²), its
    modified flow (d‖C‖²/dt = η λ_C² ‖∇_C L̂‖², docs/theory/mathematics.md §M9), SGD and the SDE."""
    rec, idx, _, _ = stage1_end(ctx)
    n2 = np.sum(np.asarray(ctx.traj.C[idx], np.float64) ** 2, axis=1)
    if n2[0] == 0:
        ctx.skip("‖C‖² conserved", "C = 0 at the start")
        return
    drift = float(np.max(np.abs(n2 / n2[0] - 1.0)))
    name = "I: ‖C‖² conserved (relative change)"
    if ctx.gd:
        method = ctx.cfg.solver.method_for("I")
        why = ("GD's modified flow grows ‖C‖² at the rate η λ_C² ‖∇_C L̂‖²" if method == "modified"
               else "explicit Euler grows ‖C‖² by η²‖∇_C L̂‖² per step" if method == "gd"
               else "the central flow's oscillation term ½X∇S grows ‖C‖² at the edge" if method == "central"
               else "discrete noisy steps grow ‖C‖² (by η²‖∇_C L̂_B‖² per SGD step; Itô's term for the SDE)")
        ctx.info(name, 0.0, drift, why, "exact")
        return
    sc = ctx.cfg.solver
    tol = 2.0 * max(int(rec.steps), 1) * (sc.rtol + sc.atol * math.sqrt(ctx.nS) / math.sqrt(n2[0]))
    ctx.add(decided_row(name, 0.0, drift, tol, claim="exact", rule=("le", tol), wrong=drift + _WRONG_NORM_DRIFT))


def _rate_error(ctx: Ctx, rows, iA: int, k: float) -> tuple[float, int]:
    """The largest relative error of the linearised pairwise rates
    ``k (J(A) − J(S))`` against the flow's exact ``d/dt log(c_A/c_S) =
    −2 η_C (∂L̂/∂C_A/C_A − ∂L̂/∂C_S/C_S)`` (stored gradient) at the given saved rows,
    and how many (row, set) pairs were left out because the set's ``C_S`` is exactly 0
    there (a loser that underflowed late in Stage I: its log-ratio is −∞ and has no rate;
    its 0/0 would otherwise be a nan that ``max`` drops without a word). ``inf`` when the
    set `A` itself is 0 at a row, or a linearised rate is 0."""
    tr, J = ctx.traj, ctx.th.rates.J
    eta = float(ctx.cfg.schedule.eta_C)
    worst, left_out = 0.0, 0
    for i in rows:
        C = np.asarray(tr.C[i], np.float64)
        if C[iA] == 0:
            return math.inf, left_out
        live = C != 0
        g = np.zeros_like(C)
        g[live] = -2.0 * eta * np.asarray(tr.grad_C[i], np.float64)[live] / C[live]
        for j in range(ctx.nS):
            if j == iA:
                continue
            if not live[j]:
                left_out += 1
                continue
            lin = k * (J[iA] - J[j])
            worst = max(worst, abs((g[iA] - g[j]) / lin - 1.0) if lin != 0 else math.inf)
    return worst, left_out


def _left_out(n: int) -> str:
    return f"; {n} (row, set) pairs with C_S = 0 left out" if n else ""


def row_duration(ctx: Ctx) -> None:
    """Finite: the linearised Stage I's duration (docs/theory/mathematics.md §M8.1,
    :func:`~gflow.theory.predicted_stage1_duration` with the run's c(0), a₀, η_C,
    δ) against the event time of Stage I. Tolerance ``2 ε t_pred``, ε the
    largest relative error of the linearised pairwise rates against the flow's
    exact rates (stored gradient) at the start and the end of Stage I: every
    log-ratio then runs at ``(1 ± ε)`` times its predicted speed, which moves
    the crossing by at most ``ε/(1 − ε)`` of it (factor 2: the error between the
    two ends is not measured). Wrong answer: the event time × 1.5."""
    st = stage1_end(ctx)
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
    eps, n0 = _rate_error(ctx, [int(idx[0]), end], du.index, du.rate)
    tol = 2.0 * eps * du.t
    ctx.add(
        decided_row(
            name, du.t, measured, tol if why else f"2ε·t_pred = {tol:.3g} (ε = {eps:.2g}: rate error; set {set_label(du.S)}{_left_out(n0)})",
            claim="finite", rule=("abs", du.t, tol), wrong=moved_away(measured, du.t, 0.5 * measured), why_not=why,
        )
    )
