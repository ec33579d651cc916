"""The gradient flow dθ/dt = −Λ ∇L̂_N(θ), integrated with diffrax (SPEC §4–5).

:func:`integrate` runs a schedule and returns a :class:`~gflow.trajectory.Trajectory`:

- ``schedule.kind = "staged"`` (the paper): Stage I moves only C, Stage II
  only w, Stage III only a, on one continuous time axis; Stages I and II end
  at their events (diffrax events, located by a Newton root find) or
  durations, Stage III at its duration;
- ``schedule.kind = "joint"`` (extension): every block at once, with time
  scales ``Λ = diag(η_w, η_C, η_a)``;
- ``solver.method = "gd"`` (extension): discrete gradient descent
  ``θ_{k+1} = θ_k − η Λ ∇L̂(θ_k)`` on ``t = kη`` (explicit Euler with the
  constant step η), for either schedule.

Each stage is integrated one decade of its own time τ = t − t0 at a time
(``solver.save_per_decade`` saved points each); the trajectory (with the loss, gradient and
Monte Carlo standard errors at every saved time) is written to ``out`` after
each one, so a failure keeps everything up to it and an interrupted run can
be resumed.
"""

from __future__ import annotations

import importlib.metadata
import time
from collections.abc import Callable
from pathlib import Path

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx

from .config import Config
from .loss import PopulationLoss, StageLoss, make_loss
from .model import Params, init_params
from .trajectory import StageRecord, Trajectory, load, save

_STAGES = {"I": ("C",), "II": ("w",), "III": ("a",), "joint": ("w", "C", "a")}


class FlowError(RuntimeError):
    """An integration that failed: says which stage, at what time and why.

    `trajectory` holds everything up to the failure (also written to `out`
    when one was given).
    """

    def __init__(self, message: str, *, stage: str, t: float, trajectory: Trajectory, out: Path | None):
        where = f" (partial trajectory kept in {str(out)!r})" if out is not None else ""
        super().__init__(f"Stage {stage} failed at t = {t:.6g}: {message}{where}")
        self.stage = stage
        self.t = t
        self.trajectory = trajectory
        self.out = out


