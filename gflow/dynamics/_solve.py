"""The compiled solve of one stage's decade (docs/theory/mathematics.md §M4–§M5): the vector field,
its evaluation counters, the step-size controller carried across solves, the
events (and the steady ending), the joint flow's log coordinates, the save
grids, and one ``diffeqsolve``. :mod:`gflow.dynamics._flow` drives it.
"""

from __future__ import annotations

import itertools

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx

from ..config import Config
from ..core import Params, PopulationLoss, StageLoss, grad_hvp, has_table, member_of
from ._central import central_field

# ---------------------------------------------------------------------------
# Vector field and events
# ---------------------------------------------------------------------------


def block_scales(cfg: Config, moves: tuple[str, ...], dtype) -> dict:
    """The time scale Λ of every moving block: ``η_w``, ``η_C`` or ``η_a`` by the block's
    group (a member's extra blocks belong to one of the three, ``AbstractModel.block_group``)."""
    # arrays, not static floats: runs that differ only in (η_w, η_C, η_a) share the compiled solve
    eta = {"w": cfg.schedule.eta_w, "C": cfg.schedule.eta_C, "a": cfg.schedule.eta_a}
    group = member_of(cfg.model).block_group
    return {b: jnp.asarray(eta[group(b)], dtype) for b in moves}


# Vector-field evaluations. Two ways to count them:
#
# - in the program (the single driver with "tsit5" or "gd"): an explicit solver's evaluations
#   are a known function of what the solve did (see solve_segment's ``nfev``), computed from
#   diffrax's step counts and the controller state. The compiled program then has no host
#   callback, so JAX's persistent compilation cache can keep it: a program with a callback is
#   never written to that cache (the callback is a pointer into the process), and the three
#   stage solves were recompiled on every warm start;
# - on the host (implicit solvers, whose Newton iterations vary, and the batched driver): one
#   counter per stage run; the field carries its run's tag (an array leaf, so tags do not
#   recompile the solve) and a debug callback adds one to that tag's count per evaluation.
#   Under vmap the callback is called once per replicate with its own tag, so each replicate
#   of a batch counts the evaluations of the batched field.
#
# tests/test_flow.py checks that both ways give the same count.
COUNTS: dict[int, int] = {}
_TAGS = itertools.count()


def new_tag() -> int:
    tag = next(_TAGS)
    COUNTS[tag] = 0
    return tag


def _tick(tag) -> None:
    t = int(tag)
    if t in COUNTS:
        COUNTS[t] += 1


