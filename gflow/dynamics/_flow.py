"""The gradient flow dθ/dt = −Λ ∇L̂_N(θ), integrated with diffrax (docs/theory/mathematics.md §M4–§M5).

:func:`integrate` runs a schedule and returns a :class:`~gflow.trajectory.Trajectory`:

- ``schedule.kind = "staged"`` (the paper): Stage I moves only C, Stage II
  only w, Stage III only a, on one continuous time axis; Stages I and II end
  at their events (diffrax events, located by a Newton root find) or
  durations, Stage III at its duration;
- ``schedule.kind = "joint"`` (extension): every block at once, with time
  scales ``Λ = diag(η_w, η_C, η_a)``;
- ``solver.method = "gd"`` (extension): discrete gradient descent
  ``θ_{k+1} = θ_k − η Λ ∇L̂(θ_k)`` on ``t = kη`` (explicit Euler with the
  constant step η), for either schedule;
- ``solver.method = "modified"`` (extension, docs/theory/mathematics.md §M9): GD's first-order
  modified flow ``dθ/dt = −Λg − (η/2) Λ H Λ g`` at GD's step ``η = solver.eta``,
  integrated by Tsit5 like the flow (same stages, events, coordinates, saves,
  progress and resume); ``η = 0`` is the flow.

Each stage is integrated one decade of its own time τ = t − t0 at a time
(``solver.save_per_decade`` saved points each); the trajectory (with the loss, gradient and
Monte Carlo standard errors at every saved time) is written to ``out`` after
each one, so a failure keeps everything up to it and an interrupted run can
be resumed.
"""

from __future__ import annotations

import threading
import time

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._util import STAGE_CODES, cached_call, prepare_call, versions
from ..config import Config, refuse_sgd
from ..core import Params, PopulationLoss, StageLoss, init_params, make_loss, member_of
from ..trajectory import WRITING, StageRecord, Trajectory
from ._ahead import AheadOfTime
from ._central import unsolved_state
from ._resume import check_params, check_resumable
from ._solve import (
    COUNTS,
    LogC,
    VectorField,
    as_f64,
    block_scales,
    event_coordinates,
    event_value,
    failure_reason,
    field_options,
    fresh_carry,
    new_tag,
    ode_method,
    save_grid,
    solve_segment,
    split_segments,
    stats_at,
)


def stage_blocks(cfg: Config, stage: str) -> tuple[str, ...]:
    """The blocks stage `stage` (``"I"``, ``"II"``, ``"III"`` or ``"joint"``) trains: the model's
    member declares them (``AbstractModel.stage_moves``; the paper's: C, w, a, all)."""
    return member_of(cfg.model).stage_moves[stage]


class FlowError(RuntimeError):
    """An integration that failed: says which stage, at what time and why.

    `trajectory` holds everything up to the failure (also written to `out`
    when one was given).
    """

    def __init__(self, message: str, *, stage: str, t: float, trajectory: Trajectory, out=None):
        where = f" (partial trajectory kept in {str(out)!r})" if out is not None else ""
        super().__init__(f"Stage {stage} failed at t = {t:.6g}: {message}{where}")
        self.stage = stage
        self.t = t
        self.trajectory = trajectory
        self.out = out


# ---------------------------------------------------------------------------
# integrate
# ---------------------------------------------------------------------------


def stage_plan(cfg: Config) -> list[tuple[str, float]]:
    if cfg.schedule.kind == "joint":
        return [("joint", cfg.schedule.t1)]
    return list(zip(("I", "II", "III"), cfg.schedule.durations))


def params_from(traj: Trajectory, i: int, dtype) -> Params:
    return Params.from_blocks({b: jnp.asarray(v, dtype) for b, v in traj.state(i).items()})


# The options of :func:`gflow.integrate` that both engines (the flow's, the stochastic methods')
# take, with their defaults; they are documented there.
RUN_OPTIONS = {"resume": False, "overwrite": False, "loss": None, "params0": None, "verbose": False,
               "throw": True, "outputs": None, "on_loss": None}  # fmt: skip


def run_options(options: dict) -> dict:
    """`options` completed with :data:`RUN_OPTIONS`' defaults; an unknown name is a ``TypeError``."""
    unknown = sorted(set(options) - set(RUN_OPTIONS))
    if unknown:
        raise TypeError(f"unexpected options {unknown}; allowed: {sorted(RUN_OPTIONS)}")
    return {**RUN_OPTIONS, **options}


