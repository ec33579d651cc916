"""What every check row reads (docs/theory/mathematics.md §M7): the run, its theory and estimator
(:class:`Ctx`), the contrast λ of the model's kernel on a GIH's match
indicator, and the jitted per-sequence force and loss of the model."""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._util import bracketed_root, mean_se, rows_of_stage
from ..core import Params, PopulationLoss, member_of, subset_label
from ..dynamics import block_scales
from ..theory import Theory, rate_symbol, set_gih
from ..trajectory import Trajectory, selected_set
from ._report import Row

# Event threshold slack: diffrax locates the event with a Newton root find at
# rtol = atol = 1e-12; the event function at the located time is within
# rounding of 0.
EVENT_SLACK = 1e-9


def own(model, h: int) -> int:
    """Index in ``s[h−1]`` of head h's weight on its own offset h (``h − 1`` for
    aligned windows, ``0`` for shifted ones; the aligned layout if `model` is ``None``)."""
    return h - 1 if model is None else model.own_offset_index(h)


def contrast(s, c_frac, S, sets, model=None) -> float:
    """The contrast ``λ = (c_S/Σc)·Π_{h∈S} (s^(h)_h)²`` of the model's kernel
    on the GIH's match indicator on offsets S (see the module docstring).
    ``λ = 1`` exactly when the copier is one-hot on S and ``c = e_S``.

    `s` is the copier attention ``(H, M)``, `c_frac` ``c/Σc`` in the order of `sets`;
    `model` (a :class:`~gflow.ModelConfig`) says where head h's own offset
    sits in ``s[h−1]`` (default: the aligned windows, index ``h − 1``).
    """
    S = tuple(S)
    lam = float(np.asarray(c_frac)[list(sets).index(S)])
    for h in S if model is None else member_of(model).heads_of(S):  # a member's set: its attention heads
        lam *= float(np.asarray(s)[h - 1, own(model, h)]) ** 2
    return lam


def first_layer(tr, i, dt):
    """The trajectory's first layer at saved index `i` (w, and a member's extra blocks) as arrays of
    dtype `dt`, for the model functions below (``gflow.Trajectory.first_layer``)."""
    return jax.tree.map(lambda v: jnp.asarray(v, dt), tr.first_layer(i))


@eqx.filter_jit
def model_force_per_seq(loss: PopulationLoss, w, C, a):
    """``−∂ℓ_n/∂a`` for every sequence at θ = (w, C, a) (`w`: the first layer, an array or the
    dict of a member's blocks, :func:`first_layer`)."""
    f = lambda aa: loss.per_sequence(Params.assemble(w, C, aa))
    return -jax.jvp(f, (a,), (jnp.ones_like(a),))[1]


@eqx.filter_jit
def model_loss_per_seq(loss: PopulationLoss, w, C, a):
    return loss.per_sequence(Params.assemble(w, C, a))


@eqx.filter_jit
def model_force_grid(loss: PopulationLoss, w, C, a_grid):
    """``F(a) = −∂L̂/∂a`` (mean over sequences) at θ = (w, C, a) for every a of `a_grid`."""
    mean_loss = lambda aa: jnp.mean(loss.per_sequence(Params.assemble(w, C, aa)))
    return jax.lax.map(lambda aa: -jax.grad(mean_loss)(aa), a_grid)


@eqx.filter_jit
def model_dforce(loss: PopulationLoss, w, C, a):
    """``∂F/∂a = −∂²L̂/∂a²`` at θ = (w, C, a)."""
    mean_loss = lambda aa: jnp.mean(loss.per_sequence(Params.assemble(w, C, aa)))
    return -jax.grad(jax.grad(mean_loss))(a)


@eqx.filter_jit
def model_grad(loss: PopulationLoss, blocks: dict) -> dict:
    """``∇L̂`` at θ given by its `blocks` (name → array), as a dict of the same blocks."""
    return jax.grad(lambda bl: loss(Params.from_blocks(bl)))(blocks)


def attention_velocity(cfg, loss: PopulationLoss, blocks: dict, moves) -> np.ndarray:
    """``d/dτ`` of each head's query attention over its offsets, ``(H, M)``, along the flow
    ``dθ/dτ = −Λ ∇L̂`` that moves the blocks `moves` (Λ: ``η_w``, ``η_C`` or ``η_a`` by the
    block's group), at θ given by `blocks`: the member's own gradient pushed through its
    ``query_attention`` by a Jacobian-vector product."""
    dt = loss.eps.dtype
    blocks = {b: jnp.asarray(v, dt) for b, v in blocks.items()}
    g = model_grad(loss, blocks)
    scale = block_scales(cfg, tuple(moves), dt)
    v = {b: -scale[b] * g[b] if b in moves else jnp.zeros_like(g[b]) for b in blocks}
    return np.asarray(jax.jvp(member_of(cfg.model).query_attention, (blocks,), (v,))[1], np.float64)


