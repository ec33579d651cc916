"""The figure of a stochastic run's seeds: their mean and spread.

A run of ``solver.method = "sgd"`` or ``"sde"`` keeps R seeds
(:attr:`~gflow.Trajectory.per_seed`); the run's other figures draw its
seed-mean trajectory (θ̄(t), the mean loss). :func:`plot_seeds` shows the seeds
themselves, four panels against ``log t``: ``a``, ``‖C‖``, ``c_S/Σc`` of the set the seed
mean selected, and the loss ``L̂_N``. In each: every seed as a thin line (up to 20 of
them), the mean over the seeds of the seed's own value (a thick line), the spread
(mean ± one standard deviation over the seeds, a light band) and the mean's standard
error (± 2 SE, a darker band: what the check report judges by); with the theory, ``a*``
and ``inf_a L_GIH`` of that set as dashed lines (named in the panel's title instead when
they lie far off the seeds' range, which they would squash).
"""

from __future__ import annotations

import numpy as np

from ..core import subset_label
from ..theory import Theory
from ..trajectory import Trajectory, selected_set
from ._base import new_figure, root_figure, stage3_law_of

_MAX_LINES = 20


def seed_quantities(traj: Trajectory) -> dict[str, tuple[str, np.ndarray]]:
    """``{key: (label, (R, T) values)}`` of the panels: a, ‖C‖, c_S/Σc of the selected set, loss."""
    ps = traj.per_seed
    C = np.asarray(ps["C"], np.float64)
    c = C**2
    S = selected_set(traj)
    j = traj.subsets.index(S) if S is not None else int(np.argmax(traj.c_frac[-1]))
    return {
        "a": (r"$a$", np.asarray(ps["a"], np.float64)),
        "C_norm": (r"$\|C\|$", np.sqrt(c.sum(-1))),
        "c_frac": (rf"$c_S/\Sigma c$, S = {subset_label(traj.subsets[j])}", c[..., j] / c.sum(-1)),
        "loss": (r"loss $\hat L_N$", np.asarray(ps["loss"], np.float64)),
    }


def plot_seeds(traj: Trajectory, theory: Theory | dict | None = None, *, fig=None):
    """Every seed, their mean and spread (module docstring); ``ValueError`` for a run
    without seeds."""
    if not traj.n_seeds:
        raise ValueError("plot_seeds: the run has no seed axis (not a stochastic run)")
    R = traj.n_seeds
    fig = new_figure((12.0, 7.5)) if fig is None else fig
    axes = fig.subplots(2, 2, sharex=True).ravel()
    pos = traj.ts > 0
    t = traj.ts[pos]
    law = stage3_law_of(traj, theory)
    lines = {"a": None if law is None else law.a_star, "loss": None if law is None else law.limit_loss}
    for ax, (key, (label, v)) in zip(axes, seed_quantities(traj).items()):
        v = v[:, pos]
        mean = v.mean(0)
        sd = v.std(0, ddof=1) if R > 1 else np.zeros_like(mean)
        se = sd / np.sqrt(R)
        for r in range(min(R, _MAX_LINES)):
            ax.plot(t, v[r], color="0.6", lw=0.6, alpha=0.7, label="one seed" if r == 0 else None)
        ax.fill_between(t, mean - sd, mean + sd, color="tab:blue", alpha=0.18, lw=0, label="spread: ±1 s.d.")
        ax.fill_between(t, mean - 2 * se, mean + 2 * se, color="tab:blue", alpha=0.4, lw=0, label="±2 SE of the mean")
        ax.plot(t, mean, color="tab:blue", lw=1.8, label=f"mean of {R} seeds")
        ref = lines.get(key)
        if ref is not None and np.isfinite(ref):
            name = "a*" if key == "a" else r"$\inf_a L_{\rm GIH}$"
            lo, hi = float(np.min(v)), float(np.max(v))
            if lo - (hi - lo) <= ref <= hi + (hi - lo):  # near the seeds: a line; far: named in the title
                ax.axhline(ref, color="tab:red", ls="--", lw=1.2, label=f"{name} = {ref:.4g}")
            else:
                ax.set_title(f"{name} = {ref:.4g} (off the axis)", fontsize=8)
        ax.set_xscale("log")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    for ax in axes[2:]:
        ax.set_xlabel("$t$")
    cfg = traj.config
    m = cfg.solver.method_for("I")
    what = (f"SGD, η = {cfg.solver.eta:g}, B = {cfg.sgd.batch} ({cfg.sgd.sampling})" if m == "sgd"
            else f"SDE of SGD with η = {cfg.solver.eta:g}, B = {cfg.sgd.batch}")  # fmt: skip
    fig.suptitle(f"{what}: {R} seeds, their mean and spread", fontsize=11)
    return root_figure(fig)
