"""Several runs that differ only in their Monte Carlo sample, integrated together
under ``vmap`` (extension; used by :mod:`gflow.runs._replicates`).

:func:`integrate_batch_with_errors` takes configurations that differ only in
``estimator.seed`` and returns the same trajectories as :func:`gflow.integrate`
of each one (the same saved times, values equal to rounding), integrating
them as one batch:

- the R losses (:func:`gflow.make_loss` of each seed: identical shapes) are
  stacked along a new leading axis, and every stage's
  :class:`~gflow.core.StageLoss`, every ``diffeqsolve`` of a stage's decade
  (``gflow.dynamics._solve.solve_segment``) and the loss statistics at the saved
  times run under ``eqx.filter_vmap`` over that axis. diffrax's step-size
  control, event detection and root find act per replicate (a batched
  ``while`` loop runs until the last replicate is done; the others are
  masked), so each replicate takes the steps it would take alone;
- a resumed replicate (``resume``) starts from its own last saved state and
  time with its saved step-size controller state, as ``gflow.integrate``
  resumes it, and idles through the stages it has completed; each
  replicate's controller state is saved with its snapshots, as a single
  run's is;
- each replicate keeps its own clock, grids, events and controller carry,
  exactly as ``gflow.dynamics._flow.run_stage`` does for one run: replicate r's
  stage starts at its own ``t0_r`` and saves at ``t0_r + τ`` on the stage's
  τ grid, so the k-th solve of every replicate has the same shapes. A
  replicate whose stage has ended (its event, or the end of its grid) while
  others go on is given a zero-length solve (``t0 = t1``, every saved time
  ``= t0``; diffrax skips the loop) whose rows are discarded: it does not move;
- Stage II's event heads (the set selected by each replicate's Stage I) are a
  static argument of the compiled solve, so the replicates are grouped by
  their selected set: the largest group runs on the whole batch (the others'
  members idle in it, so the compiled shapes do not change), every other group
  as its own batch (a group of one runs ``run_stage`` itself);
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
of the batch (added, for a resumed replicate, to its saved one).

A batch holds its R samples in memory at once (plus, briefly, a second copy:
while they are stacked, and while each stage's loss is built):
:func:`gflow.run_replicates` chooses the batch size from
:func:`sample_bytes`. ``solver.progress`` is ignored in a batch.
"""

from __future__ import annotations

import contextlib
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._util import versions
from ..config import Config, refuse_sgd
from ..core import (
    Params,
    PopulationLoss,
    SparseCountFeatures,
    init_params,
    make_loss,
    resolve_layout,
    sparse_window_blocks,
)
from ..trajectory import StageRecord, Trajectory
from ._flow import (
    FlowError,
    StageRun,
    append_rows,
    index_of_stage,
    integrate,
    params_from,
    run_stage,
    stage1_selection,
    stage_plan,
    stage_record,
    stage_start,
)
from ._resume import check_params, check_resumable
from ._solve import (
    VectorField,
    as_f64,
    block_scales,
    field_options,
    fresh_carry,
    ode_method,
    solve_segment,
    stats_at,
)

__all__ = ["integrate_batch_with_errors", "sample_bytes"]



def sample_bytes(config: Config) -> int:
    """Bytes of one sample's features (what a replicate adds to a batch).

    Counts layout: ``N·d·(d+1)^M`` window counts, plus the query code and
    ``π(·|z_q)`` (``N·(1 + d)`` numbers); positions layout: ``N·L·M²`` match
    numbers (``N·(L+1)·M²`` more with ``norm = "layer"``), the tokens and
    ``π(·|z_q)``; sparse layout: at most ``U = min(L, Σ_p d^(span−p))``
    window slots (``d`` counts and a window each), the query window, the
    tokens and ``π(·|z_q)`` (the vectors layout: the same arrays). ``M`` is the span (``H+M−1`` for shifted
    windows). In ``estimator.dtype`` (8 or 4 bytes; integers 8)."""
    est, data, model = config.estimator, config.data, config.model
    N, d, M, L = est.N, data.d, model.span, data.L
    item = 8 if est.dtype == "float64" else 4
    layout = resolve_layout(est.layout, d, model)
    if layout == "counts":
        return N * (d * (d + 1) ** M * item + 8 + d * item)
    if layout in ("sparse", "vectors"):
        U = min(L, int(sparse_window_blocks(d, M)[-1]))
        return N * (U * (d * item + 8) + 8 + L * 8 + d * item)
    self_match = (L + 1) * M * M * item if model.norm == "layer" else 0
    return N * (L * M * M * item + self_match + L * 8 + d * item)


