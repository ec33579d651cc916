"""The Monte Carlo population ICL loss and its gradient (docs/theory/mathematics.md §M3, §M5).

``L̂_N(θ) = (1/N) Σ_n ℓ_RB(θ; X_n, π_n)`` on a sample drawn once from a fixed
key (common random numbers), so ``L̂_N`` is a deterministic smooth function of
θ and ``-∇L̂_N`` is a proper vector field for an ODE solver. The target is
Rao–Blackwellised: ``ℓ_RB = -Σ_e π(e | z_q) log(ŷ_e + ε)`` (or, with
``estimator.target = "drawn"``, the sampled ``y``: ``-log(ŷ_y + ε)``).
"""

from __future__ import annotations

from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

from . import _model
from ._data import DataConfig, Sample, sample
from ._model import (
    CountFeatures,
    HeadFeatures,
    ModelConfig,
    Params,
    PositionFeatures,
    SparseCountFeatures,
    features,
)

_LOSSES = ("log", "ce_on_probs")
_DTYPES = ("float64", "float32")
_LAYOUTS = ("auto", "counts", "positions", "heads", "sparse")
_TARGETS = ("expected", "drawn")


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
      official code's shifted windows) or ``"auto"`` (default: see
      :func:`resolve_layout`).
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
    """

    N: int = eqx.field(static=True, default=10_000)
    seed: int = eqx.field(static=True, default=0)
    eps: float = 1e-6
    loss: Literal["log", "ce_on_probs"] = eqx.field(static=True, default="log")
    dtype: Literal["float64", "float32"] = eqx.field(static=True, default="float64")
    layout: Literal["auto", "counts", "positions", "heads", "sparse"] = eqx.field(static=True, default="auto")
    chunk: int = eqx.field(static=True, default=0)
    shard: bool = eqx.field(static=True, default=False)
    target: Literal["expected", "drawn"] = eqx.field(static=True, default="expected")

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

    @property
    def jdtype(self):
        return jnp.float64 if self.dtype == "float64" else jnp.float32


def sequence_loss(yhat: Float[Array, " d"], cond: Float[Array, " d"], eps, kind: str) -> Float[Array, ""]:
    """Rao–Blackwellised loss of one sequence, ``-Σ_e π(e|z_q) log(ŷ_e + ε)``
    (``kind="log"``), or ``-Σ_e π(e|z_q) log softmax(ŷ)_e``
    (``kind="ce_on_probs"``)."""
    if kind == "log":
        return -jnp.sum(cond * jnp.log(yhat + eps))
    return -jnp.sum(cond * jax.nn.log_softmax(yhat))


def unseen_mass(X, cond: Float[Array, " d"]) -> Float[Array, ""]:
    """``Σ_e π(e|z_q) 1{e absent from x_1..x_L}``: the target mass the model
    cannot predict for any θ (``ŷ_e = 0``), whose loss is capped by ε."""
    seen = jax.nn.one_hot(X, cond.shape[-1], dtype=cond.dtype).max(0)
    return jnp.sum(cond * (1.0 - seen))


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


# Largest number of padded windows (d+1)**M for which layout="auto" tabulates
# κ on window pairs: the table is ((d+1)**M)**2 entries, the counts
# (d+1)**M * d per sequence.
_AUTO_MAX_WINDOWS = 512
# Largest sparse κ table (query windows × sparse windows) for which
# layout="auto" picks "sparse": 2**20 entries (8 MB in float64; its Jacobian,
# for the per-sequence gradients, is dim(w) + |𝒮| times that).
_AUTO_MAX_SPARSE = 2**20
# Largest (batches × sparse table entries) for which the batch gradients of the
# sparse layout are summed on the table (as for counts); above, per sequence.
_MAX_BATCH_TABLE = 2**23


def sparse_table_size(d: int, span: int) -> int:
    """Entries of the sparse layout's κ table at ``L >= span``:
    ``d**span`` query windows × ``Σ_{p=0..span} d**(span−p)`` windows."""
    return d**span * sum(d ** (span - p) for p in range(span + 1))


def resolve_layout(layout: str, d: int, M: int) -> str:
    """``"auto"`` is ``"counts"`` when ``(d+1)**M <= 512`` (``M``: the span,
    every offset the copier reads), else ``"sparse"`` when its κ table has at
    most ``2**20`` entries (:func:`sparse_table_size`: 88,452 for d = 3 and
    the official code's span 5), else ``"positions"``."""
    if layout not in _LAYOUTS:
        raise ValueError(f"estimator.layout must be one of {_LAYOUTS}, got {layout!r}")
    if layout == "auto":
        if _power_at_most(d + 1, M, _AUTO_MAX_WINDOWS):
            return "counts"
        return "sparse" if sparse_table_size(d, M) <= _AUTO_MAX_SPARSE else "positions"
    return layout


def _power_at_most(base: int, exp: int, limit: int) -> bool:
    """``base**exp <= limit`` for ``base >= 2``, in at most ``log2(limit) + 1`` multiplications
    (never computing a huge power: M = 10**30 must not hang)."""
    x = 1
    for _ in range(int(exp)):
        x *= base
        if x > limit:
            return False
    return True


def _tree_norm(t) -> Float[Array, ""]:
    return jnp.sqrt(sum(jnp.sum(x**2) for x in jax.tree.leaves(t)))


def mean_se(x):
    n = x.shape[0]
    se = jnp.std(x, axis=0, ddof=1 if n > 1 else 0) / jnp.sqrt(n)
    return jnp.mean(x, axis=0), se


def seqmap(fn, args: tuple, chunk: int = 0):
    """Map ``fn`` (one sequence's arrays → a pytree) over the leading axis.

    ``chunk = 0``: one ``vmap``. ``chunk > 0``: ``lax.map`` over chunks of
    ``chunk`` sequences, each vmapped and rematerialised in the backward pass
    (``jax.checkpoint``), so the working memory of a loss or gradient is
    O(chunk) rather than O(N); the result is the same to rounding. The last
    chunk is padded with copies of the first sequences, then dropped.
    ``None`` entries of ``args`` pass through.
    """
    N = jax.tree.leaves(args)[0].shape[0]
    if not chunk or chunk >= N:
        return jax.vmap(fn)(*args)
    n_chunks = -(-N // chunk)
    pad = n_chunks * chunk - N

    def prep(x):
        if pad:
            x = jnp.concatenate([x, x[:pad]])
        return x.reshape((n_chunks, chunk) + x.shape[1:])

    chunks = jax.tree.map(prep, args)
    out = jax.lax.map(jax.checkpoint(lambda xs: jax.vmap(fn)(*xs)), chunks)
    return jax.tree.map(lambda o: o.reshape((n_chunks * chunk,) + o.shape[2:])[:N], out)


class PopulationLoss(eqx.Module):
    """The estimator ``L̂_N(θ)`` on a fixed sample (docs/theory/mathematics.md §M3, §M5).

    Build with :func:`make_loss`. Calling it returns the mean loss; see
    :meth:`value_and_grad`, :meth:`stats`, :meth:`per_sequence`.

    Two exact layouts of the same sample: ``CountFeatures`` (κ tabulated on
    window pairs, the sample as window counts; fast) and ``PositionFeatures``
    (per-position match tensors; general). They agree to rounding. With
    ``chunk > 0`` every per-sequence computation runs in chunks (see
    :func:`seqmap`).
    """

    feats: CountFeatures | PositionFeatures
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

    # -- one sequence ------------------------------------------------------
    def _one_positions(self, params: Params, X, G, Gs, cond):
        kap = _model.kappa(params, G, Gs, self.model)
        yhat = _model.predict_from_kappa(params.a, kap, X, cond.shape[-1])
        return sequence_loss(yhat, cond, self.eps, self.kind)

    def _one_heads(self, a, C, tab, X, hk, hq, cond):
        P, Ps = _model.head_products(tab, hk, hq, self.model)
        kap = _model.kappa_from_products(C, P, Ps, self.model)
        return sequence_loss(_model.predict_from_kappa(a, kap, X, cond.shape[-1]), cond, self.eps, self.kind)

    def _one_counts(self, a, row, counts, cond):
        return sequence_loss(_model.predict_from_counts(a, row, counts), cond, self.eps, self.kind)

    def _table(self, w, C):
        return _model.kappa_table(w, C, self.model, self.d)

    def _sparse_table(self, w, C):
        return _model.sparse_kappa_table(w, C, self.model, self.d, self.feats.X.shape[-1])

    def _sparse_jacobian(self, params: Params):
        """The sparse κ table ``(nQ, nK)``, its Jacobian as one row of
        ``dκ/d(w, C)`` per entry ``(nQ·nK, dim w + |𝒮|)``, and the map
        ``(row of J-space, ∂/∂a) → Params``."""
        table = self._sparse_table(params.w, params.C)
        Jw, JC = jax.jacfwd(self._sparse_table, argnums=(0, 1))(params.w, params.C)
        QK = table.size
        nw = params.w.size
        J = jnp.concatenate([Jw.reshape(QK, nw), JC.reshape(QK, -1)], axis=-1)
        unflat = lambda g, ga: Params(w=g[..., :nw].reshape(g.shape[:-1] + params.w.shape), C=g[..., nw:], a=ga)  # noqa: E731
        return table, J, unflat

    def _sparse_size(self) -> int:
        f = self.feats
        r0, r1 = _model.sparse_query_block(self.d, self.model.span, f.X.shape[-1])
        return (r1 - r0) * int(_model.sparse_window_blocks(self.d, self.model.span)[-1])

    def _sparse_args(self):
        f = self.feats
        return (f.Gs, f.G, f.counts, f.cond)

    def _positions_args(self):
        f = self.feats
        return (f.X, f.G, f.Gs, f.cond)

    # -- the estimator -----------------------------------------------------
    def per_sequence(self, params: Params) -> Float[Array, " N"]:
        """``ℓ_RB`` of every sequence, ``(N,)``."""
        f = self.feats
        if isinstance(f, SparseCountFeatures):
            table = self._sparse_table(params.w, params.C)
            fn = lambda q, keys, counts, cond: self._one_counts(params.a, table[q, keys], counts, cond)  # noqa: E731
            return seqmap(fn, self._sparse_args(), self.chunk)
        if isinstance(f, HeadFeatures):
            tab = _model.head_tables(params.w, self.model, self.d)
            fn = lambda X, hk, hq, cond: self._one_heads(params.a, params.C, tab, X, hk, hq, cond)  # noqa: E731
            return seqmap(fn, self._positions_args(), self.chunk)
        if isinstance(f, PositionFeatures):
            fn = lambda X, G, Gs, cond: self._one_positions(params, X, G, Gs, cond)  # noqa: E731
            return seqmap(fn, self._positions_args(), self.chunk)
        table = self._table(params.w, params.C)
        fn = lambda q, counts, cond: self._one_counts(params.a, table[q], counts, cond)  # noqa: E731
        return seqmap(fn, (f.qcode, f.counts, f.cond), self.chunk)

    def __call__(self, params: Params) -> Float[Array, ""]:
        return jnp.mean(self.per_sequence(params))

    def value_and_grad(self, params: Params) -> tuple[Float[Array, ""], Params]:
        return jax.value_and_grad(self.__call__)(params)

    def grad(self, params: Params) -> Params:
        return jax.grad(self.__call__)(params)

    def unseen(self) -> Float[Array, ""]:
        """Mean unseen mass (θ-independent): the target mass on tokens absent
        from the context."""
        f = self.feats
        if isinstance(f, PositionFeatures):
            return jnp.mean(seqmap(unseen_mass, (f.X, f.cond), self.chunk))
        seen = f.counts.sum(-1) > 0
        return jnp.mean(jnp.sum(jnp.where(seen, 0.0, f.cond), -1))

    def per_sequence_grads(self, params: Params) -> tuple[Float[Array, " N"], Params]:
        """Per-sequence losses and gradients (leaves with a leading N axis)."""
        f = self.feats
        if isinstance(f, SparseCountFeatures):
            # The gradient with respect to a sequence's κ entries, mapped to
            # (w, C) by the Jacobian of the κ table at those entries.
            table, J, unflat = self._sparse_jacobian(params)
            K = table.shape[1]
            g1 = jax.value_and_grad(self._one_counts, argnums=(0, 1))

            def one_s(q, keys, counts, cond):
                ls, (ga, grow) = g1(params.a, table[q, keys], counts, cond)
                return ls, unflat(grow @ J[q * K + keys], ga)

            return seqmap(one_s, self._sparse_args(), self.chunk)
        if isinstance(f, HeadFeatures):

            def one_h(p: Params, X, hk, hq, cond):
                tab = _model.head_tables(p.w, self.model, self.d)
                return self._one_heads(p.a, p.C, tab, X, hk, hq, cond)

            vg = jax.value_and_grad(one_h)
            return seqmap(lambda *xs: vg(params, *xs), self._positions_args(), self.chunk)
        if isinstance(f, PositionFeatures):
            vg = jax.value_and_grad(self._one_positions)
            return seqmap(lambda *xs: vg(params, *xs), self._positions_args(), self.chunk)

        # Each sequence needs only its query's row of the κ table.
        def one(p: Params, q, counts, cond):
            row = _model.kappa_row(p.w, p.C, q, self.model, self.d)
            return self._one_counts(p.a, row, counts, cond)

        vg = jax.value_and_grad(one)
        return seqmap(lambda *xs: vg(params, *xs), (f.qcode, f.counts, f.cond), self.chunk)

    def batch_grads(self, params: Params, batches: int) -> tuple[Float[Array, " B"], Params]:
        """Mean gradients over ``B`` disjoint batches of sequences (sequence
        ``n`` in batch ``n mod B``) and each batch's share ``n_b/N``.

        This is how the standard errors of the gradient are estimated (batch
        means, docs/theory/mathematics.md §M5). For the counts layout it costs about one gradient:
        per-sequence gradients with respect to (a, the sequence's row of κ)
        are summed per batch and query window, then mapped to (w, C) by the
        Jacobian of the κ table.
        """
        share, gb, _ = self._batch_grads(params, batches)
        return share, gb

    def _batch_grads(self, params: Params, batches: int):
        """:meth:`batch_grads`, plus the per-sequence losses when the same
        pass yields them (counts layout; ``None`` otherwise)."""
        N = self.N
        B = max(1, min(int(batches), N))
        bid = np.arange(N) % B
        n_b = np.bincount(bid, minlength=B).astype(np.float64)
        share = jnp.asarray(n_b / N, self.eps.dtype)
        f = self.feats
        if isinstance(f, SparseCountFeatures) and B * self._sparse_size() <= _MAX_BATCH_TABLE:
            # As for counts: the per-sequence gradients with respect to (a, the
            # sequence's κ entries) summed per batch on the table, then mapped
            # to (w, C) by the table's Jacobian.
            table, J, unflat = self._sparse_jacobian(params)
            Q, K = table.shape
            g1 = jax.value_and_grad(self._one_counts, argnums=(0, 1))
            fn = lambda q, keys, counts, cond: g1(params.a, table[q, keys], counts, cond)  # noqa: E731
            ls, (ga, grow) = seqmap(fn, self._sparse_args(), self.chunk)
            nb = jnp.asarray(n_b, ls.dtype)
            seg = (jnp.asarray(bid)[:, None] * Q + f.Gs[:, None]) * K + f.G
            T = jax.ops.segment_sum(grow.reshape(-1), seg.reshape(-1), num_segments=B * Q * K)
            g = (T.reshape(B, Q * K) @ J) / nb[:, None]
            return share, unflat(g, jax.ops.segment_sum(ga, jnp.asarray(bid), num_segments=B) / nb), ls
        if isinstance(f, SparseCountFeatures):  # a large table: per-sequence gradients, summed per batch
            ls, gs = self.per_sequence_grads(params)
            nb = jnp.asarray(n_b, ls.dtype)
            gb = jax.tree.map(
                lambda x: jax.ops.segment_sum(x, jnp.asarray(bid), num_segments=B)
                / nb.reshape((B,) + (1,) * (x.ndim - 1)),
                gs,
            )
            return share, gb, ls
        if isinstance(f, CountFeatures):
            table = self._table(params.w, params.C)
            g1 = jax.value_and_grad(self._one_counts, argnums=(0, 1))
            fn = lambda q, counts, cond: g1(params.a, table[q], counts, cond)  # noqa: E731
            ls, (ga, grow) = seqmap(fn, (f.qcode, f.counts, f.cond), self.chunk)
            Q = table.shape[0]
            T = jax.ops.segment_sum(grow, jnp.asarray(bid) * Q + f.qcode, num_segments=B * Q)
            T = T.reshape(B, Q, -1) / jnp.asarray(n_b, T.dtype)[:, None, None]
            Jw, JC = jax.jacfwd(self._table, argnums=(0, 1))(params.w, params.C)
            gb = Params(
                w=jnp.einsum("bqk,qkhm->bhm", T, Jw),
                C=jnp.einsum("bqk,qks->bs", T, JC),
                a=jax.ops.segment_sum(ga, jnp.asarray(bid), num_segments=B) / jnp.asarray(n_b, ga.dtype),
            )
            return share, gb, ls
        nb = -(-N // B)
        idx = np.arange(B * nb)
        real = idx < N
        order = np.where(real, idx, 0).reshape(nb, B).T  # (B, nb), batch b holds n ≡ b mod B
        wts = jnp.asarray(real.reshape(nb, B).T, self.eps.dtype)
        feats_b = jax.tree.map(lambda x: x[order], f)

        def batch_loss(p, fb, wb):
            sub = eqx.tree_at(lambda L: L.feats, self, fb)
            return jnp.sum(wb * sub.per_sequence(p)) / jnp.sum(wb)

        return share, jax.vmap(jax.grad(batch_loss), in_axes=(None, 0, 0))(params, feats_b, wts), None

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
    construction: with only ``a`` moving, κ of every sequence; with only
    ``C`` moving, the products ``Π_{h∈S}⟨v_q^(h), v_l^(h)⟩``. Call it with a
    dict ``{block: value}`` of the moving blocks.
    """

    loss: PopulationLoss
    frozen: Params
    moves: tuple[str, ...] = eqx.field(static=True)
    cache: object = None

    def __init__(self, loss: PopulationLoss, params: Params, moves: tuple[str, ...]):
        self.loss, self.frozen, self.moves = loss, params, tuple(moves)
        f, ch = loss.feats, loss.chunk
        if isinstance(f, SparseCountFeatures) and self.moves in (("a",), ("C",)):
            if self.moves == ("a",):
                self.cache = loss._sparse_table(params.w, params.C)[f.Gs[:, None], f.G]  # each sequence's κ
            else:
                self.cache = _model.sparse_window_products(params.w, loss.model, loss.d, f.X.shape[-1])
        elif isinstance(f, HeadFeatures) and self.moves in (("a",), ("C",)):
            tab = _model.head_tables(params.w, loss.model, loss.d)
            prods = lambda hk, hq: _model.head_products(tab, hk, hq, loss.model)  # noqa: E731
            if self.moves == ("a",):
                fn = lambda hk, hq: _model.kappa_from_products(params.C, *prods(hk, hq), loss.model)  # noqa: E731
            else:
                fn = prods
            self.cache = seqmap(fn, (f.G, f.Gs), ch)
        elif self.moves == ("a",):
            if isinstance(f, PositionFeatures):
                fn = lambda G, Gs: _model.kappa(params, G, Gs, loss.model)  # noqa: E731
                self.cache = seqmap(fn, (f.G, f.Gs), ch)
            else:
                self.cache = loss._table(params.w, params.C)[f.qcode]
        elif self.moves == ("C",):
            if isinstance(f, PositionFeatures):
                fn = lambda G, Gs: _model.products(params.w, G, Gs, loss.model)  # noqa: E731
                self.cache = seqmap(fn, (f.G, f.Gs), ch)
            else:
                self.cache = _model.window_products(params.w, loss.model, loss.d)
        else:
            self.cache = None

    def full(self, y: dict) -> Params:
        """The whole θ with the moving blocks set to ``y``."""
        return Params(**{b: y.get(b, getattr(self.frozen, b)) for b in ("w", "C", "a")})

    def init(self) -> dict:
        return {b: getattr(self.frozen, b) for b in self.moves}

    def __call__(self, y: dict) -> Float[Array, ""]:
        L, f, ch = self.loss, self.loss.feats, self.loss.chunk
        if self.moves not in (("a",), ("C",)):
            return L(self.full(y))
        a = y["a"] if self.moves == ("a",) else self.frozen.a
        if isinstance(f, SparseCountFeatures):
            if self.moves == ("a",):
                fn = lambda row, counts, cond: L._one_counts(a, row, counts, cond)  # noqa: E731
                return jnp.mean(seqmap(fn, (self.cache, f.counts, f.cond), ch))
            r0 = _model.sparse_query_block(L.d, L.model.span, f.X.shape[-1])[0]
            table = _model.kappa_from_sparse_products(y["C"], *self.cache, L.model, r0)
            fn = lambda q, keys, counts, cond: L._one_counts(a, table[q, keys], counts, cond)  # noqa: E731
            return jnp.mean(seqmap(fn, L._sparse_args(), ch))
        if isinstance(f, PositionFeatures):

            def one(cache, X, cond):
                if self.moves == ("a",):
                    kap = cache
                else:
                    kap = _model.kappa_from_products(y["C"], cache[0], cache[1], L.model)
                return sequence_loss(_model.predict_from_kappa(a, kap, X, L.d), cond, L.eps, L.kind)

            return jnp.mean(seqmap(one, (self.cache, f.X, f.cond), ch))
        if self.moves == ("a",):
            fn = lambda row, counts, cond: L._one_counts(a, row, counts, cond)  # noqa: E731
            return jnp.mean(seqmap(fn, (self.cache, f.counts, f.cond), ch))
        table = _model.kappa_from_window_products(y["C"], self.cache, L.model)
        fn = lambda q, counts, cond: L._one_counts(a, table[q], counts, cond)  # noqa: E731
        return jnp.mean(seqmap(fn, (f.qcode, f.counts, f.cond), ch))


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


def kernel_conditional(data: DataConfig, estimator: EstimatorConfig):
    """``π(·|z_q)`` of every sequence of the sample :func:`make_loss` draws, when the
    loss's target is not it (``estimator.target = "drawn"``: the target is the drawn
    token ``e(y)``), else ``None``. The sample is drawn again from the same key, so it is
    the very sample of the loss. The loss ladder's oracle (:mod:`gflow.ladder`) predicts
    with it."""
    if estimator.target != "drawn":
        return None
    smp = sample(data, estimator.N, key=jax.random.key(estimator.seed), dtype=jnp.float64)
    return smp.cond


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
    ``e(y)`` (the sample's own ``x_{L+1}``). The counts layout tabulates the
    ``(d+1)**model.span`` windows of every offset the copier reads; the
    sparse layout only the windows a sequence can show. `drawn`: that sample, when the
    caller already holds it (a grid's points take theirs from a shared chain,
    :func:`gflow.core.sample_from_chain`: the same sample bit for bit); it is not drawn again.
    """
    if key is None:
        key = jax.random.key(estimator.seed)
    dt = estimator.jdtype
    layout = resolve_layout(estimator.layout, data.d, model.span)
    smp = sample(data, estimator.N, key=key, dtype=jnp.float64) if drawn is None else drawn
    if estimator.target == "drawn":
        smp = eqx.tree_at(lambda s: s.cond, smp, jax.nn.one_hot(smp.y, data.d, dtype=smp.cond.dtype))
    feats = features(smp, model, layout=layout, dtype=dt)
    if estimator.shard:
        feats = shard_features(feats)
    return PopulationLoss(
        feats=feats, model=model, eps=jnp.asarray(estimator.eps, dt), kind=estimator.loss, chunk=estimator.chunk
    )
