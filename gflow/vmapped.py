"""Several runs that differ only in their Monte Carlo sample, integrated together
under ``vmap`` (extension; used by :mod:`gflow.replicates`).

:func:`integrate_batch` takes configurations that differ only in
``estimator.seed`` and returns the same trajectories as :func:`gflow.integrate`
of each one (the same saved times, values equal to rounding), integrating
them as one batch:

- the R losses (:func:`gflow.make_loss` of each seed: identical shapes) are
  stacked along a new leading axis, and every stage's
  :class:`~gflow.loss.StageLoss`, every ``diffeqsolve`` of a stage's decade
  (``gflow.flow._solve_segment``) and the loss statistics at the saved
  times run under ``eqx.filter_vmap`` over that axis. diffrax's step-size
  control, event detection and root find act per replicate (a batched
  ``while`` loop runs until the last replicate is done; the others are
  masked), so each replicate takes the steps it would take alone;
- each replicate keeps its own clock, grids, events and controller carry,
  exactly as ``gflow.flow._run_stage`` does for one run: replicate r's
  stage starts at its own ``t0_r`` and saves at ``t0_r + τ`` on the stage's
  τ grid, so the k-th solve of every replicate has the same shapes. A
  replicate whose stage has ended (its event, or the end of its grid) while
  others go on is given a zero-length solve (``t0 = t1``, every saved time
  ``= t0``; diffrax skips the loop) whose rows are discarded: it does not move;
- Stage II's event heads (the set selected by each replicate's Stage I) are a
  static argument of the compiled solve, so the replicates are grouped by
  their selected set: the largest group runs on the whole batch (the others'
  members idle in it, so the compiled shapes do not change), every other group
  as its own batch (a group of one runs ``_run_stage`` itself);
- a replicate whose stage cannot start (a non-finite gradient), whose solve
  fails or whose state becomes non-finite is marked as
  :func:`gflow.integrate` marks it (``ended_by = "failed"``, status
  ``"failed: Stage … at t = …: why"``, the partial trajectory kept and
  written) and idles for the rest of the run; the others go on. Nothing is
  raised for it.

**Statistics.** A stage record's ``t0``, ``t1``, ``ended_by``, ``steps`` and
``rejected`` are the replicate's own. ``nfev`` counts evaluations of the
*batched* vector field (one evaluation covers every replicate of the batch,
idle ones included) over the stage's solves of the batch, so it is the same
for every replicate of a batch, and larger than a single run's: under
``vmap`` a ``lax.cond`` whose predicate differs across replicates runs both
branches (e.g. the initial-step heuristic of a continued solve, two
evaluations per solve) and the batched loop runs until its slowest
replicate has finished. ``wall`` of a stage and of the run is the wall time
of the batch.

A batch holds its R samples in memory at once (plus, briefly, a second copy:
while they are stacked, and while each stage's loss is built):
:func:`gflow.replicates.run_replicates` chooses the batch size from
:func:`sample_bytes`. ``solver.progress`` is ignored in a batch.
"""

from __future__ import annotations

import time
from pathlib import Path

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .config import Config
from .flow import (
    _NFEV,
    _append_rows,
    _failure,
    _kept_rows,
    _STAGES,
    FlowError,
    _check_params,
    _count_evaluation,
    _event_coordinates,
    _event_value,
    _fresh_carry,
    _grid,
    _plan,
    _run_stage,
    _scales,
    _segments,
    _solve_segment,
    _stage_index,
    _stage_start,
    _stats_at,
    _VectorField,
    integrate,
    versions,
)
from .loss import PopulationLoss, make_loss, resolve_layout
from .model import Params, init_params
from .trajectory import StageRecord, Trajectory, save

__all__ = ["integrate_batch", "sample_bytes"]

_BLOCKS = ("w", "C", "a")