# ---------------------------------------------------------------------------
# Stacking and the batched computations
# ---------------------------------------------------------------------------


def _stack(losses: list[PopulationLoss]) -> PopulationLoss:
    """The losses stacked along a new leading axis (array leaves; the rest shared).

    Sparse-layout features hold as many window slots as their sample's
    sequences need at most: every replicate's are padded to the largest
    (unused slots: window 0, zero counts, which the loss ignores)."""
    if isinstance(losses[0].feats, SparseCountFeatures):
        U = max(L.feats.counts.shape[-1] for L in losses)

        def pad(L):
            f = L.feats
            w = [(0, 0)] * (f.counts.ndim - 1) + [(0, U - f.counts.shape[-1])]
            f = eqx.tree_at(lambda f: (f.G, f.counts), f, (jnp.pad(f.G, w[1:]), jnp.pad(f.counts, w)))
            return eqx.tree_at(lambda L: L.feats, L, f)

        losses = [pad(L) for L in losses]
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
    return eqx.filter_vmap(lambda L, y: stage_start(L, y, moves))(loss_b, y_b)


@eqx.filter_jit
def _solve_batch(vf, y0, t0, t1, ts, dt0, carry, t_stage0=None, **settings):
    """``solve_segment`` of every replicate (leading axis of every argument
    but `dt0`; `t_stage0`: each replicate's stage start and event coordinates
    there, for the steady test), one batched ``diffeqsolve``."""
    def one(vf, y0, t0, t1, ts, carry, t_stage0):
        return solve_segment(vf, y0, t0, t1, ts, dt0, carry, t_stage0=t_stage0, **settings)

    return eqx.filter_vmap(one)(vf, y0, t0, t1, ts, carry, t_stage0)


@eqx.filter_jit
def _stats_batch(loss_b: PopulationLoss, ys_b: Params):
    return eqx.filter_vmap(stats_at)(loss_b, ys_b)


def _append_batch(trajs, loss_b, members, rows, stage_index: int) -> None:
    """Append saved rows to several trajectories with their statistics,
    computed for the whole batch at once.

    `members`: the batch's replicate indices (the leading axis of `loss_b`);
    `rows`: ``{replicate: (ts, {"w", "C", "a"})}`` for those that have rows
    (at most one block, ``save_per_decade + 1``, each: one solve's saved
    points). Blocks are padded with their last row, as ``gflow.dynamics._flow._append``
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
    ys_b = Params.from_blocks({k: np.stack([b[k] for b in blocks]) for k in blocks[0]})
    st_b = jax.device_get(_stats_batch(loss_b, ys_b))
    for k, r in enumerate(members):
        if r not in rows:
            continue
        ts, v = rows[r]
        n = len(ts)
        st = jax.tree.map(lambda x, k=k, n=n: np.asarray(x)[k, :n], st_b)
        append_rows(trajs[r], ts, v, st, stage_index=stage_index)


# ---------------------------------------------------------------------------
# The batch
# ---------------------------------------------------------------------------


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
        self.wall0 = [0.0] * R  # a resumed run's wall time before this batch
        self.trajs: list[Trajectory] = []
        self.errors: list[FlowError | None] = [None] * R
        self.alive = list(range(R))


def integrate_batch_with_errors(configs, *, outs=None, resume=False, overwrite=False, verbose=False):
    """:func:`gflow.integrate_batch`, also returning each replicate's :class:`FlowError` (or ``None``)."""
    cfgs = list(configs)
    if cfgs:
        refuse_sgd(cfgs[0], "gflow.integrate_batch")
    _check_batch(cfgs)
    R = len(cfgs)
    outs = [None] * R if outs is None else list(outs)
    resume = [bool(resume)] * R if isinstance(resume, (bool, np.bool_)) else [bool(x) for x in resume]
    for what, n in (("folders in `outs`", len(outs)), ("flags in `resume`", len(resume))):
        if n != R:
            raise ValueError(f"integrate_batch: {n} {what} for {R} configurations")
    for o, again in zip(outs, resume):
        if again and o is None:
            raise ValueError("resume=True needs the run folder in `outs`")
        if o is not None and not again and o.holds_run() and not overwrite:
            raise ValueError(f"{str(o)!r} already holds a run: pass overwrite=True or choose another folder")
    if R == 1:
        try:
            return [integrate(cfgs[0], out=outs[0], resume=resume[0], overwrite=overwrite, verbose=verbose)], [None]
        except FlowError as e:
            return [e.trajectory], [e]
    with contextlib.ExitStack() as held:  # every replicate's folder locked for the whole batch
        for o in outs:
            if o is not None:
                held.enter_context(o.lock())
        return _integrate_batch_locked(cfgs, outs, resume, verbose)


