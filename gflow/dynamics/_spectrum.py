"""The Hessian spectrum along a trajectory and GD's stability edge (docs/theory/mathematics.md §M9).

GD ``θ_{k+1} = θ_k − η Λ g`` (``g = ∇L̂``) is linearly stable near θ iff
``η < η_c(θ) = 2/λ_max(Λ^{1/2} H Λ^{1/2})``, ``H = ∇²L̂`` the Hessian of the run's
Monte Carlo loss on its fixed sample. ``Λ^{1/2} H Λ^{1/2}`` is symmetric and has
the eigenvalues of ``ΛH``; dim θ = H·M + |𝒮| + 1 (17 at the default), so it is
computed densely.

**What Λ is.** The diagonal of the step matrix at a saved state
(:func:`step_scales`):

- joint schedule: ``diag(η_w, η_C, η_a)`` (``schedule.eta_*``; the published run
  has Λ = I). A block with ``η_b = 0`` is frozen;
- staged schedule: the stage's mask times its block's speed. A state saved in
  Stage I has ``Λ = η_C`` on C and 0 on w and a; Stage II ``η_w`` on w; Stage III
  ``η_a`` on a (the first saved state, t = 0, belongs to Stage I). This is the
  ``Λ`` of the staged GD and of the staged modified flow.

A frozen block adds exact zeros to the spectrum (``ΛH`` has them); only the
moving coordinates' block ``Λ_m^{1/2} H_mm Λ_m^{1/2}`` is kept. In the counts and
sparse layouts (the default, and the official options') H is computed whole by the
κ table's structure (:func:`gflow.core.table_hessian`: one pass over the sample, its
per-sequence Hessian in the table's entries a diagonal plus a term of rank d + 2,
pulled back by the table's Jacobian; about 11 gradients at the default, against
2·dim θ = 34 for the Hessian-vector products below). Any other loss (the positions
and heads layouts, a test's function): the Hessian columns of the moving
coordinates, each a Hessian-vector product (forward mode over the gradient:
``jax.hessian``'s ``jacfwd(jacrev)`` restricted to those columns), all at once under
``vmap``.

The spectrum is of L̂ in θ's own coordinates (C, not the joint flow's log|C|): the
coordinates GD steps in.

**Scale invariance.** L̂ depends on C only through C/‖C‖, so ``C·g_C = 0`` and the
C-block of H scales like 1/‖C‖²: a small ‖C‖ (the paper's c₀ = 0.01) puts λ_max of
the joint Λ = I high, and GD with a fixed η past its edge until ‖C‖ has grown
(GD's ‖C_{k+1}‖² = ‖C_k‖² + η²λ_C²‖g_C‖²).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._util import STAGE_CODES
from ..config import Config
from ..core import (
    Params,
    PopulationLoss,
    flatten,
    has_table,
    init_params,
    make_loss,
    member_of,
    subset_label,
    table_hessian,
    unflatten,
)

_BLOCKS = ("w", "C", "a")
_STAGE_OF_CODE = {v: k for k, v in STAGE_CODES.items()}
_STAGES = ("I", "II", "III", "joint")


def _shapes(cfg: Config) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Every block of θ of the configured member with its shape, in flat θ's order (w, C, a,
    then the extra blocks sorted by name; ``gflow.core.flatten``)."""
    p = jax.eval_shape(lambda: init_params(cfg.model, cfg.init, d=cfg.data.d, L=cfg.data.L))
    return tuple((b, tuple(p.get(b).shape)) for b in p.names)


def _like(shapes):
    return Params.from_blocks({b: jnp.zeros(sh) for b, sh in shapes})


# ---------------------------------------------------------------------------
# Coordinates
# ---------------------------------------------------------------------------


def coordinate_blocks(H: int, M: int, nS: int, extra=()) -> np.ndarray:
    """The block (``"w"``, ``"C"``, ``"a"`` or an extra block's name) of every coordinate of the
    flat θ (``w`` row-major, then ``C``, then ``a``, then the extra blocks ``(name, shape)`` of
    `extra` in order)."""
    out = ["w"] * (H * M) + ["C"] * nS + ["a"]
    for b, sh in extra:
        out += [b] * int(np.prod(sh))
    return np.array(out)