def sample_bytes(config: Config) -> int:
    """Bytes of one sample's features (what a replicate adds to a batch).

    Counts layout: ``N·d·(d+1)^M`` window counts, plus the query code and
    ``π(·|z_q)`` (``N·(1 + d)`` numbers); positions layout: ``N·L·M²`` match
    numbers (``N·(L+1)·M²`` more with ``norm = "layer"``), the tokens and
    ``π(·|z_q)``. In ``estimator.dtype`` (8 or 4 bytes; integers 8)."""
    est, data, model = config.estimator, config.data, config.model
    N, d, M, L = est.N, data.d, model.M, data.L
    item = 8 if est.dtype == "float64" else 4
    if resolve_layout(est.layout, d, M) == "counts":
        return N * (d * (d + 1) ** M * item + 8 + d * item)
    self_match = (L + 1) * M * M * item if model.norm == "layer" else 0
    return N * (L * M * M * item + self_match + L * 8 + d * item)


def integrate_batch(
    configs: list[Config],
    *,
    outs: list[str | Path | None] | None = None,
    overwrite: bool = False,
    verbose: bool = False,
) -> list[Trajectory]:
    """Integrate the gradient flows of `configs` as one vmapped batch.

    **Arguments:**

    - `configs`: the runs; they must differ only in ``estimator.seed``.
    - `outs`: one folder (or ``None``) per configuration: each trajectory is
      written there as :func:`gflow.integrate` writes it (after every solve,
      at the end of every stage, at the end).
    - `overwrite`: allow writing over runs already saved in `outs`.
    - `verbose`: a line per batched solve.

    **Returns:** one :class:`~gflow.trajectory.Trajectory` per configuration,
    equal to :func:`gflow.integrate` of it to rounding (statistics as in the
    module docstring). A failed replicate's trajectory has the status
    ``"failed: …"`` that :func:`gflow.integrate` would have raised with.

    **Raises:** ``ValueError`` for an empty list, configurations that differ
    in more than the seed, `outs` of another length, or a folder that already
    holds a run (without `overwrite`).
    """
    trajs, _ = _integrate_batch(configs, outs=outs, overwrite=overwrite, verbose=verbose)
    return trajs


# ---------------------------------------------------------------------------
# Stacking and the batched computations
# ---------------------------------------------------------------------------


def _stack(losses: list[PopulationLoss]) -> PopulationLoss:
    """The losses stacked along a new leading axis (array leaves; the rest shared)."""
    dyns, statics = zip(*(eqx.partition(L, eqx.is_array) for L in losses))
    if any(jax.tree.structure(d) != jax.tree.structure(dyns[0]) for d in dyns) or any(
        not eqx.tree_equal(s, statics[0]) for s in statics
    ):
        raise ValueError("integrate_batch: the replicates' losses differ in structure")  # pragma: no cover
    return eqx.combine(jax.tree.map(lambda *xs: jnp.stack(xs), *dyns), statics[0])


def _take(loss_b: PopulationLoss, idx) -> PopulationLoss:
    """Replicate ``idx`` (an int: unbatched) or replicates ``idx`` (a list) of a stacked loss."""
    dyn, static = eqx.partition(loss_b, eqx.is_array)
    sel = idx if isinstance(idx, int) else np.asarray(idx)
    return eqx.combine(jax.tree.map(lambda x: x[sel], dyn), static)


@eqx.filter_jit
def _stage_start_batch(loss_b: PopulationLoss, y_b: Params, moves: tuple[str, ...]):
    return eqx.filter_vmap(lambda L, y: _stage_start(L, y, moves))(loss_b, y_b)


@eqx.filter_jit
def _solve_batch(vf, y0, t0, t1, ts, dt0, carry, t_stage0=None, **settings):
    """``_solve_segment`` of every replicate (leading axis of every argument
    but `dt0`; `t_stage0`: each replicate's stage start and event coordinates
    there, for the steady test), one batched ``diffeqsolve``."""
    def one(vf, y0, t0, t1, ts, carry, t_stage0):
        return _solve_segment(vf, y0, t0, t1, ts, dt0, carry, t_stage0=t_stage0, **settings)

    return eqx.filter_vmap(one)(vf, y0, t0, t1, ts, carry, t_stage0)