class VectorField(eqx.Module):
    """``−Λ ∇L̂`` restricted to the moving blocks: the ODE state is the dict of
    moving blocks only, so frozen blocks stay bit-for-bit fixed and an
    implicit solver's Jacobian is only as large as what moves.

    With `eta_mod` (``solver.method = "modified"``, docs/theory/mathematics.md §M9) the field is GD's
    first-order modified flow ``−Λg − (η/2) Λ H Λ g`` (``g = ∇L̂``, ``H = ∇²L̂``,
    both of the stage loss: the moving blocks only, so ``Λ`` is the stage's mask),
    its Hessian-vector product ``H(Λg)`` by the κ table's structure in the counts and
    sparse layouts (:func:`gflow.core.grad_hvp`), else from ``jax.linearize`` of the
    gradient (one gradient and one tangent pass); no Hessian is formed. ``eta_mod = 0``
    gives ``−Λg`` (the flow, to rounding)."""

    stage_loss: StageLoss
    scale: dict
    tag: jax.Array | None = None  # the run's evaluation counter (see new_tag); None: not counted

    # joint schedule: when given, y["C"] is ℓ = log|C| and C = sign_C·e^ℓ (see LogC)
    sign_C: jax.Array | None = None

    # GD's step η of the modified flow (an array: runs that differ in η share the compiled solve);
    # None: the gradient flow
    eta_mod: jax.Array | None = None

    # GD's step η of the central flow (``solver.method = "central"``, gflow.dynamics._central) and
    # the most eigenvalues it holds at the edge (``solver.edge_eigs``); None: not the central flow
    edge_eta: jax.Array | None = None
    edge_k: int = eqx.field(static=True, default=2)

    def __call__(self, t, y: dict, args) -> dict:
        if self.tag is not None:
            jax.debug.callback(_tick, self.tag)
        if self.sign_C is None:
            return self.theta_field(y)
        return LogC.field(self, y)

    def theta_field(self, x: dict) -> dict:
        """The field in θ's own coordinates (C, not log|C|) at the moving blocks `x`."""
        if self.edge_eta is not None:
            return central_field(self.stage_loss, self.scale, x, self.edge_eta, self.edge_k)
        if self.eta_mod is None:
            g = jax.grad(self.stage_loss)(x)
            return {b: -self.scale[b] * g[b] for b in x}
        half = 0.5 * self.eta_mod
        sl = self.stage_loss
        if has_table(sl.loss):
            # the counts and sparse layouts: g and H(Λg) through the κ table's structure
            # (gflow.core.grad_hvp: two passes over the sample, about 1.9 gradients; the
            # linearised gradient below costs about 4.5). H is the whole θ's; Λ's mask
            # keeps the stage's blocks, so H(Λg) is the stage loss's Hessian times Λg.
            def direction(g: Params) -> Params:
                return Params.from_blocks({b: (self.scale[b] * g.get(b) if b in x else jnp.zeros_like(g.get(b)))
                                           for b in g.names})  # fmt: skip

            g, hv = grad_hvp(sl.loss, sl.full(x), direction)
            return {b: -self.scale[b] * g.get(b) - half * (self.scale[b] * hv.get(b)) for b in x}
        g, hvp = jax.linearize(jax.grad(sl), x)
        lg = {b: self.scale[b] * g[b] for b in x}
        hlg = hvp(lg)
        return {b: -lg[b] - half * (self.scale[b] * hlg[b]) for b in x}


def field_options(cfg: Config, stage: str, dtype) -> dict:
    """The keyword arguments of :class:`VectorField` that say which flow a stage integrates: GD's
    modified flow (``eta_mod``: GD's step η), its central flow (``edge_eta``: η, and ``edge_k``),
    or the flow (both ``None``)."""
    method = cfg.solver.method_for(stage)
    eta = jnp.asarray(cfg.solver.eta, dtype)
    return {"eta_mod": eta if method == "modified" else None, "edge_eta": eta if method == "central" else None,
            "edge_k": cfg.solver.edge_eigs}


#: The adaptive diffrax solvers of ``solver.method``: Tsit5 (5th order), Kvaerno5 (implicit, stiff stages),
#: Heun (2nd order with Euler's embedded error: a field with switching surfaces, the Full model's).
ADAPTIVE = {"tsit5": diffrax.Tsit5, "kvaerno5": diffrax.Kvaerno5, "heun": diffrax.Heun}


def ode_method(method: str) -> str:
    """The diffrax solver of a ``solver.method``: the modified and central flows are integrated by
    Tsit5."""
    return "tsit5" if method in ("modified", "central") else method


