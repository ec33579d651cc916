"""The Stage II and Stage III rows of the check report (docs/theory/mathematics.md §M6.3–§M6.5), on
the set Stage I selected; one function per row, its claim, tolerance and wrong
answer in its docstring."""

from __future__ import annotations

import contextlib
import math

import jax.numpy as jnp
import numpy as np

from .._util import PLATEAU_EXIT, linear_fit, log_slope, power_exponent
from ..core import member_of
from ..theory import LawCurve, gih_dforce, gih_force, gih_force_per_seq
from ._base import (
    EVENT_SLACK,
    Ctx,
    attention_velocity,
    contrast,
    first_layer,
    model_dforce,
    model_force_grid,
    model_force_per_seq,
    model_loss_per_seq,
    model_zero,
    moved_away,
    own,
    sample_se,
    set_label,
)
from ._report import decided_row


def _stage2(ctx: Ctx):
    if ctx.joint:
        ctx.skip("Stage II rows", "joint schedule (no Stage II)")
        return None
    rec, idx = ctx.stage("II"), ctx.rows_of("II")
    if rec is None or idx.size == 0:
        ctx.skip("Stage II rows", "the run has no saved Stage II")
        return None
    if not rec.selected:
        ctx.skip("Stage II rows", "Stage I selected the empty set: no head to concentrate")
        return None
    # a member's set names its heads and other components (the residual stream: 0): its heads
    heads = tuple(member_of(ctx.cfg.model).heads_of(tuple(rec.selected)))
    if not heads:
        ctx.skip("Stage II rows", f"the selected set {set_label(tuple(rec.selected))} has no attention head")
        return None
    return rec, idx, heads


def _rows_stage2_events(ctx: Ctx, rec, idx, heads) -> None:
    """Exact: for each head h of the selected set, s^(h)_h ≥ 1 − δ at the end of
    Stage II (the event). Wrong answer: the head's largest weight on another offset."""
    s = ctx.traj.s[int(idx[-1])]
    thr = 1.0 - ctx.delta
    for h in heads:
        j = own(ctx.cfg.model, h)
        v = float(s[h - 1, j])
        other = float(np.delete(s[h - 1], j).max()) if s.shape[1] > 1 else None
        why = None if rec.ended_by == "event" or v >= thr - EVENT_SLACK else f"Stage II ended by {rec.ended_by}"
        if not ctx.cfg.schedule.events:
            why = "schedule.events = false: Stage II has no event, it ran its duration"
        ctx.add(
            decided_row(
                f"II: s^({h})_{h} at end of Stage II", f"≥ {thr:g}", v, f"≥ 1−δ = {thr:g} (event; slack {EVENT_SLACK:g})",
                claim="exact", rule=("ge", thr - EVENT_SLACK), wrong=other, why_not=why,
            )
        )


def _row_beta(ctx: Ctx, rec, idx, h: int) -> None:
    """Finite (gflow's one-line softmax argument, not the paper): the logit gap
    obeys du/dτ ≈ K e^{−u}, so ``1 − s ≈ A/(B + τ)``, whose log-log slope on
    ``[τ₁, τ₂]`` lies in ``[1 − r, 1]``, ``r = (1 − s(τ₁))/(1 − s(0))``; fitted on
    the saved points with ``1 − s ≤ (1 − s(0))/4`` (or the last half);
    tolerance ``|β − 1| ≤ r + |Δ log K|``: K drifts as the copier sharpens and
    the log-log slope moves with it, so the measured drift of
    ``K = (du/dτ) e^u`` (u = logit of s^(h)_h, finite differences on the saved
    points) over the fitted range is added.
    Undecided when ``r > 1/2`` (not asymptotic yet). Wrong answer: β × 1.5."""
    s, tau = ctx.traj.s, ctx.traj.ts[idx] - rec.t0
    i0, j = int(idx[0]) - 1, own(ctx.cfg.model, h)
    y = 1.0 - s[idx, h - 1, j]
    y0 = 1.0 - float(s[i0, h - 1, j])
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
    with np.errstate(divide="ignore", invalid="ignore"):
        u = np.log(s[idx, h - 1, j] / y)
        K = np.gradient(u, tau) * np.exp(u) if idx.size > 1 else np.array([math.nan])
        kl = K[late]
        drift = abs(math.log(kl[-1] / kl[0])) if kl[0] > 0 and kl[-1] > 0 else math.inf
    where = f"{n} pts ({which}), τ ∈ [{tau[late][0]:.3g}, {tau[late][-1]:.3g}]"
    why = ctx.outside("stage2")
    if not r <= 0.5:
        why = why or f"not yet asymptotic, 1−s fell only to {r:.2g} of its start; {where}"
    ctx.add(
        decided_row(
            name, 1.0, beta,
            f"|β−1| ≤ r + |Δlog K| = {r:.3g} + {drift:.3g}; softmax argument, not the paper; {where}",
            claim="finite", rule=("abs", 1.0, r + drift), wrong=1.5 * beta, why_not=why,
        )
    )