@eqx.filter_jit
def _stats_batch(loss_b: PopulationLoss, ys_b: Params):
    return eqx.filter_vmap(_stats_at)(loss_b, ys_b)


def _append_batch(trajs, loss_b, members, rows, stage_index: int) -> None:
    """Append saved rows to several trajectories with their statistics,
    computed for the whole batch at once.

    `members`: the batch's replicate indices (the leading axis of `loss_b`);
    `rows`: ``{replicate: (ts, {"w", "C", "a"})}`` for those that have rows
    (at most one block, ``save_per_decade + 1``, each: one solve's saved
    points). Blocks are padded with their last row, as ``gflow.flow._append``
    pads, and idle replicates get a copy of some replicate's block."""
    if not rows:
        return
    block = trajs[members[0]].config.solver.save_per_decade + 1
    pad = next(iter(rows.values()))[1]
    blocks = []
    for r in members:
        v = rows[r][1] if r in rows else pad
        m = len(v["a"])
        if m > block:  # pragma: no cover - one solve saves at most `block` points
            raise AssertionError(f"{m} rows in one block of {block}")
        blocks.append({k: np.concatenate([x, np.repeat(x[-1:], block - m, axis=0)]) for k, x in v.items()})
    ys_b = Params(**{k: np.stack([b[k] for b in blocks]) for k in _BLOCKS})
    st_b = jax.device_get(_stats_batch(loss_b, ys_b))
    for k, r in enumerate(members):
        if r not in rows:
            continue
        ts, v = rows[r]
        n = len(ts)
        st = jax.tree.map(lambda x, k=k, n=n: np.asarray(x)[k, :n], st_b)
        _append_rows(trajs[r], ts, v, st, stage_index=stage_index)


# ---------------------------------------------------------------------------
# The batch
# ---------------------------------------------------------------------------


def _f64(x):
    return jnp.asarray(x, dtype=jnp.float64)


def _where(mask: np.ndarray, new, old):
    """``new`` for the replicates in `mask` (leading axis), ``old`` for the others."""
    return jax.tree.map(lambda n, o: jnp.where(mask.reshape(mask.shape + (1,) * (n.ndim - 1)), n, o), new, old)


def _check_batch(cfgs: list[Config]) -> None:
    if not cfgs:
        raise ValueError("integrate_batch: no configurations")
    ref = cfgs[0].to_dict()
    ref["estimator"].pop("seed")
    for i, c in enumerate(cfgs[1:], 1):
        d = c.to_dict()
        d["estimator"].pop("seed")
        if d != ref:
            diff = [f"{s}.{k}" for s in ref for k in ref[s] if ref[s][k] != d[s][k]]
            raise ValueError(
                f"integrate_batch: configurations must differ only in estimator.seed; "
                f"configs[{i}] differs from configs[0] in {', '.join(diff)}"
            )


class _Runs:
    """The state of the replicates of a batch between stages."""

    def __init__(self, cfgs, outs, t_wall, verbose):
        self.cfgs, self.outs, self.t_wall, self.verbose = cfgs, outs, t_wall, verbose
        R = len(cfgs)
        self.y: list[dict] = [{}] * R  # numpy {"w", "C", "a"} of each replicate's last saved state
        self.t = [0.0] * R
        self.trajs: list[Trajectory] = []
        self.errors: list[FlowError | None] = [None] * R
        self.alive = list(range(R))

    def fail(self, r: int, rec: StageRecord, msg: str, t_fail: float, t_stage: float) -> None:
        """``_run_stage``'s failure, without raising: the replicate stops, the others go on."""
        tr, out = self.trajs[r], self.outs[r]
        rec.ended_by = "failed"
        rec.t1 = float(tr.ts[-1])
        rec.wall = time.perf_counter() - t_stage
        rec.nfev = _NFEV[0]
        tr.status = f"failed: Stage {rec.name} at t = {t_fail:.6g}: {msg}"
        tr.wall = time.perf_counter() - self.t_wall
        if out is not None:
            save(tr, out)
        self.errors[r] = FlowError(msg, stage=rec.name, t=t_fail, trajectory=tr, out=out)
        self.alive.remove(r)