def _integrate_batch_locked(cfgs, outs, resume, verbose):
    runs = _Runs(cfgs, outs, time.perf_counter(), verbose)
    cfg = cfgs[0]
    # what can be wrong with a resumed run is checked before sampling, as gflow.integrate does
    saved = {}
    for r, (c, o) in enumerate(zip(cfgs, outs)):
        if resume[r]:
            saved[r] = o.load()
            check_resumable(saved[r], c)
    params0 = None
    if len(saved) < len(cfgs):
        params0 = init_params(cfg.model, cfg.init, d=cfg.data.d, L=cfg.data.L, dtype=cfg.estimator.jdtype)
        check_params(params0, cfg)
    loss_b = _stack([make_loss(c.data, c.model, c.estimator) for c in cfgs])
    _begin(runs, saved, params0, loss_b)
    for name, duration in stage_plan(cfg):
        if not runs.alive:
            break
        recs = {}
        for r in runs.alive:  # a replicate that has completed this stage already (resumed) idles through it
            rec = stage_record(runs.trajs[r], name, duration, runs.t[r], select=stage1_selection)
            if rec is not None:
                recs[r] = rec
        _run_groups(runs, recs, loss_b, duration)
    for r in runs.alive:
        tr = runs.trajs[r]
        tr.status = "complete"
        tr.wall = runs.wall0[r] + time.perf_counter() - runs.t_wall
        if outs[r] is not None:
            outs[r].save(tr)
    return runs.trajs, runs.errors


def _begin(runs: _Runs, saved: dict[int, Trajectory], params0: Params | None, loss_b) -> None:
    """Each replicate's trajectory, state and time: a resumed one's (`saved`) as
    :func:`gflow.integrate` resumes it, a new one's initial state as its first row
    (the new ones' statistics computed for the batch at once)."""
    cfg = runs.cfgs[0]
    dtype = cfg.estimator.jdtype
    first = {}
    for r, c in enumerate(runs.cfgs):
        if r in saved:
            tr = saved[r]
            tr.config, tr.status = c, "running"  # was "interrupted", "failed: …" or "complete"
            y = params_from(tr, -1, dtype)
            runs.t[r], runs.wall0[r] = float(tr.ts[-1]), tr.wall
        else:
            tr = Trajectory.empty(c, cfg.model.H, cfg.model.M, len(cfg.model.subsets),
                                  {b: np.shape(v) for b, v in params0.x.items()})  # fmt: skip
            tr.versions = versions()
            y = params0
            first[r] = (np.zeros(1), {b: np.asarray(v)[None] for b, v in y.blocks().items()})
        runs.trajs.append(tr)
        runs.y[r] = {b: np.asarray(v) for b, v in y.blocks().items()}
    members = list(range(len(runs.cfgs)))
    _append_batch(runs.trajs, loss_b, members, first, stage_index=index_of_stage(stage_plan(cfg)[0][0]))