def _row_outside(ctx: Ctx, idx, heads) -> None:
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
            f"II: heads outside {set_label(heads)} move little (max abs Δw, out/in)", 0.0, ratio, tol,
            claim="finite", rule=("le", tol), wrong=1.0, why_not=ctx.outside("stage2"),
        )
    )


def _row_rate(ctx: Ctx, rec, idx, heads) -> None:
    """Finite, for every member (gflow's, not the paper's): the rate at which Stage II starts
    concentrating each head of the selected set, ``∂τ s^(h)_h`` at τ = 0, predicted from the
    member's own loss: its gradient at the Stage I end, scaled by the stage's rates Λ, pushed
    through the member's query attention (:func:`gflow.checks._base.attention_velocity`). It
    holds for any first layer (RPE, token-aware, absolute positions, the Full model), and
    says which way the flow turns the head and how fast, where the β row's softmax argument
    does not apply. Measured from the first saved points of Stage II: the forward
    difference quotients ``D_k = (s(τ_k) − s(0))/τ_k`` extrapolated to τ = 0 (Richardson,
    ``r_k = D_k − (D_{k+1} − D_k) τ_k/(τ_{k+1} − τ_k)``, exact for a quadratic); measured
    ``r_0``, tolerance ``3·max_k |r_k − r_0|`` (k = 1, 2: the neglected cubic term) plus
    ``10⁻⁶·|predicted|`` (the solver's error). Undecided when that tolerance would not reject
    a rate × 1.5 (saved points too far apart). Wrong answer: the measured rate × 1.5."""
    if idx.size < 4:
        ctx.skip("II: initial rate", f"only {idx.size} saved points in Stage II")
        return
    i0 = int(idx[0]) - 1
    tr = ctx.traj
    tau = np.asarray(tr.ts[idx[:4]] - rec.t0, np.float64)
    if not np.all(np.diff(np.concatenate([[0.0], tau])) > 0):
        ctx.skip("II: initial rate", "the first saved times of Stage II are not increasing")
        return
    moves = tuple(member_of(ctx.cfg.model).stage_moves["II"])
    sdot = attention_velocity(ctx.cfg, ctx.loss, tr.blocks(i0), moves)
    for h in heads:
        j = own(ctx.cfg.model, h)
        s = np.asarray(tr.s[:, h - 1, j], np.float64)
        D = (s[idx[:4]] - s[i0]) / tau
        r = D[:3] - (D[1:] - D[:3]) * tau[:3] / (tau[1:] - tau[:3])
        pred, meas = float(sdot[h - 1, j]), float(r[0])
        tol = 3.0 * float(np.max(np.abs(r[1:] - r[0]))) + 1e-6 * abs(pred)
        name = f"II: initial rate ∂τ s^({h})_{h} (the member's own gradient)"
        why = None
        if not tol < 0.5 * abs(meas):
            why = f"the first saved points (τ ≤ {tau[-1]:.3g}) do not resolve the rate: tolerance {tol:.3g}"
        ctx.add(
            decided_row(
                name, pred, meas,
                f"3·spread of the extrapolations + 1e-6·|pred| = {tol:.3g} (τ = {tau[0]:.3g}…{tau[-1]:.3g})",
                claim="finite", rule=("abs", pred, tol), wrong=1.5 * meas, why_not=why,
            )
        )


def rows_stage2(ctx: Ctx) -> None:
    st = _stage2(ctx)
    if st is None:
        return
    rec, idx, heads = st
    _rows_stage2_events(ctx, rec, idx, heads)
    _row_rate(ctx, rec, idx, heads)
    for h in heads:
        _row_beta(ctx, rec, idx, h)
    _row_outside(ctx, idx, heads)


