"""The sections of a configuration (``[schedule]``, ``[solver]``, ``[sgd]``, ``[sde]``; the
data, model, initialisation and estimator sections are gflow.core's) and :class:`Config`."""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import equinox as eqx
import numpy as np

from ..core import MAX_RELABEL_D, DataConfig, EstimatorConfig, InitConfig, ModelConfig, check_positions
from ._limits import (
    LIMITS,
    MAX_KERNEL_DEPTH,
    MAX_SETS,
    check_limits,
    init_bounds,
    is_float,
    is_int,
    n_sets,
    short_repr,
)

_KINDS = ("staged", "joint")
_METHODS = ("tsit5", "kvaerno5", "heun", "gd", "modified", "central", "sgd", "sde")
METHODS = _METHODS  # every solver.method a configuration accepts (gflow run runs each)
# The stochastic methods: R seeds (``sgd.seeds``) of a noisy training run, not one flow. ``gflow run``
# and ``gflow.integrate`` run them (a trajectory with a seed axis); the flow integrators do not.
STOCHASTIC_METHODS = ("sgd", "sde")
_SAMPLINGS = ("fresh", "fixed", "replace")
_SHARDS = ("none", "seeds", "batch")
_JOINT_COORDS = ("log", "C")


def _floats(x) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in x)
    except TypeError:
        return (float(x),)


class ScheduleConfig(eqx.Module):
    """Which parameter blocks move, and for how long (docs/theory/mathematics.md §M4).

    - `kind`: ``"staged"`` (the paper: Stage I moves only C, Stage II only w,
      Stage III only a) or ``"joint"`` (extension: all blocks at once with
      time scales ``eta_w, eta_C, eta_a``).
    - `durations`: staged only; the maximal duration of each stage, in flow
      time. Defaults ``(1e3, 1e10, 1e4)``: Stages I and II normally end at
      their events (Stage II is slow, its rate proportional to ``a0``, so its
      cap is generous); Stage III runs its whole duration, by default well
      past the time ``~e^{a*}/C*`` (a few hundred at the default) at which a
      settles at the finite-L fixed point a*, after which nothing moves. Stage k starts where stage k−1 ended.
    - `delta`: the event threshold δ. Stage I ends when
      ``max_S c_S/Σc >= 1 − δ``; Stage II when ``s^(h)_h >= 1 − δ`` for every
      head h of the selected set. Default ``0.01``.
    - `events`: end Stages I and II at their events (default) or only at
      their durations.
    - `t1`: joint only; the end time (default ``1e6``).
    - `eta_w`, `eta_C`, `eta_a`: per-block time scales Λ (joint; the staged
      schedule uses them too, as the speed of the block that moves). All 1.
    """

    kind: Literal["staged", "joint"] = eqx.field(static=True, default="staged")
    durations: tuple[float, ...] = eqx.field(static=True, default=(1e3, 1e10, 1e4), converter=_floats)
    delta: float = eqx.field(static=True, default=0.01)
    events: bool = eqx.field(static=True, default=True)
    t1: float = eqx.field(static=True, default=1e6)
    eta_w: float = eqx.field(static=True, default=1.0)
    eta_C: float = eqx.field(static=True, default=1.0)
    eta_a: float = eqx.field(static=True, default=1.0)

    def __check_init__(self):
        if self.kind not in _KINDS:
            raise ValueError(f"schedule.kind must be one of {_KINDS}, got {self.kind!r}")
        if len(self.durations) != 3 or not all(math.isfinite(x) and x > 0 for x in self.durations):
            raise ValueError(
                f"schedule.durations must be three finite positive times (Stages I, II, III), got {self.durations}"
            )
        if not 0 < self.delta < 1:
            raise ValueError(f"schedule.delta must be in (0, 1), got {self.delta!r}")
        if not isinstance(self.events, bool):
            raise ValueError(f"schedule.events must be true or false, got {self.events!r}")
        if not (math.isfinite(self.t1) and self.t1 > 0):
            raise ValueError(f"schedule.t1 must be a finite positive time, got {self.t1!r}")
        for name in ("eta_w", "eta_C", "eta_a"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"schedule.{name} must be a finite number >= 0, got {v!r}")