def integrate(config: Config = Config(), *, out=None, **options) -> Trajectory:
    """The flow's engine behind :func:`gflow.integrate` (the same options, results and errors),
    with `out` a run-folder hook (:class:`gflow.runs.RunFolder`) or ``None``. With `out`, the
    folder's lock is held for the whole integration, and a ``KeyboardInterrupt`` (SIGINT) marks
    the saved run ``"interrupted"`` (its last saved snapshot, resumable) before it propagates;
    the resumed run must have the settings of the saved one (:func:`check_resumable`)."""
    refuse_sgd(config, "gflow.integrate")  # solver.method = "sgd": gflow.sgd runs it, not the flow
    kw = run_options(options)
    if out is None:
        return _integrate(config, out=None, **kw)
    with out.lock():
        try:
            return _integrate(config, out=out, **kw)
        except KeyboardInterrupt:
            out.mark_interrupted()
            raise


def _integrate(config: Config, *, out, resume, overwrite, loss, params0, verbose, throw, outputs=None,
               on_loss=None) -> Trajectory:  # fmt: skip
    cfg = config
    dtype = cfg.estimator.jdtype
    t_wall = time.perf_counter()
    plan = stage_plan(cfg)
    # Everything that can be wrong with the request is checked before sampling.
    if resume:
        if out is None:
            raise ValueError("resume=True needs the run folder `out`")
        traj = out.load()
        check_resumable(traj, cfg)
    else:
        if out is not None and out.holds_run() and not overwrite:
            raise ValueError(
                f"{str(out)!r} already holds a run: resume it (resume=True, `gflow run --resume`) "
                "or pass overwrite=True (`--overwrite`)"
            )
        if params0 is None:
            params0 = init_params(cfg.model, cfg.init, d=cfg.data.d, L=cfg.data.L, dtype=dtype)
        check_params(params0, cfg)
        y = Params.from_blocks({b: jnp.asarray(v, dtype) for b, v in params0.blocks().items()})
        if out is not None and overwrite:
            out.remove_stale()
    if loss is None:
        loss = make_loss(cfg.data, cfg.model, cfg.estimator)
    if not resume:
        check_first_step(cfg, loss, y, plan[0][0])
    if on_loss is not None:  # the request is valid and its sample drawn (the command line starts its theory)
        on_loss(loss)

    if resume:
        traj.config = cfg
        traj.status = "running"  # was "interrupted", "failed: …" or "complete"
        y = params_from(traj, -1, dtype)
        t = float(traj.ts[-1])
        wall0 = traj.wall
    else:
        t = 0.0
        wall0 = 0.0
        H, M = cfg.model.H, cfg.model.M
        traj = Trajectory.empty(cfg, H, M, len(cfg.model.subsets), {b: np.shape(v) for b, v in y.x.items()})
        traj.versions = versions()
        _append(traj, loss, np.zeros(1), {b: np.asarray(v)[None] for b, v in y.blocks().items()},
                stage_index=index_of_stage(plan[0][0]))  # fmt: skip

    ahead = prepare_stages(cfg, traj, loss, y)
    try:
        for name, duration in plan:
            rec = stage_record(traj, name, duration, t)
            if rec is None:
                continue
            if ahead is not None:
                ahead.wait(name, tuple(rec.selected or ()))
            try:
                y, t = run_stage(traj, rec, loss, cfg, y, t, rec.t0 + duration, out, verbose, wall0, t_wall)
            except FlowError as e:
                if throw:
                    raise
                return e.trajectory
    finally:
        if ahead is not None:
            ahead.join()

    traj.status = "complete"
    if outputs and out is not None:  # complete once the caller has written (and recorded) them
        traj.status, traj.files = WRITING, {str(n): None for n in outputs}
    traj.wall = wall0 + time.perf_counter() - t_wall
    if out is not None:
        out.save(traj)
    return traj