def _run_groups(runs: _Runs, recs: dict[int, StageRecord], loss_b, duration: float) -> None:
    """One stage of the replicates in `recs`, grouped by their selected set: the largest group
    on the whole batch, the others as their own batches, a group of one by the single driver."""
    members = list(range(len(runs.cfgs)))
    groups: dict[tuple, list[int]] = {}
    for r in recs:
        groups.setdefault(tuple(recs[r].selected or ()), []).append(r)
    for g, (heads, active) in enumerate(sorted(groups.items(), key=lambda kv: -len(kv[1]))):
        if len(active) == 1:
            _run_one(runs, recs, loss_b, active[0], duration)
        elif g == 0:
            _run_stage_batch(runs, recs, loss_b, members, active, duration)
        else:
            _run_stage_batch(runs, recs, _take(loss_b, active), active, active, duration)


def _run_one(runs: _Runs, recs, loss_b, r: int, duration: float) -> None:
    """A group of one: ``gflow.dynamics._flow.run_stage`` itself, on the replicate's own loss."""
    rec, cfg = recs[r], runs.cfgs[r]
    dtype = cfg.estimator.jdtype
    y = Params.from_blocks({b: jnp.asarray(v, dtype) for b, v in runs.y[r].items()})
    try:
        y, t = run_stage(runs.trajs[r], rec, _take(loss_b, r), cfg, y, runs.t[r], rec.t0 + duration, runs.outs[r],
                          runs.verbose, runs.wall0[r], runs.t_wall)  # fmt: skip
    except FlowError as e:
        runs.errors[r] = e
        runs.alive.remove(r)
        return
    runs.y[r] = {b: np.asarray(v) for b, v in y.blocks().items()}
    runs.t[r] = t


def _run_stage_batch(runs: _Runs, recs, loss_b, members: list[int], active: list[int], duration: float) -> None:
    """One stage of the replicates `active` on the batch `members` (the leading
    axis of `loss_b`; members not in `active` idle): each replicate's host-side
    bookkeeping is a ``gflow.dynamics._flow.StageRun``, as in a single run, and the
    j-th solve of every replicate still running is one batched solve, the
    others given zero-length solves (``t0 = t1``)."""
    r0 = active[0]
    dtype = runs.cfgs[r0].estimator.jdtype
    stage = {r: StageRun(runs.trajs[r], recs[r], runs.cfgs[r], runs.y[r], runs.t[r], recs[r].t0 + duration,
                          runs.outs[r], wall0=runs.wall0[r], t_wall=runs.t_wall, batched=True)
             for r in active}  # fmt: skip
    y_b = Params.from_blocks({b: jnp.asarray(np.stack([runs.y[r][b] for r in members]), dtype) for b in runs.y[r0]})
    sl_b, finite0 = _stage_start_batch(loss_b, y_b, stage[r0].moves)
    # the jitted function returns a copy of the samples inside the stage loss: hold the stacked ones instead
    sl_b = eqx.tree_at(lambda sl: sl.loss, sl_b, loss_b)
    finite0 = np.asarray(finite0)
    going = [r for k, r in enumerate(members) if r in stage and stage[r].start(bool(finite0[k]))]
    if going:
        _solves_batch(runs, stage, sl_b, loss_b, members, going)
    for r in active:
        run = stage[r]
        if run.error is not None:
            runs.errors[r] = run.error
            runs.alive.remove(r)
        else:
            # every replicate's nfev and wall of the stage are the batch's (module docstring): its
            # tag counted every batched evaluation, also after its own stage had ended
            run._clock()
            run._save()
        run.close()