class _S3:
    """The saved Stage III points and the selected set's GIH law."""

    def __init__(self, ctx: Ctx, S, idx, rec):
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
        self.lam_end = contrast(tr.s[self.end], tr.c_frac[self.end], S, ctx.sets, ctx.cfg.model)
        self.lam_pts = np.array([contrast(tr.s[i], tr.c_frac[i], S, ctx.sets, ctx.cfg.model) for i in self.pts])
        lo, hi = self.law.window
        self.inwin = (self.a >= lo) & (self.a <= hi) & (self.tau > 0)
        # the selected set's law from the stage's start (a joint run: from t = 0), at the saved τ
        # (StageIIILaw.a; None where the law cannot be followed from a₀: no zero below a₀)
        self.a_gih = self.a_lam = None
        with contextlib.suppress(ValueError):
            self.a_gih = self.law.a(self.tau, self.a_start, self.eta_a)
            if self.lam_end > 0:
                self.a_lam = self.law.a(self.tau, self.a_start, self.eta_a, lam=self.lam_end)
        self.joint_why = "joint schedule: the Stage III law is the staged flow's" if ctx.joint else None


def _one_hot_C(ctx: Ctx, S) -> np.ndarray:
    """C with all its weight on S (the model depends on C only through c/Σc)."""
    C = np.zeros(ctx.nS)
    C[ctx.sets.index(tuple(S))] = 1.0
    return C


def _row_slope_paper(ctx: Ctx, d: _S3) -> None:
    """Paper: the slope of a against log τ is 1 (``a = log t + O(1)``), fitted over the saved
    times with a in the selected set's validity window **and past the plateau**,
    ``a ≥ a₀ + log 2`` (a₀ = a at the stage's start): the paper's own law
    ``log(e^{a₀} + C*η_a τ)`` has the local slope ``1 − e^{a₀−a}``, below 1/2 (flat on a log
    axis) until then, so decades of τ spent at a ≈ a₀ would pull any fit towards 0 (with
    parents (1, 5) at L = 20 a fit from τ = 2·10⁻⁴ gave 0.13). Allowed ``[1/2, 2]``, the factor
    2 by which the window lets ``F e^a`` vary. Wrong answer: the slope × 2.5 (or ÷ 2.5 below
    1), e.g. ``a = (1/3) log t``.

    Undecided at every finite size: the slope is 1 only as L → ∞ (the window [a_lo, a_hi]
    widens like ln L), and the interval [1/2, 2] would pass nearly any flow; the row names
    the ``gflow limit`` command that decides it by finite-size scaling, and the finite rows
    (the GIH law's and the member's own slope) carry the prediction at this size."""
    lo, hi = d.law.window
    lo_fit = max(lo, d.a_start + PLATEAU_EXIT)
    slope, n = log_slope(d.tau, d.a, (lo, hi), a_start=d.a_start)
    fit = (d.a >= lo_fit) & (d.a <= hi) & (d.tau > 0)
    name = "III: slope of a vs log τ in window (paper: 1)"
    why = ctx.outside("paper") or d.joint_why
    where = f"a ∈ [{lo_fit:.3g}, {hi:.3g}]: the window [{lo:.3g}, {hi:.3g}] past the plateau a ≥ a₀ + log 2 = " \
            f"{d.a_start + PLATEAU_EXIT:.3g}"  # fmt: skip
    if n >= 2:
        where += f", τ ∈ [{d.tau[fit].min():.3g}, {d.tau[fit].max():.3g}]"
    if n < 3:
        why = why or f"{n} saved times with {where}"
    wrong = None if not math.isfinite(slope) else (slope * 2.5 if slope >= 1 else slope / 2.5)
    L = int(ctx.cfg.data.L)
    why = why or (f"an L → ∞ claim, decided in the limit by `gflow limit CONFIG --param data.L={L},{2 * L},{4 * L},"
                  f"{8 * L}`; at this size the member's own law predicts the row below ({n} pts, {where})")  # fmt: skip
    ctx.add(
        decided_row(
            name, 1.0, None if not math.isfinite(slope) else slope,
            f"within [1/2, 2]: the window lets F·e^a vary by 2 ({n} pts, {where})",
            claim="paper", rule=("interval", 0.5, 2.0), wrong=wrong, why_not=why,
        )
    )
    if fit.sum() >= 3:
        x = np.log(d.tau[fit])
        ctx.info("III: slope of a vs log τ in window (GIH law, λ-rescaled law)",
                 [linear_fit(x, d.a_gih[fit])[0], linear_fit(x, d.a_lam[fit])[0]], slope,
                 f"the laws da/dτ = η_a F(a) and η_a λF(λa), λ = {d.lam_end:.4g}, from a₀ at τ = 0 "
                 "(StageIIILaw.a), fitted on the same times", "finite")  # fmt: skip


def _fraction(err, tol) -> float:
    """The largest ``err/tol`` (a zero tolerance: 0 for a zero error, ∞ otherwise; the residual
    member's one-hot copier can match the GIH's force exactly, with no sampling spread)."""
    r = np.divide(err, tol, out=np.where(err > 0, np.inf, 0.0), where=tol > 0)
    return float(np.max(r))