def _integrate_batch(configs, *, outs=None, overwrite=False, verbose=False):
    """:func:`integrate_batch`, also returning each replicate's :class:`FlowError` (or ``None``)."""
    cfgs = list(configs)
    _check_batch(cfgs)
    R = len(cfgs)
    outs = [None] * R if outs is None else [None if o is None else Path(o) for o in outs]
    if len(outs) != R:
        raise ValueError(f"integrate_batch: {len(outs)} folders in `outs` for {R} configurations")
    for o in outs:
        if o is not None and (o / "run.json").exists() and not overwrite:
            raise ValueError(f"{str(o)!r} already holds a run: pass overwrite=True or choose another folder")
    if R == 1:
        try:
            return [integrate(cfgs[0], out=outs[0], overwrite=overwrite, verbose=verbose)], [None]
        except FlowError as e:
            return [e.trajectory], [e]

    cfg = cfgs[0]
    dtype = cfg.estimator.jdtype
    t_wall = time.perf_counter()
    plan = _plan(cfg)
    params0 = init_params(cfg.model, cfg.init, dtype=dtype)
    _check_params(params0, cfg)
    loss_b = _stack([make_loss(c.data, c.model, c.estimator) for c in cfgs])

    runs = _Runs(cfgs, outs, t_wall, verbose)
    H, M, nS = cfg.model.H, cfg.model.M, len(cfg.model.subsets)
    y0 = {b: np.asarray(getattr(params0, b)) for b in _BLOCKS}
    for c in cfgs:
        tr = Trajectory.empty(c, H, M, nS)
        tr.versions = versions()
        runs.trajs.append(tr)
    runs.y = [dict(y0) for _ in range(R)]
    members = list(range(R))
    first = {r: (np.zeros(1), {b: v[None] for b, v in y0.items()}) for r in members}
    _append_batch(runs.trajs, loss_b, members, first, stage_index=_stage_index(plan[0][0]))

    for name, duration in plan:
        if not runs.alive:
            break
        recs = {}
        for r in runs.alive:
            tr = runs.trajs[r]
            rec = StageRecord(name=name, moves=list(_STAGES[name]), t0=runs.t[r], t1=runs.t[r])
            if name == "II":
                rec.selected = _selected(tr)
            tr.stages.append(rec)
            recs[r] = rec
        groups: dict[tuple, list[int]] = {}
        for r in runs.alive:
            groups.setdefault(tuple(recs[r].selected or ()), []).append(r)
        for g, (heads, active) in enumerate(sorted(groups.items(), key=lambda kv: -len(kv[1]))):
            if len(active) == 1:
                _run_one(runs, recs, loss_b, active[0], duration)
            elif g == 0:
                _run_stage_batch(runs, recs, loss_b, members, active, duration)
            else:
                _run_stage_batch(runs, recs, _take(loss_b, active), active, active, duration)

    for r in runs.alive:
        tr = runs.trajs[r]
        tr.status = "complete"
        tr.wall = time.perf_counter() - t_wall
        if outs[r] is not None:
            save(tr, outs[r])
    return runs.trajs, runs.errors


def _selected(traj: Trajectory) -> list[int]:
    """The set selected by Stage I (``gflow.integrate``'s rule): the largest ``c_S/Σc`` at its end."""
    return list(traj.subsets[traj.c_frac[-1].argmax()])


def _run_one(runs: _Runs, recs, loss_b, r: int, duration: float) -> None:
    """A group of one: ``gflow.flow._run_stage`` itself, on the replicate's own loss."""
    rec, cfg = recs[r], runs.cfgs[r]
    dtype = cfg.estimator.jdtype
    y = Params(**{b: jnp.asarray(v, dtype) for b, v in runs.y[r].items()})
    try:
        y, t = _run_stage(runs.trajs[r], rec, _take(loss_b, r), cfg, y, runs.t[r], rec.t0 + duration, runs.outs[r],
                          runs.verbose, 0.0, runs.t_wall)  # fmt: skip
    except FlowError as e:
        runs.errors[r] = e
        runs.alive.remove(r)
        return
    runs.y[r] = {b: np.asarray(getattr(y, b)) for b in _BLOCKS}
    runs.t[r] = t