def versions() -> dict[str, str]:
    out = {}
    for pkg in ("gflow", "jax", "jaxlib", "diffrax", "equinox", "optimistix", "numpy"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


# ---------------------------------------------------------------------------
# Vector field and events
# ---------------------------------------------------------------------------


def _scales(cfg: Config, moves: tuple[str, ...], dtype) -> dict:
    # arrays, not static floats: runs that differ only in (η_w, η_C, η_a) share the compiled solve
    eta = {"w": cfg.schedule.eta_w, "C": cfg.schedule.eta_C, "a": cfg.schedule.eta_a}
    return {b: jnp.asarray(eta[b], dtype) for b in moves}


_NFEV = [0]


def _count_evaluation():
    # a fixed module-level callback: a fresh closure per stage would be a new
    # static field and force a recompilation of the solve
    _NFEV[0] += 1


class _VectorField(eqx.Module):
    """``−Λ ∇L̂`` restricted to the moving blocks: the ODE state is the dict of
    moving blocks only, so frozen blocks stay bit-for-bit fixed and an
    implicit solver's Jacobian is only as large as what moves."""

    stage_loss: StageLoss
    scale: dict
    counter: Callable | None = eqx.field(static=True, default=None)

    # joint schedule (sgd branch): when given, y["C"] is ℓ = log|C| and C = sign_C·e^ℓ (see _LogC)
    sign_C: jax.Array | None = None

    def __call__(self, t, y: dict, args) -> dict:
        if self.counter is not None:
            jax.debug.callback(self.counter)
        if self.sign_C is None:
            g = jax.grad(self.stage_loss)(y)
            return {b: -self.scale[b] * g[b] for b in y}
        return _LogC.field(self, y)


class _CarriedPID(diffrax.AbstractAdaptiveStepSizeController):
    """diffrax's ``PIDController`` whose state also keeps the last proposed
    step, so a stage integrated one decade (one ``diffeqsolve``) at a time
    continues each solve with the step size and error history the previous
    one ended with, instead of restarting the controller (a fresh start
    guesses a step, usually far too small late in a stage, and climbs back
    with rejections: it doubled the vector-field evaluations of a run).

    The state is ``(pid_state, dt)``; ``dt <= 0`` means "no previous solve":
    the PID controller's own initial-step heuristic is used.
    """

    pid: diffrax.PIDController

    @property
    def rtol(self):
        return self.pid.rtol

    @property
    def atol(self):
        return self.pid.atol

    @property
    def norm(self):
        return self.pid.norm

    def wrap(self, direction):
        return _CarriedPID(self.pid.wrap(direction))

    def init(self, terms, t0, t1, y0, dt0, args, func, error_order):
        tnext, st = self.pid.init(terms, t0, t1, y0, dt0, args, func, error_order)
        return tnext, (st, tnext - t0)

    def adapt_step_size(self, t0, t1, y0, y1_candidate, args, y_error, error_order, controller_state):
        st, dt_prev = controller_state
        keep, nt0, nt1, jump, st, result = self.pid.adapt_step_size(
            t0, t1, y0, y1_candidate, args, y_error, error_order, st
        )
        # An accepted step shorter than the step proposed before it was clipped to the end of the
        # solve: its own proposal reflects the clipped length, so keep the larger of the two.
        clipped = keep & (t1 - t0 < dt_prev * (1 - 1e-9))
        dt = jnp.where(clipped, jnp.maximum(nt1 - nt0, dt_prev), nt1 - nt0)
        return keep, nt0, nt1, jump, (st, dt), result


# --- joint flow in log-selector coordinates (sgd branch: issue 15) -------------------------------


class _LogC:
    """The joint flow with the selector in log coordinates ``ℓ_S = log|C_S|``.

    Exact change of variables (not an approximation): ``∂L/∂C_S = 2 C_S ∂L/∂c_S``
    (``c = C²``), so ``C_S = 0`` is invariant, ``C_S`` never changes sign, and
    ``dℓ_S/dt = (dC_S/dt)/C_S = −2 η_C ∂L/∂c_S``. In C the losing sets decay like
    ``C_S ∝ e^{−λ_S t}`` with ``λ_S ∝ 1/‖C‖²`` (hundreds at the paper's c₀ = 0.01,
    since the flow keeps ‖C‖ fixed: the loss depends on C only through c/Σc), a stiff
    mode an explicit solver must resolve at every step; in ℓ the same decay is a
    straight line ``ℓ_S ≈ ℓ_S(0) − λ_S t`` whose Jacobian vanishes with ``c_S``.

    The field is evaluated at ``max(ℓ, ℓ_floor)`` with ``e^{2ℓ_floor} =
    tiny^{1/2}`` (1e-154 in float64, 1e-19 in float32), so that
    ``c_S``'s share of Σc is far below rounding (its effect on the loss is exactly
    zero in floating point) while ``∂L/∂c_S = g_S/(2C_S)`` stays finite after ``c_S``
    would underflow. Components with ``C_S = 0`` (sign 0) stay 0, as in the flow.
    """

    @staticmethod
    def floor(dtype) -> float:
        return float(0.25 * np.log(np.finfo(np.dtype(dtype)).tiny))

    @staticmethod
    def to_log(C):
        C = np.asarray(C)
        tiny = np.finfo(C.dtype).tiny
        return np.sign(C), np.log(np.maximum(np.abs(C), tiny)).astype(C.dtype)

    @staticmethod
    def from_log(sign, ell):
        return np.asarray(sign) * np.exp(np.asarray(ell))

    @staticmethod
    def field(vf, y: dict) -> dict:
        ell = y["C"]
        lo = _LogC.floor(ell.dtype)
        Cc = vf.sign_C * jnp.exp(jnp.maximum(ell, lo))
        g = jax.grad(vf.stage_loss)({**y, "C": Cc})
        safe = jnp.where(vf.sign_C != 0, Cc, 1.0)
        dell = jnp.where(vf.sign_C != 0, -vf.scale["C"] * g["C"] / safe, 0.0)
        return {b: (dell if b == "C" else -vf.scale[b] * g[b]) for b in y}


# ---------------------------------------------------------------------------------------------------


def _event_value(stage: str, y: dict, delta: float, heads: tuple[int, ...]):
    """Real-valued event function, crossing zero upwards at the stage's event."""
    if stage == "I":
        c = y["C"] ** 2
        return jnp.max(c / c.sum()) - (1.0 - delta)
    # Stage II: every head h of the selected set attends to offset h.
    s = jax.nn.softmax(y["w"], axis=-1)
    return jnp.min(jnp.stack([s[h - 1, h - 1] for h in heads])) - (1.0 - delta)


# ---------------------------------------------------------------------------
# One segment: a single diffeqsolve
# ---------------------------------------------------------------------------


def _fresh_carry(dtype):
    """The controller carry of a stage's first solve: no previous step."""
    one = jnp.asarray(1.0, dtype)
    return ((one, one, jnp.asarray(False)), jnp.asarray(0.0, jnp.float64))


@eqx.filter_jit
def _solve_segment(vf, y0, t0, t1, ts, dt0, carry, *, method, rtol, atol, max_steps, delta, event_stage, heads,
                   progress):  # fmt: skip
    """One ``diffeqsolve`` over ``[t0, t1]`` saving at ``ts`` (and ``t1``).

    ``carry`` is the step-size controller's state at the end of the previous
    solve of the stage (:func:`_fresh_carry` for the first); the controller
    state at the end of this one is returned. Only solver settings are static,
    so runs that differ in durations, seeds, data or time scales reuse the
    compiled solve.
    """
    controller_state = None
    if method == "gd":
        solver, controller = diffrax.Euler(), diffrax.ConstantStepSize()
    else:
        solver = diffrax.Tsit5() if method == "tsit5" else diffrax.Kvaerno5()
        controller = _CarriedPID(diffrax.PIDController(rtol=rtol, atol=atol))
        term = diffrax.ODETerm(vf)
        pid_state, dt_prev = carry
        # the previous solve's last proposed step, or (first solve) the PID heuristic; lax.cond
        # evaluates only the branch taken, so a continued solve spends no evaluations here
        dt0 = jax.lax.cond(
            dt_prev > 0,
            lambda: dt_prev,
            lambda: controller.init(term, t0, t1, y0, None, None, solver.func, solver.error_order(term))[1][1],
        )
        dt0 = jnp.minimum(dt0, t1 - t0)
        controller_state = (pid_state, dt0)
    event = None
    if event_stage is not None:
        fn = lambda t, y, args, **kw: _event_value(event_stage, y, delta, heads)  # noqa: E731
        if method == "gd":
            # gradient descent stops at the first iterate where the condition holds
            event = diffrax.Event(lambda t, y, args, **kw: fn(t, y, args) >= 0)
        else:
            event = diffrax.Event(fn, root_finder=optx.Newton(rtol=1e-12, atol=1e-12), direction=True)
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(vf),
        solver,
        t0,
        t1,
        dt0,
        y0,
        saveat=diffrax.SaveAt(ts=ts, t1=True, controller_state=method != "gd"),
        stepsize_controller=controller,
        controller_state=controller_state,
        event=event,
        max_steps=max_steps,
        # never differentiated through: a plain while loop (no checkpointing machinery)
        adjoint=diffrax.ForwardMode(),
        throw=False,
        progress_meter=diffrax.TqdmProgressMeter() if progress else diffrax.NoProgressMeter(),
    )
    return sol.ts, sol.ys, sol.result, sol.stats, (carry if method == "gd" else sol.controller_state)