def check_first_step(cfg: Config, loss: PopulationLoss, y: Params, stage: str) -> None:
    """GD's step η (``solver.method = "gd"``, and the central flow, whose η is GD's) refused before
    integrating when GD diverges at the start: one step ``θ₁ = θ₀ − η Λ ∇L̂(θ₀)`` of the first
    stage's moving blocks from `y` (θ₀ in the run's dtype) gives a non-finite θ₁ or L̂(θ₁). (On the paper's model GD does not otherwise
    diverge at the start: at d = 3, joint, η = 0.45 … 100 (L = 20, N = 300) and up to 10¹²
    (L = 12, N = 100) keep a finite loss, the selector catapulting and a growing; η = 10³⁰⁰
    overflows C² in the first step.) One gradient and two losses, in the program every stage's
    start calls (:func:`stage_start`)."""
    eta = cfg.solver.eta
    if cfg.solver.method_for(stage) not in ("gd", "central") or eta is None:
        return
    moves = stage_blocks(cfg, stage)
    scales = block_scales(cfg, moves, cfg.estimator.jdtype)
    step = {b: (eta * scales[b] if b in moves else v) for b, v in _no_step(y).items()}
    _, finite, l0 = _start_checks(loss, y, step)
    if not bool(finite):
        raise ValueError(
            f"solver.eta = {eta!r}: GD diverges at the start: one step θ₀ − η Λ ∇L̂(θ₀) of the blocks "
            f"{', '.join(moves)} gives a non-finite θ or loss (L̂(θ₀) = {float(l0):.6g}); take a smaller solver.eta"
        )


def stage1_selection(traj: Trajectory) -> tuple[int, ...]:
    """The set selected by Stage I: the largest ``c_S/Σc`` at its end."""
    return tuple(traj.subsets[traj.c_frac[-1].argmax()])


def stage_record(traj: Trajectory, name: str, duration: float, t: float, select=stage1_selection) -> StageRecord | None:
    """The record of stage `name` to run next (of the given `duration`), or ``None`` when there is
    nothing to run: a new one starting at `t` (Stage II with the set ``select(traj)``), a resumed
    one, or the last one completed at its duration, reopened to extend it to a longer one."""
    rec = next((r for r in traj.stages if r.name == name), None)
    if rec is not None and rec.complete:
        new_end = rec.t0 + duration
        last = traj.stages[-1] is rec
        if rec.ended_by in ("event", "steady") or new_end <= rec.t1 * (1 + 1e-12) or not last:
            return None  # nothing to extend
        rec.complete = False
    if rec is None:
        rec = StageRecord(name=name, moves=list(stage_blocks(traj.config, name)), t0=t, t1=t)
        if name == "II":
            rec.selected = select(traj)
        traj.stages.append(rec)
    return rec


def index_of_stage(name: str) -> int:
    return STAGE_CODES[name]


def _append(traj: Trajectory, loss: PopulationLoss, ts: np.ndarray, ys: dict, *, stage_index: int) -> None:
    """Append saved states (numpy ``{"w", "C", "a"}`` with a leading axis) with
    their loss, gradient and standard errors.

    The statistics are computed in blocks of one solve's saved points (a
    decade, plus an event's time): one compiled shape, little padding."""
    n = len(ts)
    block = traj.config.solver.save_per_decade + 1
    parts = []
    for i in range(0, n, block):
        blk = {k: v[i : i + block] for k, v in ys.items()}
        m = len(blk["a"])
        blk = {k: np.concatenate([v, np.repeat(v[-1:], block - m, axis=0)]) for k, v in blk.items()}
        st = jax.device_get(stats_at(loss, Params.from_blocks(blk)))
        parts.append(jax.tree.map(lambda x: np.asarray(x)[:m], st))
    append_rows(traj, ts, ys, jax.tree.map(lambda *xs: np.concatenate(xs), *parts), stage_index=stage_index)


def append_rows(traj: Trajectory, ts: np.ndarray, ys: dict, st, *, stage_index: int) -> None:
    """Append saved states and their statistics (a numpy ``LossStats`` with a leading axis)."""
    extra = {}
    for b in st.grad.x:
        extra.update({f"x_{b}": ys[b], f"grad_x_{b}": st.grad.x[b], f"grad_se_x_{b}": st.grad_se.x[b]})
    traj.append(
        ts=ts, stage=np.full(len(ts), stage_index), w=ys["w"], C=ys["C"], a=ys["a"],
        loss=st.loss, loss_se=st.loss_se, unseen=st.unseen,
        grad_w=st.grad.w, grad_C=st.grad.C, grad_a=st.grad.a,
        grad_se_w=st.grad_se.w, grad_se_C=st.grad_se.C, grad_se_a=st.grad_se.a,
        grad_norm=st.grad_norm, **extra,
    )  # fmt: skip