class _CarriedPID(diffrax.AbstractAdaptiveStepSizeController):
    """diffrax's ``PIDController`` whose state also keeps the last proposed
    step, so a stage integrated one decade (one ``diffeqsolve``) at a time
    continues each solve with the step size and error history the previous
    one ended with, instead of restarting the controller (a fresh start
    guesses a step, usually far too small late in a stage, and climbs back
    with rejections: it doubled the vector-field evaluations of a run).

    The state is ``(pid_state, dt, (accepted, n_first))``; ``dt <= 0`` means "no previous
    solve": the PID controller's own initial-step heuristic is used. ``accepted`` says
    whether this solve has accepted a step and ``n_first`` counts the steps rejected before
    its first accepted one (each re-evaluates the field at the solve's start: Tsit5 reuses
    its last stage only after an accepted step); only ``(pid_state, dt)`` is carried to the
    next solve.
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
        return tnext, (st, tnext - t0, _fresh_first())

    def adapt_step_size(self, t0, t1, y0, y1_candidate, args, y_error, error_order, controller_state):
        st, dt_prev, (accepted, n_first) = controller_state
        keep, nt0, nt1, jump, st, result = self.pid.adapt_step_size(
            t0, t1, y0, y1_candidate, args, y_error, error_order, st
        )
        # An accepted step shorter than the step proposed before it was clipped to the end of the
        # solve: its own proposal reflects the clipped length, so keep the larger of the two.
        clipped = keep & (t1 - t0 < dt_prev * (1 - 1e-9))
        dt = jnp.where(clipped, jnp.maximum(nt1 - nt0, dt_prev), nt1 - nt0)
        first = (accepted | keep, n_first + jnp.where(accepted | keep, 0, 1))
        return keep, nt0, nt1, jump, (st, dt, first), result


def _fresh_first():
    """``(accepted, n_first)`` of a solve that has taken no step (:class:`_CarriedPID`)."""
    return jnp.asarray(False), jnp.asarray(0, jnp.int32)


# --- joint flow in log-selector coordinates -------------------------------------------------------


class LogC:
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
        lo = LogC.floor(ell.dtype)
        Cc = vf.sign_C * jnp.exp(jnp.maximum(ell, lo))
        safe = jnp.where(vf.sign_C != 0, Cc, 1.0)
        if vf.eta_mod is None and vf.edge_eta is None:  # the flow, as it always was (bit for bit)
            g = jax.grad(vf.stage_loss)({**y, "C": Cc})
            dell = jnp.where(vf.sign_C != 0, -vf.scale["C"] * g["C"] / safe, 0.0)
            return {b: (dell if b == "C" else -vf.scale[b] * g[b]) for b in y}
        # the modified and central flows: the same field in θ pushed forward, dℓ_S/dt = (dC_S/dt)/C_S
        f = vf.theta_field({**y, "C": Cc})
        dell = jnp.where(vf.sign_C != 0, f["C"] / safe, 0.0)
        return {b: (dell if b == "C" else f[b]) for b in y}


# ---------------------------------------------------------------------------------------------------


def event_value(stage: str, y: dict, delta: float, heads: tuple[int, ...], member):
    """Real-valued event function, crossing zero upwards at the stage's event: Stage I, the
    largest of the selector's shares reaches ``1 − δ`` (the model's member reads its shares,
    ``c/Σc`` for the paper's); Stage II, the query's attention of every head h of the
    selected set on its own offset h."""
    if stage == "I":
        return jnp.max(member.shares(y)) - (1.0 - delta)
    # Stage II: every head h of the selected set attends to offset h.
    s = member.query_attention(y)
    own = member.model.own_offset_index
    return jnp.min(jnp.stack([s[h - 1, own(h)] for h in heads])) - (1.0 - delta)


def event_coordinates(stage: str, y: dict, heads: tuple[int, ...], member):
    """What a stage's event reads: the selector's shares (Stage I) or the attention rows
    ``s^(h)`` of the selected heads (Stage II)."""
    if stage == "I":
        return member.shares(y)
    s = member.query_attention(y)
    return jnp.stack([s[h - 1] for h in heads])


# A stage has settled when running it as long again would move its event's coordinates by less than
# this fraction of δ (the resolution at which the event reads them).
STEADY_FRACTION = 0.1


def _steady_cond(stage: str, heads: tuple[int, ...], delta: float, member):
    """Boolean steady-state condition of a stage with an event (extension):
    ``diffrax.steady_state_event`` (max norm, ``atol = STEADY_FRACTION·δ``,
    ``rtol = 0``) applied to ``τ·dφ/dt``, and ``τ‖dφ/dt‖ < STEADY_FRACTION·‖φ − φ₀‖``,
    where ``φ`` are the coordinates the event reads (:func:`event_coordinates`),
    ``dφ/dt = Jφ·f`` along the vector field ``f = −Λ∇L̂`` (the moving block's
    gradient times its time scale), ``τ = t − t_stage0`` the stage's elapsed
    time and ``φ₀`` the coordinates at the stage's start (the solve's ``args``
    are ``(t_stage0, φ₀)``).

    Why these choices: (i) the factor τ makes the test invariant under a
    rescaling of time — a stage that ran to τ has settled when running it as
    long again would change ``φ`` by less than the tolerance; diffrax's plain
    ``‖f‖ < atol + rtol‖y‖`` is not, and stops slow stages early or fast ones
    late. (ii) The second condition asks that the flow has decelerated: its
    rate is a tenth of its average rate ``‖φ − φ₀‖/τ`` so far (early in a slow
    stage ``τ‖dφ/dt‖ ≈ ‖φ − φ₀‖`` is small too, without any settling).
    (iii) ``φ``, not the logits ``w``: a copier approaching a face of the
    simplex (``s_i → 0``) has logits moving like ``log t`` (``τ‖ẇ‖`` stays of
    order one), so no tolerance on ``w`` ever ends such a stage. (iv) The
    tolerance ``δ/10``: an approach to the event like a power ``1 − s ~ τ^{−β}``
    has ``τ ṡ = β(1 − s) > βδ`` until the event fires, so only approaches
    slower than ``β = 1/10`` could be mistaken for steady; the solver's error
    (rtol ≈ 1e-8) is far below it.
    """
    def inf_norm(x):
        return jnp.max(jnp.abs(x))

    base = diffrax.steady_state_event(rtol=0.0, atol=STEADY_FRACTION * delta, norm=inf_norm)

    def cond(t, y, args, *, terms, **kwargs):
        t_stage0, phi0 = args
        tau = jnp.maximum(t - t_stage0, 0.0)
        f = terms.vf(t, y, args)
        phi, dphi = jax.jvp(lambda y_: event_coordinates(stage, y_, heads, member), (y,), (f,))
        rate = diffrax.ODETerm(lambda t_, y_, a_: tau * dphi)
        small = base(t, jnp.zeros_like(dphi), args, terms=rate, **kwargs)
        decelerated = tau * inf_norm(dphi) < STEADY_FRACTION * inf_norm(phi - phi0)
        # False at the stage's start (τ = 0), where diffrax also evaluates boolean conditions
        return (tau > 0) & small & decelerated

    return cond


# ---------------------------------------------------------------------------
# One segment: a single diffeqsolve
# ---------------------------------------------------------------------------


def fresh_carry(dtype):
    """The controller carry of a stage's first solve: no previous step."""
    # float64 whatever the state's dtype: diffrax's PID step leaves its state in the (float64) time
    # dtype, and the loop carry must keep its dtypes (a float32 state crashed here)
    one = jnp.asarray(1.0, jnp.float64)
    return ((one, one, jnp.asarray(False)), jnp.asarray(0.0, jnp.float64))