@eqx.filter_jit
def _stats_at(loss: PopulationLoss, ys: Params):
    st = jax.lax.map(loss.stats, ys)
    return st


# ---------------------------------------------------------------------------
# Save grids
# ---------------------------------------------------------------------------


def _grid(t0: float, t_end: float, cfg: Config) -> np.ndarray:
    """Saved times of a stage in ``(t0, t_end]``: ``t0 + τ`` with τ on a
    logarithmic grid of ``save_per_decade`` points a decade from ``tau_min``
    (each stage's clock starts at its start), ending exactly at ``t_end``; on
    multiples of η for "gd"."""
    sc = cfg.solver
    dur = t_end - t0
    k = sc.save_per_decade
    n = max(1, int(np.floor(k * np.log10(dur / sc.tau_min) + 1e-9)) + 1) if dur > sc.tau_min else 1
    g = t0 + sc.tau_min * 10.0 ** (np.arange(n) / k)
    g = np.append(g[g < t_end], t_end)
    if sc.is_gd:
        # whole steps only: the stage takes ⌈(t_end − t0)/η⌉ steps (its end is
        # rounded up to the next iterate), and every saved time is an iterate
        eta = sc.eta
        k0 = round(t0 / eta)
        n_end = max(1, int(np.ceil((t_end - t0) / eta - 1e-9)))
        m = np.clip(np.round((g - t0) / eta), 1, n_end)
        g = (k0 + np.unique(np.append(m, n_end))) * eta
    return np.unique(g)