def _kept_rows(ts, ys: dict, t: float, y_np: dict, moves: tuple[str, ...]) -> tuple[np.ndarray, dict, bool]:
    """The rows of one solve's saved output worth keeping: after ``t``, without
    padding, duplicates or unfilled (infinite) times; with the frozen blocks
    ``y_np`` filled in. Returns the kept times, the full states
    ``{"w", "C", "a"}`` and whether they are all finite."""
    ts = np.asarray(ts)
    nxt = np.concatenate([ts[1:], [np.inf]])
    keep = np.flatnonzero(np.isfinite(ts) & (ts > t) & ~(np.isfinite(nxt) & (nxt <= ts)))
    full = {b: (np.asarray(ys[b]) if b in moves else np.broadcast_to(y_np[b], (len(ts),) + np.shape(y_np[b])))[keep]
            for b in y_np}  # fmt: skip
    return ts[keep], full, all(np.all(np.isfinite(v)) for v in full.values())


def stage_start(loss: PopulationLoss, y: Params, moves: tuple[str, ...]):
    """The stage's loss with its frozen work done, and whether ∇L̂ is finite at the start: two
    programs, so that the gradient's (the same shapes in every stage) compiles once a run."""
    return _stage_loss(loss, y, moves), _start_checks(loss, y, _no_step(y))[0]


def _no_step(y: Params) -> dict:
    return {b: jnp.zeros((), v.dtype) for b, v in y.blocks().items()}


@eqx.filter_jit
def _start_checks(loss: PopulationLoss, y: Params, step: dict):
    """Whether ∇L̂(y) is finite, whether one GD step ``y − step ⊙ ∇L̂(y)`` (``step``: η Λ of each
    block, 0 for a frozen one) has a finite θ and loss, and L̂(y). One program for both uses (the
    stages' starts pass no step; :func:`check_first_step` GD's), compiled once a run."""
    l0, g = loss.value_and_grad(y)
    finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(g)]))
    y1 = y.with_blocks({b: v - step[b] * g.get(b) for b, v in y.blocks().items()})
    ok = jnp.isfinite(loss(y1)) & jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(y1.blocks())]))
    return finite, ok, l0


@eqx.filter_jit
def _stage_loss(loss: PopulationLoss, y: Params, moves: tuple[str, ...]):
    return StageLoss(loss, y, moves)


_NOT_FINITE_AT_START = ("the gradient of the loss is not finite at the stage's start "
                        "(e.g. estimator.eps = 0 with tokens absent from a context)")


# The most steps tsit5 may be foreseen to take over a decade of a staged schedule's stage before
# ``solver.stiff_switch`` goes on with kvaerno5 (StageRun.foresee_stiff)
STIFF_STEPS = 10_000


