"""The sharpness figure of a run (docs/theory/mathematics.md §M9): ``λ_max(ΛH)`` along the run.

One panel per stage (each on its own clock, as the other run figures), with the
largest eigenvalue of ``Λ^{1/2} H Λ^{1/2}`` (:class:`gflow.dynamics.Spectrum`) at the
saved times where the spectrum was computed; for a run with a GD step η (GD, its
modified flow, SGD) the stability edge ``λ_max = 2/η`` as a horizontal line, the
region above it shaded; the largest λ_max of the run (the smallest edge ``η_c = 2/λ_max``,
:attr:`gflow.Spectrum.eta_c_min`) marked ★ and quoted in the title with the method that made
the run.
"""

from __future__ import annotations

import numpy as np

from ..dynamics import Spectrum
from ..trajectory import Trajectory
from ._base import SIZE_STAGES, method_label, new_figure, root_figure, stage_axes, stage_segments


def plot_sharpness(traj: Trajectory, spectrum: Spectrum, *, fig=None):
    """``λ_max(ΛH)(t)`` of a run, per stage, with ``2/η`` marked where the run has a step η."""
    segs = stage_segments(traj)
    fig = new_figure(SIZE_STAGES) if fig is None else fig
    axes = stage_axes(fig, segs, 0.3)
    lam = np.asarray(spectrum.lam_max)
    if lam.ndim > 1:  # a seed axis (SGD): mean over seeds
        lam = lam.reshape(-1, lam.shape[-1]).mean(0)
    pos = {int(i): k for k, i in enumerate(spectrum.index)}
    eta = spectrum.eta
    for ax, seg in zip(axes, segs):
        ks = [pos[int(i)] for i in seg.idx if int(i) in pos]
        rows = np.array([int(spectrum.index[k]) for k in ks], int)
        tau = traj.ts[rows] - seg.rec.t0 if len(rows) else np.zeros(0)
        y = lam[ks] if ks else np.zeros(0)
        ok = (tau > 0) & (y > 0)
        ax.plot(tau[ok], y[ok], "-o", color="tab:red", ms=3, lw=1.5, label=r"$\lambda_{\max}(\Lambda H)$")
        if eta is not None and eta > 0:
            ax.axhline(2.0 / eta, color="k", ls="--", lw=1.2, label=rf"GD's stability edge $2/\eta$ ($\eta$ = {eta:g})")
            ax.axhspan(2.0 / eta, max(2.0 / eta, float(np.max(y[ok], initial=0.0))) * 1.5, color="0.85",
                       alpha=0.5, lw=0)  # fmt: skip
        ax.set_yscale("log")
        ax.set_xlabel(seg.tau_label)
        ax.set_title(seg.title(True), fontsize=9)
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel(r"$\lambda_{\max}$ of $\Lambda^{1/2} H \Lambda^{1/2}$")
    # GD's edge over the whole run: the smallest η_c(t) and where (marked; a point at τ = 0 is left
    # of a log axis, so the title says so rather than quoting a value the axes do not draw)
    ec_min = spectrum.eta_c_min
    t_min, st_min = spectrum.where_eta_c_min
    where = ""
    if np.isfinite(ec_min):
        seg = next((sg for sg in segs if sg.rec.name == st_min), None)
        tau_min = t_min - seg.rec.t0 if seg is not None else t_min
        if seg is not None and tau_min > 0:
            ax = axes[segs.index(seg)]
            ax.plot([tau_min], [2.0 / ec_min], "*", color="k", ms=12, zorder=5,
                    label=rf"min over the run of $\eta_c = 2/\lambda_{{\max}}$: {ec_min:.3g}")  # fmt: skip
            where = f"at t = {t_min:.3g} (★)"
        else:
            start = "the run's start" if st_min == "joint" else f"Stage {st_min}'s start"
            where = f"at t = {t_min:.3g}, {start} (left of the log axis)"
    handles = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(list(handles.values()), list(handles.keys()), loc="outside lower center", ncol=len(handles),
               fontsize=8)  # fmt: skip
    what = method_label(traj.config, traj.stages[0].name if traj.stages else "I")
    edge = f"min over the run η_c = 2/λ_max = {ec_min:.3g} {where}" if np.isfinite(ec_min) else "λ_max ≤ 0 throughout"
    fig.suptitle(
        f"sharpness along the run ({'the gradient flow' if what == 'flow' else what}): GD with step η is linearly "
        f"stable where λ_max < 2/η;\n{edge}",
        fontsize=11,
    )
    return root_figure(fig)