def _segments(grid: np.ndarray, size: int) -> list[np.ndarray]:
    """Split the grid into solves of ``size`` points (a decade), each padded
    with its end: every solve of every run with the same solver settings has
    one shape, so it compiles once."""
    parts = [grid[i : i + size] for i in range(0, len(grid), size)]
    return [np.concatenate([p, np.full(size - len(p), p[-1])]) for p in parts]


# ---------------------------------------------------------------------------
# integrate
# ---------------------------------------------------------------------------


def _plan(cfg: Config) -> list[tuple[str, float]]:
    if cfg.schedule.kind == "joint":
        return [("joint", cfg.schedule.t1)]
    return list(zip(("I", "II", "III"), cfg.schedule.durations))


def _params_from(traj: Trajectory, i: int, dtype) -> Params:
    st = traj.state(i)
    return Params(w=jnp.asarray(st["w"], dtype), C=jnp.asarray(st["C"], dtype), a=jnp.asarray(st["a"], dtype))


def integrate(
    config: Config = Config(),
    *,
    out: str | Path | None = None,
    resume: bool = False,
    overwrite: bool = False,
    loss: PopulationLoss | None = None,
    params0: Params | None = None,
    verbose: bool = False,
) -> Trajectory:
    """Integrate the gradient flow of ``config`` and return its trajectory.

    **Arguments:**

    - `config`: the run (``Config()`` is the paper's default staged run).
    - `out`: a folder; if given, ``trajectory.npz`` and ``run.json`` are
      written there after every segment.
    - `resume`: continue the run saved in `out` from its last saved state, up
      to the (possibly later) end times of ``config`` — e.g. a longer Stage
      III. The data, model, initialisation, estimator, solver method and
      schedule kind must equal the saved run's.
    - `overwrite`: allow writing over a run already saved in `out` (without
      it, that is an error: a finished run is never replaced silently).
    - `loss`: an estimator to reuse (default: ``make_loss`` from the config's
      seed; passing the same one to several runs compares them on one sample).
    - `params0`: the initial θ (default: the paper's initialisation).
    - `verbose`: print a line per segment.

    **Returns:** a :class:`~gflow.trajectory.Trajectory`.

    **Raises:** :class:`FlowError` (with the partial trajectory) when a
    stage's solve fails or its vector field is not finite.
    """
    cfg = config
    dtype = cfg.estimator.jdtype
    out = None if out is None else Path(out)
    t_wall = time.perf_counter()
    plan = _plan(cfg)
    # Everything that can be wrong with the request is checked before sampling.
    if resume:
        if out is None:
            raise ValueError("resume=True needs the run folder `out`")
        traj = load(out)
        _check_resumable(traj.config, cfg)
    else:
        if out is not None and (out / "run.json").exists() and not overwrite:
            raise ValueError(
                f"{str(out)!r} already holds a run: resume it (resume=True, `gflow run --resume`) "
                "or pass overwrite=True (`--overwrite`)"
            )
        if params0 is None:
            params0 = init_params(cfg.model, cfg.init, dtype=dtype)
        _check_params(params0, cfg)
    if loss is None:
        loss = make_loss(cfg.data, cfg.model, cfg.estimator)

    if resume:
        traj.config = cfg
        y = _params_from(traj, -1, dtype)
        t = float(traj.ts[-1])
        wall0 = traj.wall
    else:
        y = Params(**{b: jnp.asarray(getattr(params0, b), dtype) for b in ("w", "C", "a")})
        t = 0.0
        wall0 = 0.0
        H, M = cfg.model.H, cfg.model.M
        traj = Trajectory.empty(cfg, H, M, len(cfg.model.subsets))
        traj.versions = versions()
        _append(traj, loss, np.zeros(1), {b: np.asarray(getattr(y, b))[None] for b in ("w", "C", "a")},
                stage_index=_stage_index(plan[0][0]))  # fmt: skip

    for name, duration in plan:
        rec = next((r for r in traj.stages if r.name == name), None)
        if rec is not None and rec.complete:
            new_end = rec.t0 + duration
            last = traj.stages[-1] is rec
            if rec.ended_by == "event" or new_end <= rec.t1 * (1 + 1e-12) or not last:
                continue  # nothing to extend
            rec.complete = False
        if rec is None:
            rec = StageRecord(name=name, moves=list(_STAGES[name]), t0=t, t1=t)
            if name == "II":
                sel = traj.c_frac[-1].argmax()
                rec.selected = list(traj.subsets[sel])
            traj.stages.append(rec)
        y, t = _run_stage(traj, rec, loss, cfg, y, t, rec.t0 + duration, out, verbose, wall0, t_wall)

    traj.status = "complete"
    traj.wall = wall0 + time.perf_counter() - t_wall
    if out is not None:
        save(traj, out)
    return traj


