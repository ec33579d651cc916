"""The figures of a run (README §M7).

One function per figure, each taking the :class:`~gflow.trajectory.Trajectory`
and the theory (the :class:`gflow.theory.Theory`, or its JSON dict, or ``None``
for the run alone) and returning the matplotlib ``Figure``:

- :func:`plot_c_frac`: the selector weights ``c_S/Σc`` of every ``S ∈ 𝒮``;
- :func:`plot_copier`: the copier's attention ``s^(h) = softmax(w^(h))``,
  heads × offsets, before and after;
- :func:`plot_a_vs_logt`: ``a`` against ``log τ`` in Stage III with the
  least-squares line on the validity window (:func:`fit_a_log_tau`) and ``a*``;
- :func:`plot_rate`: the measured ``∂ₜa·e^a`` against ``a`` with the GIH's
  ``F(a)·e^a``, ``C*`` and the window;
- :func:`plot_loss`: the loss with its SE band and ``inf_a L_GIH``;
- :func:`plot_summary`: the story of the three stages on one page.

:func:`plot_run` draws them all for a run folder; :func:`run_theory` reads (or
computes and saves) the run's ``theory.json``.

**Time axes.** The staged schedule runs every stage on its own clock: Stage k
starts at ``t_k`` and saves at ``τ = t − t_k`` on a logarithmic grid, so its
dynamics span decades of τ whatever ``t_k`` is (Stage III starts at
``t ≈ 2.6e4`` in the small run and moves at ``τ ~ 1–1e3``, which an absolute
``log t`` axis squeezes into a sliver at its right end). Whole-run figures
therefore draw one panel per stage, each on its own logarithmic τ axis, sharing
the y axis: a panel edge is a stage boundary, its title gives the stage's
``t`` range and how it ended, and its width is proportional to the decades of
τ it shows (at least 30 % of the widest), so a decade has about the same width
in every panel. Points at ``τ = 0`` (a stage's first instant, equal to the
previous stage's last point) are not on a log axis and are left out. A joint
run (one stage from ``t = 0``) has one panel on ``log t``.

matplotlib is imported inside the functions, and figures are built with
``matplotlib.figure.Figure`` (rendered by Agg on save), never through
``pyplot``: nothing is registered in pyplot's global state, and a figure is
freed as soon as it is no longer referenced.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from ._fit import linear_fit
from ._gih import StageIIILaw
from ._io import STAGE_CODES
from .theory import Theory, load_or_compute, selected_set
from .trajectory import StageRecord, Trajectory, load

__all__ = [
    "fit_a_log_tau",
    "plot_a_vs_logt",
    "plot_c_frac",
    "plot_copier",
    "plot_loss",
    "plot_rate",
    "plot_run",
    "plot_summary",
    "run_theory",
]

_STAGE_CODE = STAGE_CODES
_FORMATS = ("png", "svg", "pdf")
DPI = 120

# Figure sizes in inches: the single figures, and the one-page summary.
_SIZE_STAGES = (13.0, 4.6)
_SIZE_SINGLE = (7.5, 5.0)
_SIZE_COPIER = (9.5, 4.2)
_SIZE_SUMMARY = (15.0, 9.0)


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Segment:
    """The saved points of one stage: indices into the trajectory, and ``τ = t − t0``."""

    rec: StageRecord
    idx: np.ndarray
    tau: np.ndarray

    def title(self, compact: bool = False, extra: str | None = None) -> str:
        r = self.rec
        if r.name == "joint":
            head = "joint flow" if compact else "joint flow (all blocks move)"
        else:
            head = f"Stage {r.name} ({', '.join(r.moves)} moves)"
        end = r.ended_by if r.complete or r.ended_by == "failed" else "running"
        lines = [head, f"t = {_g(r.t0)} → {_g(r.t1)}"]
        if not compact:
            lines[-1] += f" (ended by {end})" if extra is None else ""
            lines += [f"ended by {end}"] if extra is not None else []
        return "\n".join(lines + ([extra] if extra else []))

    @property
    def tau_label(self) -> str:
        if self.rec.name == "joint" and self.rec.t0 == 0:
            return "$t$"
        return rf"$\tau = t - t_{{\rm {self.rec.name}}}$"

    @property
    def decades(self) -> float:
        t = self.tau[self.tau > 0]
        return float(np.log10(t.max() / t.min())) if t.size > 1 else 0.0


def _g(x: float) -> str:
    return "0" if x == 0 else f"{x:.3g}"


def _segments(traj: Trajectory, names=None) -> list[_Segment]:
    """One :class:`_Segment` per stage with saved points (optionally only the
    stages named in `names`)."""
    if len(traj) == 0:
        raise ValueError("the run has no saved points: nothing to plot")
    segs = []
    for rec in traj.stages:
        if names is not None and rec.name not in names:
            continue
        idx = np.flatnonzero(traj.stage == _STAGE_CODE.get(rec.name, -1))
        if idx.size:
            segs.append(_Segment(rec, idx, traj.ts[idx] - rec.t0))
    if not segs:
        have = [r.name for r in traj.stages]
        raise ValueError(f"no saved points in the stages {list(names or have)} (the run's stages: {have})")
    return segs


def _stage_axes(fig, segs: list[_Segment], min_frac: float):
    """One axis per stage, sharing y, widths proportional to the decades of τ
    shown (at least `min_frac` of the widest)."""
    dec = np.array([s.decades for s in segs])
    widths = np.maximum(dec, min_frac * max(dec.max(), 1.0))
    axes = fig.subplots(1, len(segs), sharey=True, squeeze=False, gridspec_kw={"width_ratios": widths})[0]
    for ax, seg in zip(axes, segs):
        ax.set_xscale("log")
        if seg.decades < 1.0:
            # less than a decade: matplotlib would label every minor tick and crowd them
            from matplotlib.ticker import LogLocator

            ax.xaxis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))
    return axes


def _a_segment(traj: Trajectory) -> _Segment | None:
    """The stage in which ``a`` moves: Stage III (staged) or the joint phase."""
    for name in ("III", "joint"):
        try:
            return _segments(traj, (name,))[0]
        except ValueError:
            continue
    return None


def _new_figure(size):
    from matplotlib.figure import Figure

    return Figure(figsize=size, dpi=DPI, layout="constrained")


def _root(fig):
    return fig.figure  # a SubFigure's .figure is the root Figure; a Figure's is itself


def _as_theory(theory):
    """A :class:`~gflow.theory.Theory` (or its JSON dict, or ``None``) as a Theory."""
    if theory is None or isinstance(theory, Theory):
        return theory
    return Theory.from_json(theory)


def _stage3(traj: Trajectory, theory) -> StageIIILaw | None:
    """The GIH law of the set Stage I selected (README §M8.1: Stage III follows the
    selected set), else of the theory's ``S*``."""
    theory = _as_theory(theory)
    if theory is None:
        return None
    S = selected_set(traj)
    return theory.laws[S] if S in theory.laws else theory.laws.get(theory.S_star)