def _row_force(ctx: Ctx, d: _S3) -> None:
    """Finite: the measured ``∂_τ a·e^a = −η_a ∂_a L̂·e^a`` (stored gradient)
    against ``η_a F(a) e^a`` at every saved time in the window; pointwise
    tolerance ``|λF(λa) − F(a)| + ρ + k_se paired SE``, ρ the selector's
    residual: the staged flow freezes c at its Stage I event (1 − δ on the
    selected set), and ρ = |F_model(c) − F_model(e_S)| at the same w, a
    (measured) is how far that residual mass moves the model's force. Measured: the largest
    fraction of its tolerance a point uses (≤ 1 passes). Wrong answer: the
    measured force × 1.5."""
    name = "III: ∂τa vs η_a F(a) in window (largest fraction of tolerance used)"
    if d.inwin.sum() == 0:
        ctx.info(name, "≤ 1", None, "no saved time with a in the window", "finite")
        return
    tr, loss, dt = ctx.traj, ctx.loss, ctx.loss.eps.dtype
    k = np.flatnonzero(d.inwin)
    F = np.asarray(gih_force(d.gih, jnp.asarray(d.a[k], jnp.float64)), np.float64)
    lamk = d.lam_pts[k]
    Flam = lamk * np.asarray(gih_force(d.gih, jnp.asarray(lamk * d.a[k])), np.float64)
    pse, resid = [], []
    C1 = jnp.asarray(_one_hot_C(ctx, d.S), dt)
    for j in k:
        i = int(d.pts[j])
        w, aj = first_layer(tr, i, dt), jnp.asarray(d.a[j], dt)
        fm = np.asarray(model_force_per_seq(loss, w, jnp.asarray(tr.C[i], dt), aj), np.float64)
        fg = gih_force_per_seq(d.gih, jnp.asarray(d.a[j], jnp.float64))
        pse.append(sample_se(fm - np.asarray(fg, np.float64)))
        resid.append(abs(float(np.mean(fm)) - float(np.mean(np.asarray(model_force_per_seq(loss, w, C1, aj))))))
    tol_abs = np.abs(Flam - F) + np.asarray(resid) + ctx.k_se * np.asarray(pse)
    used = _fraction(np.abs(d.force[k] - F), tol_abs)
    wrong = _fraction(np.abs(1.5 * d.force[k] - F), tol_abs)
    # the tolerance relative to |F(a)|, over the points where F(a) ≠ 0 (a saved a can sit on the
    # zero a* itself, where the relative size is not defined)
    nz = F != 0
    rel = tol_abs[nz] / np.abs(F[nz]) if nz.any() else np.array([np.inf])
    why = ctx.outside("gih") or (d.joint_why and d.joint_why + f" (λ = {lamk.min():.3g}…{lamk.max():.3g})")
    ctx.add(
        decided_row(
            name, "≤ 1", used,
            f"pointwise |λF(λa)−F(a)| + ρ + {ctx.k_se:g} paired SE (relative {rel.min():.3g}…{rel.max():.3g}, "
            f"λ = {lamk.min():.4g}, {k.size} pts)",
            claim="finite", rule=("le", 1.0), wrong=wrong, why_not=why,
        )
    )


def _frozen_zeros(ctx: Ctx, d: _S3) -> tuple[float | None, float | None]:
    """``a°``: the zero of the model's force ``−∂L̂/∂a`` at the end's (w, C) that
    Stage III's one-dimensional flow from its start settles at
    (:func:`~gflow.checks._base.model_zero`), and the same with the selector
    one-hot on S (``C = e_S``) at the same w."""
    tr, a_max = ctx.traj, float(d.law.a_grid[-1])
    w, C = tr.first_layer(d.end), tr.C[d.end]
    a0 = model_zero(ctx.loss, w, C, d.a_start, a_max)
    a0_S = model_zero(ctx.loss, w, _one_hot_C(ctx, d.S), d.a_start, a_max)
    return a0, a0_S