def _check_params(p: Params, cfg: Config) -> None:
    shapes = {"w": (cfg.model.H, cfg.model.M), "C": (len(cfg.model.subsets),), "a": ()}
    for b, shape in shapes.items():
        x = np.asarray(getattr(p, b))
        if x.shape != shape or not np.all(np.isfinite(x)):
            raise ValueError(f"params0.{b} must be a finite array of shape {shape} for this model, got {x.shape}")
    if not np.any(np.asarray(p.C) != 0):
        raise ValueError("params0.C must not be all zero (c = C² would have Σc = 0)")


def _stage_index(name: str) -> int:
    return {"I": 1, "II": 2, "III": 3, "joint": 0}[name]


def _check_resumable(old: Config, new: Config) -> None:
    a, b = old.to_dict(), new.to_dict()
    for sec in ("data", "model", "init", "estimator"):
        if a[sec] != b[sec]:
            raise ValueError(f"cannot resume: [{sec}] differs from the saved run's ({a[sec]} != {b[sec]})")
    for key in ("method",):
        if a["solver"][key] != b["solver"][key]:
            raise ValueError(f"cannot resume: solver.{key} differs from the saved run's")
    if a["schedule"]["kind"] != b["schedule"]["kind"]:
        raise ValueError("cannot resume: schedule.kind differs from the saved run's")


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
        st = jax.device_get(_stats_at(loss, Params(**blk)))
        parts.append(jax.tree.map(lambda x: np.asarray(x)[:m], st))
    _append_rows(traj, ts, ys, jax.tree.map(lambda *xs: np.concatenate(xs), *parts), stage_index=stage_index)


def _append_rows(traj: Trajectory, ts: np.ndarray, ys: dict, st, *, stage_index: int) -> None:
    """Append saved states and their statistics (a numpy ``LossStats`` with a leading axis)."""
    traj.append(
        ts=ts, stage=np.full(len(ts), stage_index), w=ys["w"], C=ys["C"], a=ys["a"],
        loss=st.loss, loss_se=st.loss_se, unseen=st.unseen,
        grad_w=st.grad.w, grad_C=st.grad.C, grad_a=st.grad.a,
        grad_se_w=st.grad_se.w, grad_se_C=st.grad_se.C, grad_se_a=st.grad_se.a,
        grad_norm=st.grad_norm,
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
            for b in ("w", "C", "a")}  # fmt: skip
    return ts[keep], full, all(np.all(np.isfinite(v)) for v in full.values())


def _failure(result, ok: bool, sc, name: str) -> str:
    """Why a stage's solve failed (``ok``: the solver itself succeeded, so the state went non-finite)."""
    why = diffrax.RESULTS[result] if not ok else "the state became non-finite"
    return f"{why} (solver {sc.method_for(name)}, rtol={sc.rtol}, atol={sc.atol}, max_steps={sc.max_steps} per segment)"


@eqx.filter_jit
def _stage_start(loss: PopulationLoss, y: Params, moves: tuple[str, ...]):
    """The stage's loss with its frozen work done, and whether ∇L̂ is finite at the start."""
    g = loss.grad(y)
    finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(g)]))
    return StageLoss(loss, y, moves), finite