def _window(traj: Trajectory, theory) -> tuple[float, float] | None:
    law = _stage3(traj, theory)
    if law is None or not all(np.isfinite(law.window)):
        return None
    return float(law.window[0]), float(law.window[1])


def _s_star(traj: Trajectory, theory) -> tuple[int, ...] | None:
    theory = _as_theory(theory)
    return None if theory is None else theory.S_star


def _selected_heads(traj: Trajectory, theory: Theory | dict | None) -> tuple[int, ...]:
    """Stage II's heads (the set Stage I selected), else the theory's ``S*``."""
    for r in traj.stages:
        if r.selected:
            return tuple(r.selected)
    return _s_star(traj, theory) or ()


def _label(S) -> str:
    return "∅" if not S else "{" + ",".join(map(str, S)) + "}"


def _rate(traj: Trajectory, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Measured ``∂ₜa = −η_a ∂L̂/∂a`` and its SE at the saved indices."""
    eta = float(traj.config.schedule.eta_a)
    return -eta * traj.grad_a[idx], eta * traj.grad_se_a[idx]


# ---------------------------------------------------------------------------
# The fit of a against log τ
# ---------------------------------------------------------------------------


def fit_a_log_tau(traj: Trajectory, theory: Theory | dict | None) -> dict | None:
    """Least-squares line ``a = slope·ln τ + intercept`` over the saved points of
    the stage in which ``a`` moves (Stage III, or the joint phase) whose ``a``
    lies in the theory's validity window ``{F e^a ≥ C*/2}`` (README §M6.4; the
    paper's ``∂ₜa ≍ e^{−a}`` gives slope 1). ``τ = t − t_III`` (``t`` for a
    joint run); points at ``τ = 0`` are left out.

    Returns ``{"slope", "intercept", "n", "tau_min", "tau_max", "window"}``, or
    ``None`` when there is no window, no moving ``a``, or fewer than two points
    in the window.
    """
    win = _window(traj, theory)
    seg = _a_segment(traj)
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
    theory's ``S* = argmax Ĩ`` (README §M6.1) is drawn thicker.

    `fig`: a ``Figure`` or ``SubFigure`` to draw into (default: a new one);
    `compact`: shorter titles and the legend inside, for :func:`plot_summary`.
    Returns the (root) Figure.
    """
    import matplotlib as mpl

    segs = _segments(traj, stages)
    fig = _new_figure(_SIZE_STAGES) if fig is None else fig
    axes = _stage_axes(fig, segs, 0.3)
    S_star = _s_star(traj, theory)
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
    star = "" if S_star is None else rf"; thick: $S^* = \arg\max\,\tilde I$ = {_label(S_star)}"
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
    return _root(fig)


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
    in red: Stage II drives them to 1 (README §M6.3).
    """
    from matplotlib.patches import Rectangle

    fig = _new_figure(_SIZE_COPIER) if fig is None else fig
    axes = fig.subplots(1, 2, squeeze=False)[0]
    s = traj.s
    H, M = s.shape[1:]
    heads = _selected_heads(traj, theory)
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
        ax.set_title(f"{what}: t = {_g(float(traj.ts[i]))} ({stage})", fontsize=9 if compact else 10)
    cb = fig.colorbar(im, ax=list(axes), shrink=0.9)
    cb.set_label(r"$s^{(h)}_m$")
    sel = f"; red: heads {_label(heads)}" if heads else ""
    if compact:
        pre = "" if any(r.name == "joint" for r in traj.stages) else "Stage II: "
        fig.suptitle(rf"{pre}copier attention $s^{{(h)}}${sel}", fontsize=10)
    else:
        sel = rf"; red outline: $s^{{(h)}}_h$ of the selected heads {_label(heads)}" if heads else ""
        fig.suptitle(rf"copier attention $s^{{(h)}} = \mathrm{{softmax}}(w^{{(h)}})${sel}", fontsize=11)
    return _root(fig)


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
        ax = _new_figure(_SIZE_SINGLE).subplots()
    seg = _a_segment(traj)
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
        return _root(ax.figure)
    pos = seg.tau > 0
    tau, a = seg.tau[pos], traj.a[seg.idx[pos]]
    win = _window(traj, theory)
    s3 = _stage3(traj, theory)
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
    return _root(ax.figure)


# ---------------------------------------------------------------------------
# 4. ∂ₜa·e^a against a
# ---------------------------------------------------------------------------


def plot_rate(traj: Trajectory, theory: Theory | dict | None = None, *, ax=None, compact: bool = False):
    """The measured ``∂ₜa·e^a`` (``∂ₜa = −η_a ∂L̂/∂a`` at the saved points of the
    stage where ``a`` moves, with ±1 SE bars from the gradient's Monte Carlo SE)
    against ``a``, with the theory's ``F(a)·e^a`` of the GIH and its ±1 SE band,
    ``C* = max F·e^a`` (and ``C*/2``), the validity window (shaded) and ``a*``
    (README §M6.4)."""
    if ax is None:
        ax = _new_figure(_SIZE_SINGLE).subplots()
    seg = _a_segment(traj)
    s3 = _stage3(traj, theory)
    win = _window(traj, theory)
    a_meas = r_meas = None
    if seg is not None:
        a_meas = traj.a[seg.idx]
        r, rse = _rate(traj, seg.idx)
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
        a = s3.a
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
    return _root(ax.figure)


# ---------------------------------------------------------------------------
# 5. The loss
# ---------------------------------------------------------------------------


_LADDER_LINES = {
    "oracle": ("oracle E H(π(·|z_q))", "0.35", ":"),
    "bayes": ("Bayes (Dirichlet predictive)", "tab:green", (0, (5, 2))),
    "unigram": ("context unigram (GIH at a = 0)", "tab:purple", (0, (1, 1))),
}


def _ladder_lines(ax, theory) -> None:
    """The loss ladder's rungs (README §M8.3; the theory's ``ladder``, the dict
    of :meth:`gflow.ladder.Ladder.to_json`) as horizontal lines; the GIH rung
    is the limit-loss line already drawn."""
    lad = theory.get("ladder") if isinstance(theory, dict) else getattr(theory, "ladder", None)
    rungs = {r["name"]: r for r in (lad or {}).get("rungs", [])}
    for k, (lab, col, ls) in _LADDER_LINES.items():
        r = rungs.get(k)
        if r is not None and r.get("loss") is not None:
            ax.axhline(r["loss"], color=col, ls=ls, lw=1.2, label=f"{lab} = {r['loss']:.4g} ± {r['se'] or 0:.2g}")


def plot_loss(traj: Trajectory, theory: Theory | dict | None = None, *, fig=None, stages=None, compact: bool = False):
    """The loss ``L̂`` with its ±1 SE band against ``log τ``, one panel per stage
    (shared y axis; `stages` selects them; see the module's note on time axes),
    with the GIH's limit loss ``inf_a L_GIH`` and its SE as a horizontal line in
    every panel (README §M6.5), in the stage where ``a`` moves the GIH's loss
    ``L_GIH(a(τ))`` along the measured ``a``, and each stage's change of loss
    ``ΔL`` (from the previous stage's last state) in its panel's title; with
    ``theory["ladder"]``, the oracle, Bayes and unigram rungs as further
    horizontal lines (README §M8.3)."""
    segs = _segments(traj, stages)
    fig = _new_figure(_SIZE_STAGES) if fig is None else fig
    axes = _stage_axes(fig, segs, 0.4 if compact else 0.3)
    s3 = _stage3(traj, theory)
    lim = None if s3 is None else s3.limit_loss
    for ax, seg in zip(axes, segs):
        pos = seg.tau > 0
        tau, idx = seg.tau[pos], seg.idx[pos]
        L, se = traj.loss[idx], traj.loss_se[idx]
        ax.fill_between(tau, L - se, L + se, color="tab:blue", alpha=0.25, lw=0, label="±1 SE")
        ax.plot(tau, L, color="tab:blue", lw=1.8, label=r"loss $\hat L$")
        if lim is not None:
            lse = s3.limit_loss_se or 0.0
            ax.axhspan(lim - lse, lim + lse, color="tab:red", alpha=0.12, lw=0)
            where = r"$a\to\infty$" if np.isinf(s3.a_limit) else f"a = {s3.a_limit:.3g}"
            ax.axhline(
                lim,
                color="tab:red",
                ls="--",
                lw=1.3,
                label=rf"GIH limit $\inf_a L_{{\rm GIH}}$ = {lim:.4g} ± {lse:.2g} (at {where})",
            )
        _ladder_lines(ax, theory)
        if s3 is not None and seg.rec.name in ("III", "joint"):
            ag, Lg = s3.a, s3.L
            aa = traj.a[idx]
            ok = (aa >= ag[0]) & (aa <= ag[-1])
            ax.plot(
                tau[ok],
                np.interp(aa[ok], ag, Lg),
                color="tab:orange",
                ls="-.",
                lw=1.5,
                label=r"GIH along the flow: $L_{\rm GIH}(a(\tau))$",
            )
        # the stage starts from the previous stage's last saved state
        i0 = seg.idx[0] - 1 if seg.idx[0] > 0 else seg.idx[0]
        dL = traj.loss[seg.idx[-1]] - traj.loss[i0]
        ax.set_xlabel(seg.tau_label)
        ax.set_title(seg.title(compact, rf"$\Delta L$ = {dL:+.2g}"), fontsize=8 if compact else 9)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(r"loss $\hat L$")
    handles = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(
        list(handles.values()),
        list(handles.keys()),
        loc="outside lower center",
        ncol=2 if compact else min(len(handles), 4),
        fontsize=7 if compact else 8,
    )
    if len(segs) == 1:
        fig.suptitle(r"loss $\hat L$", fontsize=10 if compact else 11)
    elif compact:
        fig.suptitle("loss, each stage on its own clock", fontsize=10)
    else:
        fig.suptitle("loss against each stage's own time (a panel edge is a stage boundary)", fontsize=11)
    return _root(fig)


# ---------------------------------------------------------------------------
# 6. Summary
# ---------------------------------------------------------------------------


def _summary_text(traj: Trajectory, theory: Theory | dict | None) -> str:
    cfg = traj.config
    st = {r.name: r for r in traj.stages}
    lines = []
    S_star = _s_star(traj, theory)
    cf_end = traj.c_frac[-1]
    j = int(np.argmax(cf_end))
    lines.append("Stage I: selector c")
    if S_star is not None:
        lines.append(f"  theory   S* = argmax Ĩ = {_label(S_star)}")
    t_I = f", t = {_g(st['I'].t1)}" if "I" in st else ""
    lines.append(f"  measured argmax c/Σc = {traj.labels[j]} ({cf_end[j]:.3f}){t_I}")
    lines.append("Stage II: copier w")
    heads = _selected_heads(traj, theory)
    s_end = traj.s[-1]
    vals = [f"s^({h})_{h} = {s_end[h - 1, h - 1]:.3f}" for h in heads if h <= min(s_end.shape)]
    if vals:
        lines.append("  end: " + ", ".join(vals))
    if "II" in st:
        lines.append(f"  ended at t = {_g(st['II'].t1)} (by {st['II'].ended_by})")
    lines.append("Stage III: a")
    s3 = _stage3(traj, theory)
    if s3 is not None:
        win = _window(traj, theory)
        if s3.C_star is not None:
            lines.append(f"  theory   C* = {s3.C_star:.4g} ± {s3.C_star_se or 0:.2g}")
        if win is not None:
            lines.append(f"           window = [{win[0]:.3g}, {win[1]:.3g}]")
        if s3.a_star is not None:
            lines.append(f"           a* = {s3.a_star:.4g} ± {s3.a_star_se or 0:.2g}")
    fit = fit_a_log_tau(traj, theory)
    if fit is not None:
        lines.append(f"  measured slope of a vs ln τ = {fit['slope']:.3f} (paper: 1)")
    lines.append(f"           a(end) = {traj.a[-1]:.4g}")
    lines.append("Loss")
    lines.append(f"  {traj.loss[0]:.4f} → {traj.loss[-1]:.4f} ± {traj.loss_se[-1]:.2g}")
    if s3 is not None and s3.limit_loss is not None:
        lines.append(f"  inf_a L_GIH = {s3.limit_loss:.4f} ± {s3.limit_loss_se or 0:.2g}")
    lines.append("")
    lines.append(f"status: {traj.status}; wall {traj.wall:.0f} s")
    lines.append(f"N = {cfg.estimator.N}, seed {cfg.estimator.seed}, solver {cfg.solver.method}")
    return "\n".join(lines)


def plot_summary(traj: Trajectory, theory: Theory | dict | None = None, *, fig=None):
    """One page (15 × 9 in) telling the three stages' story, on a 2 × 3 grid:
    ``c_S/Σc`` where ``c`` moves (Stage I; the whole run for a joint run), the
    copier before/after (Stage II), ``a`` against ``log τ`` (Stage III); the
    loss over every stage, ``∂ₜa·e^a`` against ``a`` (Stage III), and the key
    numbers measured next to the theory's."""
    fig = _new_figure(_SIZE_SUMMARY) if fig is None else fig
    sub = fig.subfigures(2, 3, wspace=0.02, hspace=0.02)
    joint = any(r.name == "joint" for r in traj.stages)
    first = ["joint"] if joint else ["I"]
    if not any(r.name in first and (traj.stage == _STAGE_CODE[r.name]).any() for r in traj.stages):
        first = None
    plot_c_frac(traj, theory, fig=sub[0, 0], stages=first, compact=True)
    plot_copier(traj, theory, fig=sub[0, 1], compact=True)
    plot_a_vs_logt(traj, theory, ax=sub[0, 2].subplots(), compact=True)
    plot_loss(traj, theory, fig=sub[1, 0], compact=True)
    plot_rate(traj, theory, ax=sub[1, 1].subplots(), compact=True)
    ax = sub[1, 2].subplots()
    ax.set_axis_off()
    ax.text(
        0.0,
        1.0,
        _summary_text(traj, theory),
        va="top",
        ha="left",
        family="monospace",
        fontsize=9,
        transform=ax.transAxes,
    )
    ax.set_title("measured and predicted", fontsize=10, loc="left")
    d, m = traj.config.data, traj.config.model
    kind = "joint" if joint else "staged"
    fig.suptitle(
        f"gflow run ({kind}): d = {d.d}, parents {tuple(d.parents)}, α = {d.alpha:g}, L = {d.L}; "
        f"TF(M = {m.M}, H = {m.H}, D = {m.D}); N = {traj.config.estimator.N}",
        fontsize=12,
    )
    return _root(fig)


# ---------------------------------------------------------------------------
# A run folder
# ---------------------------------------------------------------------------


def run_theory(run_dir: str | Path, traj: Trajectory | None = None) -> Theory:
    """The theory of a run (:func:`gflow.theory.load_or_compute`): ``run_dir/theory.json``
    if it belongs to the run (written by ``gflow check``), else computed on the
    run's configuration and sample (2000 prior kernels) and saved."""
    return load_or_compute(run_dir, traj)[0]


_FIGURES = {
    "c_frac": plot_c_frac,
    "copier": plot_copier,
    "a_vs_logt": plot_a_vs_logt,
    "rate": plot_rate,
    "loss": plot_loss,
    "summary": plot_summary,
}


def plot_run(
    run_dir: str | Path, figdir: str | Path | None = None, *, fmt: str = "png", theory=None
) -> list[Path]:
    """Draw every figure of the run saved in `run_dir` into `figdir` (default
    ``run_dir/figures``): ``c_frac``, ``copier``, ``a_vs_logt``, ``rate``,
    ``loss`` and ``summary``, in format `fmt` (png, svg or pdf; 120 dpi).

    `theory`: a :class:`gflow.theory.Theory` (or its JSON dict); default
    :func:`run_theory` (``theory.json``, computed and saved if missing).
    Raises ``FileNotFoundError`` if `run_dir` holds no run. Returns the paths
    written, in the order above.
    """
    if fmt not in _FORMATS:
        raise ValueError(f"fmt must be one of {_FORMATS}, got {fmt!r}")
    run_dir = Path(run_dir)
    traj = load(run_dir)
    if theory is None:
        theory = run_theory(run_dir, traj)
    figdir = run_dir / "figures" if figdir is None else Path(figdir)
    figdir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, make in _FIGURES.items():
        p = figdir / f"{name}.{fmt}"
        make(traj, theory).savefig(p, dpi=DPI)
        paths.append(p)
    return paths