class StageRun:
    """One run's passage through one stage, on the host: everything around the
    compiled solves, shared by the single driver (:func:`run_stage`) and the
    batched one (``gflow.dynamics._vmapped``), so the two cannot drift apart.

    It decides how the stage starts (:meth:`start`: a non-finite field fails at
    once, an event already met ends the stage, otherwise the stage's save grid
    is cut into solves of one decade each), what the j-th solve integrates
    (:meth:`solve_args`), which of a solve's saved rows are kept
    (:meth:`take`), and what follows a solve (:meth:`settle`: a failure, the
    stage's event, its last solve, or the next solve), keeping the stage
    record (times, steps, evaluations, wall time, how it ended) and the run's
    status and folder up to date. A failure is recorded in `error` (a
    :class:`FlowError` with the partial trajectory); the driver decides
    whether to raise it.
    """

    # count every solver's evaluations on the host (tests/test_flow.py compares the two counts)
    host_count = False

    def __init__(self, traj: Trajectory, rec: StageRecord, cfg: Config, y_np: dict, t: float, t_end: float,
                 out, *, wall0: float, t_wall: float, verbose: bool = False,
                 batched: bool = False):  # fmt: skip
        self.traj, self.rec, self.cfg, self.out = traj, rec, cfg, out
        self.y_np, self.t, self.t_end = y_np, t, t_end
        self.wall0, self.t_wall, self.verbose = wall0, t_wall, verbose
        self.name = rec.name
        self.moves = stage_blocks(cfg, rec.name)
        self.member = member_of(cfg.model)
        self.index = index_of_stage(rec.name)
        self.heads = self.member.heads_of(tuple(rec.selected or ())) if rec.name == "II" else ()
        self.batched = batched
        # the stage's solver: the configuration's, or the one a stiff switch went on with (resumed)
        self.method = rec.solver or cfg.solver.method_for(rec.name)
        events = cfg.schedule.events and (rec.name == "I" or (rec.name == "II" and self.heads))
        self.event_stage = rec.name if events else None
        # a stage with an event also ends when it settles short of it (ended_by "steady", _steady_cond)
        self.steady = self.event_stage is not None and self.method != "gd"
        # the joint flow integrates the selector in log coordinates (LogC; η_C = 0: C is constant,
        # kept in C so that it stays bit for bit). GD steps in C, and so does the central flow:
        # its oscillation term ½X∇S need not vanish with a losing weight C_S (the eigenvectors at
        # the edge mix sets where eigenvalues cross), and in ℓ = log|C_S| it is divided by C_S, a
        # stiff term that held Tsit5 to steps of 1e-4 where C takes steps of about η
        self.log_c = (rec.name == "joint" and cfg.solver.method_for(rec.name) not in ("gd", "central")
                      and cfg.solver.joint_coords == "log" and cfg.schedule.eta_C > 0)  # fmt: skip
        self.sign_C = LogC.to_log(y_np["C"])[0] if self.log_c else None
        self.t_stage = time.perf_counter()
        self.wall_before, self.nfev_before = rec.wall, rec.nfev
        # evaluations: counted in the compiled program for explicit solvers (no host callback,
        # so the persistent compilation cache keeps the solve), on the host otherwise (_solve)
        # (the batched driver counts on the host: each replicate counts the batched evaluations)
        self.in_program = (not (batched or StageRun.host_count)
                           and self.method in ("tsit5", "gd", "modified", "central"))  # fmt: skip
        self.tag = new_tag()
        self.nfev_program = 0
        self.segs: list[np.ndarray] = []
        self.j = 0
        self.error: FlowError | None = None
        self.switched = False  # set by :meth:`switch`; the driver rebuilds its field and solver
        self.unsolved: str | None = None  # a central flow's unsolved complementarity problem (:meth:`guard_central`)

    @property
    def running(self) -> bool:
        """Whether solves remain."""
        return self.error is None and not self.rec.complete and self.j < len(self.segs)

    def _clock(self) -> None:
        rec = self.rec
        rec.nfev = self.nfev_before + COUNTS.get(self.tag, 0) + self.nfev_program
        rec.wall = self.wall_before + time.perf_counter() - self.t_stage
        self.traj.wall = self.wall0 + time.perf_counter() - self.t_wall

    def _save(self) -> None:
        if self.out is not None:
            self.out.save(self.traj)

    def fail(self, msg: str, t_fail: float) -> None:
        rec, traj = self.rec, self.traj
        rec.ended_by = "failed"
        rec.t1 = float(traj.ts[-1])
        self._clock()
        traj.status = f"failed: Stage {self.name} at t = {t_fail:.6g}: {msg}"
        self._save()
        self.error = FlowError(msg, stage=self.name, t=t_fail, trajectory=traj, out=self.out)

    def end(self, ended_by: str) -> None:
        rec = self.rec
        rec.ended_by, rec.complete, rec.t1 = ended_by, True, self.t
        if rec.name in ("I", "joint"):  # the stage that selects records what it selected
            rec.selected = stage1_selection(self.traj)
        self._clock()

    def close(self) -> None:
        """Stop counting this run's evaluations."""
        COUNTS.pop(self.tag, None)

    def start(self, finite0: bool) -> bool:
        """Begin the stage given whether ∇L̂ is finite at its start; whether solves follow."""
        if not finite0:
            self.fail(_NOT_FINITE_AT_START, self.t)
            return False
        cfg = self.cfg
        y0 = {b: jnp.asarray(v) for b, v in self.y_np.items()}
        if self.event_stage is not None and float(event_value(self.name, y0, cfg.schedule.delta, self.heads,
                                                               self.member)) >= 0:  # fmt: skip
            self.end("event")
            return False
        grid = save_grid(self.rec.t0, self.t_end, cfg)
        grid = grid[grid > self.t * (1 + 1e-12)]
        self.segs = split_segments(grid, cfg.solver.save_per_decade) if len(grid) else []
        if not self.segs:
            self.end("duration")
            return False
        return True

    def steady_args(self):
        """``(stage start time, the event's coordinates there)`` for the steady test (a resumed
        stage: from its first saved row), or ``None`` when the stage cannot end steady."""
        if not self.steady:
            return None
        traj = self.traj
        i0 = min(int(np.searchsorted(traj.ts, self.rec.t0 * (1 - 1e-12))), len(traj.ts) - 1)
        st0 = traj.state(i0)
        dtype = self.cfg.estimator.jdtype
        phi0 = event_coordinates(self.name, {b: jnp.asarray(st0[b], dtype) for b in self.moves}, self.heads,
                                 self.member)
        return as_f64(self.rec.t0), phi0

    def solve_args(self) -> tuple[dict, float, float, np.ndarray]:
        """The j-th solve: its moving blocks' start, its start and end times, and its saved times."""
        seg = self.segs[self.j]
        y0 = {b: self.y_np[b] for b in self.moves}
        if self.log_c:
            y0["C"] = LogC.to_log(self.y_np["C"])[1]
        return y0, self.t, float(seg[-1]), np.maximum(seg, self.t)  # (a decade redone after a stiff switch)

    def take(self, ts, ys: dict, result, stats):
        """Count a solve's steps and keep its rows; returns the rows to append
        (``(ts, {"w", "C", "a"})``, or ``None``) and the solve's outcome for :meth:`settle`."""
        rec = self.rec
        if self.log_c:
            ys = {**ys, "C": LogC.from_log(self.sign_C, ys["C"])}
        if self.in_program:
            self.nfev_program += int(stats["nfev"])
        rec.steps += int(stats["num_accepted_steps"])
        rec.rejected += int(stats["num_rejected_steps"])
        ts_kept, full, finite = _kept_rows(ts, ys, self.t, self.y_np, self.moves)
        rows = (ts_kept, full) if finite and len(ts_kept) else None
        return rows, (result, finite, ts_kept, full, bool(stats.get("steady", False)))

    def settle(self, outcome) -> None:
        """After the solve's rows are appended: fail, end (event or last solve), or go on."""
        result, finite, ts_kept, full, settled = outcome
        traj, sc = self.traj, self.cfg.solver
        if self.unsolved is not None:
            self.fail(self.unsolved, float(traj.ts[-1]))
            return
        ok = bool(result == diffrax.RESULTS.successful) or bool(result == diffrax.RESULTS.event_occurred)
        if not ok and finite and self.can_switch() and bool(result == diffrax.RESULTS.max_steps_reached):
            self.switch(ts_kept, full, f"tsit5 ran out of steps (max_steps = {sc.max_steps})")
            return
        if not ok or not finite:
            self.fail(failure_reason(result, ok, sc, self.name, self.moves, self.method, member_of(self.cfg.model).switching),
                      float(traj.ts[-1]))  # fmt: skip
            return
        if len(ts_kept):
            self.y_np = {b: v[-1] for b, v in full.items()}
            self.t = float(ts_kept[-1])
        self.rec.t1 = self.t
        self._clock()
        self.j += 1
        if self.verbose:
            print(f"  stage {self.name}: t = {self.t:.4g}, loss = {traj.loss[-1]:.6f}, steps = {self.rec.steps}, "
                  f"nfev = {self.rec.nfev}, {self.rec.wall:.1f} s", flush=True)  # fmt: skip
        if bool(result == diffrax.RESULTS.event_occurred):
            self.end("steady" if settled else "event")
        elif self.j == len(self.segs):
            self.end("duration")
        self._save()

    def guard_central(self, rows, outcome, sl):
        """A central flow's solve keeps its saved states up to the first whose complementarity problem
        was not solved (:func:`~gflow.dynamics._central.unsolved_state`); the stage then fails there."""
        bad = unsolved_state(sl, block_scales(self.cfg, self.moves, self.cfg.estimator.jdtype), self.cfg.solver.eta,
                             self.cfg.solver.edge_eigs, *rows)  # fmt: skip
        if bad is None:
            return rows, outcome
        n, self.unsolved = bad
        ts, full = rows[0][:n], {b: v[:n] for b, v in rows[1].items()}
        return ((ts, full) if n else None), (outcome[0], outcome[1], ts, full, outcome[4])

    def can_switch(self) -> bool:
        """Whether ``solver.stiff_switch`` may continue this stage implicitly: tsit5 on a stage of
        the staged schedule (not the joint one, not in a batch), not a switching member's (an implicit
        solver meets the same switching surfaces)."""
        return (self.cfg.solver.stiff_switch and not self.batched and self.method == "tsit5"
                and self.name in ("I", "II", "III") and not member_of(self.cfg.model).switching)  # fmt: skip

    def foresee_stiff(self, carry) -> None:
        """Between two solves of a stage that may switch: switch now when tsit5's last step would
        take more than :data:`STIFF_STEPS` steps over the next decade.
        A stiff flow holds the explicit step at its stability bound ~3.5/|λ| (λ the Jacobian's most
        negative eigenvalue) while each decade is 10× longer (the ``value`` member's Stage III: 7,439
        steps over τ ∈ [0.8, 8], then 74,387; with a LayerNorm, its Stage II); the paper's stages take
        about 100 steps each in all."""
        if not (self.running and self.can_switch()):
            return
        dt = float(carry[1])  # the carry: (the PID controller's state, its last proposed step)
        ahead = float(self.segs[self.j][-1]) - self.t
        if dt > 0 and ahead / dt > STIFF_STEPS:  # (not read from max_steps: it may change on resume)
            self.switch([], {}, f"tsit5's step {dt:.3g} would take {ahead / dt:.3g} steps over the next decade")

    def switch(self, ts_kept, full, why: str) -> None:
        """Go on with kvaerno5 from the last saved point (`why`: what made the stage stiff): a
        failed decade's saved rows are kept (tsit5 reached them within tolerance), the rest of it is
        solved again."""
        if len(ts_kept):
            self.y_np = {b: v[-1] for b, v in full.items()}
            self.t = float(ts_kept[-1])
        rec = self.rec
        rec.solver, rec.solver_from, rec.t1 = "kvaerno5", self.t, self.t
        self.method, self.in_program = "kvaerno5", False
        self.switched = True
        self._clock()
        if self.verbose:
            print(f"  stage {self.name}: {why} at t = {self.t:.6g}: stiff; going on with kvaerno5 "
                  "(solver.stiff_switch)", flush=True)  # fmt: skip
        seg = self.segs[self.j]
        if not np.any(seg > self.t * (1 + 1e-12)):
            self.j += 1
            if self.j == len(self.segs):
                self.end("duration")
        self._save()

    def carry0(self, dtype):
        """The controller carry of the stage's first solve here: the saved one when the run was
        interrupted at this very point (a resumed run continues with these very steps), else fresh."""
        carry = fresh_carry(dtype)
        saved = self.traj.controller
        here = saved is not None and saved.get("stage") == self.name and saved.get("t") == self.t
        if here and not self.cfg.solver.is_gd:
            leaves = [jnp.asarray(v, x.dtype) for v, x in zip(saved["state"], jax.tree.leaves(carry))]
            carry = jax.tree.unflatten(jax.tree.structure(carry), leaves)
        return carry

    def keep_carry(self, rows, carry) -> None:
        """Record the controller carry after a solve (`rows`: what :meth:`take` returned), saved
        with the next snapshot (:meth:`settle` saves)."""
        t_now = float(rows[0][-1]) if rows is not None else self.t
        self.traj.controller = {"stage": self.name, "t": t_now,
                                "state": [np.asarray(x).item() for x in jax.tree.leaves(carry)]}  # fmt: skip


