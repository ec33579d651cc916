"""A run's flow at any time, as diffrax's dense output gives it (``SaveAt(dense=True)``): the
state θ(t) at times that were not saved, from the saved state just before each and the run's own
vector field (docs/theory/mathematics.md §M4).

The flow is autonomous within a stage and its state is θ, so the solution between two saved
times is the solution of the stage's ODE started at the earlier one: :class:`DenseSolution`
integrates it there, with the run's solver (``"tsit5"``, ``"kvaerno5"``; GD's modified flow by
Tsit5) and tolerances, the stage's moving blocks and time scales, saving at the times asked.
It agrees with a run that saved those times itself (``solver.save_times``) to the solver's
tolerance, not bit for bit (the steps differ). Explicit times inside a run are
``solver.save_times``; this is for times chosen after the run.

Choices (the paper is silent): the joint flow is integrated in θ's own coordinates (C, not
log|C|: over one gap between saved times the stiffness of the losing weights is harmless); GD,
SGD and the SDE are refused (an iteration has no state between its iterates).
"""

from __future__ import annotations

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..core import Params, PopulationLoss, StageLoss, make_loss, member_of
from ..trajectory import Trajectory
from ._solve import ADAPTIVE, VectorField, block_scales, field_options, ode_method

_CHUNK = 16  # times per solve (padded): one compiled shape per stage


@eqx.filter_jit
def _solve(vf, y0, t0, ts, *, method, rtol, atol, max_steps):
    solver = ADAPTIVE[method]()
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(vf), solver, t0, ts[-1], None, y0, saveat=diffrax.SaveAt(ts=ts),
        stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol), max_steps=max_steps,
        adjoint=diffrax.ForwardMode(), throw=False,
    )  # fmt: skip
    return sol.ys, sol.result


class DenseSolution:
    """The flow of a saved run evaluated at any time of ``[0, ts[-1]]`` (module docstring).

    ``DenseSolution(traj)`` (or [`gflow.dense_solution`][gflow.dense_solution]) builds the run's
    estimator (``make_loss`` of its configuration) unless `loss` is given;
    :meth:`evaluate` returns θ at any times, :meth:`a` the classifier scale alone.

    **Raises:** ``ValueError`` for a GD, SGD or SDE run (no state between iterates) or a run
    without saved times.
    """

    def __init__(self, traj: Trajectory, *, loss: PopulationLoss | None = None):
        sc = traj.config.solver
        if sc.method_for("I") in ("gd", "sgd", "sde"):
            raise ValueError(f"dense_solution: solver.method = {sc.method!r} is an iteration: it has no state "
                             "between its iterates (only the flows and the modified flow have a dense solution)")  # fmt: skip
        if len(traj.ts) == 0:
            raise ValueError("dense_solution: the run has no saved time")
        self.traj = traj
        cfg = traj.config
        self.loss = make_loss(cfg.data, cfg.model, cfg.estimator) if loss is None else loss
        self.t_end = float(traj.ts[-1])

    def _stage_at(self, t: float):
        """The stage record whose interval ``(t0, t1]`` holds `t`."""
        for rec in self.traj.stages:
            if rec.t0 < t <= rec.t1 * (1 + 1e-15):
                return rec
        return self.traj.stages[-1]

    def evaluate(self, t) -> dict[str, np.ndarray]:
        """θ at the times `t` (a number or an array, each in ``[0, ts[-1]]``):
        ``{"w": (n, H, M), "C": (n, |𝒮|), "a": (n,)}`` (and a member's extra blocks) for ``n``
        times (squeezed for a number).
        A saved time returns its saved state exactly."""
        t_arr = np.atleast_1d(np.asarray(t, np.float64))
        if t_arr.ndim != 1 or np.any(~np.isfinite(t_arr)) or np.any(t_arr < 0) or np.any(t_arr > self.t_end):
            raise ValueError(f"dense_solution: times must lie in [0, {self.t_end:g}] (the run's saved span), got "
                             f"{t_arr.min() if t_arr.size else t!r}…{t_arr.max() if t_arr.size else t!r}")  # fmt: skip
        tr, cfg = self.traj, self.traj.config
        dtype = cfg.estimator.jdtype
        state = tr.state(0)  # every block, a member's extra blocks included
        out = {b: np.empty((t_arr.size, *np.shape(v))) for b, v in state.items()}
        groups: dict[tuple[str, int], list[int]] = {}
        for k, x in enumerate(t_arr):
            i = int(np.searchsorted(tr.ts, x, side="right")) - 1  # the last saved time <= x
            if tr.ts[i] == x:
                for b in out:
                    out[b][k] = tr.state(i)[b]
                continue
            rec = self._stage_at(float(x))
            i = max(i, int(np.searchsorted(tr.ts, rec.t0 * (1 - 1e-15))))  # never before the stage's start
            groups.setdefault((rec.name, i), []).append(k)
        sc = cfg.solver
        for (name, i), ks in groups.items():
            moves = member_of(cfg.model).stage_moves[name]
            y = Params.from_blocks({b: jnp.asarray(v, dtype) for b, v in tr.state(i).items()})
            vf = VectorField(stage_loss=StageLoss(self.loss, y, moves), scale=block_scales(cfg, moves, dtype),
                             **field_options(cfg, name, dtype))  # fmt: skip
            y0 = {b: y.get(b) for b in moves}
            want = t_arr[ks]
            order = np.argsort(want)
            for j in range(0, len(ks), _CHUNK):
                part = want[order[j : j + _CHUNK]]
                ts = np.concatenate([part, np.full(_CHUNK - len(part), part[-1])])
                ys, result = _solve(vf, y0, jnp.asarray(tr.ts[i], jnp.float64), jnp.asarray(ts, jnp.float64),
                                    method=ode_method(sc.method_for(name)), rtol=sc.rtol, atol=sc.atol,
                                    max_steps=sc.max_steps)  # fmt: skip
                if not bool(result == diffrax.RESULTS.successful):
                    raise RuntimeError(f"dense_solution: the solve of Stage {name} from t = {tr.ts[i]:g} failed: "
                                       f"{diffrax.RESULTS[result]}")  # fmt: skip
                ys = jax.device_get(ys)
                for m, k in enumerate(np.asarray(ks)[order[j : j + _CHUNK]]):
                    for b in out:
                        out[b][k] = np.asarray(ys[b][m]) if b in moves else tr.state(i)[b]
        if np.ndim(t) == 0:
            return {b: v[0] for b, v in out.items()}
        return out

    def a(self, t) -> np.ndarray:
        """The classifier scale a at the times `t` (see :meth:`evaluate`)."""
        return self.evaluate(t)["a"]


def dense_solution(traj: Trajectory, *, loss: PopulationLoss | None = None) -> DenseSolution:
    """The run's flow at any time of ``[0, ts[-1]]``, as diffrax's ``SaveAt(dense=True)`` gives
    it: a [`gflow.DenseSolution`][gflow.DenseSolution] (``sol.evaluate(t)``, ``sol.a(t)``),
    integrated from the saved state before each time with the run's vector field, solver and
    tolerances. Explicit times saved by the run itself are ``solver.save_times``."""
    return DenseSolution(traj, loss=loss)