class SolverConfig(eqx.Module):
    """How the ODE is integrated.

    - `method`: ``"tsit5"`` (default; adaptive explicit, PID step control),
      ``"kvaerno5"`` (adaptive implicit, for stiff stages; the ODE state is
      only the moving block, so its Jacobian is small), ``"heun"`` (adaptive explicit of
      order 2, Euler's step its error estimate: for a field with switching surfaces, like the
      Full model's relu⟨u_q, u_l⟩, where a higher order gains nothing across a switch and
      Tsit5's error estimate stalls on them; docs/results/official-full.md) or ``"gd"``
      (extension: discrete gradient descent ``θ_{k+1} = θ_k − η Λ ∇L̂(θ_k)``,
      i.e. explicit Euler with the constant step ``eta``, on ``t = kη``).
      ``"modified"`` (extension, docs/theory/mathematics.md §M9): GD's first-order modified flow
      ``dθ/dt = −Λg − (η/2) Λ H Λ g`` at GD's step ``eta`` (``g = ∇L̂``, ``H = ∇²L̂``
      through a Hessian-vector product: about two gradients per evaluation in the counts
      and sparse layouts, docs/theory/mathematics.md §M9), integrated by Tsit5 like the flow with the
      same tolerances, stages, events and coordinates; ``eta = 0`` is the flow.
      ``"central"`` (extension, docs/theory/central-flow.md): GD's central flow at the step
      ``eta`` (Cohen, Damian et al. 2025), the flow that GD follows on average once an
      eigenvalue of ``ΛH`` reaches the edge ``2/η``: the flow below the edge, then
      ``dθ/dt = −Λ[∇L̂ + ½ Σ X_ij ∇(u_iᵀHu_j)]`` with the oscillation's covariance X holding
      up to `edge_eigs` eigenvalues at the edge; integrated by Tsit5 like the flow (a dense
      Hessian and third-derivative products per evaluation).
      One name for every stage, or a list of three, one per stage
      (``["tsit5", "tsit5", "kvaerno5"]``); "gd", "modified" and "central" are all or nothing.
      ``"sgd"`` and ``"sde"`` (extensions, joint schedule only, all or nothing; the
      stochastic methods :data:`STOCHASTIC_METHODS`): online SGD with step ``eta`` to
      ``schedule.t1`` (``⌈t1/η⌉`` steps, as GD), and its diffusion limit, the SDE (the
      stochastic modified equation of that SGD), each over ``sgd.seeds`` seeds with the
      settings of the ``[sgd]`` and ``[sde]`` sections (:class:`SGDSection`,
      :class:`SDESection`). ``gflow run`` and ``gflow.integrate`` run them and return a
      trajectory with a seed axis (:attr:`gflow.Trajectory.per_seed`); the same runs as
      :func:`gflow.sgd` and :func:`gflow.sde` of the configuration. Replicates, sweeps
      and ``gflow.integrate_batch`` integrate flows only and refuse them.
    - `rtol`, `atol`: tolerances of the adaptive step control (defaults
      ``1e-8``, ``1e-10``).
    - `max_steps`: per segment of a stage (default ``100_000``).
    - `eta`: the step of ``"gd"``, ``"sgd"`` and the central flow ``"central"`` (``> 0``)
      and of the modified flow ``"modified"`` (``>= 0``) (default ``0.1``). GD takes whole steps
      only: a stage of duration T takes ``⌈T/η⌉`` steps (it ends at the first
      iterate at or after its nominal end), a stage's event ends it at the
      first iterate where the condition holds, and saved times are rounded to
      iterates.
    - `save_per_decade`: saved times per decade of each stage's own time
      ``τ = t − t0`` (default 12), on a logarithmic grid from `tau_min` to the
      stage's duration, plus every stage boundary (an event's time).
    - `tau_min`: the first saved τ of every stage (default ``1e-3``).
      Each decade is one solve, after which the trajectory is written to
      disk, so an interrupted run resumes from its last completed decade.
    - `save_times`: explicit times t (on the run's clock, each > 0) saved beside the
      logarithmic grid, as diffrax's ``SaveAt(ts=...)`` (default none); each is saved in
      the stage that holds it, times after the run's end are not reached. They cut the
      solves where they fall, so the trajectory agrees with the one without them to the
      solver's tolerance, not bit for bit. A time chosen after the run: ``gflow.dense_solution``.
      Not for ``"sgd"``/``"sde"`` (their saved steps are a grid of steps).
    - `progress`: show diffrax's tqdm progress meter.
    - `joint_coords`: ``"log"`` (default) integrates the joint schedule's selector as
      ``ℓ = log|C|`` (an exact change of variables that removes the stiff decay of the
      losing weights; CHANGELOG.md, the joint flow in log coordinates), ``"C"`` in C itself.
      Adaptive solvers of the joint schedule with ``eta_C > 0`` only; GD always steps in C.
    - `stiff_switch`: when tsit5 meets a stiff stretch in a stage of the staged schedule —
      its last step would take more than 10,000 steps over the next decade of saves, or it ran
      out of ``max_steps`` in one — redo that decade from its last saved point and go on with
      kvaerno5 (default ``true``). A stiff flow holds the explicit step at its stability bound
      while each decade is ten times longer: the ``value`` member's Stage III (a sits at a
      fast-attracting zero of −∂L̂/∂a: its value matrices carry the classifier's scale) and,
      with a LayerNorm, its Stage II. The stage record says so (``StageRecord.solver``,
      ``solver_from``), as do the report's run line and ``gflow run``'s summary; ``false``: the
      stage fails (exit 3) with advice. The joint schedule and ``integrate_batch`` do not switch.
    - `edge_eigs`: the most eigenvalues of ``ΛH`` the central flow holds at the edge at once
      (an integer ``>= 1``, default 2; ``"central"`` only): each held eigenvalue costs a
      third-derivative product per pair, and a further one past the edge is not held (the
      run's report says when that happened).
    """

    method: str | tuple[str, str, str] = eqx.field(
        static=True, default="tsit5", converter=lambda m: m if isinstance(m, str) else tuple(m)
    )
    rtol: float = eqx.field(static=True, default=1e-8)
    atol: float = eqx.field(static=True, default=1e-10)
    max_steps: int = eqx.field(static=True, default=100_000)
    eta: float = eqx.field(static=True, default=0.1)
    save_per_decade: int = eqx.field(static=True, default=12)
    tau_min: float = eqx.field(static=True, default=1e-3)
    save_times: tuple[float, ...] = eqx.field(static=True, default=(), converter=lambda v: tuple(v))
    progress: bool = eqx.field(static=True, default=False)
    joint_coords: str = eqx.field(static=True, default="log")
    edge_eigs: int = eqx.field(static=True, default=2)
    stiff_switch: bool = eqx.field(static=True, default=True)

    def method_for(self, stage: str) -> str:
        """The solver used for a stage (``"I"``, ``"II"``, ``"III"``; ``"joint"``
        uses the first name of a list)."""
        if isinstance(self.method, str):
            return self.method
        return self.method[{"I": 0, "II": 1, "III": 2}.get(stage, 0)]

    @property
    def is_gd(self) -> bool:
        return self.method_for("I") == "gd"

    @property
    def is_stochastic(self) -> bool:
        """``"sgd"`` or ``"sde"``: R seeds of a noisy run (:data:`STOCHASTIC_METHODS`)."""
        return self.method_for("I") in STOCHASTIC_METHODS

    @property
    def models_gd(self) -> bool:
        """Whether the run models GD at the step ``eta`` ("gd" itself, its modified flow
        "modified" or its central flow "central"), so that it is not the gradient flow (‖C‖
        grows, for one)."""
        return self.method_for("I") in ("gd", "modified", "central")

    def __check_init__(self):
        names = (self.method,) if isinstance(self.method, str) else self.method
        if not isinstance(self.method, str) and len(names) != 3:
            raise ValueError(
                f"solver.method as a list needs one entry per stage (three: Stages I, II, III), got "
                f"{list(names)!r}; give one name (a string) for every stage, e.g. {names[0]!r}"
                if names else "solver.method as a list needs one entry per stage (three: Stages I, II, III), got []"
            )
        if any(m not in _METHODS for m in names):
            raise ValueError(
                f"solver.method must be one of {_METHODS} or a list of three of them (Stages I, II, III), "
                f"got {self.method!r}"
            )
        for m in ("gd", "modified", "central", *STOCHASTIC_METHODS):
            if m in names and len(set(names)) > 1:
                raise ValueError(f"solver.method: {m!r} cannot be mixed with ODE solvers, got {self.method!r}")
        for name in ("rtol", "atol"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"solver.{name} must be a finite number > 0, got {v!r}")
        # the modified flow's η may be 0 (the flow itself); a step of GD or SGD may not
        lo_ok = (lambda v: v >= 0) if "modified" in names else (lambda v: v > 0)
        if not (isinstance(self.eta, (int, float)) and math.isfinite(self.eta) and lo_ok(self.eta)):
            bound = ">= 0 with solver.method = 'modified'" if "modified" in names else "> 0"
            raise ValueError(f"solver.eta must be a finite number {bound}, got {self.eta!r}")
        if not (isinstance(self.tau_min, (int, float)) and math.isfinite(self.tau_min) and self.tau_min > 0):
            raise ValueError(f"solver.tau_min must be a finite number > 0, got {self.tau_min!r}")
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0
                   for x in self.save_times):  # fmt: skip
            raise ValueError(f"solver.save_times must be a list of finite times > 0, got {list(self.save_times)!r}")
        if self.save_times and self.is_stochastic:
            raise ValueError(f"solver.save_times must be empty for solver.method = {self.method!r} (SGD and the SDE "
                             f"save on a grid of steps, sgd.save_per_decade), got {list(self.save_times)!r}")  # fmt: skip
        for name, lo in (("max_steps", 1), ("save_per_decade", 1), ("edge_eigs", 1)):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < lo:
                raise ValueError(f"solver.{name} must be an integer >= {lo}, got {v!r}")
        if self.joint_coords not in _JOINT_COORDS:
            raise ValueError(f"solver.joint_coords must be one of {_JOINT_COORDS}, got {self.joint_coords!r}")
        for name in ("progress", "stiff_switch"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"solver.{name} must be true or false, got {getattr(self, name)!r}")


