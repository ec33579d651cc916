"""The panels of a run's figures (:mod:`gflow.figures`): the selector weights, the
copier before and after, ``a`` against ``log τ`` with the fitted line on the
validity window, and the measured ``∂ₜa·e^a`` against the GIH's ``F(a)·e^a``
(docs/theory/mathematics.md §M6.4, §M7).
"""

from __future__ import annotations

import numpy as np

from .._util import linear_fit
from ..core import subset_label
from ..theory import Theory
from ..trajectory import Trajectory
from ._base import (
    SIZE_COPIER,
    SIZE_SINGLE,
    SIZE_STAGES,
    a_segment,
    fmt_g,
    measured_rate,
    new_figure,
    root_figure,
    s_star,
    selected_heads,
    stage3_law_of,
    stage_axes,
    stage_segments,
    validity_window,
)

# ---------------------------------------------------------------------------
# The fit of a against log τ
# ---------------------------------------------------------------------------


def fit_a_log_tau(traj: Trajectory, theory: Theory | dict | None) -> dict | None:
    """Least-squares line ``a = slope·ln τ + intercept`` over the saved points of
    the stage in which ``a`` moves (Stage III, or the joint phase) whose ``a``
    lies in the theory's validity window ``{F e^a ≥ C*/2}`` (docs/theory/mathematics.md §M6.4; the
    paper's ``∂ₜa ≍ e^{−a}`` gives slope 1). ``τ = t − t_III`` (``t`` for a
    joint run); points at ``τ = 0`` are left out.

    Returns ``{"slope", "intercept", "n", "tau_min", "tau_max", "window"}``, or
    ``None`` when there is no window, no moving ``a``, or fewer than two points
    in the window.
    """
    win = validity_window(traj, theory)
    seg = a_segment(traj)
    if win is None or seg is None:
        return None
    a = traj.a[seg.idx]
    m = (seg.tau > 0) & (a >= win[0]) & (a <= win[1])
    if m.sum() < 2:
        return None
    slope, intercept, _ = linear_fit(np.log(seg.tau[m]), a[m])
    return {
        "slope": float(slope),
        "intercept": float(intercept),
        "n": int(m.sum()),
        "tau_min": float(seg.tau[m].min()),
        "tau_max": float(seg.tau[m].max()),
        "window": win,
    }


# ---------------------------------------------------------------------------
# 1. c_S / Σc
# ---------------------------------------------------------------------------