def _solves_batch(runs: _Runs, stage: dict, sl_b, loss_b, members: list[int], going: list[int]) -> None:
    """The batched solves of a stage, until no replicate of `going` runs any more (each one's
    :class:`~gflow.dynamics._flow.StageRun` in `stage`; an idle member borrows the first run's arguments)."""
    run0 = next(iter(stage.values()))
    of = [stage.get(r, run0) for r in members]
    name, cfg = run0.name, run0.cfg
    sc, dtype, B = cfg.solver, cfg.estimator.jdtype, len(members)
    scale = {b: jnp.broadcast_to(v, (B,)) for b, v in block_scales(cfg, run0.moves, dtype).items()}
    # idle members count under tag -1, which no run holds
    tags = jnp.asarray([stage[r].tag if r in stage else -1 for r in members])
    sign_C = None
    if run0.log_c:  # the joint selector in log coordinates, each replicate's own signs
        sign_C = jnp.asarray(np.stack([run.sign_C for run in of]), dtype)
    # GD's step of the modified or the central flow, one per replicate (the same)
    opts = {k: (v if v is None or k == "edge_k" else jnp.broadcast_to(v, (B,)))
            for k, v in field_options(cfg, name, dtype).items()}  # fmt: skip
    vf = VectorField(stage_loss=sl_b, scale=scale, tag=tags, sign_C=sign_C, **opts)
    settings = {
        "method": ode_method(sc.method_for(name)), "rtol": sc.rtol, "atol": sc.atol, "max_steps": sc.max_steps,
        "delta": cfg.schedule.delta, "event_stage": run0.event_stage, "heads": run0.heads, "progress": False,
        "steady": run0.steady,
    }  # fmt: skip
    t_stage0 = None
    if run0.steady:  # each replicate's stage start and event coordinates there (idle: any)
        t_stage0 = jax.tree.map(lambda *xs: jnp.stack(xs), *[run.steady_args() for run in of])
    # each replicate's controller carry: a resumed one continues with its saved one (as gflow.integrate)
    carry = jax.tree.map(lambda *xs: jnp.stack(xs),
                         *[stage[r].carry0(dtype) if r in going else fresh_carry(dtype) for r in members])  # fmt: skip
    while going:
        t0 = np.array([runs.t[r] for r in members])
        t1, ts = t0.copy(), np.repeat(t0[:, None], sc.save_per_decade, axis=1)
        y0 = {b: np.stack([runs.y[r][b] for r in members]) for b in run0.moves}
        for k, r in enumerate(members):
            if r in going:
                y0k, t0[k], t1[k], ts[k] = stage[r].solve_args()
                for b in run0.moves:
                    y0[b][k] = y0k[b]
        ts_b, ys_b, result_b, stats_b, new_carry = _solve_batch(
            vf, {b: jnp.asarray(v, dtype) for b, v in y0.items()}, as_f64(t0), as_f64(t1), as_f64(ts),
            as_f64(sc.eta), carry, t_stage0, **settings,
        )  # fmt: skip
        # a replicate's carry moves on only with its own solves
        carry = _where(np.array([r in going for r in members]), new_carry, carry)
        ts_b, ys_b, result_b, stats_b, carry_np = jax.device_get((ts_b, ys_b, result_b, stats_b, carry))
        rows, outcome = {}, {}
        for k, r in enumerate(members):
            if r in going:
                # a 0-d array, not a numpy scalar: diffrax.RESULTS[...] reads the message of arrays only
                res = jax.tree.map(lambda x, k=k: np.asarray(np.asarray(x)[k]), result_b)
                st = {key: np.asarray(v)[k] if np.ndim(v) else v for key, v in stats_b.items()}  # max_steps: shared
                row, outcome[r] = stage[r].take(ts_b[k], {b: ys_b[b][k] for b in run0.moves}, res, st)
                if row is not None:
                    rows[r] = row
                stage[r].keep_carry(row, jax.tree.map(lambda x, k=k: x[k], carry_np))
        _append_batch(runs.trajs, loss_b, members, rows, stage_index=run0.index)
        for r in outcome:
            stage[r].settle(outcome[r])
            runs.y[r], runs.t[r] = stage[r].y_np, stage[r].t
        going = [r for r in going if stage[r].running]
        if runs.verbose:
            now = [runs.t[r] for r in stage if stage[r].error is None]
            print(f"  stage {name} (batch of {B}): {len(going)} of {len(stage)} still running, "
                  f"t = {min(now, default=np.nan):.4g}…{max(now, default=np.nan):.4g}, "
                  f"{time.perf_counter() - run0.t_stage:.1f} s", flush=True)  # fmt: skip