@eqx.filter_jit
def solve_segment(vf, y0, t0, t1, ts, dt0, carry, *, method, rtol, atol, max_steps, delta, event_stage, heads,
                   progress, steady=False, t_stage0=None):  # fmt: skip
    """One ``diffeqsolve`` over ``[t0, t1]`` saving at ``ts`` (and ``t1``).

    With ``steady`` (adaptive solvers, stages with an event), the solve also
    stops when the stage has settled (:func:`_steady_cond`; ``t_stage0`` is
    ``(stage start time, event coordinates there)``); ``stats["steady"]`` then says that this, not the stage's
    event, ended it.

    ``carry`` is the step-size controller's state at the end of the previous
    solve of the stage (:func:`fresh_carry` for the first); the controller
    state at the end of this one is returned. Only solver settings are static,
    so runs that differ in durations, seeds, data or time scales reuse the
    compiled solve.
    """
    controller_state = None
    if method == "gd":
        solver, controller = diffrax.Euler(), diffrax.ConstantStepSize()
    else:
        solver = ADAPTIVE[method]()
        controller = _CarriedPID(diffrax.PIDController(rtol=rtol, atol=atol))
        term = diffrax.ODETerm(vf)
        pid_state, dt_prev = carry
        # the previous solve's last proposed step, or (first solve) the PID heuristic; lax.cond
        # evaluates only the branch taken, so a continued solve spends no evaluations here
        dt0 = jax.lax.cond(
            dt_prev > 0,
            lambda: dt_prev,
            # y0 in the time dtype: diffrax's initial-step heuristic mixes y's and t's dtypes (float32 state)
            lambda: controller.init(
                term, t0, t1, jax.tree.map(lambda x: x.astype(t0.dtype), y0), None, None, solver.func,
                solver.error_order(term),
            )[1][1],
        )
        dt0 = jnp.minimum(dt0, t1 - t0)
        controller_state = (pid_state, dt0, _fresh_first())
    event = None
    if event_stage is not None:
        member = vf.stage_loss.loss.member
        fn = lambda t, y, args, **kw: event_value(event_stage, y, delta, heads, member)  # noqa: E731
        if method == "gd":
            # gradient descent stops at the first iterate where the condition holds
            event = diffrax.Event(lambda t, y, args, **kw: fn(t, y, args) >= 0)
        else:
            event = diffrax.Event(fn, root_finder=optx.Newton(rtol=1e-12, atol=1e-12), direction=True)
            if steady:
                event = diffrax.Event([fn, _steady_cond(event_stage, heads, delta, member)], root_finder=event.root_finder,
                                      direction=[True, None])  # fmt: skip
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(vf),
        solver,
        t0,
        t1,
        dt0,
        y0,
        args=t_stage0 if steady else None,
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
    stats = dict(sol.stats)
    if steady and event_stage is not None and method != "gd":
        event_fired, steady_fired = sol.event_mask
        stats = dict(stats, steady=steady_fired & ~event_fired)
    if method == "gd":
        stats["nfev"] = stats["num_steps"]  # Euler: one evaluation a step, none at the start
        return sol.ts, sol.ys, sol.result, stats, carry
    pid_state, dt_last, (accepted, n_first) = sol.controller_state
    if method == "tsit5":
        stats["nfev"] = _tsit5_nfev(stats["num_steps"], accepted, n_first, carry[1] > 0,
                                    steady and event_stage is not None)  # fmt: skip
    return sol.ts, sol.ys, sol.result, stats, (pid_state, dt_last)


