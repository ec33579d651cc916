"""What every check row reads (README §M7): the run, its theory and estimator
(:class:`_Ctx`), the contrast λ of the model's kernel on a GIH's match
indicator, and the jitted per-sequence force and loss of the model."""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._gih import make_gih
from ._io import rows_of_stage
from ._report import Row
from .loss import PopulationLoss
from .model import Params, subset_label
from .theory import Theory, selected_set
from .trajectory import Trajectory

# Event threshold slack: diffrax locates the event with a Newton root find at
# rtol = atol = 1e-12; the event function at the located time is within
# rounding of 0.
_EVENT_SLACK = 1e-9


def contrast(s, c_frac, S, sets) -> float:
    """The contrast ``λ = (c_S/Σc)·Π_{h∈S} (s^(h)_h)²`` of the model's kernel
    on the GIH's match indicator on offsets S (see the module docstring).
    ``λ = 1`` exactly when the copier is one-hot on S and ``c = e_S``.

    `s` is the copier attention ``(H, M)``, `c_frac` ``c/Σc`` in the order of `sets`.
    """
    S = tuple(S)
    lam = float(np.asarray(c_frac)[list(sets).index(S)])
    for h in S:
        lam *= float(np.asarray(s)[h - 1, h - 1]) ** 2
    return lam


@eqx.filter_jit
def _model_force_per_seq(loss: PopulationLoss, w, C, a):
    """``−∂ℓ_n/∂a`` for every sequence at θ = (w, C, a)."""
    f = lambda aa: loss.per_sequence(Params(w=w, C=C, a=aa))
    return -jax.jvp(f, (a,), (jnp.ones_like(a),))[1]


@eqx.filter_jit
def _model_loss_per_seq(loss: PopulationLoss, w, C, a):
    return loss.per_sequence(Params(w=w, C=C, a=a))


def _se(x) -> float:
    x = np.asarray(x, np.float64)
    return float(np.std(x, ddof=1) / math.sqrt(x.size)) if x.size > 1 else 0.0


def _label(S) -> str:
    return "—" if S is None else subset_label(tuple(S))


def _away(measured: float, ref: float, by: float) -> float:
    """``measured`` moved by `by` away from `ref` (a wrong answer that cannot
    come back inside a tolerance centred on `ref`)."""
    return float(measured) + (by if float(measured) >= float(ref) else -by)


class _Ctx:
    def __init__(self, traj: Trajectory, theory: Theory, loss: PopulationLoss, k_se: float):
        self.traj, self.th, self.loss, self.k_se = traj, theory, loss, float(k_se)
        self.cfg = traj.config
        self.sets = traj.subsets
        self.nS = len(self.sets)
        self.joint = self.cfg.schedule.kind == "joint"
        self.gd = self.cfg.solver.is_gd
        self.delta = self.cfg.schedule.delta
        self.S_star, self.argmax_J = theory.S_star, theory.argmax_J
        self.selected = selected_set(traj)
        self.rows: list[Row] = []
        self.skipped: list[str] = []
        self.notes: list[str] = []
        self._gih: dict = {}

    def gih(self, S):
        S = tuple(S)
        if S not in self._gih:
            self._gih[S] = make_gih(self.loss, S)
        return self._gih[S]

    def stage(self, name: str):
        return next((r for r in self.traj.stages if r.name == name), None)

    def rows_of(self, name: str) -> np.ndarray:
        return rows_of_stage(self.traj.stage, name)

    def outside(self, law: str) -> str | None:
        """Why `law` does not cover the run's options (``None`` if it does)."""
        ok, why = self.th.covers(law, self.cfg)
        return None if ok else f"not covered by the {law} law: {why}"

    def add(self, row: Row) -> None:
        self.rows.append(row)

    def info(self, name, predicted, measured, why, claim) -> None:
        self.rows.append(Row(name, predicted, measured, f"info: {why}", None, claim))

    def skip(self, what: str, why: str) -> None:
        self.skipped.append(f"{what}: {why}")