def coordinate_labels(cfg: Config) -> list[str]:
    """A label for every coordinate of the flat θ: ``w[h,i]`` (head h, RPE index i,
    both from 1), ``C{1,2}`` / ``C∅``, ``a``, and a member's extra blocks as ``B[h,i,j]``
    (indices from 1)."""
    m = cfg.model
    w = [f"w[{h},{i}]" for h in range(1, m.H + 1) for i in range(1, m.M + 1)]
    out = w + ["C" + subset_label(S) for S in m.subsets] + ["a"]
    for b, sh in _shapes(cfg)[3:]:
        out += [f"{b}[{','.join(str(i + 1) for i in ix)}]" for ix in np.ndindex(*sh)]
    return out


def step_scales(cfg: Config, stage: str) -> np.ndarray:
    """The diagonal of Λ (flat θ's order) for a state saved in `stage` (``"I"``,
    ``"II"``, ``"III"`` or ``"joint"``): the time scale of each block's group where the
    stage trains the block (the member's ``stage_moves``), 0 elsewhere; see the module
    docstring."""
    sc = cfg.schedule
    eta = {"w": sc.eta_w, "C": sc.eta_C, "a": sc.eta_a}
    if stage not in _STAGES:
        raise ValueError(f"stage must be one of {_STAGES}, got {stage!r}")
    member = member_of(cfg.model)
    moves = member.stage_moves[stage]
    m = cfg.model
    blocks = coordinate_blocks(m.H, m.M, len(m.subsets), _shapes(cfg)[3:])
    return np.array([eta[member.block_group(b)] if b in moves else 0.0 for b in blocks], np.float64)


# ---------------------------------------------------------------------------
# The Hessian
# ---------------------------------------------------------------------------


#: The memory the Hessian-vector products of one state may hold at once: a model without the κ
#: table's second derivatives (the Full model, absolute positions) takes one HVP per moving
#: coordinate, and all of them vmapped at once ran out of memory for the Full model at N = 200
#: (about 100 coordinates); :func:`hvp_batch` fits them into this.
HVP_MEMORY = 4 * 2**30


def hvp_bytes(loss_fn, theta, H: int, M: int, shapes=None) -> int:
    """The temporary memory XLA's memory analysis reports for one compiled Hessian-vector product
    at a θ of `theta`'s shape (it does not depend on the direction, nor on which coordinates move)."""
    like = None if shapes is None else _like(shapes)
    f = lambda x: loss_fn(unflatten(x, H, M, like=like))  # noqa: E731
    one = jax.jit(lambda th, v: jax.jvp(jax.grad(f), (th,), (v,))[1])
    return max(int(one.lower(theta, theta).compile().memory_analysis().temp_size_in_bytes), 1)


