"""Shared pieces of gflow's figures (:mod:`gflow.figures`): sizes, the per-stage
panels on each stage's own clock, and reading the theory.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .._util import STAGE_CODES
from ..theory import StageIIILaw, Theory
from ..trajectory import StageRecord, Trajectory, selected_set

STAGE_CODE = STAGE_CODES
FORMATS = ("png", "svg", "pdf")
DPI = 120

# Figure sizes in inches: the single figures, and the one-page summary.
SIZE_STAGES = (13.0, 4.6)
SIZE_SINGLE = (7.5, 5.0)
SIZE_COPIER = (9.5, 4.2)
SIZE_SUMMARY = (15.0, 9.0)


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Segment:
    """The saved points of one stage: indices into the trajectory, and ``τ = t − t0``."""

    rec: StageRecord
    idx: np.ndarray
    tau: np.ndarray
    method: str = "flow"  # what integrated the stage (method_label): "flow", "GD (η = 0.01)", …

    def title(self, compact: bool = False, extra: str | None = None) -> str:
        r = self.rec
        if r.name == "joint":
            head = f"joint {self.method}" if compact else f"joint {self.method} (all blocks move)"
        else:
            head = f"Stage {r.name} ({', '.join(r.moves)} moves)" + ("" if self.method == "flow" else f", {self.method}")
        end = r.ended_by if r.complete or r.ended_by == "failed" else "running"
        lines = [head, f"t = {fmt_g(r.t0)} → {fmt_g(r.t1)}"]
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


def method_label(cfg, stage: str) -> str:
    """What integrated a stage, for a figure's title: ``"flow"`` (an adaptive solver of the
    gradient flow), ``"GD (η = 0.01)"``, ``"modified flow (η = 0.1)"``, ``"central flow (η = 0.1)"``, ``"SGD (η = 0.05, B = 20)"``,
    ``"SDE (η = 0.05, B = 20)"``."""
    m, eta = cfg.solver.method_for(stage), cfg.solver.eta
    if m in ("tsit5", "kvaerno5", "heun"):
        return "flow"
    if m == "gd":
        return f"GD (η = {eta:g})"
    if m == "modified":
        return f"modified flow (η = {eta:g})"
    if m == "central":
        return f"central flow (η = {eta:g})"
    return f"{m.upper()} (η = {eta:g}, B = {cfg.sgd.batch})"


def fmt_g(x: float) -> str:
    return "0" if x == 0 else f"{x:.3g}"


def stage_segments(traj: Trajectory, names=None) -> list[_Segment]:
    """One :class:`_Segment` per stage with saved points (optionally only the
    stages named in `names`)."""
    if len(traj) == 0:
        raise ValueError("the run has no saved points: nothing to plot")
    segs = []
    for rec in traj.stages:
        if names is not None and rec.name not in names:
            continue
        idx = np.flatnonzero(traj.stage == STAGE_CODE.get(rec.name, -1))
        if idx.size:
            segs.append(_Segment(rec, idx, traj.ts[idx] - rec.t0, method_label(traj.config, rec.name)))
    if not segs:
        have = [r.name for r in traj.stages]
        raise ValueError(f"no saved points in the stages {list(names or have)} (the run's stages: {have})")
    return segs


def stage_axes(fig, segs: list[_Segment], min_frac: float):
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


def a_segment(traj: Trajectory) -> _Segment | None:
    """The stage in which ``a`` moves: Stage III (staged) or the joint phase."""
    for name in ("III", "joint"):
        try:
            return stage_segments(traj, (name,))[0]
        except ValueError:
            continue
    return None


def new_figure(size):
    from matplotlib.figure import Figure

    return Figure(figsize=size, dpi=DPI, layout="constrained")


def root_figure(fig):
    return fig.figure  # a SubFigure's .figure is the root Figure; a Figure's is itself


def _as_theory(theory):
    """A :class:`~gflow.theory.Theory` (or its JSON dict, or ``None``) as a Theory."""
    if theory is None or isinstance(theory, Theory):
        return theory
    return Theory.from_json(theory)


def stage3_law_of(traj: Trajectory, theory) -> StageIIILaw | None:
    """The GIH law of the set Stage I selected (docs/theory/mathematics.md §M8.1: Stage III follows the
    selected set), else of the theory's ``S*``; ``None`` when the loss is taken at every position
    (the GIH is a last-position law)."""
    theory = _as_theory(theory)
    if theory is None or traj.config.estimator.positions != "last":
        return None
    S = selected_set(traj)
    return theory.laws[S] if S in theory.laws else theory.laws.get(theory.S_star)


def validity_window(traj: Trajectory, theory) -> tuple[float, float] | None:
    law = stage3_law_of(traj, theory)
    if law is None or not all(np.isfinite(law.window)):
        return None
    return float(law.window[0]), float(law.window[1])


def s_star(traj: Trajectory, theory) -> tuple[int, ...] | None:
    theory = _as_theory(theory)
    return None if theory is None else theory.S_star


def selected_heads(traj: Trajectory, theory: Theory | dict | None) -> tuple[int, ...]:
    """Stage II's heads (the set Stage I selected), else the theory's ``S*``."""
    for r in traj.stages:
        if r.selected:
            return tuple(r.selected)
    return s_star(traj, theory) or ()


def measured_rate(traj: Trajectory, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Measured ``∂ₜa = −η_a ∂L̂/∂a`` and its SE at the saved indices."""
    eta = float(traj.config.schedule.eta_a)
    return -eta * traj.grad_a[idx], eta * traj.grad_se_a[idx]