def run_stage(traj, rec: StageRecord, loss, cfg: Config, y: Params, t: float, t_end: float, out, verbose,
               wall0, t_wall):  # fmt: skip
    """One stage of one run (the single driver of :class:`StageRun`); raises its :class:`FlowError`."""
    dtype = cfg.estimator.jdtype
    run = StageRun(traj, rec, cfg, {b: np.asarray(v) for b, v in y.blocks().items()}, t, t_end, out,
                    wall0=wall0, t_wall=t_wall, verbose=verbose)  # fmt: skip
    # Checked before the (possibly long) solve: a non-finite field fails at once.
    sl, finite0 = stage_start(loss, y, run.moves)
    try:
        _solves(run, loss, sl, finite0)
    finally:
        run.close()
    if run.error is not None:
        raise run.error
    return Params.from_blocks({b: jnp.asarray(v, dtype) for b, v in run.y_np.items()}), run.t


def _solve_options(cfg: Config, name: str, event_stage, heads, steady: bool, steady_args, method=None) -> dict:
    """The static options of a stage's :func:`solve_segment` (and ``t_stage0``); `method`: the
    stage's solver when not the configuration's (a stiff switch's)."""
    sc = cfg.solver
    return dict(method=ode_method(method or sc.method_for(name)), rtol=sc.rtol, atol=sc.atol, max_steps=sc.max_steps,
                delta=cfg.schedule.delta, event_stage=event_stage, heads=heads, progress=sc.progress, steady=steady,
                t_stage0=steady_args)  # fmt: skip