def _row_a_zero(ctx: Ctx, d: _S3, a0: float | None) -> None:
    """Exact: staged Stage III moves only a (w, C frozen at their Stage II / I
    values), so it is the one-dimensional gradient flow ``da/dτ = η_a F(a)``,
    ``F = −∂L̂/∂a`` at the frozen (w, C), and settles at the zero ``a°`` of F it
    reaches from its start (computed by bisection on the run's sample).
    Tolerance: the adaptive solver's accumulated local-error budget
    ``2·steps·(rtol·|a°| + atol)`` (errors do not grow at a stable zero; rtol
    at least the dtype's unit roundoff).
    Undecided when the stage has not settled: the distance left,
    ``|F(a_end)|/|F'(a°)|`` (stored gradient; the Newton step), exceeds a
    quarter of the tolerance. Informational for gradient descent (no error
    budget) and the joint schedule (w and C move with a). Wrong answer: ``a + 1``."""
    name = "III: a at end vs a° (zero of −∂L̂/∂a at Stage III's frozen w, C)"
    a_end = float(ctx.traj.a[d.end])
    if ctx.joint:
        ctx.skip(name, "joint schedule: w and C move with a, there is no frozen force")
        return
    if a0 is None:
        ctx.info(name, "∞ (F > 0 on the grid)", a_end, "the frozen force has no zero on the theory's grid", "exact")
        return
    if ctx.gd:
        ctx.info(name, a0, a_end, "gradient descent or its modified flow: no solver error budget for GD", "exact")
        return
    tr, sc, dt = ctx.traj, ctx.cfg.solver, ctx.loss.eps.dtype
    rec = ctx.stage("III")
    rtol = max(float(sc.rtol), float(np.finfo(dt).eps))  # a float32 run cannot resolve rtol = 1e-8
    tol = 2.0 * max(int(rec.steps), 1) * (rtol * abs(a0) + sc.atol)
    slope = abs(float(model_dforce(ctx.loss, first_layer(tr, d.end, dt), jnp.asarray(tr.C[d.end], dt),
                                    jnp.asarray(a0, dt))))  # fmt: skip
    left = abs(float(d.force[-1])) / slope if slope > 0 else math.inf
    why = None if left <= tol / 4.0 else f"Stage III not settled: |F(a_end)|/|F'(a°)| = {left:.3g}"
    ctx.add(decided_row(name, a0, a_end, tol, claim="exact", rule=("abs", a0, tol),
                        wrong=moved_away(a_end, a0, 1.0), why_not=why))  # fmt: skip


#: The member law's slope row: relative tolerance between the flow's slope and the law's on the
#: same a's (the law's τ(a) by :class:`~gflow.theory.LawCurve`'s quadrature of F tabulated on
#: :data:`MEMBER_GRID` points from a's start to a°, spacing at most 0.03 on the theory's grid
#: [0, 30]; measured 1.5·10⁻⁸ on the small run at L = 30, N = 500 and 8·10⁻⁹ on a residual run
#: at parents (2, 3)).
MEMBER_SLOPE_RTOL = 0.02
MEMBER_GRID = 1001