def _check_count(sec: str, obj, name: str, lo: int) -> None:
    v = getattr(obj, name)
    if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < lo:
        raise ValueError(f"{sec}.{name} must be an integer >= {lo}, got {v!r}")


def check_sgd_sampling(sampling, shard) -> None:
    """``sgd.sampling`` and ``sgd.shard``, and their one rule (``shard = "batch"`` splits fresh
    batches); shared by the ``[sgd]`` section and :class:`gflow.SGDConfig`."""
    if sampling not in _SAMPLINGS:
        raise ValueError(f"sgd.sampling must be one of {_SAMPLINGS}, got {sampling!r}")
    if shard not in _SHARDS:
        raise ValueError(f"sgd.shard must be one of {_SHARDS}, got {shard!r}")
    if shard == "batch" and sampling != "fresh":
        raise ValueError(f"sgd.shard = 'batch' splits fresh batches: it needs sgd.sampling = 'fresh', "
                         f"got {sampling!r} (use sgd.shard = 'seeds')")  # fmt: skip


class SGDSection(eqx.Module):
    """The ``[sgd]`` section: the stochastic runs (``solver.method = "sgd"`` or ``"sde"``).

    The step η is ``solver.eta``, the end ``schedule.t1``, the saved steps
    ``solver.save_per_decade`` a decade of the step count; this section says what a
    deterministic run does not have (ignored by the flows and GD):

    - `batch`: sequences per step B (default 1000); the SDE models the SGD of this B
      (noise scale ``√(η/B)``). ``<= estimator.N`` with ``sampling = "fixed"``.
    - `seeds`: independent runs R (default 8), vmapped; the trajectory's seed axis.
    - `seed`: base PRNG seed (default 0): seed r draws its batches (SGD) or its
      Brownian motion (SDE) from ``fold_in(key(seed), r)``, so seed r's run does not
      depend on R.
    - `sampling`: SGD's batches: ``"fresh"`` (default: online SGD, B new sequences a
      step), ``"fixed"`` (without replacement from the fixed sample, epoch by epoch)
      or ``"replace"`` (B i.i.d. draws from the fixed sample); :mod:`gflow.sgd`.
    - `shard`: ``"none"`` (default), ``"seeds"`` or ``"batch"``: how SGD splits its work
      over the devices (:class:`gflow.SGDConfig`).
    """

    batch: int = eqx.field(static=True, default=1000)
    seeds: int = eqx.field(static=True, default=8)
    seed: int = eqx.field(static=True, default=0)
    sampling: str = eqx.field(static=True, default="fresh")
    shard: str = eqx.field(static=True, default="none")

    def __check_init__(self):
        for name in ("batch", "seeds"):
            _check_count("sgd", self, name, 1)
        _check_count("sgd", self, "seed", 0)
        check_sgd_sampling(self.sampling, self.shard)