def failure_reason(result, ok: bool, sc, name: str, moves=(), method: str | None = None, switching: bool = False) -> str:
    """Why a stage's solve failed (``ok``: the solver succeeded, the state went non-finite); a stiff Stage III's
    remedy, or a switching member's (``switching``: its field slides along switching surfaces). `method`: the
    stage's solver when not the configuration's (a stiff switch's)."""
    method = method or sc.method_for(name)
    why = diffrax.RESULTS[result] if not ok else "the state became non-finite"
    msg = f"{why} (solver {method}, rtol={sc.rtol}, atol={sc.atol}, max_steps={sc.max_steps} per segment)"
    if not ok and result == diffrax.RESULTS.max_steps_reached and switching and method != "gd":
        return msg + (". This model's field switches (a relu of its parameters in the second layer) and its flow slides "
                      "along a switching surface, where an adaptive solver's steps collapse: integrate it by a fixed "
                      "step, solver.method = 'gd' with solver.eta (first order; docs/results/official-full.md measures "
                      "the step's error)")  # fmt: skip
    if not ok and result == diffrax.RESULTS.max_steps_reached and tuple(moves) == ("a",) and method == "tsit5":
        msg += (". Stage III moves a alone: at a fast-attracting zero of −∂L̂/∂a (a member whose value matrices carry the "
                f"scale: `value`) it is stiff; integrate it implicitly: solver.method = ['{sc.method_for('I')}', "
                f"'{sc.method_for('II')}', 'kvaerno5']"
                + ("" if sc.stiff_switch else " (or solver.stiff_switch = true: go on with it when tsit5 stiffens)"))  # fmt: skip
    return msg