def _run_stage(traj, rec: StageRecord, loss, cfg: Config, y: Params, t: float, t_end: float, out, verbose,
               wall0, t_wall):  # fmt: skip
    name = rec.name
    idx = _stage_index(name)
    t_stage = time.perf_counter()
    wall_before, nfev_before = rec.wall, rec.nfev
    _NFEV[0] = 0
    counter = _NFEV

    moves = _STAGES[name]
    dtype = cfg.estimator.jdtype
    heads = tuple(rec.selected or ())
    event_stage = None
    if cfg.schedule.events and (name == "I" or (name == "II" and heads)):
        event_stage = name

    def fail(msg, t_fail):
        rec.ended_by = "failed"
        rec.t1 = float(traj.ts[-1])
        rec.wall = wall_before + time.perf_counter() - t_stage
        rec.nfev = nfev_before + counter[0]
        traj.status = f"failed: Stage {name} at t = {t_fail:.6g}: {msg}"
        traj.wall = wall0 + time.perf_counter() - t_wall
        if out is not None:
            save(traj, out)
        raise FlowError(msg, stage=name, t=t_fail, trajectory=traj, out=out)

    # Checked before the (possibly long) solve: a non-finite field fails at once.
    sl, finite0 = _stage_start(loss, y, moves)
    if not bool(finite0):
        fail("the gradient of the loss is not finite at the stage's start "
             "(e.g. estimator.eps = 0 with tokens absent from a context)", t)  # fmt: skip
    vf = _VectorField(stage_loss=sl, scale=_scales(cfg, moves, dtype), counter=_count_evaluation)
    y_np = {b: np.asarray(getattr(y, b)) for b in ("w", "C", "a")}
    # (η_C = 0: C is constant, kept in C so that it stays bit for bit)
    log_c = (name == "joint" and cfg.solver.method_for(name) != "gd" and cfg.solver.joint_coords == "log"
             and cfg.schedule.eta_C > 0)  # fmt: skip
    if log_c:  # sgd branch: the selector in log coordinates (see _LogC)
        sign_C = _LogC.to_log(y_np["C"])[0]
        vf = eqx.tree_at(lambda v: v.sign_C, vf, jnp.asarray(sign_C, dtype), is_leaf=lambda x: x is None)
    if event_stage is not None and float(_event_value(name, y_np, cfg.schedule.delta, heads)) >= 0:
        rec.ended_by, rec.complete, rec.t1 = "event", True, t
        rec.wall = wall_before + time.perf_counter() - t_stage
        return y, t

    grid = _grid(rec.t0, t_end, cfg)
    grid = grid[grid > t * (1 + 1e-12)]
    ended_by = "duration"
    carry = _fresh_carry(dtype)
    for seg in _segments(grid, cfg.solver.save_per_decade) if len(grid) else []:
        y_moving = {b: jnp.asarray(y_np[b], dtype) for b in moves}
        if log_c:
            y_moving["C"] = jnp.asarray(_LogC.to_log(y_np["C"])[1], dtype)
        sc = cfg.solver
        f64 = lambda x: jnp.asarray(x, dtype=jnp.float64)  # noqa: E731
        ts, ys, result, stats, carry = _solve_segment(
            vf, y_moving, f64(t), f64(float(seg[-1])), f64(seg), f64(sc.eta), carry,
            method=sc.method_for(name), rtol=sc.rtol, atol=sc.atol, max_steps=sc.max_steps,
            delta=cfg.schedule.delta, event_stage=event_stage, heads=heads, progress=sc.progress,
        )  # fmt: skip
        ts, ys, result, stats = jax.device_get((ts, ys, result, stats))
        if log_c:
            ys = {**ys, "C": _LogC.from_log(sign_C, ys["C"])}
        rec.steps += int(stats["num_accepted_steps"])
        rec.rejected += int(stats["num_rejected_steps"])
        ts_kept, full, finite = _kept_rows(ts, ys, t, y_np, moves)
        if finite and len(ts_kept):
            _append(traj, loss, ts_kept, full, stage_index=idx)
        ok = result == diffrax.RESULTS.successful or result == diffrax.RESULTS.event_occurred
        if not ok or not finite:
            fail(_failure(result, ok, cfg.solver, name), float(traj.ts[-1]))
        if len(ts_kept):
            y_np = {b: v[-1] for b, v in full.items()}
            t = float(ts_kept[-1])
        rec.t1 = t
        rec.nfev = nfev_before + counter[0]
        rec.wall = wall_before + time.perf_counter() - t_stage
        traj.wall = wall0 + time.perf_counter() - t_wall
        if verbose:
            print(f"  stage {name}: t = {t:.4g}, loss = {traj.loss[-1]:.6f}, steps = {rec.steps}, "
                  f"nfev = {rec.nfev}, {rec.wall:.1f} s", flush=True)  # fmt: skip
        if result == diffrax.RESULTS.event_occurred:
            ended_by = "event"
            break
        if out is not None:
            save(traj, out)
    rec.ended_by = ended_by
    rec.complete = True
    rec.t1 = t
    rec.nfev = nfev_before + counter[0]
    rec.wall = wall_before + time.perf_counter() - t_stage
    if out is not None:
        save(traj, out)
    y = Params(**{b: jnp.asarray(v, dtype) for b, v in y_np.items()})
    return y, t