class SDESection(eqx.Module):
    """The ``[sde]`` section: the diffusion limit of ``[sgd]``'s SGD (``solver.method = "sde"``;
    its η, B, R and seed are ``solver.eta``, ``sgd.batch``, ``sgd.seeds``, ``sgd.seed``).

    - `dt`: the Euler–Maruyama step (default ``0``: ``η/4``).
    - `noise`: multiplies the diffusion (default 1: the SDE; 0: the gradient flow).
    - `sigma_sample`: ``0`` (default: the gradient covariance Σ from the whole fixed
      sample) or M, ``1 <= M <= estimator.N``: Σ from its first M sequences.
    """

    dt: float = eqx.field(static=True, default=0.0)
    noise: float = eqx.field(static=True, default=1.0)
    sigma_sample: int = eqx.field(static=True, default=0)

    def __check_init__(self):
        for name in ("dt", "noise"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"sde.{name} must be a finite number >= 0, got {v!r}")
        _check_count("sde", self, "sigma_sample", 0)


class Config(eqx.Module):
    """A whole run: one section per concern. ``Config()`` is the paper's default."""

    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    init: InitConfig = InitConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    solver: SolverConfig = SolverConfig()
    estimator: EstimatorConfig = EstimatorConfig()
    sgd: SGDSection = SGDSection()
    sde: SDESection = SDESection()

    def __check_init__(self):
        check_limits(self.to_dict())  # before anything below computes a size from them
        m = self.model
        if n_sets(m.H + (1 if m.family.token_component else 0), m.D) > MAX_SETS:
            raise ValueError(
                f"model.H = {m.H} with model.D = {m.D} gives more than {MAX_SETS} selectable sets of heads "
                f"(|𝒮| = Σ_(r <= D) C(H, r)); lower model.D or model.H"
            )
        big, gap = init_bounds(self.estimator.dtype)
        for name in ("a0", "w_plus", "w_minus"):
            v = float(getattr(self.init, name))
            if not abs(v) <= big:
                raise ValueError(
                    f"init.{name} must satisfy |{name}| <= {big:.6g} = ln(largest {self.estimator.dtype}) "
                    f"(e^{name} must be finite), got {v!r}"
                )
        if not abs(float(self.init.w_plus) - float(self.init.w_minus)) <= gap:
            raise ValueError(
                f"init.w_plus and init.w_minus must satisfy |w_plus − w_minus| <= {gap:.6g} = −ln(smallest normal "
                f"{self.estimator.dtype}) (every attention weight ≈ e^−|w_plus − w_minus| a normal number), got "
                f"w_plus = {self.init.w_plus!r}, w_minus = {self.init.w_minus!r}"
            )
        if self.solver.method_for("I") in ("gd", "sgd"):  # whole steps of eta: their number must be an exact float
            T = self.schedule.t1 if self.schedule.kind == "joint" else max(self.schedule.durations)
            if not T / self.solver.eta <= 2.0**53:
                raise ValueError(
                    f"solver.eta = {self.solver.eta!r} is too small for a run of duration {T!r} (schedule.durations / "
                    f"schedule.t1): more than 2^53 steps of {self.solver.method_for('I')!r}"
                )
        self._check_stochastic()
        if self.model.member == "edelman" and self.estimator.loss != "ce_on_probs":  # its output is logits
            raise ValueError("model.member = 'edelman' outputs logits: estimator.loss must be 'ce_on_probs' (their "
                             f"cross-entropy), got {self.estimator.loss!r}")  # fmt: skip
        check_positions(self.data, self.model, self.estimator)
        if self.estimator.relabel and self.data.d > MAX_RELABEL_D:
            raise ValueError(f"estimator.relabel averages over the d! relabellings of the tokens and needs "
                             f"data.d <= {MAX_RELABEL_D}, got data.d = {self.data.d}")  # fmt: skip
        if self.model.windows == "shifted" and self.schedule.kind == "staged" and self.schedule.events:
            # the Stage II event reads s^(h)_h (aligned windows); shifted head h's own offset is w[h-1, 0]
            raise ValueError(
                "model.windows = 'shifted' with schedule.kind = 'staged' needs schedule.events = false "
                "(the Stage II event is defined for aligned windows), or schedule.kind = 'joint'"
            )
        if self.model.span == self.model.M and self.model.H > self.model.M:  # heads start on their own offsets 1..H
            raise ValueError(
                f"model.H must be <= model.M for the paper's initialisation, got H={self.model.H}, M={self.model.M}"
            )
        # c_S = c0² must be a normal, finite number of the run's dtype: c0 = 1e-200 gave c = 0
        # (Σc = 0, a non-finite gradient blamed on estimator.eps)
        fi = np.finfo(self.estimator.dtype)
        c0 = abs(float(self.init.c0))
        lo, hi = math.sqrt(float(fi.tiny)), math.sqrt(float(fi.max) / len(self.model.subsets))
        if not lo <= c0 <= hi:
            raise ValueError(
                f"init.c0 must satisfy {lo:.3g} <= |c0| <= {hi:.3g} with estimator.dtype = {self.estimator.dtype!r} "
                f"(c_S = c0² and Σc must be normal finite numbers), got {self.init.c0!r}"
            )

    def _check_stochastic(self) -> None:
        """A stochastic method's settings that depend on other sections (before any compute)."""
        m = self.solver.method_for("I")
        if m not in STOCHASTIC_METHODS:
            return
        if self.schedule.kind != "joint":
            raise ValueError(
                f"solver.method = {m!r} needs schedule.kind = 'joint' (SGD moves every block at every step), "
                f"got schedule.kind = {self.schedule.kind!r}"
            )
        if self.estimator.shard or self.estimator.chunk:
            raise ValueError(f"solver.method = {m!r} does not support estimator.shard or estimator.chunk "
                             f"(sgd.shard splits SGD's work over the devices)")  # fmt: skip
        N = self.estimator.N
        if m == "sgd" and self.sgd.sampling == "fixed" and self.sgd.batch > N:
            raise ValueError(f"sgd.batch = {self.sgd.batch} must be <= estimator.N = {N} for sgd.sampling = 'fixed'")
        if m == "sde" and self.sde.sigma_sample > N:
            raise ValueError(f"sde.sigma_sample = {self.sde.sigma_sample} must be <= estimator.N = {N} (0: all of it)")

    def replace(self, **sections) -> Config:
        """A copy with some fields changed: ``cfg.replace(data={"L": 40})``."""
        d = self.to_dict()
        for sec, vals in sections.items():
            check_names(sec, vals)  # before the update: the suggestion looks among the keys not given
            d[sec].update(vals)
        return from_dict(d)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain (TOML/JSON-serialisable) dictionary of every field."""
        out = {}
        for sec in SECTIONS:
            obj = getattr(self, sec)
            vals = {}
            for f in dataclasses.fields(obj):
                v = getattr(obj, f.name)
                if f.name == "kernel":
                    v = None if v is None else v.array.tolist()
                elif isinstance(v, tuple):
                    v = list(v)
                elif isinstance(v, np.generic):
                    v = v.item()
                vals[f.name] = v
            out[sec] = vals
        return out


SECTIONS = {
    "data": DataConfig,
    "model": ModelConfig,
    "init": InitConfig,
    "schedule": ScheduleConfig,
    "solver": SolverConfig,
    "estimator": EstimatorConfig,
    "sgd": SGDSection,
    "sde": SDESection,
}

# ---------------------------------------------------------------------------
# Types of every key (checked before any section is built)
# ---------------------------------------------------------------------------


class KeyType(NamedTuple):
    """An accepted type: `expected` is what an error message says was expected."""

    expected: str
    ok: Callable[[Any], bool]






_INT = KeyType("an integer (not a float or a bool)", is_int)
_FLOAT = KeyType("a finite number (not a string or a bool)", is_float)
_BOOL = KeyType("true or false", lambda v: isinstance(v, (bool, np.bool_)))
_STR = KeyType("a string", lambda v: isinstance(v, str))
_INTS = KeyType(
    "an integer or a list of integers (not floats or bools)",
    lambda v: is_int(v) or (isinstance(v, (list, tuple)) and all(is_int(x) for x in v)),
)
_FLOATS = KeyType(
    "a list of finite numbers", lambda v: isinstance(v, (list, tuple)) and all(is_float(x) for x in v)
)
_STRS = KeyType(
    "a string or a list of strings",
    lambda v: isinstance(v, str) or (isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v)),
)
_MATRIX = KeyType("a (nested) list of finite numbers", lambda v: kernel_problem(v) is None)

# The type of every configuration key. To add a key: add the field (with its default and its range
# check in ``__check_init__``) to the section's class, and ONE line here, ``"section.key": _TYPE``;
# tests/test_config.py checks that every field of every section has a line. Ranges and allowed
# values are checked by the section classes, after the types. Keys listed here that a section does
# not have are still rejected as unknown (lines for keys other branches add are harmless).
KEY_TYPES: dict[str, KeyType] = {
    "data.d": _INT,
    "data.parents": _INTS,
    "data.alpha": _FLOAT,
    "data.L": _INT,
    "data.start": _STR,
    "data.burn_in": _INT,
    "data.kernel": _MATRIX,
    "data.kind": _STR,
    "data.prior": _STR,
    "data.graph": KeyType("a graph name, a list of integers or a list of lists of integers",
                          lambda v: isinstance(v, str) or (isinstance(v, (list, tuple)) and all(
                              is_int(x) or (isinstance(x, (list, tuple)) and all(is_int(y) for y in x))
                              for x in v))),
    "data.graph_seed": _INT,
    "data.graph_parents": _INT,
    "data.triggers": _INT,
    "data.trigger_mode": _STR,
    "data.bigram_seed": _INT,
    "model.M": _INT,
    "model.H": _INT,
    "model.D": _INT,
    "model.norm": _STR,
    "model.head_norm": _BOOL,
    "model.windows": _STR,
    "model.member": _STR,
    "model.token_form": _STR,
    "model.token_init": _FLOAT,
    "model.value_init": _FLOAT,
    "model.layernorm": _BOOL,
    "model.proj_init": _FLOAT,
    "model.omega0": _FLOAT,
    "model.random_init": _FLOAT,
    "init.w_plus": _FLOAT,
    "init.w_minus": _FLOAT,
    "init.c0": _FLOAT,
    "init.a0": _FLOAT,
    "schedule.kind": _STR,
    "schedule.durations": _FLOATS,
    "schedule.delta": _FLOAT,
    "schedule.events": _BOOL,
    "schedule.t1": _FLOAT,
    "schedule.eta_w": _FLOAT,
    "schedule.eta_C": _FLOAT,
    "schedule.eta_a": _FLOAT,
    "solver.method": _STRS,
    "solver.rtol": _FLOAT,
    "solver.atol": _FLOAT,
    "solver.max_steps": _INT,
    "solver.eta": _FLOAT,
    "solver.save_per_decade": _INT,
    "solver.tau_min": _FLOAT,
    "solver.save_times": _FLOATS,
    "solver.progress": _BOOL,
    "solver.joint_coords": _STR,
    "solver.edge_eigs": _INT,
    "solver.stiff_switch": _BOOL,
    "estimator.N": _INT,
    "estimator.seed": _INT,
    "estimator.eps": _FLOAT,
    "estimator.loss": _STR,
    "estimator.dtype": _STR,
    "estimator.layout": _STR,
    "estimator.chunk": _INT,
    "estimator.shard": _BOOL,
    "estimator.target": _STR,
    "estimator.relabel": _BOOL,
    "estimator.positions": _STR,
    "sgd.batch": _INT,
    "sgd.seeds": _INT,
    "sgd.seed": _INT,
    "sgd.sampling": _STR,
    "sgd.shard": _STR,
    "sde.dt": _FLOAT,
    "sde.noise": _FLOAT,
    "sde.sigma_sample": _INT,
}



def kernel_problem(v) -> str | None:
    """Why `v` is not a rectangular nested list of finite numbers at most :data:`MAX_KERNEL_DEPTH`
    deep (``None`` if it is one); iterative, so any depth is answered without recursion."""
    if v is None:
        return None
    if isinstance(v, np.ndarray):
        if v.dtype.kind not in "iuf":
            return f"an array of numbers, got dtype {v.dtype}"
        if v.ndim > MAX_KERNEL_DEPTH:
            return f"at most {MAX_KERNEL_DEPTH} levels of lists deep, got {v.ndim}"
        return None if np.all(np.isfinite(v)) else "finite numbers (no NaN or infinity)"
    shape: list[int] = []
    level = [v]
    while level and isinstance(level[0], (list, tuple)):
        if len(shape) >= MAX_KERNEL_DEPTH:
            return f"at most {MAX_KERNEL_DEPTH} levels of lists deep ((d**k, d) or (d,)*k + (d,))"
        n = len(level[0])
        if n == 0:
            return "a non-empty (nested) list of numbers"
        if any(not isinstance(x, (list, tuple)) or len(x) != n for x in level):
            return f"rectangular (every list at depth {len(shape) + 1} of the same length {n}, no number beside a list)"
        shape.append(n)
        level = [y for x in level for y in x]
    if not shape:
        return "a (nested) list of finite numbers, not a single value"
    if not all(is_float(x) for x in level):
        return "a (nested) list of finite numbers (no strings, bools, NaN or infinities)"
    return None


def check_type(sec: str, key: str, v) -> Any:
    """``v`` if it has the key's type (ints of float keys become floats) and, for an integer key,
    lies within :data:`LIMITS`, else ``ValueError`` naming the key, the value given and what was
    expected."""
    name = f"{sec}.{key}"
    t = KEY_TYPES.get(name)
    if t is None:  # a field without a line in the table: its class checks it
        return v
    if t is _MATRIX:
        why = kernel_problem(v)
        if why is not None:
            raise ValueError(f"{name} must be {why}, got {short_repr(v)}")
        return v
    if not t.ok(v):
        raise ValueError(f"{name} must be {t.expected}, got {short_repr(v)} ({type(v).__name__})")
    if name in LIMITS:
        check_limits({sec: {key: v}})
    if t is _FLOAT:
        return float(v)
    if t is _FLOATS:
        return [float(x) for x in v]
    return v


def did_you_mean(name: str, allowed, section: str | None = None, given=()) -> str:
    """``" (did you mean 'x'?)"`` for the closest allowed names (``difflib``, cutoff 0.6), or
    ``""``; for a key, also the same key in another section (``data.N`` → ``estimator.N``)."""
    close = [c for c in difflib.get_close_matches(name, list(allowed), n=2, cutoff=0.6) if c not in given]
    if section is not None:
        close = [f"{section}.{c}" for c in close]
        close += [f"{s}.{name}" for s, cls in SECTIONS.items()
                  if s != section and name in {f.name for f in dataclasses.fields(cls)}]  # fmt: skip
    if not close:
        return ""
    return " (did you mean " + " or ".join(repr(c) for c in close) + "?)"


def check_names(sec: str, vals) -> None:
    """A ``ValueError`` for an unknown section `sec`, or (`vals` a table) an unknown key of it,
    naming it with the closest allowed names (:func:`did_you_mean`, among the keys not given)."""
    if sec not in SECTIONS:
        raise ValueError(f"unknown config section {sec!r}{did_you_mean(sec, SECTIONS)}; allowed: {sorted(SECTIONS)}")
    if isinstance(vals, dict):
        allowed = [f.name for f in dataclasses.fields(SECTIONS[sec])]
        for k in vals:
            if k not in allowed:
                raise ValueError(f"unknown config key {sec}.{k}{did_you_mean(k, allowed, sec, vals)}; "
                                 f"allowed keys of [{sec}]: {allowed}")  # fmt: skip


def from_dict(d: dict[str, Any]) -> Config:
    """Build a :class:`Config` from nested dictionaries; unknown sections or
    keys, and values of the wrong type (:data:`KEY_TYPES`), raise
    ``ValueError`` naming them. Missing fields take their defaults."""
    if not isinstance(d, dict):
        raise ValueError(f"a configuration must be a table of sections, got {type(d).__name__}")
    kwargs = {}
    for sec, vals in d.items():
        check_names(sec, vals)
        if not isinstance(vals, dict):
            raise ValueError(f"config section {sec!r} must be a table of keys, got {vals!r}")
        cls = SECTIONS[sec]
        vals = {k: check_type(sec, k, v) for k, v in vals.items()}
        try:
            kwargs[sec] = cls(**vals)
        except (TypeError, ValueError, OverflowError) as e:
            msg = str(e)
            if f"{sec}." not in msg:
                msg = f"bad value in [{sec}] (keys {sorted(vals)}): {msg}"
            raise ValueError(msg) from None
    try:
        return Config(**kwargs)
    except (TypeError, OverflowError) as e:
        raise ValueError(f"bad configuration: {e}") from None