def prepare_stages(cfg: Config, traj: Trajectory, loss: PopulationLoss, y: Params) -> AheadOfTime | None:
    """Start :class:`AheadOfTime` for a staged run from its start (``None`` for anything else: the
    joint schedule, a host-counted solver, the progress meter, or a resumed run)."""
    sc = cfg.solver
    if cfg.schedule.kind != "staged" or sc.progress or StageRun.host_count or traj.stages or len(traj.ts) != 1:
        return None
    if any(sc.method_for(n) not in ("tsit5", "gd", "modified", "central") for n in ("II", "III")):
        return None
    dtype = cfg.estimator.jdtype
    C0, gC0 = np.asarray(traj.C[0]), np.asarray(traj.grad_C[0])
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(C0 != 0, -gC0 / np.where(C0 != 0, C0, 1.0), -np.inf)
    member = member_of(cfg.model)
    heads = member.heads_of(tuple(int(h) for h in cfg.model.subsets[int(np.argmax(rate))]))
    ahead = AheadOfTime(heads)

    def one(name: str, heads: tuple[int, ...]) -> None:
        grid = save_grid(0.0, float(cfg.schedule.durations[("I", "II", "III").index(name)]), cfg)
        seg = split_segments(grid, sc.save_per_decade)[0]
        moves = stage_blocks(cfg, name)
        event_stage = name if cfg.schedule.events and name == "II" and heads else None
        steady = event_stage is not None and sc.method_for(name) != "gd"
        y0 = {b: jnp.asarray(np.asarray(y.get(b)), dtype) for b in moves}
        t_stage0 = (as_f64(0.0), event_coordinates(name, y0, heads, member)) if steady else None
        vf = VectorField(stage_loss=_stage_loss(loss, y, moves), scale=block_scales(cfg, moves, dtype), tag=None,
                         sign_C=None, **field_options(cfg, name, dtype))  # fmt: skip
        prepare_call(solve_segment, (vf, y0, as_f64(0.0), as_f64(seg[-1]), as_f64(seg), as_f64(sc.eta),
                                     fresh_carry(dtype)), _solve_options(cfg, name, event_stage, heads, steady, t_stage0))

    def work():
        for name, h in (("II", heads), ("III", ())):
            try:
                one(name, h)
            except Exception:  # noqa: BLE001 (a head start only: the stage compiles its program itself)
                pass
            finally:
                ahead.ready[name].set()

    ahead.thread = threading.Thread(target=work, name="gflow-ahead-of-time")
    ahead.thread.start()
    return ahead


