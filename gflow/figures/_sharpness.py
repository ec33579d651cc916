"""The sharpness figure of a run (README §M9): ``λ_max(ΛH)`` along the run.

One panel per stage (each on its own clock, as the other run figures), with the
largest eigenvalue of ``Λ^{1/2} H Λ^{1/2}`` (:class:`gflow.dynamics.Spectrum`) at the
saved times where the spectrum was computed; for a run with a GD step η (GD, its
modified flow, SGD) the stability edge ``λ_max = 2/η`` as a horizontal line, the
region above it shaded.
"""

from __future__ import annotations

import numpy as np

from ..dynamics import Spectrum
from ..trajectory import Trajectory
from ._base import SIZE_STAGES, new_figure, root_figure, stage_axes, stage_segments


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
    handles = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(list(handles.values()), list(handles.keys()), loc="outside lower center", ncol=len(handles),
               fontsize=8)  # fmt: skip
    finite = np.isfinite(spectrum.eta_c.reshape(-1)) if np.size(spectrum.eta_c) else np.zeros(0, bool)
    ec0 = float(np.asarray(spectrum.eta_c).reshape(-1, len(spectrum.index))[:, 0].mean()) if finite.any() else np.inf
    fig.suptitle(
        f"sharpness along the run: GD with step η is linearly stable where λ_max < 2/η "
        f"(η_c = 2/λ_max = {ec0:.3g} at the first computed time)",
        fontsize=11,
    )
    return root_figure(fig)
