"""Whether a saved run may be resumed with a configuration (:func:`check_resumable`), and whether
starting parameters fit a configuration (:func:`check_params`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..config import Config
from ..core import Params, init_params
from ..trajectory import Trajectory

# Settings that may differ on resume: they do not change the trajectory already saved.
# (schedule.durations / t1 may grow, see check_resumable.) Every other key must be equal.
_RESUME_FREE = {"solver.max_steps", "solver.progress", "schedule.durations", "schedule.t1"}


def check_resumable(saved: Trajectory, new: Config) -> None:
    """Refuse to resume ``saved`` with a configuration that would not have produced the trajectory
    saved so far: ``ValueError`` naming the key and both values.

    Every key must be equal except :data:`_RESUME_FREE`. Choices (extension; the paper does not
    resume): a stage's duration may change only if the saved trajectory stays what the new duration
    gives — a stage completed at its event may get any duration >= its length; the stage run last (or
    running) may get a longer one (it is extended); an earlier stage completed at its duration must
    keep it. The joint ``t1`` may only grow."""
    a, b = saved.config.to_dict(), new.to_dict()
    for sec in a:
        for k in sorted(set(a[sec]) | set(b.get(sec, {}))):
            key, va, vb = f"{sec}.{k}", a[sec].get(k), b.get(sec, {}).get(k)
            if key not in _RESUME_FREE and va != vb:
                raise ValueError(
                    f"cannot resume: {key} = {vb!r} differs from the saved run's {va!r} (it defines the "
                    "trajectory saved so far; use the saved value, or start a new run with --overwrite)"
                )
    if new.schedule.kind == "joint":
        if new.schedule.t1 < saved.config.schedule.t1 and float(saved.ts[-1]) > new.schedule.t1:
            raise ValueError(
                f"cannot resume: schedule.t1 = {new.schedule.t1!r} is before the saved run's time "
                f"{float(saved.ts[-1])!r} (saved with {saved.config.schedule.t1!r})"
            )
        return
    old_d, new_d = saved.config.schedule.durations, new.schedule.durations
    for i, (name, rec) in enumerate((r.name, r) for r in saved.stages):
        j = ("I", "II", "III").index(name)
        if new_d[j] == old_d[j]:
            continue
        last = rec is saved.stages[-1]
        length = rec.t1 - rec.t0
        fine = (rec.ended_by == "event" and new_d[j] >= length) or (last and new_d[j] > old_d[j])
        if not fine:
            raise ValueError(
                f"cannot resume: schedule.durations[{j}] (Stage {name}) = {new_d[j]!r} differs from the saved "
                f"run's {old_d[j]!r}, and Stage {name} ({rec.ended_by}, length {length:.6g}) would not be the "
                "saved one: only the last stage run may be extended"
            )


def check_params(p: Params, cfg: Config) -> None:
    ref = jax.eval_shape(lambda: init_params(cfg.model, cfg.init, d=cfg.data.d, L=cfg.data.L, dtype=jnp.float64))
    if set(p.names) != set(ref.names):
        raise ValueError(f"params0 must have the blocks {ref.names} of model.member = {cfg.model.member!r}, "
                         f"got {p.names}")  # fmt: skip
    for b in ref.names:
        shape = tuple(ref.get(b).shape)
        x = np.asarray(p.get(b))
        if x.shape != shape or not np.all(np.isfinite(x)):
            raise ValueError(f"params0.{b} must be a finite array of shape {shape} for this model, got {x.shape}")
    if not np.any(np.asarray(p.C) != 0):
        raise ValueError("params0.C must not be all zero (c = C² would have Σc = 0)")