def _solves(run: StageRun, loss, sl, finite0) -> None:
    cfg, traj = run.cfg, run.traj
    dtype = cfg.estimator.jdtype
    if run.start(bool(finite0)):
        sign_C = None if run.sign_C is None else jnp.asarray(run.sign_C, dtype)

        def field():
            tag = None if run.in_program else jnp.asarray(run.tag)
            return VectorField(stage_loss=sl, scale=block_scales(cfg, run.moves, dtype), tag=tag, sign_C=sign_C,
                               **field_options(cfg, run.name, dtype))  # fmt: skip

        vf = field()
        sc = cfg.solver
        carry = run.carry0(dtype)
        steady_args = run.steady_args()
        while run.running:
            if run.switched:  # a stiff switch: the implicit solver counts on the host, from a fresh controller
                run.switched, vf, carry = False, field(), fresh_carry(dtype)
            y0, t0, t1, seg = run.solve_args()
            ts, ys, result, stats, carry = cached_call(solve_segment, (
                vf, {b: jnp.asarray(v, dtype) for b, v in y0.items()}, as_f64(t0), as_f64(t1), as_f64(seg), as_f64(sc.eta),
                carry), _solve_options(cfg, run.name, run.event_stage, run.heads, run.steady, steady_args, run.method),
                result_at=2,
            )  # fmt: skip
            rows, outcome = run.take(*jax.device_get((ts, ys, result, stats)))
            if rows is not None and run.method == "central":
                rows, outcome = run.guard_central(rows, outcome, sl)
            if rows is not None:
                _append(traj, loss, *rows, stage_index=run.index)
            run.keep_carry(rows, carry)
            run.settle(outcome)
            run.foresee_stiff(carry)