def _rows_member_law(ctx: Ctx, d: _S3, a0: float | None) -> None:
    """Finite, for every member: staged Stage III moves only a, at the first layer and selector
    Stage II left (θ_II), so its law is the member's own one-dimensional flow
    ``da/dτ = η_a F(a)``, ``F(a) = −∂L̂(θ_II, a)/∂a`` on the run's sample, by automatic
    differentiation (no closed form: the paper's GIH law is its limit for the paper's model with a
    one-hot copier and c = e_S). Two rows:

    - the window ``{a : F(a)e^a ≥ ½ max F e^a}`` (the interval around the maximum below a°), where
      a(τ) follows ``log τ`` with a slope of order one, and the slope of a against ``log τ`` over
      the saved times in it: the flow's against the law's, ``τ(a) = ∫_{a₀}^{a} da'/(η_a F(a'))``
      at the same a's (quadrature, not the flow's solver); tolerance :data:`MEMBER_SLOPE_RTOL`
      relative; wrong answer: the slope × 1.5. Undecided when a starts within log 2 of a° (a has
      no plateau to leave: a member whose value matrices or LayerNorm took the classifier's growth
      in Stage II, whose a moves by 10⁻¹¹ and whose slope is round-off);
    - the limit loss: ``L̂`` at the end against ``L̂(θ_II, a°)``, the law's limit; tolerance the
      a° row's solver budget carried through the loss (``|F(a_end)|·|a_end − a°| + 1e-12``), and
      undecided when F > 0 on the grid (no finite limit) or Stage III has not settled; wrong
      answer: the loss moved by half of ``L̂(θ_II, a₀) − L̂(θ_II, a°)``.

    Skipped for the joint schedule (the law is the staged flow's) and for a member whose Stage III
    moves more than a (the linear classifier's W)."""
    name_s = "III: slope of a vs log τ in the member's own window (its law da/dτ = η_a F(a), F = −∂L̂(θ_II, a)/∂a)"
    name_l = "limit loss: L̂ at end vs L̂(θ_II, a°) (the member's own Stage III law)"
    if ctx.joint:
        for n in (name_s, name_l):
            ctx.skip(n, "joint schedule: w and C move with a, the law is the staged flow's")
        return
    moves = tuple(member_of(ctx.cfg.model).stage_moves["III"])
    if moves != ("a",):
        for n in (name_s, name_l):
            ctx.skip(n, f"model.member = {ctx.cfg.model.member!r}: its Stage III moves {moves}, not a alone")
        return
    tr, dt = ctx.traj, ctx.loss.eps.dtype
    gd_why = "discrete steps (GD, SGD, the SDE) follow the flow's law only to their step size" if ctx.gd else None
    w, C = first_layer(tr, d.end, dt), jnp.asarray(tr.C[d.end], dt)
    top = float(a0) if a0 is not None else float(d.law.a_grid[-1])
    lo_a = min(d.a_start, top)
    grid = np.linspace(lo_a, top, MEMBER_GRID)  # one shape for every run: one compiled force grid
    F = np.asarray(model_force_grid(ctx.loss, w, C, jnp.asarray(grid, dt)), np.float64)
    Fe = F * np.exp(grid)
    if not np.any(F > 0):
        ctx.info(name_s, "—", None, "the frozen force is not positive above a's start: no log τ regime", "finite")
    elif top - lo_a < math.log(2.0):
        ctx.info(name_s, "—", None, f"a starts {top - lo_a:.3g} below the law's zero a° = {top:.4g} (less than log 2): "
                                    "no log τ regime; the classifier's scale grew in Stage II", "finite")  # fmt: skip
    else:
        k = int(np.argmax(Fe))
        ok = Fe >= 0.5 * Fe[k]
        i0, i1 = k, k
        while i0 > 0 and ok[i0 - 1]:
            i0 -= 1
        while i1 < grid.size - 1 and ok[i1 + 1]:
            i1 += 1
        win = (float(grid[i0]), float(grid[i1]))
        fit = (d.a >= win[0]) & (d.a <= win[1]) & (d.tau > 0) & (d.a > lo_a)
        if fit.sum() < 3:
            ctx.info(name_s, "—", None, f"{int(fit.sum())} saved times with a in the window "
                                         f"[{win[0]:.3g}, {win[1]:.3g}]", "finite")  # fmt: skip
        else:
            a_pts = d.a[fit]
            slope = linear_fit(np.log(d.tau[fit]), a_pts)[0]
            tau_law = LawCurve(grid, F, Fe, d.a_start, d.eta_a).tau_to(a_pts)  # ∫ da/(η_a F) from a's start
            pred = linear_fit(np.log(tau_law), a_pts)[0]
            tol = MEMBER_SLOPE_RTOL * abs(pred)
            ctx.add(decided_row(name_s, pred, slope, f"{MEMBER_SLOPE_RTOL:g} relative ({int(fit.sum())} pts, window "
                                f"a ∈ [{win[0]:.3g}, {win[1]:.3g}])", claim="finite",
                                rule=("abs", pred, tol), wrong=1.5 * slope, why_not=gd_why))  # fmt: skip
    if a0 is None:
        ctx.info(name_l, "—", float(tr.loss[d.end]), "F > 0 on the whole grid: no finite limit a°", "finite")
        return
    L_end = float(np.mean(np.asarray(model_loss_per_seq(ctx.loss, w, C, jnp.asarray(tr.a[d.end], dt)))))
    L_lim = float(np.mean(np.asarray(model_loss_per_seq(ctx.loss, w, C, jnp.asarray(a0, dt)))))
    L_0 = float(np.mean(np.asarray(model_loss_per_seq(ctx.loss, w, C, jnp.asarray(d.a_start, dt)))))
    a_end = float(tr.a[d.end])
    tol = abs(float(d.force[-1])) * abs(a_end - a0) + 1e-12
    rec = ctx.stage("III")
    settled = rec is not None and rec.complete and rec.ended_by in ("steady", "event", "duration")
    slope = abs(float(model_dforce(ctx.loss, w, C, jnp.asarray(a0, dt))))
    left = abs(float(d.force[-1])) / slope if slope > 0 else math.inf
    why = gd_why or (None if settled and left <= 1e-3 * max(1.0, abs(a0)) else
                     f"Stage III not settled: |F(a_end)|/|F'(a°)| = {left:.3g}")  # fmt: skip
    ctx.add(decided_row(name_l, L_lim, L_end, tol, claim="finite", rule=("abs", L_lim, tol),
                        wrong=moved_away(L_end, L_lim, 0.5 * abs(L_0 - L_lim)), why_not=why))  # fmt: skip