def hvp_batch(loss_fn, theta, cols, H: int, M: int, shapes=None, *, budget: int = HVP_MEMORY,
              per_hvp: int | None = None) -> int:  # fmt: skip
    """How many of the ``len(cols)`` Hessian-vector products of one state to vmap at once: `budget`
    bytes over one product's (:func:`hvp_bytes`, measured unless `per_hvp` gives it), at least 1;
    all of them when they fit, the single vmap."""
    per = hvp_bytes(loss_fn, theta, H, M, shapes) if per_hvp is None else int(per_hvp)
    return int(max(1, min(len(cols), int(budget) // per)))


def _sym_block(loss_fn, theta, root_scale_m, cols, H, M, shapes=None, hvps: int | None = None):
    """``Λ_m^{1/2} H_mm Λ_m^{1/2}`` at the flat θ (the moving coordinates `cols`; `shapes`: a
    member's blocks, ``_shapes``, ``None`` for the paper's θ; `hvps`: Hessian-vector products
    vmapped at once, :func:`hvp_batch`, ``None`` for all)."""
    c = jnp.asarray(cols)
    like = None if shapes is None else _like(shapes)
    if has_table(loss_fn):  # the counts and sparse layouts: the whole Hessian by the κ table's structure
        S = table_hessian(loss_fn, unflatten(theta, H, M, like=like))[c[:, None], c[None, :]]
        S = S * root_scale_m[:, None] * root_scale_m[None, :]
        return 0.5 * (S + S.T)
    f = lambda x: loss_fn(unflatten(x, H, M, like=like))  # noqa: E731
    grad = jax.grad(f)
    P = theta.shape[0]
    E = jnp.zeros((len(cols), P), theta.dtype).at[jnp.arange(len(cols)), c].set(root_scale_m)
    hvp = lambda v: jax.jvp(grad, (theta,), (v,))[1]  # noqa: E731  (row j: H Λ^{1/2} e_{cols[j]})
    HE = jax.vmap(hvp)(E) if hvps is None or hvps >= len(cols) else jax.lax.map(hvp, E, batch_size=hvps)
    S = HE[:, c] * root_scale_m[None, :]
    return 0.5 * (S + S.T)


@eqx.filter_jit
def _blocks_jit(loss_fn, thetas, root_scale_m, cols: tuple[int, ...], H: int, M: int, shapes=None, hvps=None):
    return jax.vmap(lambda th: _sym_block(loss_fn, th, root_scale_m, cols, H, M, shapes, hvps))(thetas)


def _map_blocks(
    loss_fn, thetas, root_scale_m, cols: tuple[int, ...], H: int, M: int, batch: int, shapes=None,
    per_hvp: int | None = None,
) -> np.ndarray:
    """:func:`_sym_block` of every flat θ in `thetas`, `batch` at a time: one compiled
    shape ``(batch, P)`` whatever the number of states (the last chunk is padded). `per_hvp`: one
    Hessian-vector product's memory (:func:`hvp_bytes`), measured here when not given."""
    n = thetas.shape[0]
    out = []
    # the states of a batch are vmapped too: each gets its share of the HVPs' memory
    hvps = None if has_table(loss_fn) else hvp_batch(loss_fn, thetas[0], cols, H, M, shapes,
                                                      budget=HVP_MEMORY // batch, per_hvp=per_hvp)  # fmt: skip
    for i in range(0, n, batch):
        chunk = thetas[i : i + batch]
        m = chunk.shape[0]
        if m < batch:
            chunk = jnp.concatenate([chunk, jnp.repeat(chunk[-1:], batch - m, axis=0)])
        out.append(np.asarray(jax.device_get(_blocks_jit(loss_fn, chunk, root_scale_m, cols, H, M, shapes,
                                                         None if hvps == len(cols) else hvps)))[:m])  # fmt: skip
    return np.concatenate(out)


def loss_hessian(loss: Callable[[Params], jax.Array], params: Params, scales=None) -> np.ndarray:
    """The dense ``Λ^{1/2} H Λ^{1/2}`` (``H = ∇²loss`` at `params`, flat θ's order;
    `scales` the diagonal of Λ, default the identity: then H itself). `loss` is any
    function of :class:`~gflow.Params` (e.g. a :class:`~gflow.PopulationLoss`).
    Frozen coordinates (scale 0) have zero rows and columns. A
    :class:`~gflow.PopulationLoss` in the counts or sparse layout is differentiated
    twice by the κ table's structure (:func:`gflow.core.table_hessian`; the same matrix
    as ``jax.hessian`` to rounding, a few gradients' cost), any other function by one
    Hessian-vector product per coordinate."""
    theta = flatten(params)
    P = theta.shape[0]
    s = np.ones(P) if scales is None else np.asarray(scales, np.float64)
    _check_scales(s, P)
    cols = tuple(int(i) for i in np.flatnonzero(s > 0))
    out = np.zeros((P, P))
    if cols:
        H, M = params.w.shape
        rs = jnp.asarray(np.sqrt(s[list(cols)]), theta.dtype)
        shapes = None if not params.x else tuple((b, tuple(np.shape(params.get(b)))) for b in params.names)
        blk = np.asarray(_map_blocks(loss, theta[None], rs, cols, H, M, 1, shapes)[0], np.float64)
        out[np.ix_(cols, cols)] = blk
    return out


def _check_scales(s: np.ndarray, P: int) -> None:
    if s.shape != (P,) or not np.all(np.isfinite(s)) or np.any(s < 0):
        raise ValueError(f"scales must be {P} finite numbers >= 0 (the diagonal of Λ), got {s!r}")


# ---------------------------------------------------------------------------
# The spectrum along a trajectory
# ---------------------------------------------------------------------------


class _Edge:
    """GD's stability edge from `lam_max`, the largest eigenvalue of ΛH (a :class:`Spectrum`'s or a :class:`Sharpness`'s)."""

    @property
    def eta_c(self) -> np.ndarray:
        """GD's stability edge ``2/λ_max`` ``(*R, T)`` (``inf`` where ``λ_max <= 0``)."""
        lm = self.lam_max
        with np.errstate(divide="ignore"):
            return np.where(lm > 0, 2.0 / np.where(lm > 0, lm, 1.0), np.inf)

    @property
    def eta_c_min(self) -> float:
        """GD's stability edge over the whole run: the smallest ``η_c(t) = 2/λ_max(t)`` over the
        computed times (and seeds). GD at a fixed η is linearly stable along the run only below
        it: η_c can fall by orders of magnitude as the flow sharpens (125× along a joint flow at
        L = 20, N = 200 by t = 21), so ``η_c(0)`` alone says nothing about later times."""
        ec = np.asarray(self.eta_c, np.float64)
        return float(np.min(ec)) if ec.size else math.inf

    @property
    def where_eta_c_min(self) -> tuple[float, str]:
        """``(t, stage)`` of the saved time where :attr:`eta_c_min` is reached (for seeds: of the
        seed mean's smallest)."""
        ec = np.asarray(self.eta_c, np.float64).reshape(-1, len(self.ts)).min(0)
        k = int(np.argmin(ec))
        return float(self.ts[k]), str(self.stage[k])


@dataclasses.dataclass
class Spectrum(_Edge):
    """Eigenvalues of ``ΛH`` (as ``Λ^{1/2} H Λ^{1/2}``) at saved states of a run.

    - `ts` ``(T,)``: the saved times; `index` ``(T,)``: their rows in the trajectory;
      `stage` ``(T,)``: the stage of each (``"I"``, ``"II"``, ``"III"``, ``"joint"``).
    - `eigvals` ``(*R, T, P)``: all P = dim θ eigenvalues, descending (a frozen
      block's coordinates contribute exact zeros); ``*R``: the trajectory's leading
      axes (a seed axis for SGD's runs, none for a flow).
    - `scales` ``(T, P)``: the diagonal of Λ at each saved state.
    - `vectors` ``(*R, T, k, P)`` or ``None``: the unit eigenvectors ``u`` of the top k
      eigenvalues (of the symmetric ``Λ^{1/2}HΛ^{1/2}``; ``ΛH``'s own right
      eigenvectors are ``Λ^{1/2}u``), in flat θ's order (:func:`coordinate_labels`).
    - `labels` ``(P,)``: the coordinates' labels; `blocks` ``(P,)``: their blocks.
    - `eta`: the run's GD step where it has one (``solver.method`` "gd", "modified"
      or "sgd"), else ``None``.

    Derived: :attr:`lam_max`, :attr:`lam_min`, :attr:`eta_c` (``2/λ_max`` at every time),
    :attr:`eta_c_min` (its minimum over the run) and :attr:`where_eta_c_min` (where),
    :attr:`block_weights`, :attr:`top_block`.
    """

    ts: np.ndarray
    index: np.ndarray
    stage: np.ndarray
    eigvals: np.ndarray
    scales: np.ndarray
    labels: list[str]
    blocks: np.ndarray
    vectors: np.ndarray | None = None
    eta: float | None = None

    @property
    def lam_max(self) -> np.ndarray:
        """``λ_max(ΛH)`` ``(*R, T)``."""
        return self.eigvals[..., 0]

    @property
    def lam_min(self) -> np.ndarray:
        """The smallest eigenvalue ``(*R, T)`` (a frozen block's zeros included)."""
        return self.eigvals[..., -1]

    @property
    def block_names(self) -> tuple[str, ...]:
        """The blocks of θ in flat θ's order (w, C, a, then a member's extra blocks)."""
        return tuple(dict.fromkeys(str(b) for b in self.blocks))

    @property
    def block_weights(self) -> np.ndarray | None:
        """``(*R, T, k, nb)``: the share of each top eigenvector's squared norm in each block
        (:attr:`gflow.Spectrum.block_names`: w, C and a for the paper's model)."""
        if self.vectors is None:
            return None
        return np.stack([np.sum(self.vectors[..., self.blocks == b] ** 2, axis=-1) for b in self.block_names], axis=-1)

    @property
    def top_block(self) -> np.ndarray | None:
        """``(*R, T, k)``: the block (``"w"``, ``"C"``, ``"a"``, …) holding most of each top eigenvector."""
        bw = self.block_weights
        return None if bw is None else np.array(self.block_names)[np.argmax(bw, axis=-1)]

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Plain arrays (for ``np.savez``); :meth:`from_arrays` reads them back."""
        d = {"ts": self.ts, "index": self.index, "stage": self.stage.astype(str), "eigvals": self.eigvals,
             "scales": self.scales, "labels": np.array(self.labels), "blocks": self.blocks.astype(str),
             "eta": np.array(np.nan if self.eta is None else self.eta)}  # fmt: skip
        if self.vectors is not None:
            d["vectors"] = self.vectors
        return d

    @classmethod
    def from_arrays(cls, d) -> Spectrum:
        eta = float(np.asarray(d["eta"]))
        return cls(ts=np.asarray(d["ts"]), index=np.asarray(d["index"]), stage=np.asarray(d["stage"]).astype(str),
                   eigvals=np.asarray(d["eigvals"]), scales=np.asarray(d["scales"]),
                   labels=[str(x) for x in np.asarray(d["labels"])], blocks=np.asarray(d["blocks"]).astype(str),
                   vectors=np.asarray(d["vectors"]) if "vectors" in d else None,
                   eta=None if np.isnan(eta) else eta)  # fmt: skip


def select_rows(T: int, max_times: int | None) -> np.ndarray:
    """At most `max_times` of ``T`` saved rows, evenly spaced in index (the saved times
    are on a logarithmic grid per stage, so this is even in log t), first and last kept."""
    if max_times is None or T <= max_times:
        return np.arange(T)
    if not isinstance(max_times, (int, np.integer)) or isinstance(max_times, bool) or max_times < 2:
        raise ValueError(f"max_times must be an integer >= 2, got {max_times!r}")
    return np.unique(np.round(np.linspace(0, T - 1, max_times)).astype(int))


def _run_eta(cfg: Config) -> float | None:
    m = cfg.solver.method_for("I")
    return float(cfg.solver.eta) if m in ("gd", "modified", "central", "sgd") else None


@dataclasses.dataclass
class _States:
    """The saved states of a trajectory a spectrum reads (:func:`_saved_states`)."""

    cfg: Config
    H: int
    M: int
    nS: int
    shapes: tuple
    extra: tuple
    P: int
    lead: tuple  # (*R, T)
    rows: np.ndarray
    stage: np.ndarray
    scales: np.ndarray  # (T', P)
    flat: np.ndarray  # (T', nR, P)


def _saved_states(cfg: Config | None, traj, indices, max_times) -> _States:
    """Flat θ at the chosen rows of `traj` (every leading seed axis kept), their stages and Λ;
    ``ValueError`` for states whose shapes are not the model's and rows outside the trajectory."""
    cfg = traj.config if cfg is None else cfg
    m = cfg.model
    H, M, nS = m.H, m.M, len(m.subsets)
    shapes = _shapes(cfg)
    extra = shapes[3:]
    P = H * M + nS + 1 + sum(int(np.prod(sh)) for _, sh in extra)
    w, C, a = (np.asarray(getattr(traj, b)) for b in _BLOCKS)
    xs = getattr(traj, "x", {}) or {}
    lead = a.shape  # (*R, T)
    if w.shape != lead + (H, M) or C.shape != lead + (nS,) or len(lead) < 1:
        raise ValueError(f"traj's states do not fit the model (H = {H}, M = {M}, |𝒮| = {nS}): "
                         f"w {w.shape}, C {C.shape}, a {a.shape}")  # fmt: skip
    for b, sh in extra:
        if b not in xs or np.shape(xs[b]) != lead + sh:
            raise ValueError(f"traj's states do not fit model.member = {m.member!r}: its block {b!r} of shape "
                             f"{sh} per state is {'missing' if b not in xs else np.shape(xs[b])}")  # fmt: skip
    T = lead[-1]
    if indices is None:
        rows = select_rows(T, max_times)
    else:
        rows = np.asarray(indices, int).ravel()
        if rows.size == 0 or np.any((rows < -T) | (rows >= T)):
            raise ValueError(f"indices must be rows of the trajectory (0..{T - 1}), got {indices!r}")
        rows = np.where(rows < 0, rows + T, rows)
        rows = rows[select_rows(len(rows), max_times)]
    codes = np.asarray(getattr(traj, "stage", np.zeros(T, int)))
    joint = cfg.schedule.kind == "joint" or codes.shape != (T,)
    stage = np.array(["joint" if joint else _STAGE_OF_CODE.get(int(codes[i]), "joint") for i in rows])
    scales = np.stack([step_scales(cfg, s) for s in stage]) if len(rows) else np.zeros((0, P))
    parts = [w.reshape(lead + (H * M,)), C, a[..., None]] + [np.asarray(xs[b]).reshape(lead + (-1,)) for b, _ in extra]
    flat = np.concatenate(parts, axis=-1)  # (*R, T, P)
    flat = np.moveaxis(flat, len(lead) - 1, 0)[rows]  # (T', *R, P)
    nR = int(np.prod(lead[:-1], dtype=int))
    return _States(cfg, H, M, nS, shapes, extra, P, lead, rows, stage, scales, flat.reshape(len(rows), nR, P))


def hessian_spectrum(
    cfg: Config | None,
    traj,
    *,
    loss: PopulationLoss | Callable | None = None,
    indices=None,
    max_times: int | None = None,
    vectors: int = 0,
    batch: int = 1,
) -> Spectrum:
    """The eigenvalues of ``ΛH`` (as ``Λ^{1/2} H Λ^{1/2}``, ``H = ∇²L̂``) at the saved
    states of a trajectory, and GD's stability edge ``η_c = 2/λ_max``.

    **Arguments:**

    - `cfg`: the run's configuration (``None``: ``traj.config``): its sample (L̂ is
      ``make_loss(cfg.data, cfg.model, cfg.estimator)``, the run's own fixed sample)
      and its Λ (module docstring: the stage's mask in a staged run,
      ``diag(η_w, η_C, η_a)`` in a joint one).
    - `traj`: anything with saved states ``w`` ``(*R, T, H, M)``, ``C``, ``a`` and
      times ``ts`` ``(T,)``: a flow's, GD's or the modified flow's
      :class:`~gflow.Trajectory`, or online SGD's :class:`~gflow.SGDRun` (its seed
      axis ``R``). The stage of each row is read from ``traj.stage`` where it has one
      (else the joint Λ).
    - `loss`: the sample's L̂ if already built (must be the run's), or any function of
      :class:`~gflow.Params` whose Hessian is wanted (a test's quadratic).
    - `indices`: the rows to use (default all; see `max_times`).
    - `max_times`: at most this many rows, evenly spaced in index (first and last kept).
    - `vectors`: also keep the top `vectors` eigenvectors (0: none).
    - `batch`: states whose Hessians are computed at once (vmapped; memory grows with it).

    **Cost:** per state, the structured Hessian of the counts and sparse layouts (about
    11 gradients at the default), else one Hessian-vector product per moving
    coordinate (vmapped, about 44 gradients at the joint default), and a ``P × P``
    ``eigh`` (docs/theory/mathematics.md §M9 and ``scripts/benchmarks/bench_spectrum.py`` measure it in gradients).

    **Raises:** ``ValueError`` for rows outside the trajectory, a bad `vectors`,
    `max_times` or `batch`, or states whose shapes are not the model's.
    """
    st = _saved_states(cfg, traj, indices, max_times)
    cfg, H, M, nS, shapes, extra, P, lead, rows, stage, scales = (
        st.cfg, st.H, st.M, st.nS, st.shapes, st.extra, st.P, st.lead, st.rows, st.stage, st.scales)  # fmt: skip
    if not isinstance(vectors, (int, np.integer)) or isinstance(vectors, bool) or not 0 <= vectors <= P:
        raise ValueError(f"vectors must be an integer in [0, {P}] (dim θ), got {vectors!r}")
    if not isinstance(batch, (int, np.integer)) or isinstance(batch, bool) or batch < 1:
        raise ValueError(f"batch must be an integer >= 1, got {batch!r}")
    if loss is None:
        loss = make_loss(cfg.data, cfg.model, cfg.estimator)
    dtype = cfg.estimator.jdtype
    flat, nR = st.flat, st.flat.shape[1]
    eig = np.zeros((len(rows), nR, P))
    vec = np.zeros((len(rows), nR, vectors, P)) if vectors else None
    # one HVP's memory, measured once for every Λ below (the loss and θ's shape are theirs)
    per_hvp = None
    if len(rows) and not has_table(loss):
        per_hvp = hvp_bytes(loss, jnp.asarray(flat[0, 0], dtype), H, M, shapes if extra else None)
    # one compiled program per distinct Λ (the stages of a staged run)
    for key in {tuple(s) for s in scales}:
        s = np.asarray(key)
        sel = np.flatnonzero(np.all(scales == s, axis=1))
        cols = tuple(int(i) for i in np.flatnonzero(s > 0))
        if not cols:
            continue
        rs = jnp.asarray(np.sqrt(s[list(cols)]), dtype)
        th = jnp.asarray(flat[sel].reshape(-1, P), dtype)
        blocks = np.asarray(_map_blocks(loss, th, rs, cols, H, M, batch, shapes if extra else None, per_hvp),
                            np.float64)  # fmt: skip
        lam, U = np.linalg.eigh(blocks)  # ascending
        full = np.zeros((len(th), P))
        full[:, : len(cols)] = lam[:, ::-1]
        full = -np.sort(-full, axis=1)  # the frozen coordinates' zeros among the moving eigenvalues
        eig[sel] = full.reshape(len(sel), nR, P)
        if vectors:
            k = min(vectors, len(cols))
            V = np.zeros((len(th), vectors, P))
            V[:, :k, list(cols)] = np.swapaxes(U[:, :, ::-1][:, :, :k], 1, 2)
            vec[sel] = V.reshape(len(sel), nR, vectors, P)
    # back to (*R, T', ...)
    eig = np.moveaxis(eig.reshape((len(rows),) + lead[:-1] + (P,)), 0, len(lead) - 1)
    if vec is not None:
        vec = np.moveaxis(vec.reshape((len(rows),) + lead[:-1] + (vectors, P)), 0, len(lead) - 1)
    ts = np.asarray(traj.ts)
    ts = ts[..., rows] if ts.shape[-1:] == (lead[-1],) else ts
    return Spectrum(ts=ts, index=rows, stage=stage, eigvals=eig, scales=scales, labels=coordinate_labels(cfg),
                    blocks=coordinate_blocks(H, M, nS, extra), vectors=vec, eta=_run_eta(cfg))  # fmt: skip


# ---------------------------------------------------------------------------
# The sharpness alone: λ_max by Lanczos, warm-started along the run
# ---------------------------------------------------------------------------

#: Lanczos steps per state for λ_max of a loss without the κ table's Hessian (:func:`sharpness`): the
#: largest eigenvalue of Λ^{1/2}HΛ^{1/2} from this many Hessian-vector products instead of one per
#: moving coordinate, started from the previous state's top eigenvector (tests/test_spectrum.py: the
#: dense spectrum's λ_max to 1e-10 relative on a short GD run of absolute positions; on the shipped
#: official Full run at L = 30, N = 500, t ≤ 0.2, 108 coordinates: 1.8e-15 with 12 steps, 7.8e-9 with 8).
LANCZOS_STEPS = 16


@dataclasses.dataclass
class Sharpness(_Edge):
    """``λ_max(ΛH)`` at saved states of a run (:func:`sharpness`): `ts`, `index` (their rows),
    `stage`, `lam_max` ``(T,)``, `eta` (the run's GD step, or ``None``), `hvps` (Hessian-vector
    products per state: 0 where the κ table's Hessian was computed whole); with
    :attr:`eta_c`, :attr:`eta_c_min`, :attr:`where_eta_c_min` as :class:`Spectrum`'s."""

    ts: np.ndarray
    index: np.ndarray
    stage: np.ndarray
    lam_max: np.ndarray
    eta: float | None = None
    hvps: int = 0


@eqx.filter_jit
def _lanczos_top(loss_fn, theta, root_scale_m, v0, fresh, cols: tuple[int, ...], H: int, M: int, shapes, steps: int):
    """λ_max of ``Λ_m^{1/2} H_mm Λ_m^{1/2}`` at the flat θ and its unit Ritz vector: `steps` Lanczos
    steps with full reorthogonalisation (twice) from the unit `v0`; at a breakdown (an invariant
    subspace found) the next direction is row j of `fresh` ``(steps, n)`` made orthogonal to the
    basis, so the tridiagonal matrix stays ``VᵀAV``."""
    c = jnp.asarray(cols)
    like = None if shapes is None else _like(shapes)
    grad = jax.grad(lambda x: loss_fn(unflatten(x, H, M, like=like)))
    P = theta.shape[0]

    def A(v):
        e = jnp.zeros(P, theta.dtype).at[c].set(root_scale_m * v)
        return root_scale_m * jax.jvp(grad, (theta,), (e,))[1][c]

    def orth(V, w):
        w = w - V.T @ (V @ w)
        return w - V.T @ (V @ w)

    def body(j, carry):
        V, alpha, beta = carry
        w = A(V[j])
        a = w @ V[j]
        w = orth(V, w)
        b = jnp.linalg.norm(w)
        ok = b > 1e-12 * (jnp.abs(a) + 1.0)
        r = orth(V, fresh[j])
        nxt = jnp.where(ok, w / jnp.where(ok, b, 1.0), r / jnp.maximum(jnp.linalg.norm(r), 1e-300))
        return V.at[j + 1].set(nxt), alpha.at[j].set(a), beta.at[j].set(jnp.where(ok, b, 0.0))

    n = len(cols)
    V0 = jnp.zeros((steps + 1, n), theta.dtype).at[0].set(v0)
    V, alpha, beta = jax.lax.fori_loop(0, steps, body, (V0, jnp.zeros(steps, theta.dtype), jnp.zeros(steps, theta.dtype)))
    T = jnp.diag(alpha) + jnp.diag(beta[:-1], 1) + jnp.diag(beta[:-1], -1)
    lam, Y = jnp.linalg.eigh(T)
    u = Y[:, -1] @ V[:steps]
    return lam[-1], u / jnp.linalg.norm(u)


def sharpness(
    cfg: Config | None,
    traj,
    *,
    loss: PopulationLoss | Callable | None = None,
    indices=None,
    max_times: int | None = None,
    steps: int = LANCZOS_STEPS,
) -> Sharpness:
    """``λ_max(ΛH)`` at the saved states of a trajectory (the arguments as :func:`hessian_spectrum`'s;
    a deterministic run, no seed axis), and GD's edge ``2/λ_max``: what GD's report reads, at a
    fraction of the whole spectrum's cost for a loss without the κ table's Hessian (the Full model,
    the positions layout): ``min(steps, n)`` Lanczos steps per state (n moving coordinates, each
    step one Hessian-vector product), each state started from the previous one's top eigenvector
    (mixed with a fixed random direction: λ_max moves little between saved states). A loss with
    the κ table's Hessian has it whole at a few gradients' cost: its λ_max is
    :func:`hessian_spectrum`'s. Deterministic: the same run gives the same numbers.

    **Raises:** what :func:`hessian_spectrum` raises for the states and rows, and ``ValueError``
    for a trajectory with a seed axis or `steps` not an integer >= 2."""
    if not isinstance(steps, (int, np.integer)) or isinstance(steps, bool) or steps < 2:
        raise ValueError(f"steps must be an integer >= 2, got {steps!r}")
    st = _saved_states(cfg, traj, indices, max_times)
    if st.flat.shape[1] != 1:
        raise ValueError(f"sharpness reads a deterministic run; this one has {st.flat.shape[1]} seeds "
                         "(hessian_spectrum takes a seed axis)")  # fmt: skip
    cfg = st.cfg
    loss = make_loss(cfg.data, cfg.model, cfg.estimator) if loss is None else loss
    ts = np.asarray(traj.ts)[st.rows]
    if has_table(loss):
        sp = hessian_spectrum(cfg, traj, loss=loss, indices=st.rows)
        return Sharpness(ts=ts, index=st.rows, stage=st.stage, lam_max=np.asarray(sp.lam_max), eta=_run_eta(cfg))
    dtype = cfg.estimator.jdtype
    shapes = st.shapes if st.extra else None
    lam = np.zeros(len(st.rows))
    rng = np.random.default_rng(0)  # fixed: the same run gives the same numbers
    prev, prev_cols, used = None, None, 0
    for i in range(len(st.rows)):
        s = st.scales[i]
        cols = tuple(int(j) for j in np.flatnonzero(s > 0))
        if not cols:
            continue
        n = len(cols)
        k = min(int(steps), n)
        used = max(used, k)
        mix = rng.standard_normal(n)
        v0 = mix if prev is None or cols != prev_cols else prev + 0.1 * np.linalg.norm(prev) * mix / np.linalg.norm(mix)
        fresh = rng.standard_normal((k, n))
        rs = jnp.asarray(np.sqrt(s[list(cols)]), dtype)
        lm, u = _lanczos_top(loss, jnp.asarray(st.flat[i, 0], dtype), rs, jnp.asarray(v0 / np.linalg.norm(v0), dtype),
                             jnp.asarray(fresh, dtype), cols, st.H, st.M, shapes, k)  # fmt: skip
        lam[i], prev, prev_cols = float(lm), np.asarray(u, np.float64), cols
    return Sharpness(ts=ts, index=st.rows, stage=st.stage, lam_max=lam, eta=_run_eta(cfg), hvps=used)