def model_zero(loss: PopulationLoss, w, C, a_from: float, a_max: float, *, spacing: float = 0.25) -> float | None:
    """The zero ``a°`` of the model's force ``F(a) = −∂L̂/∂a`` at fixed (w, C) that the
    one-dimensional flow ``da/dτ ∝ F(a)`` started at `a_from` settles at: the first
    down-crossing of F above `a_from` (if ``F(a_from) < 0`` the flow moves down,
    and the nearest zero below `a_from` is returned; ``a_from`` if ``F(a_from) = 0``).
    Grid of `spacing` on ``[a_from, a_max]``, then Newton's method safeguarded by the
    bracket (:func:`gflow._util.bracketed_root`, with ``F'`` by automatic differentiation) on the
    exact sample mean to ``1e-12``. ``None`` when F > 0 on the whole grid (no finite
    zero up to `a_max`)."""
    dt = loss.eps.dtype
    w, C = jax.tree.map(lambda v: jnp.asarray(v, dt), w), jnp.asarray(C, dt)
    f = lambda x: float(model_force_grid(loss, w, C, jnp.asarray([x], dt))[0])
    df = lambda x: float(model_dforce(loss, w, C, jnp.asarray(x, dt)))
    f0 = f(a_from)
    if f0 > 0:
        n = max(int(math.ceil((a_max - a_from) / spacing)), 1)
        grid = np.linspace(a_from, max(a_max, a_from + spacing), n + 1)
        F = np.asarray(model_force_grid(loss, w, C, jnp.asarray(grid, dt)), np.float64)
        down = np.flatnonzero((F[:-1] > 0) & (F[1:] <= 0))
        if down.size == 0:
            return None
        j = int(down[0])
        return bracketed_root(f, df, float(grid[j]), float(grid[j + 1]), float(F[j]))
    if f0 == 0:
        return float(a_from)
    lo, step = float(a_from), spacing  # F(a_from) < 0: the flow moves down to the zero below
    while lo - step > -a_max:
        flo = f(lo - step)
        if flo > 0:
            return bracketed_root(f, df, lo - step, lo, flo)
        lo, step = lo - step, 2.0 * step
    return None


def sample_se(x) -> float:
    """The standard error of the mean of `x` (:func:`gflow._util.mean_se`), as a float."""
    return float(mean_se(np.ravel(np.asarray(x, np.float64)))[1])


def set_label(S) -> str:
    return "—" if S is None else subset_label(tuple(S))


def moved_away(measured: float, ref: float, by: float) -> float:
    """``measured`` moved by `by` away from `ref` (a wrong answer that cannot
    come back inside a tolerance centred on `ref`)."""
    return float(measured) + (by if float(measured) >= float(ref) else -by)


class Ctx:
    def __init__(self, traj: Trajectory, theory: Theory, loss: PopulationLoss, k_se: float):
        self.traj, self.th, self.loss, self.k_se = traj, theory, loss, float(k_se)
        self.cfg = traj.config
        self.sets = traj.subsets
        self.nS = len(self.sets)
        self.joint = self.cfg.schedule.kind == "joint"
        # not the flow: GD or its modified flow (‖C‖ grows), SGD or the SDE (discrete noisy steps); no
        # adaptive solver's error budget for a's frozen zero
        self.gd = self.cfg.solver.models_gd or self.cfg.solver.is_stochastic
        self.delta = self.cfg.schedule.delta
        self.S_star, self.argmax_J = theory.S_star, theory.argmax_J
        # the Stage I rate's name: J for the paper's model, G for another member (the same
        # −∂L̂/∂a at a = 0, c = e_S, of the member's own loss: L̂ ≈ L₀ − a·G(c) at small a)
        self.rate = rate_symbol(self.cfg.model.member)
        self.selected = selected_set(traj)
        self.rows: list[Row] = []
        self.skipped: list[str] = []
        self.notes: list[str] = []
        self._gih: dict = {}

    def gih(self, S):
        """The GIH of the model's set `S`: of the parent offsets the set reads (a member's set
        names its heads or components, ``AbstractModel.set_offsets``: the residual member's
        {0,2} reads offsets {1,2}), as :meth:`gflow.Theory.with_law` builds its law."""
        S = tuple(S)
        if S not in self._gih:
            self._gih[S] = set_gih(self.loss, S)
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