def _row_a_end(ctx: Ctx, d: _S3, a0: float | None, a0_S: float | None) -> bool:
    """Finite: ``a(τ_end)`` against the selected set's ``a*``. Tolerance
    ``a*|1/λ_w − 1| + ρ_a + k_se`` paired SE of the zero (delta method):

    - ``λ_w = Π_{h∈S} (s^(h)_h)²``, the copier's contrast: with the selector
      one-hot on S the model is, to first order, the GIH with a shrunk to λ_w a,
      whose zero is a*/λ_w;
    - ``ρ_a = |a° − a°_S|``, how far the selector's frozen residual mass moves
      the zero: a° and a°_S are the zeros of the model's force at the end's w
      with the end's C and with C = e_S (:func:`_frozen_zeros`). It can only be
      measured: the residual mass is not a dilution of the match indicator but
      the kernels of other sets, whose information adds to S's (at D = 1 the 1 %
      left on {2} beside the selected {1} moves the zero by +0.16, four times
      the dilution a*(1/0.99 − 1) = 0.04; docs/theory/laws.md).

    Undecided unless Stage III (a joint run: the run) ran long enough to have reached the
    limit's regime: the flow settled (``τ·∂τa`` within a quarter of the tolerance) and, by the
    law's own predicted time (:meth:`gflow.StageIIILaw.tau_to`), the GIH law from the stage's
    start a₀ within a quarter of it by τ_end. Wrong answer: ``a + 1``.
    **Returns** whether Stage III was too short."""
    name = "III: a at end vs a* (selected set)"
    a_end, a_star = float(ctx.traj.a[d.end]), d.law.a_star
    if a_star is None:
        ctx.info(name, "∞ (F > 0 on the grid)", a_end, "no finite a* on the theory's grid", "finite")
        return False
    tr, dt = ctx.traj, ctx.loss.eps.dtype
    fm = model_force_per_seq(ctx.loss, first_layer(tr, d.end, dt), jnp.asarray(tr.C[d.end], dt), jnp.asarray(a_star, dt))
    fg = gih_force_per_seq(d.gih, jnp.asarray(a_star, jnp.float64))
    slope_F = abs(float(gih_dforce(d.gih, jnp.asarray(a_star, jnp.float64))))
    pse = sample_se(np.asarray(fm, np.float64) - np.asarray(fg, np.float64))
    lam_w = float(np.prod([float(tr.s[d.end][h - 1, own(ctx.cfg.model, h)]) ** 2 for h in d.S]))
    rho = abs(a0 - a0_S) if a0 is not None and a0_S is not None else math.inf
    tol = abs(a_star) * abs(1.0 / lam_w - 1.0) + rho + ctx.k_se * (pse / slope_F if slope_F > 0 else math.inf)
    reasons = []
    flow_moving = float(d.tau[-1] * d.eta_a * abs(d.force[-1]))  # drift of a over one more e-fold of τ
    if flow_moving > tol / 4.0:
        reasons.append(f"the flow still moves (τ·∂τa = {flow_moving:.3g})")
    if d.a_gih is not None and abs(float(d.a_gih[-1]) - a_star) > tol / 4.0:
        # by the law's own predicted time: when would the GIH law from a₀ be within tol/4 of a*?
        near = a_star - math.copysign(tol / 4.0, a_star - d.a_start)
        need = float(d.law.tau_to(near, d.a_start, d.eta_a))
        reasons.append(f"the GIH law from a₀ = {d.a_start:.3g} reaches a* ± tol/4 only at τ ≈ {need:.3g}, the run "
                       f"ends at τ = {float(d.tau[-1]):.3g} (the law's a there: {float(d.a_gih[-1]):.4g})")
    short = "the run is too short" if ctx.joint else "Stage III too short"
    why = ctx.outside("gih_limit") or (f"{short}: {'; '.join(reasons)}" if reasons else None)
    if why is None and not math.isfinite(rho):
        why = "the model's force at the end's w has no zero on the theory's grid (ρ_a undefined)"
    ctx.add(decided_row(name, a_star, a_end, tol, claim="finite", rule=("abs", a_star, tol),
                        wrong=moved_away(a_end, a_star, 1.0), why_not=why))  # fmt: skip
    if d.lam_end <= 0.5:
        ctx.notes.append(f"the model at the end is far from the GIH (λ = {d.lam_end:.3g}): the Stage III tolerances are loose")
    return bool(reasons)