def _tsit5_nfev(num_steps, accepted, n_first, continued, steady):
    """The vector-field evaluations of one Tsit5 ``diffeqsolve`` of :func:`solve_segment`,
    from what it did (no host callback needed; tests/test_flow.py checks it against the
    host counter):

    - the PID controller's initial-step heuristic, 2 (``f(t0, y0)`` and one trial step),
      unless the solve continues the previous one's step (``continued``);
    - the first stage ``f(t0, y0)``, once per attempt up to the first accepted step
      (``n_first`` rejected attempts, and the accepted one): Tsit5 is "first same as
      last", so after an accepted step its last stage is the next step's first;
    - six new stages a step, accepted or rejected;
    - with the steady ending (:func:`_steady_cond`), one evaluation at the start and one
      after every step (the condition reads ``f``). When the steady ending fires, diffrax's
      event root-finder calls the condition again, but only for its boolean value, which it
      discards: that evaluation is dead code and is not executed (the host counter, whose
      callback keeps it alive, counts it: 3,680 against 3,679 on the steady Stage II of
      tests/test_laws.py).
    """
    start = n_first + jnp.where(accepted, 1, 0)
    n = jnp.where(continued, 0, 2) + start + 6 * num_steps
    return n + (1 + num_steps if steady else 0)


@eqx.filter_jit
def stats_at(loss: PopulationLoss, ys: Params):
    st = jax.lax.map(loss.stats, ys)
    return st


# ---------------------------------------------------------------------------
# Save grids
# ---------------------------------------------------------------------------


def save_grid(t0: float, t_end: float, cfg: Config) -> np.ndarray:
    """Saved times of a stage in ``(t0, t_end]``: ``t0 + τ`` with τ on a
    logarithmic grid of ``save_per_decade`` points a decade from ``tau_min``
    (each stage's clock starts at its start), ending exactly at ``t_end``, with the
    explicit ``solver.save_times`` inside it; on multiples of η for "gd"."""
    sc = cfg.solver
    dur = t_end - t0
    k = sc.save_per_decade
    n = max(1, int(np.floor(k * np.log10(dur / sc.tau_min) + 1e-9)) + 1) if dur > sc.tau_min else 1
    g = t0 + sc.tau_min * 10.0 ** (np.arange(n) / k)
    g = np.append(g[g < t_end], t_end)
    if sc.save_times:  # explicit times inside the stage, beside the log grid (diffrax's SaveAt(ts=...))
        x = np.asarray(sc.save_times, np.float64)
        g = np.union1d(g, x[(x > t0) & (x < t_end)])
    if sc.is_gd:
        # whole steps only: the stage takes ⌈(t_end − t0)/η⌉ steps (its end is
        # rounded up to the next iterate), and every saved time is an iterate
        eta = sc.eta
        k0 = round(t0 / eta)
        n_end = max(1, int(np.ceil((t_end - t0) / eta - 1e-9)))
        m = np.clip(np.round((g - t0) / eta), 1, n_end)
        g = (k0 + np.unique(np.append(m, n_end))) * eta
    return np.unique(g)


def split_segments(grid: np.ndarray, size: int) -> list[np.ndarray]:
    """Split the grid into solves of ``size`` points (a decade), each padded
    with its end: every solve of every run with the same solver settings has
    one shape, so it compiles once."""
    parts = [grid[i : i + size] for i in range(0, len(grid), size)]
    return [np.concatenate([p, np.full(size - len(p), p[-1])]) for p in parts]


def as_f64(x):
    return jnp.asarray(x, dtype=jnp.float64)