def _run_stage_batch(runs: _Runs, recs, loss_b, members: list[int], active: list[int], duration: float) -> None:
    """One stage of the replicates `active`, mirroring ``gflow.flow._run_stage``
    for each, on the batch `members` (the leading axis of `loss_b`; members
    not in `active` idle)."""
    name = recs[active[0]].name
    t_stage = time.perf_counter()
    _NFEV[0] = 0
    cfg = runs.cfgs[active[0]]
    moves = _STAGES[name]
    dtype = cfg.estimator.jdtype
    heads = tuple(recs[active[0]].selected or ())
    event_stage = None
    if cfg.schedule.events and (name == "I" or (name == "II" and heads)):
        event_stage = name

    y_b = Params(**{b: jnp.asarray(np.stack([runs.y[r][b] for r in members]), dtype) for b in _BLOCKS})
    sl_b, finite0 = _stage_start_batch(loss_b, y_b, moves)
    # the jitted function returns a copy of the samples inside the stage loss: hold the stacked ones instead
    sl_b = eqx.tree_at(lambda sl: sl.loss, sl_b, loss_b)
    finite0 = np.asarray(finite0)
    segs: dict[int, list[np.ndarray]] = {}
    for k, r in enumerate(members):
        if r not in active:
            continue
        rec, t = recs[r], runs.t[r]
        if not finite0[k]:
            runs.fail(r, rec, "the gradient of the loss is not finite at the stage's start "
                      "(e.g. estimator.eps = 0 with tokens absent from a context)", t, t_stage)  # fmt: skip
        elif event_stage is not None and float(_event_value(name, runs.y[r], cfg.schedule.delta, heads)) >= 0:
            rec.ended_by, rec.complete, rec.t1 = "event", True, t
        else:
            grid = _grid(rec.t0, rec.t0 + duration, runs.cfgs[r])
            grid = grid[grid > t * (1 + 1e-12)]
            segs[r] = _segments(grid, cfg.solver.save_per_decade) if len(grid) else []
            if not segs[r]:
                rec.ended_by, rec.complete, rec.t1 = "duration", True, t
    going = [r for r in segs if segs[r]]
    if going:
        scale = {b: jnp.broadcast_to(v, (len(members),)) for b, v in _scales(cfg, moves, dtype).items()}
        vf = _VectorField(stage_loss=sl_b, scale=scale, counter=_count_evaluation)
        _solves(runs, recs, loss_b, vf, members, active, going, segs, event_stage, heads, t_stage)
    # every replicate's nfev and wall of the stage are the batch's (module docstring)
    for r in active:
        if r in runs.alive:
            recs[r].nfev = _NFEV[0]
            recs[r].wall = time.perf_counter() - t_stage
            runs.trajs[r].wall = time.perf_counter() - runs.t_wall
            if runs.outs[r] is not None:
                save(runs.trajs[r], runs.outs[r])