def _row_limit_loss(ctx: Ctx, d: _S3, too_short: bool) -> None:
    """Finite: the flow's loss at the end against the selected set's
    ``inf_a L_GIH``; tolerance ``ρ + k_se`` paired SE of the per-sequence
    difference (to first order the model is the GIH with a rescaled a: the same
    infimum), ρ = |L̂(c_end) − L̂(e_S)| at the end's w and a: the effect of the
    selector's frozen residual mass δ on other sets (it can only be measured,
    and can push the loss below the selected set's GIH infimum).
    Undecided when the a* row found the run too short for its limit (a limit compared with an
    end value the run has not reached). Wrong answer: the loss moved by half the GIH's gain
    ``L_GIH(0) − inf L_GIH`` (a model stuck halfway between the unigram and the induction head)."""
    law, tr, dt = d.law, ctx.traj, ctx.loss.eps.dtype
    lim, a_lim = law.limit_loss, law.a_limit
    lm = np.asarray(model_loss_per_seq(ctx.loss, first_layer(tr, d.end, dt), jnp.asarray(tr.C[d.end], dt),
                                        jnp.asarray(tr.a[d.end], dt)), np.float64)  # fmt: skip
    lg = np.asarray(
        d.gih.per_sequence_loss_inf() if math.isinf(a_lim) else d.gih.per_sequence_loss(jnp.asarray(a_lim, jnp.float64)),
        np.float64,
    )
    C1 = jnp.asarray(_one_hot_C(ctx, d.S), dt)
    lm1 = np.asarray(model_loss_per_seq(ctx.loss, first_layer(tr, d.end, dt), C1, jnp.asarray(tr.a[d.end], dt)))
    resid = abs(float(np.mean(lm)) - float(np.mean(lm1)))
    tol = resid + ctx.k_se * sample_se(lm - lg)
    meas = float(tr.loss[d.end])
    why = ctx.outside("gih_limit")
    if too_short and not math.isinf(a_lim):
        short = "the run is too short for its limit" if ctx.joint else "Stage III too short"
        why = why or f"{short} (the a* row says why; {ctx.k_se:g} paired SE = {tol:.3g})"
    ctx.add(
        decided_row(
            "limit loss: L̂ at end vs inf_a L_GIH (selected set)", lim, meas, tol,
            claim="finite", rule=("abs", lim, tol), wrong=moved_away(meas, lim, 0.5 * (float(law.L[0]) - lim)), why_not=why,
        )
    )


def _row_S_star_beside(ctx: Ctx, S) -> None:
    """Informational: when Stage I selected a set other than S*, the GIH law of S*
    (what the paper's S* would give) beside the selected set's."""
    if S == ctx.S_star or ctx.S_star not in ctx.th.laws:
        return
    a, b = ctx.th.law(ctx.S_star), ctx.th.law(S)
    ctx.info(
        f"III: GIH of S* = {set_label(ctx.S_star)} (paper) beside the selected {set_label(S)}: C*, a*, inf L_GIH",
        [a.C_star, a.a_star, a.limit_loss], [b.C_star, b.a_star, b.limit_loss],
        "what the paper's S* would give; the rows above use the selected set", "paper",
    )  # fmt: skip


def rows_stage3(ctx: Ctx) -> None:
    name = "joint" if ctx.joint else "III"
    rec, idx = ctx.stage(name), ctx.rows_of(name)
    S = ctx.selected
    if rec is None or idx.size == 0 or S is None:
        ctx.skip("Stage III rows", "the run has no saved Stage III")
        ctx.skip("limit loss", "the run has no saved Stage III")
        return
    if ctx.cfg.estimator.positions != "last":
        why = "the GIH law is a last-position law and the loss is taken at every position (estimator.positions)"
        ctx.skip("Stage III rows", why)
        ctx.skip("limit loss", why)
        return
    d = _S3(ctx, S, idx, rec)
    if d.a.size == 0:
        ctx.skip("Stage III rows", "no saved time after the start")
        return
    ctx.info("III: C* = max ∂τa·e^a/η_a (selected set)", d.law.C_star, float(np.max(d.force * np.exp(d.a))),
             f"max over saved times; the model's contrast λ = {d.lam_end:.4g} < 1 shifts it", "finite")  # fmt: skip
    _row_slope_paper(ctx, d)
    _row_force(ctx, d)
    a0, a0_S = _frozen_zeros(ctx, d)
    _row_a_zero(ctx, d, a0)
    _rows_member_law(ctx, d, a0)
    too_short = _row_a_end(ctx, d, a0, a0_S)
    _row_limit_loss(ctx, d, too_short)
    _row_S_star_beside(ctx, S)
