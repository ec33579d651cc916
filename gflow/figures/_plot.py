"""The figures of a run (docs/theory/mathematics.md §M7).

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

``plot_run`` draws them all for a run folder; ``run_theory`` reads (or
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

from pathlib import Path

import numpy as np

from .._util import atomic_savefig
from ..core import subset_label
from ..theory import Theory
from ..trajectory import Trajectory, load
from ._base import (
    DPI,
    FORMATS,
    SIZE_STAGES,
    SIZE_SUMMARY,
    STAGE_CODE,
    fmt_g,
    new_figure,
    root_figure,
    s_star,
    selected_heads,
    stage3_law_of,
    stage_axes,
    stage_segments,
    validity_window,
)
from ._panels import fit_a_log_tau, plot_a_vs_logt, plot_c_frac, plot_copier, plot_rate
from ._seeds import plot_seeds
from ._sharpness import plot_sharpness

__all__ = [
    "fit_a_log_tau",
    "plot_a_vs_logt",
    "plot_c_frac",
    "plot_copier",
    "plot_loss",
    "plot_rate",
    "draw_run",
    "plot_summary",
]

# ---------------------------------------------------------------------------
# 5. The loss
# ---------------------------------------------------------------------------


_LADDER_LINES = {
    "oracle": ("oracle E H(π(·|z_q))", "0.35", ":"),
    "bayes": ("Bayes (Dirichlet predictive)", "tab:green", (0, (5, 2))),
    "unigram": ("context unigram (GIH at a = 0)", "tab:purple", (0, (1, 1))),
}


def _ladder_lines(ax, theory) -> None:
    """The loss ladder's rungs (docs/theory/mathematics.md §M8.3; the theory's ``ladder``, the dict
    of :meth:`gflow.Ladder.to_json`) as horizontal lines; the GIH rung
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
    every panel (docs/theory/mathematics.md §M6.5), in the stage where ``a`` moves the GIH's loss
    ``L_GIH(a(τ))`` along the measured ``a``, and each stage's change of loss
    ``ΔL`` (from the previous stage's last state) in its panel's title; with
    ``theory["ladder"]``, the oracle, Bayes and unigram rungs as further
    horizontal lines (docs/theory/mathematics.md §M8.3)."""
    segs = stage_segments(traj, stages)
    fig = new_figure(SIZE_STAGES) if fig is None else fig
    axes = stage_axes(fig, segs, 0.4 if compact else 0.3)
    s3 = stage3_law_of(traj, theory)
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
            ag, Lg = s3.a_grid, s3.L
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
        ncol=1 if compact else min(len(handles), 4),  # compact: two columns overflow the summary page
        fontsize=7 if compact else 8,
    )
    if len(segs) == 1:
        fig.suptitle(r"loss $\hat L$", fontsize=10 if compact else 11)
    elif compact:
        fig.suptitle("loss, each stage on its own clock", fontsize=10)
    else:
        fig.suptitle("loss against each stage's own time (a panel edge is a stage boundary)", fontsize=11)
    return root_figure(fig)


# ---------------------------------------------------------------------------
# 6. Summary
# ---------------------------------------------------------------------------


def _summary_text(traj: Trajectory, theory: Theory | dict | None) -> str:
    cfg = traj.config
    st = {r.name: r for r in traj.stages}
    lines = []
    S_star = s_star(traj, theory)
    cf_end = traj.c_frac[-1]
    j = int(np.argmax(cf_end))
    lines.append("Stage I: selector c")
    if S_star is not None:
        lines.append(f"  theory   S* = argmax Ĩ = {subset_label(S_star)}")
    t_I = f", t = {fmt_g(st['I'].t1)}" if "I" in st else ""
    lines.append(f"  measured argmax c/Σc = {traj.labels[j]} ({cf_end[j]:.3f}){t_I}")
    lines.append("Stage II: copier w")
    heads = selected_heads(traj, theory)
    s_end = traj.s[-1]
    vals = [f"s^({h})_{h} = {s_end[h - 1, h - 1]:.3f}" for h in heads if h <= min(s_end.shape)]
    if vals:
        lines.append("  end: " + ", ".join(vals))
    if "II" in st:
        lines.append(f"  ended at t = {fmt_g(st['II'].t1)} (by {st['II'].ended_by})")
    lines.append("Stage III: a")
    s3 = stage3_law_of(traj, theory)
    if s3 is not None:
        win = validity_window(traj, theory)
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
    lines.append(f"status: {'complete' if traj.integrated else traj.status}; wall {traj.wall:.0f} s")
    lines.append(f"N = {cfg.estimator.N}, seed {cfg.estimator.seed}, solver {cfg.solver.method}")
    if traj.n_seeds:
        lines.append(f"{traj.n_seeds} seeds: these panels show their mean")
    return "\n".join(lines)


def plot_summary(traj: Trajectory, theory: Theory | dict | None = None, *, fig=None):
    """One page (15 × 9 in) telling the three stages' story, on a 2 × 3 grid:
    ``c_S/Σc`` where ``c`` moves (Stage I; the whole run for a joint run), the
    copier before/after (Stage II), ``a`` against ``log τ`` (Stage III); the
    loss over every stage, ``∂ₜa·e^a`` against ``a`` (Stage III), and the key
    numbers measured next to the theory's."""
    fig = new_figure(SIZE_SUMMARY) if fig is None else fig
    sub = fig.subfigures(2, 3, wspace=0.02, hspace=0.02)
    joint = any(r.name == "joint" for r in traj.stages)
    first = ["joint"] if joint else ["I"]
    if not any(r.name in first and (traj.stage == STAGE_CODE[r.name]).any() for r in traj.stages):
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
    return root_figure(fig)


def plot_strategies(traj: Trajectory, theory: Theory | dict | None = None, *, ax=None, strategies=None):
    """The mean KL from Edelman et al.'s three strategies (uniform, unigram, bigram, add-one
    counts) to the model against t (log-log), the run's phases shaded (the strategy closest by a
    factor 2) and the loss on a second axis (``gflow.strategies``, at most 100 saved times;
    `strategies`: its result when already computed). The time axis is ``t`` itself: a phase
    spans stages."""
    from ..theory import strategies_of

    if ax is None:  # a figure pyplot does not hold (as every figure here): nothing leaks into plt's state
        ax = new_figure((8, 4.5)).add_subplot()
    s = strategies if strategies is not None else strategies_of(traj, every=max(1, -(-len(traj.ts) // 100)))
    t = s["t"]
    pos = t > 0
    colors = {"uniform": "tab:gray", "unigram": "tab:orange", "bigram": "tab:green"}
    for k, c in colors.items():
        ax.loglog(t[pos], np.maximum(s[f"kl_{k}"][pos], 1e-12), color=c, lw=1.8, label=f"KL({k} ‖ model)")
    for k, a, b in s["phases"]:
        ax.axvspan(max(a, t[pos][0] if pos.any() else a), max(b, a), color=colors[k], alpha=0.12, lw=0)
    ax.set_xlabel("t")
    ax.set_ylabel("mean KL over the loss's positions")
    ax2 = ax.twinx()
    ax2.semilogx(traj.ts[traj.ts > 0], traj.loss[traj.ts > 0], color="tab:blue", lw=1.0, ls=":", label="loss")
    ax2.set_ylabel("loss", color="tab:blue")
    ph = ", ".join(f"{k} [{fmt_g(a)}, {fmt_g(b)}]" for k, a, b in s["phases"]) or "no phase"
    ax.set_title(f"Edelman et al.'s strategies against the model; phases (×2 closest): {ph}", fontsize=9)
    ax.legend(loc="lower left", fontsize=8)
    return root_figure(ax.figure)


# ---------------------------------------------------------------------------
# A run folder
# ---------------------------------------------------------------------------


_FIGURES = {
    "c_frac": plot_c_frac,
    "copier": plot_copier,
    "a_vs_logt": plot_a_vs_logt,
    "rate": plot_rate,
    "loss": plot_loss,
    "summary": plot_summary,
    "strategies": plot_strategies,
}


def draw_run(
    run_dir: str | Path, figdir: str | Path | None = None, *, fmt: str = "png", theory=None,
    traj: Trajectory | None = None, spectrum=None,
) -> list[Path]:
    """Draw every figure of the run saved in `run_dir` into `figdir` (default
    ``run_dir/figures``): ``c_frac``, ``copier``, ``a_vs_logt``, ``rate``,
    ``loss``, ``summary`` and ``strategies``, in format `fmt` (png, svg or pdf; 120 dpi); for a stochastic
    run (R seeds) these draw the seed-mean trajectory, and ``seeds`` every seed with their
    mean and spread (:func:`plot_seeds`).

    `theory`: a :class:`gflow.Theory` (or its JSON dict), or ``None`` (the
    figures are drawn without the theory's lines). `traj`: the run's
    trajectory if already loaded. :func:`gflow.plot_run` draws them with the
    run's cached theory. Raises ``FileNotFoundError`` if `run_dir` holds no run.
    With `spectrum` (the run's :class:`gflow.dynamics.Spectrum`), also ``sharpness``
    (:func:`plot_sharpness`, last). Returns the paths written, in the order above.
    """
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    run_dir = Path(run_dir)
    traj = load(run_dir) if traj is None else traj
    figdir = run_dir / "figures" if figdir is None else Path(figdir)
    figdir.mkdir(parents=True, exist_ok=True)
    paths = []
    seeds = {"seeds": plot_seeds} if traj.n_seeds else {}
    for name, make in {**_FIGURES, **seeds}.items():
        p = figdir / f"{name}.{fmt}"
        atomic_savefig(make(traj, theory), p, dpi=DPI)  # a kill while drawing leaves no truncated figure
        paths.append(p)
    if spectrum is not None:
        p = figdir / f"sharpness.{fmt}"
        plot_sharpness(traj, spectrum).savefig(p, dpi=DPI)
        paths.append(p)
    return paths