def _solves(runs: _Runs, recs, loss_b, vf, members, active, going, segs, event_stage, heads, t_stage) -> None:
    """A stage's batched solves: the j-th decade of every replicate still
    running at once, the others given zero-length solves (``t0 = t1``)."""
    r0 = active[0]
    name, cfg = recs[r0].name, runs.cfgs[r0]
    sc, dtype, idx, B = cfg.solver, cfg.estimator.jdtype, _stage_index(name), len(members)
    moves = _STAGES[name]
    settings = {
        "method": sc.method_for(name), "rtol": sc.rtol, "atol": sc.atol, "max_steps": sc.max_steps,
        "delta": cfg.schedule.delta, "event_stage": event_stage, "heads": heads, "progress": False,
    }  # fmt: skip
    # stages with an event also end when they settle short of it (gflow.flow._steady_cond)
    steady = event_stage is not None and sc.method_for(name) != "gd"
    settings["steady"] = steady
    t_stage0 = None
    if steady:
        phi0 = []
        for r in members:
            tr = runs.trajs[r]
            i0 = min(int(np.searchsorted(tr.ts, recs[r].t0 * (1 - 1e-12))), len(tr.ts) - 1)
            st0 = tr.state(i0)
            phi0.append(_event_coordinates(name, {b: jnp.asarray(st0[b], dtype) for b in moves}, heads))
        t_stage0 = (_f64(np.array([recs[r].t0 for r in members])), jnp.stack(phi0))
    carry = jax.tree.map(lambda x: jnp.broadcast_to(x, (B,) + x.shape), _fresh_carry(dtype))
    j = 0
    while going:
        t0 = np.array([runs.t[r] for r in members])
        t1, ts = t0.copy(), np.repeat(t0[:, None], sc.save_per_decade, axis=1)
        for k, r in enumerate(members):
            if r in going:
                seg = segs[r][j]
                t1[k], ts[k] = float(seg[-1]), seg
        y0 = {b: jnp.asarray(np.stack([runs.y[r][b] for r in members]), dtype) for b in moves}
        ts_b, ys_b, result_b, stats_b, new_carry = _solve_batch(
            vf, y0, _f64(t0), _f64(t1), _f64(ts), _f64(sc.eta), carry, t_stage0, **settings
        )
        # a replicate's carry moves on only with its own solves
        carry = _where(np.array([r in going for r in members]), new_carry, carry)
        ts_b, ys_b, result_b, stats_b = jax.device_get((ts_b, ys_b, result_b, stats_b))

        # each running replicate's rows, kept as _run_stage keeps them
        outcome, rows = {}, {}
        for k, r in enumerate(members):
            if r not in going:
                continue
            rec, t, y_np = recs[r], runs.t[r], runs.y[r]
            rec.steps += int(stats_b["num_accepted_steps"][k])
            rec.rejected += int(stats_b["num_rejected_steps"][k])
            ts_kept, full, finite = _kept_rows(ts_b[k], {b: ys_b[b][k] for b in moves}, t, y_np, moves)
            if finite and len(ts_kept):
                rows[r] = (ts_kept, full)
            # a 0-d array, not a numpy scalar: diffrax.RESULTS[...] reads the message of arrays only
            res = jax.tree.map(lambda x, k=k: np.asarray(np.asarray(x)[k]), result_b)
            outcome[r] = (res, finite, ts_kept, full)
        _append_batch(runs.trajs, loss_b, members, rows, stage_index=idx)

        for r, (res, finite, ts_kept, full) in outcome.items():
            rec, tr, out = recs[r], runs.trajs[r], runs.outs[r]
            ok = bool(res == diffrax.RESULTS.successful) or bool(res == diffrax.RESULTS.event_occurred)
            if not ok or not finite:
                runs.fail(r, rec, _failure(res, ok, sc, name), float(tr.ts[-1]), t_stage)
                going.remove(r)
                continue
            if len(ts_kept):
                runs.y[r] = {b: v[-1] for b, v in full.items()}
                runs.t[r] = float(ts_kept[-1])
            rec.t1 = runs.t[r]
            rec.nfev = _NFEV[0]
            rec.wall = time.perf_counter() - t_stage
            tr.wall = time.perf_counter() - runs.t_wall
            event = bool(res == diffrax.RESULTS.event_occurred)
            if event or j + 1 == len(segs[r]):
                settled = event and "steady" in stats_b and bool(np.asarray(stats_b["steady"])[members.index(r)])
                rec.ended_by = ("steady" if settled else "event") if event else "duration"
                rec.complete = True
                going.remove(r)
            if out is not None:
                save(tr, out)
        if runs.verbose:
            now = [runs.t[r] for r in active if r in runs.alive]
            print(f"  stage {name} (batch of {B}): solve {j + 1}, {len(going)} of {len(active)} still running, "
                  f"t = {min(now, default=np.nan):.4g}…{max(now, default=np.nan):.4g}, nfev = {_NFEV[0]}, "
                  f"{time.perf_counter() - t_stage:.1f} s", flush=True)  # fmt: skip
        j += 1