def plot_c_frac(
    traj: Trajectory, theory: Theory | dict | None = None, *, fig=None, stages=None, compact: bool = False
):
    """``c_S/Σc`` against ``log τ`` for every ``S ∈ 𝒮`` (one line each, labelled
    by its offsets, ``"∅"``, ``"{1,2}"``), one panel per stage (`stages`: the
    names to draw, default all; see the module's note on time axes). The
    theory's ``S* = argmax Ĩ`` (docs/theory/mathematics.md §M6.1) is drawn thicker.

    `fig`: a ``Figure`` or ``SubFigure`` to draw into (default: a new one);
    `compact`: shorter titles and the legend inside, for ``plot_summary``.
    Returns the (root) Figure.
    """
    import matplotlib as mpl

    segs = stage_segments(traj, stages)
    fig = new_figure(SIZE_STAGES) if fig is None else fig
    axes = stage_axes(fig, segs, 0.3)
    S_star = s_star(traj, theory)
    cf = traj.c_frac
    colors = mpl.colormaps["tab10"].colors
    for ax, seg in zip(axes, segs):
        pos = seg.tau > 0
        for j, (S, lab) in enumerate(zip(traj.subsets, traj.labels)):
            star = S_star is not None and tuple(S) == S_star
            ax.plot(
                seg.tau[pos],
                cf[seg.idx[pos], j],
                color=colors[j % 10],
                lw=2.6 if star else 1.4,
                label=lab,
                zorder=3 if star else 2,
            )
        ax.set_xlabel(seg.tau_label)
        ax.set_title(seg.title(compact), fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(r"$c_S\,/\,\Sigma c$")
    axes[0].set_ylim(-0.03, 1.03)
    star = "" if S_star is None else rf"; thick: $S^* = \arg\max\,\tilde I$ = {subset_label(S_star)}"
    handles, labels = axes[0].get_legend_handles_labels()
    if compact:
        axes[0].legend(
            handles, labels, title="S (offsets)", fontsize=7, title_fontsize=7, ncol=2, loc="upper left"
        )
        pre = "" if any(sg.rec.name == "joint" for sg in segs) else "Stage I: "
        fig.suptitle(rf"{pre}selector weights $c_S/\Sigma c${star}", fontsize=10)
    else:
        fig.legend(
            handles,
            labels,
            loc="outside right upper",
            title="S (offsets)",
            fontsize=8,
            ncol=1 if len(labels) <= 12 else 2,
        )
        fig.suptitle(rf"selector weights $c_S/\Sigma c$ for every S in $\mathcal{{S}}${star}", fontsize=11)
    return root_figure(fig)


# ---------------------------------------------------------------------------
# 2. The copier's attention
# ---------------------------------------------------------------------------


def plot_copier(
    traj: Trajectory,
    theory: Theory | dict | None = None,
    *,
    fig=None,
    before: int = 0,
    after: int = -1,
    compact: bool = False,
):
    """Heatmaps (heads × offsets) of the copier's attention ``s^(h) = softmax(w^(h))``
    at saved indices `before` (default the start) and `after` (default the end),
    each cell annotated with its value, one colorbar on ``[0, 1]``. The cells
    ``s^(h)_h`` of the selected heads (Stage II's set, else ``S*``) are outlined
    in red: Stage II drives them to 1 (docs/theory/mathematics.md §M6.3).
    """
    from matplotlib.patches import Rectangle

    fig = new_figure(SIZE_COPIER) if fig is None else fig
    axes = fig.subplots(1, 2, squeeze=False)[0]
    s = traj.s
    H, M = s.shape[1:]
    heads = selected_heads(traj, theory)
    n = len(traj)
    digits = 2 if compact and M > 3 else 3
    fs = (8 if compact else 9) if M <= 5 else (7 if M <= 8 else 5)
    im = None
    for k, (ax, i, what) in enumerate(zip(axes, (before, after), ("before", "after"))):
        i = i % n
        im = ax.imshow(s[i], vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
        for h in range(H):
            for m in range(M):
                v = s[i, h, m]
                ax.text(
                    m,
                    h,
                    f"{v:.{digits}f}",
                    ha="center",
                    va="center",
                    fontsize=fs,
                    color="black" if v > 0.6 else "white",
                )
        for h in heads:
            if 1 <= h <= min(H, M):
                ax.add_patch(Rectangle((h - 1.5, h - 1.5), 1, 1, fill=False, ec="red", lw=2.2))
        ax.set_xticks(range(M), [str(m) for m in range(1, M + 1)])
        ax.set_yticks(range(H), [str(h) for h in range(1, H + 1)])
        ax.set_xlabel("offset m" if compact else r"offset $m$ (attends to $x_{l-m}$)")
        if k == 0:
            ax.set_ylabel("head h")
        stage = {0: "joint", 1: "Stage I", 2: "Stage II", 3: "Stage III"}.get(int(traj.stage[i]), "")
        ax.set_title(f"{what}: t = {fmt_g(float(traj.ts[i]))} ({stage})", fontsize=9 if compact else 10)
    cb = fig.colorbar(im, ax=list(axes), shrink=0.9)
    cb.set_label(r"$s^{(h)}_m$")
    sel = f"; red: heads {subset_label(heads)}" if heads else ""
    if compact:
        pre = "" if any(r.name == "joint" for r in traj.stages) else "Stage II: "
        fig.suptitle(rf"{pre}copier attention $s^{{(h)}}${sel}", fontsize=10)
    else:
        sel = rf"; red outline: $s^{{(h)}}_h$ of the selected heads {subset_label(heads)}" if heads else ""
        fig.suptitle(rf"copier attention $s^{{(h)}} = \mathrm{{softmax}}(w^{{(h)}})${sel}", fontsize=11)
    return root_figure(fig)


# ---------------------------------------------------------------------------
# 3. a against log τ
# ---------------------------------------------------------------------------


def plot_a_vs_logt(traj: Trajectory, theory: Theory | dict | None = None, *, ax=None, compact: bool = False):
    """``a`` against ``log τ`` in the stage where ``a`` moves (Stage III:
    ``τ = t − t_III``; a joint run: ``t``), with the validity window shaded,
    ``a*`` (the zero of ``F``) as a horizontal line, the least-squares line
    ``a = slope·ln τ + b`` over the points in the window (:func:`fit_a_log_tau`;
    its slope in the legend, 4 decimals) and a slope-1 reference through the
    same points (the paper's ``a = log t + O(1)``)."""
    if ax is None:
        ax = new_figure(SIZE_SINGLE).subplots()
    seg = a_segment(traj)
    if seg is None:
        ax.text(
            0.5,
            0.5,
            "a never moves in this run\n(no Stage III saved yet)",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )
        ax.set_axis_off()
        return root_figure(ax.figure)
    pos = seg.tau > 0
    tau, a = seg.tau[pos], traj.a[seg.idx[pos]]
    win = validity_window(traj, theory)
    s3 = stage3_law_of(traj, theory)
    if win is not None:
        what = "window" if compact else r"validity window $F e^a \geq C^*/2$:"
        ax.axhspan(
            win[0], win[1], color="tab:green", alpha=0.13, label=f"{what} [{win[0]:.3g}, {win[1]:.3g}]"
        )
    if s3 is not None and s3.a_star is not None:
        se = s3.a_star_se
        pm = f" ± {se:.2g}" if se is not None else ""
        what = "" if compact else r"  ($F(a^*) = 0$)"
        ax.axhline(
            s3.a_star, color="tab:red", ls="--", lw=1.4, label=rf"$a^*$ = {s3.a_star:.4g}{pm}{what}"
        )
    ax.plot(
        tau,
        a,
        "o-",
        color="tab:blue",
        ms=3,
        lw=1.2,
        label=r"$a(\tau)$" if compact else r"$a(\tau)$, saved points",
    )
    fit = fit_a_log_tau(traj, theory)
    if fit is not None:
        tt = np.geomspace(fit["tau_min"], fit["tau_max"], 50)
        what = "fit on the window" if compact else "least squares on the window"
        ax.plot(
            tt,
            fit["slope"] * np.log(tt) + fit["intercept"],
            color="black",
            lw=2.2,
            label=f"{what}: slope {fit['slope']:.4f}, n = {fit['n']}",
        )
        m = (tau >= fit["tau_min"]) & (tau <= fit["tau_max"])
        b1 = float(np.mean(a[m] - np.log(tau[m])))
        ax.plot(
            tt,
            np.log(tt) + b1,
            color="dimgray",
            ls=":",
            lw=1.8,
            label="slope 1" if compact else r"slope 1: $a = \ln\tau$ + const",
        )
    ax.set_xscale("log")
    ax.set_xlabel(seg.tau_label + " (log scale)")
    ax.set_ylabel("$a$")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7 if compact else 8, loc="upper left")
    if win is None:
        note = "no theory window: no fit"
    elif fit is None:
        note = "fewer than 2 saved points in the window: no fit"
    else:
        note = r"fit $a = \mathrm{slope}\cdot\ln\tau + b$ on the window"
    stage = "Stage III" if seg.rec.name == "III" else "joint flow"
    logt = r"$\log t$" if seg.tau_label == "$t$" else r"$\log\tau$"
    if compact:
        ax.set_title(rf"{stage}: $a$ against {logt}", fontsize=10)
    else:
        ax.set_title(rf"{stage}: $a$ against {logt}; {note}", fontsize=10)
    return root_figure(ax.figure)


# ---------------------------------------------------------------------------
# 4. ∂ₜa·e^a against a
# ---------------------------------------------------------------------------


def plot_rate(traj: Trajectory, theory: Theory | dict | None = None, *, ax=None, compact: bool = False):
    """The measured ``∂ₜa·e^a`` (``∂ₜa = −η_a ∂L̂/∂a`` at the saved points of the
    stage where ``a`` moves, with ±1 SE bars from the gradient's Monte Carlo SE)
    against ``a``, with the theory's ``F(a)·e^a`` of the GIH and its ±1 SE band,
    ``C* = max F·e^a`` (and ``C*/2``), the validity window (shaded) and ``a*``
    (docs/theory/mathematics.md §M6.4)."""
    if ax is None:
        ax = new_figure(SIZE_SINGLE).subplots()
    seg = a_segment(traj)
    s3 = stage3_law_of(traj, theory)
    win = validity_window(traj, theory)
    a_meas = r_meas = None
    if seg is not None:
        a_meas = traj.a[seg.idx]
        r, rse = measured_rate(traj, seg.idx)
        ea = np.exp(a_meas)
        r_meas = r * ea
        ax.errorbar(
            a_meas,
            r_meas,
            yerr=rse * ea,
            fmt="o",
            ms=3,
            color="tab:blue",
            ecolor="tab:blue",
            elinewidth=0.8,
            alpha=0.85,
            zorder=3,
            label=r"flow (±1 SE)"
            if compact
            else r"flow: $\partial_t a\, e^a = -\eta_a\, \partial_a\hat L\, e^a$ (±1 SE)",
        )
    # x range: the measured a and the theory's landmarks, with a margin
    hi = [] if a_meas is None else [float(np.max(a_meas))]
    if s3 is not None:
        hi += [x for x in (s3.a_star, win and win[1], s3.a_C_star) if x is not None]
    x_hi = 1.15 * max(hi) + 0.3 if hi else 1.0
    x_lo = min(0.0, float(np.min(a_meas))) if a_meas is not None else 0.0
    top = []
    if s3 is not None:
        a = s3.a_grid
        Fe, Fse = s3.Fexp, s3.Fexp_se
        m = a <= x_hi
        ax.fill_between(
            a[m], (Fe - Fse)[m], (Fe + Fse)[m], color="tab:orange", alpha=0.25, lw=0, label="GIH ±1 SE"
        )
        ax.plot(
            a[m],
            Fe[m],
            color="tab:orange",
            lw=2.0,
            label=r"GIH: $F(a)\,e^a$" if compact else r"GIH theory: $F(a)\,e^a$, $F = -dL_{\rm GIH}/da$",
        )
        top.append(np.nanmax(Fe[m]))
        if s3.C_star is not None:
            C = s3.C_star
            ax.axhline(C, color="tab:purple", ls="--", lw=1.2, label=rf"$C^* = \max F e^a$ = {C:.4g}")
            ax.axhline(C / 2, color="tab:purple", ls=":", lw=1.0, label=r"$C^*/2$")
        if win is not None:
            ax.axvspan(
                win[0],
                win[1],
                color="tab:green",
                alpha=0.13,
                label=f"validity window [{win[0]:.3g}, {win[1]:.3g}]",
            )
        if s3.a_star is not None:
            ax.axvline(s3.a_star, color="tab:red", ls="--", lw=1.2, label=rf"$a^*$ = {s3.a_star:.4g}")
    if r_meas is not None:
        top.append(np.nanmax(r_meas))
    y_hi = 1.3 * max(top) if top and max(top) > 0 else 1.0
    ax.set_xlim(x_lo - 0.02 * (x_hi - x_lo), x_hi)
    ax.set_ylim(-0.35 * y_hi, y_hi)
    ax.axhline(0.0, color="black", lw=0.6)
    ax.set_xlabel("$a$")
    ax.set_ylabel(r"$\partial_t a \cdot e^{a}$")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7 if compact else 8, loc="lower left")
    where = "Stage III" if seg is None or seg.rec.name == "III" else "joint flow"
    if compact:
        ax.set_title(rf"{where}: $\partial_t a\cdot e^a$ against $a$", fontsize=10)
    else:
        ax.set_title(
            rf"{where}: law $\partial_t a \asymp e^{{-a}}$ — measured rate vs the GIH's $F(a)\,e^a$",
            fontsize=10,
        )
    if seg is None:
        ax.text(0.5, 0.9, "a never moves in this run", ha="center", transform=ax.transAxes)
    return root_figure(ax.figure)
