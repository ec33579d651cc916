"""The Monte Carlo population ICL loss and its gradient (docs/theory/mathematics.md §M3, §M5).

``L̂_N(θ) = (1/N) Σ_n ℓ_RB(θ; X_n, π_n)`` on a sample drawn once from a fixed
key (common random numbers), so ``L̂_N`` is a deterministic smooth function of
θ and ``-∇L̂_N`` is a proper vector field for an ODE solver. The target is
Rao–Blackwellised: ``ℓ_RB = -Σ_e π(e | z_q) log(ŷ_e + ε)`` (or, with
``estimator.target = "drawn"``, the sampled ``y``: ``-log(ŷ_y + ε)``).

The loss holds the sample in one layout (``gflow.core.CountFeatures``, …) and the model's
member of the family (:attr:`PopulationLoss.member`); every method below hands the work to the
layout, which computes with the member's primitives.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

from ._data import DataConfig, Sample, sample
from ._features import LAYOUTS, features
from ._kinds import kind_of
from ._member_paper import table_layout
from ._members import member_of
from ._model import ModelConfig, Params

_LOSSES = ("log", "ce_on_probs")
_DTYPES = ("float64", "float32")
_LAYOUTS = ("auto",) + LAYOUTS
_TARGETS = ("expected", "drawn")
POSITIONS = ("last", "all", "outputs")


class EstimatorConfig(eqx.Module):
    """How the population loss is estimated.

    - `N`: number of sequences (each with its own π), ``>= 1``.
    - `seed`: the sample's PRNG seed (common random numbers: drawn once).
    - `eps`: ``ε`` in ``-log(ŷ_e + ε)``, ``>= 0`` (default ``1e-6``).
    - `loss`: ``"log"`` (the paper's ICL loss, Rao–Blackwellised) or
      ``"ce_on_probs"`` (extension: cross-entropy applied to ŷ as if it were
      logits, as in the reference simulations).
    - `dtype`: ``"float64"`` (default) or ``"float32"``.
    - `layout`: how the sample is stored: ``"counts"`` (κ tabulated on the
      ``(d+1)**M`` windows, each sequence as window counts; exact and fast
      for small ``d**M``), ``"positions"`` (per-position match tensors, any
      size), ``"heads"`` (per-position window codes of each head, κ from
      per-head tables over ``(d+1)**M`` head windows; any span, the fast
      layout for shifted windows), ``"sparse"`` (κ tabulated on the
      windows a sequence can show, each sequence as counts over its own
      distinct windows; exact, the fast layout for a large span, as the
      official code's shifted windows), ``"vectors"`` (the sparse layout's arrays, κ computed per
      sequence from the first layer's vectors instead of tabulated; exact, the members whose κ
      also reads the key's own token) or ``"auto"`` (default: see :func:`resolve_layout`).
    - `chunk`: ``0`` (default) or the number of sequences per chunk: every
      per-sequence computation then runs chunk by chunk, rematerialised in
      the backward pass, so the working memory is O(chunk) (same result to
      rounding; for N = 10⁶).
    - `shard`: shard the sequence axis over all devices (``jax.devices()``;
      with ``jax.distributed``, every host's); ``N`` must be a multiple of
      the device count.
    - `target`: ``"expected"`` (default: Rao–Blackwellised, the expectation
      over ``π(·|z_q)``) or ``"drawn"`` (extension, the official code,
      docs/theory/mathematics.md §M8.5: each sequence's sampled ``y = x_{L+1}``, i.e. ``π(·|z_q)``
      replaced by the one-hot ``e(y)`` in the loss; same ``y`` as the
      sample's, so both targets share the common random numbers).
    - `relabel`: average the loss over the ``d!`` relabellings of the sample's tokens
      (extension, docs/theory/mathematics.md §M10: each sequence enters once per permutation
      of ``[d]``, so the estimator has the population loss's relabelling symmetry exactly;
      ``d!`` times the cost; ``d <= 5``). Default false.
    - `positions`: where the loss is taken: ``"last"`` (default, the paper's: the query ``x_L``
      predicts ``x_{L+1}``) or ``"all"`` (extension, as Edelman et al. and Bietti et al. train: every
      position t predicts ``x_{t+1}``, the sequence's loss the mean over the positions whose next
      token has all its parents in the context, ``t >= max(data.parents)``). ``"all"`` needs a
      member that predicts at every position (:func:`every_position_members`: ``edelman``; in
      the positions layout) and the n-gram data; ``estimator.target`` keeps its meaning at each position.
      ``"outputs"`` (extension, Bietti et al.'s ``loss_head_only``; ``data.kind = "triggers"``
      only): the positions whose token is a trigger seen before, so that the next token is its
      output from its second occurrence on, averaged over all such positions of the sample
      (a sequence with none adds nothing).
    """

    N: int = eqx.field(static=True, default=10_000)
    seed: int = eqx.field(static=True, default=0)
    eps: float = 1e-6
    loss: Literal["log", "ce_on_probs"] = eqx.field(static=True, default="log")
    dtype: Literal["float64", "float32"] = eqx.field(static=True, default="float64")
    layout: Literal["auto", "counts", "positions", "heads", "sparse", "vectors"] = eqx.field(static=True, default="auto")
    chunk: int = eqx.field(static=True, default=0)
    shard: bool = eqx.field(static=True, default=False)
    target: Literal["expected", "drawn"] = eqx.field(static=True, default="expected")
    relabel: bool = eqx.field(static=True, default=False)
    positions: Literal["last", "all", "outputs"] = eqx.field(static=True, default="last")

    def __check_init__(self):
        if not isinstance(self.N, (int, np.integer)) or self.N < 1:
            raise ValueError(f"estimator.N must be an integer >= 1, got {self.N!r}")
        if not isinstance(self.seed, (int, np.integer)):
            raise ValueError(f"estimator.seed must be an integer, got {self.seed!r}")
        if not (np.isfinite(self.eps) and self.eps >= 0):
            raise ValueError(f"estimator.eps must be a finite number >= 0, got {self.eps!r}")
        if self.loss not in _LOSSES:
            raise ValueError(f"estimator.loss must be one of {_LOSSES}, got {self.loss!r}")
        if self.layout not in _LAYOUTS:
            raise ValueError(f"estimator.layout must be one of {_LAYOUTS}, got {self.layout!r}")
        if not isinstance(self.chunk, (int, np.integer)) or isinstance(self.chunk, bool) or self.chunk < 0:
            raise ValueError(f"estimator.chunk must be an integer >= 0 (0: no chunking), got {self.chunk!r}")
        if not isinstance(self.shard, bool):
            raise ValueError(f"estimator.shard must be true or false, got {self.shard!r}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"estimator.dtype must be one of {_DTYPES}, got {self.dtype!r}")
        if self.target not in _TARGETS:
            raise ValueError(f"estimator.target must be one of {_TARGETS}, got {self.target!r}")
        if self.relabel is not True and self.relabel is not False:
            raise ValueError(f"estimator.relabel must be true or false, got {self.relabel!r}")
        if self.positions not in POSITIONS:
            raise ValueError(f"estimator.positions must be one of {POSITIONS}, got {self.positions!r}")

    @property
    def jdtype(self):
        return jnp.float64 if self.dtype == "float64" else jnp.float32




class LossStats(eqx.Module):
    """Loss and gradient at one θ with Monte Carlo standard errors (docs/theory/mathematics.md §M5).

    The standard errors are ``std_n / sqrt(N)`` of the per-sequence values,
    which are i.i.d. across sequences.
    """

    loss: Float[Array, ""]
    loss_se: Float[Array, ""]
    unseen: Float[Array, ""]
    grad: Params
    grad_se: Params
    grad_norm: Float[Array, ""]


def resolve_layout(layout: str, d: int, model) -> str:
    """The sample layout ``estimator.layout`` names for vocabulary size `d` and `model` (a
    :class:`~gflow.core.ModelConfig`, or for the paper's model its span as an integer).
    ``"auto"`` is the member's own choice; for the paper's model ``"counts"`` when
    ``(d+1)**span <= 512`` (``span``: every offset the copier reads), else ``"sparse"`` when
    its κ table has at most ``2**20`` entries (:func:`gflow.core.sparse_table_size`: 88,452 for d = 3 and
    the official code's span 5), else ``"positions"``. A layout the member does not compute
    in is a ``ValueError`` naming the allowed ones."""
    if layout not in _LAYOUTS:
        raise ValueError(f"estimator.layout must be one of {_LAYOUTS}, got {layout!r}")
    if not isinstance(model, ModelConfig):  # the paper's model of span `model`
        return table_layout(d, int(model)) if layout == "auto" else layout
    m = member_of(model)
    if layout == "auto":
        return m.auto_layout(d)
    if layout not in m.layouts:
        raise ValueError(f"estimator.layout must be one of {('auto',) + m.layouts} for model.member = "
                         f"{model.member!r}, got {layout!r}")  # fmt: skip
    return layout


def _tree_norm(t) -> Float[Array, ""]:
    return jnp.sqrt(sum(jnp.sum(x**2) for x in jax.tree.leaves(t)))


def mean_se(x):
    n = x.shape[0]
    se = jnp.std(x, axis=0, ddof=1 if n > 1 else 0) / jnp.sqrt(n)
    return jnp.mean(x, axis=0), se


class PopulationLoss(eqx.Module):
    """The estimator ``L̂_N(θ)`` on a fixed sample (docs/theory/mathematics.md §M3, §M5).

    Build with :func:`make_loss`. Calling it returns the mean loss; see
    :meth:`value_and_grad`, :meth:`stats`, :meth:`per_sequence`.

    The sample is held in one layout (`feats`): ``CountFeatures`` (κ tabulated on window
    pairs, the sample as window counts; fast), ``SparseCountFeatures`` (the same on the
    windows a sequence can show), ``PositionFeatures`` (per position; general) or
    ``HeadFeatures``. They agree to rounding. The model is `model`'s member of the family
    (:attr:`member`). With ``chunk > 0`` every per-sequence computation runs in chunks (see
    ``seqmap``).
    """

    feats: eqx.Module
    model: ModelConfig
    eps: Float[Array, ""]
    kind: str = eqx.field(static=True, default="log")
    chunk: int = eqx.field(static=True, default=0)

    @property
    def N(self) -> int:
        return self.feats.cond.shape[0]

    @property
    def d(self) -> int:
        return self.feats.cond.shape[-1]

    @property
    def member(self):
        """The model's member of the family (``gflow.core.member_of(model)``)."""
        return member_of(self.model)

    # -- the estimator -----------------------------------------------------
    def per_sequence(self, params: Params) -> Float[Array, " N"]:
        """``ℓ_RB`` of every sequence, ``(N,)``."""
        return self.feats.per_sequence(self, params)

    def __call__(self, params: Params) -> Float[Array, ""]:
        return jnp.mean(self.per_sequence(params))

    def at_last_position(self) -> PopulationLoss:
        """This estimator with the loss at the last position only, on the same sample (itself when
        it is already there): the target of every sequence's last row, unweighted
        (``estimator.positions = "all"``; the last position always takes the loss). The GIH and
        the paper's laws are last-position laws."""
        cond = self.feats.cond
        if cond.ndim == 2:
            return self
        last = cond[:, -1]
        return eqx.tree_at(lambda l_: l_.feats.cond, self, last / last.sum(-1, keepdims=True))

    def value_and_grad(self, params: Params) -> tuple[Float[Array, ""], Params]:
        return jax.value_and_grad(self.__call__)(params)

    def grad(self, params: Params) -> Params:
        return jax.grad(self.__call__)(params)

    def unseen(self) -> Float[Array, ""]:
        """Mean unseen mass (θ-independent): the target mass on tokens absent
        from the context."""
        return self.feats.unseen(self.chunk)

    def per_sequence_grads(self, params: Params) -> tuple[Float[Array, " N"], Params]:
        """Per-sequence losses and gradients (leaves with a leading N axis)."""
        return self.feats.per_sequence_grads(self, params)

    def batch_grads(self, params: Params, batches: int) -> tuple[Float[Array, " B"], Params]:
        """Mean gradients over ``B`` disjoint batches of sequences (sequence
        ``n`` in batch ``n mod B``) and each batch's share ``n_b/N``.

        This is how the standard errors of the gradient are estimated (batch
        means, docs/theory/mathematics.md §M5). For the counts layout it costs about one gradient:
        per-sequence gradients with respect to (the readout's blocks, the sequence's row of κ)
        are summed per batch and query window, then mapped to the table's blocks by the
        Jacobian of the κ table.
        """
        share, gb, _ = self._batch_grads(params, batches)
        return share, gb

    def _batch_grads(self, params: Params, batches: int):
        """:meth:`batch_grads`, plus the per-sequence losses when the same
        pass yields them (table layouts; ``None`` otherwise)."""
        N = self.N
        B = max(1, min(int(batches), N))
        bid = np.arange(N) % B
        n_b = np.bincount(bid, minlength=B).astype(np.float64)
        share = jnp.asarray(n_b / N, self.eps.dtype)
        gb, ls = self.feats.batch_grads(self, params, B, bid, n_b)
        return share, gb, ls

    def stats(self, params: Params, *, batches: int = 64) -> LossStats:
        """Loss, gradient and their Monte Carlo standard errors.

        The loss's standard error is ``std/sqrt(N)`` of the i.i.d.
        per-sequence losses; the gradient's comes from ``batches`` batch
        means (``SE² = B/(B−1) Σ_b (n_b/N)² (ḡ_b − ḡ)²``, which is
        ``std_b/sqrt(B)`` for equal batches), at the cost of one gradient.
        The mean gradient is exactly ``∇L̂`` (the share-weighted batch means).
        """
        share, gb, ls = self._batch_grads(params, batches)
        if ls is None:
            ls = self.per_sequence(params)
        loss, loss_se = mean_se(ls)
        B = share.shape[0]

        def combine(x):
            sh = share.reshape((B,) + (1,) * (x.ndim - 1))
            g = jnp.sum(sh * x, axis=0)
            var = jnp.sum(sh**2 * (x - g) ** 2, axis=0) * (B / max(B - 1, 1))
            return g, jnp.sqrt(var)

        both = jax.tree.map(combine, gb)
        is_pair = lambda t: isinstance(t, tuple)  # noqa: E731
        g = jax.tree.map(lambda t: t[0], both, is_leaf=is_pair)
        g_se = jax.tree.map(lambda t: t[1], both, is_leaf=is_pair)
        return LossStats(
            loss=loss, loss_se=loss_se, unseen=self.unseen(), grad=g, grad_se=g_se, grad_norm=_tree_norm(g)
        )


class StageLoss(eqx.Module):
    """``L̂`` as a function of the moving blocks only (a stage of the flow).

    What depends only on the frozen blocks is computed once, at
    construction: with only the readout's blocks moving (``a``, Stage III), κ of every
    sequence; with only ``C`` moving, the C-independent products (for the members that have
    them). Call it with a dict ``{block: value}`` of the moving blocks.
    """

    loss: PopulationLoss
    frozen: Params
    moves: tuple[str, ...] = eqx.field(static=True)
    cache: object = None

    def __init__(self, loss: PopulationLoss, params: Params, moves: tuple[str, ...]):
        self.loss, self.frozen, self.moves = loss, params, tuple(moves)
        self.cache = loss.feats.stage_cache(loss, params, self.moves)

    def full(self, y: dict) -> Params:
        """The whole θ with the moving blocks set to ``y``."""
        return self.frozen.with_blocks(y)

    def init(self) -> dict:
        return {b: self.frozen.get(b) for b in self.moves}

    def __call__(self, y: dict) -> Float[Array, ""]:
        if self.cache is None:
            return self.loss(self.full(y))
        return self.loss.feats.stage_loss(self.loss, self.frozen, self.moves, self.cache, y)


def shard_features(feats):
    """Place the features with their sequence axis sharded over every device
    (a 1-D mesh ``("seq",)``); the loss's mean over sequences then becomes the
    only cross-device reduction, inserted by XLA. With one device, unchanged.

    Under ``jax.distributed`` every process draws the same sample (same key),
    so the global array is the same on every host.
    """
    devs = jax.devices()
    if len(devs) == 1:
        return feats
    N = feats.cond.shape[0]
    if N % len(devs):
        raise ValueError(
            f"estimator.N = {N} must be a multiple of the number of devices ({len(devs)}) "
            "to shard the sequence axis (estimator.shard = true)"
        )
    mesh = jax.sharding.Mesh(np.array(devs), ("seq",))
    sh = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("seq"))
    return jax.tree.map(lambda x: jax.device_put(x, sh), feats)


# the largest vocabulary whose d! relabellings estimator.relabel averages over (5! = 120 copies)
MAX_RELABEL_D = 5


def relabel_sample(smp: Sample, data: DataConfig) -> Sample:
    """The sample with every sequence repeated once per permutation P of ``[d]`` (the tokens
    relabelled ``x ↦ P(x)``, with ``y``, ``z_q``, ``π(·|z_q)`` and ``π`` relabelled alike),
    ``N·d!`` sequences, permutation-major (``estimator.relabel``, docs/theory/mathematics.md §M10)."""
    d, k = data.d, len(data.parents)
    if d > MAX_RELABEL_D:
        raise ValueError(f"estimator.relabel averages over d! relabellings and needs data.d <= {MAX_RELABEL_D}, "
                         f"got data.d = {d}")  # fmt: skip
    digits = np.array(list(itertools.product(range(d), repeat=k)), np.int64).reshape(-1, k)  # row z: its digits
    radix = d ** np.arange(k - 1, -1, -1)
    out = []
    for perm in itertools.permutations(range(d)):
        P = np.asarray(perm)
        inv = np.argsort(P)
        zmap = (P[digits] * radix).sum(-1)  # z ↦ code of P(z)
        zinv = np.argsort(zmap)
        Pj = jnp.asarray(P)
        out.append(Sample(X=Pj[smp.X], y=Pj[smp.y], zq=jnp.asarray(zmap)[smp.zq], cond=smp.cond[:, inv],
                          pi=smp.pi[:, zinv][:, :, inv]))  # fmt: skip
    return jax.tree.map(lambda *xs: jnp.concatenate(xs), *out)


def every_position_members() -> tuple[str, ...]:
    """The members that predict at every position (``estimator.positions = "all"``)."""
    from ._registry import MEMBERS

    return tuple(sorted(n for n, c in MEMBERS.items() if c.every_position))


def check_positions(data: DataConfig, model: ModelConfig, estimator: EstimatorConfig) -> None:
    """``ValueError`` naming the key when ``estimator.positions`` cannot be taken with this data,
    member and layout (before any compute)."""
    if data.kind == "triggers" and estimator.relabel:
        raise ValueError("estimator.relabel is not defined for data.kind = 'triggers' (its global bigram and fixed "
                         "triggers are not symmetric under relabelling): set estimator.relabel = false")  # fmt: skip
    if estimator.positions == "last":
        return
    if estimator.positions == "outputs" and data.kind != "triggers":
        kind_of(data).output_positions(data, None, None)  # its refusal
    m = member_of(model)
    where = estimator.positions
    if not m.every_position:
        raise ValueError(f"estimator.positions = {where!r} needs a member that predicts at every position, "
                         f"model.member in {every_position_members()}; model.member = {model.member!r} "
                         f"predicts at the last position only")  # fmt: skip
    if estimator.layout not in ("auto", "positions"):
        raise ValueError(f"estimator.positions = {where!r} is computed in estimator.layout = 'positions' (or 'auto'), "
                         f"got {estimator.layout!r}")  # fmt: skip
    if data.kind == "graph" and estimator.positions == "all":
        kind_of(data).every_position(data, None, None, None)  # its refusal


def loss_targets(smp: Sample, data: DataConfig, estimator: EstimatorConfig):
    """The loss's target of every sequence of `smp`: ``(N, d)`` at the last position
    (``π(·|z_q)``, or ``e(y)`` for ``estimator.target = "drawn"``), or with
    ``estimator.positions = "all"`` ``(N, L, d)``, position t's target (``π(·|z_{t+1})`` or
    ``e(x_{t+1})``) weighted by ``1/#positions`` on the positions whose loss is taken and 0
    elsewhere, so the sequence's loss is the sum over its rows."""
    if estimator.positions == "last":
        if estimator.target == "drawn":
            return jax.nn.one_hot(smp.y, data.d, dtype=smp.cond.dtype)
        return smp.cond
    cond, valid = kind_of(data).every_position(data, smp.X, smp.y, smp.pi)
    if estimator.target == "drawn":
        nxt = jnp.concatenate([smp.X[:, 1:], smp.y[:, None].astype(smp.X.dtype)], axis=1)
        cond = jax.nn.one_hot(nxt, data.d, dtype=smp.cond.dtype)
    if estimator.positions == "outputs":  # (N, L): the sample's output positions, each weighted alike
        valid = kind_of(data).output_positions(data, smp.X, smp.pi)
        n = jnp.sum(valid)
        if int(n) == 0:
            raise ValueError("estimator.positions = 'outputs': the sample holds no output token (no trigger occurs "
                             "twice in a sequence): raise data.L or estimator.N")  # fmt: skip
        w = jnp.asarray(valid, smp.cond.dtype) * (valid.shape[0] / n)
        return cond.astype(smp.cond.dtype) * w[:, :, None]
    w = jnp.asarray(valid / valid.sum(), smp.cond.dtype)
    return cond.astype(smp.cond.dtype) * w[None, :, None]


def loss_sample(data: DataConfig, estimator: EstimatorConfig) -> Sample:
    """The sample :func:`make_loss` draws for `data` and `estimator` (key ``estimator.seed``,
    float64; relabelled when ``estimator.relabel``), drawn again; its targets as drawn (not
    :func:`loss_targets`)."""
    smp = sample(data, estimator.N, key=jax.random.key(estimator.seed), dtype=jnp.float64)
    return relabel_sample(smp, data) if estimator.relabel else smp


def kernel_conditional(data: DataConfig, estimator: EstimatorConfig):
    """``π(·|z_q)`` of every sequence of the sample :func:`make_loss` draws, when the
    loss's target is not it (``estimator.target = "drawn"``: the target is the drawn
    token ``e(y)``), else ``None``. The sample is drawn again from the same key, so it is
    the very sample of the loss. The loss ladder's oracle ([`gflow.loss_ladder`][gflow.loss_ladder]) predicts
    with it."""
    if estimator.target != "drawn":
        return None
    return loss_targets(loss_sample(data, estimator), data, dataclasses.replace(estimator, target="expected"))


def make_loss(
    data: DataConfig = DataConfig(),
    model: ModelConfig = ModelConfig(),
    estimator: EstimatorConfig = EstimatorConfig(),
    *,
    key: PRNGKeyArray | None = None,
    drawn: Sample | None = None,
) -> PopulationLoss:
    """Draw the common random numbers and build ``L̂_N``.

    The sample is drawn from ``key`` if given, else from
    ``jax.random.key(estimator.seed)``: the same configuration and seed give a
    bit-identical estimator. The sample is always drawn in float64; the
    features and the loss use ``estimator.dtype``. ``estimator.shard``
    shards the sequence axis over the devices; ``estimator.chunk`` bounds the
    working memory. ``estimator.target = "drawn"`` replaces ``π(·|z_q)`` by
    ``e(y)`` (the sample's own ``x_{L+1}``); ``estimator.positions = "all"`` takes the loss at
    every position (:func:`loss_targets`); ``estimator.relabel`` averages over the d!
    relabellings of the tokens. The counts layout tabulates the
    ``(d+1)**model.span`` windows of every offset the copier reads; the
    sparse layout only the windows a sequence can show. `drawn`: that sample, when the
    caller already holds it (a grid's points take theirs from a shared chain,
    :func:`gflow.core.sample_from_chain`: the same sample bit for bit); it is not drawn again.
    """
    if key is None:
        key = jax.random.key(estimator.seed)
    dt = estimator.jdtype
    check_positions(data, model, estimator)
    layout = resolve_layout(estimator.layout, data.d, model)
    member = member_of(model)
    smp = sample(data, estimator.N, key=key, dtype=jnp.float64) if drawn is None else drawn
    if estimator.relabel:
        smp = relabel_sample(smp, data)
    smp = eqx.tree_at(lambda s: s.cond, smp, loss_targets(smp, data, estimator))
    feats = features(smp, member, layout=layout, dtype=dt)
    if estimator.shard:
        feats = shard_features(feats)
    return PopulationLoss(
        feats=feats, model=model, eps=jnp.asarray(estimator.eps, dt), kind=estimator.loss, chunk=estimator.chunk
    )

