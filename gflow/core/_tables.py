"""Members of the model family whose second-layer logit is a function of the query's window,
the key's window and (optionally) the key's own token (docs/theory/mathematics.md §M10).

Every member but absolute positions keeps each key's second-layer feature a function of its
own token and its window's tokens, so the κ of a (query, key) pair is a θ-dependent table over
(query window, [key token,] key window), and the counts and sparse layouts of the paper's
model apply unchanged: only the table grows by the factor d when the key's own token enters
(``own_token``). :class:`AbstractWindowModel` computes every primitive of
:class:`~gflow.core.AbstractModel` from two hooks of its final classes:

- ``vectors(p, windows, own, query)``: each component's vector (the heads' outputs v^(h), and
  for some members the token itself) for positions with the given windows (``(n, span)``
  tokens, padding ``d``) and own tokens;
- ``pair_kernel(p, Vq, Vk)``: κ of every (query, key) pair from those vectors, with its split
  into C-independent ``inner_products`` and their ``combine`` with C (a Stage I cache),

plus the readout of one sequence. The helpers below (the copier's softmax with zero padding or
the official code's mask, LayerNorm, the sum-normalised and the official selectors, the
own-token readout) are shared by the members.
"""

from __future__ import annotations

import abc

import jax
import jax.numpy as jnp
import numpy as np

from ._attention import no_sequence_attention, window_attention
from ._data import all_windows
from ._family import AbstractModel
from ._member_paper import AUTO_MAX_SPARSE, sparse_table_size, table_layout
from ._model import ModelConfig, Params
from ._ops import sequence_loss
from ._paper import predict_from_counts, shifted_windows, sparse_query_block, sparse_windows
from ._traits import (
    AbstractCSelector,
    AbstractOffsetSpan,
    AbstractOwnOffsets,
    AbstractPaperStages,
    AbstractRPECopier,
)

# nn.LayerNorm's ε (PyTorch's default, the official code's LayerNorm(d))
LN_EPS = 1e-5
# the official selector's floor inside its log-products: exp(Σ_c deg_c log(x_c + 1e-24))
OFFICIAL_FLOOR = 1e-24
# the official first layer's logit on the diagonal (a position attending to itself)
DIAGONAL_LOGIT = 1e-6
# the most numbers (table entries × table parameters) for which the batch gradients go through
# the κ table's Jacobian (256 MB in float64); above, one vector-Jacobian product a batch
MAX_JACOBIAN = 2**25
# cotangents pulled back at once when the table's Jacobian is too large to form
VJP_BATCH = 4


# ---------------------------------------------------------------------------
# Shared pieces
# ---------------------------------------------------------------------------


def onehots(windows, d: int, dtype):
    """``OH[n, j, e] = 1{windows[n, j] = e}`` (padding, symbol d, is the zero vector)."""
    return (windows[..., None] == jnp.arange(d)).astype(dtype)


def layer_norm(y, gamma, beta):
    """PyTorch's ``nn.LayerNorm(d)`` over the last axis: ``γ ⊙ (y − ȳ)/√(var(y) + ε) + β``,
    the biased variance, ε = 1e-5."""
    mu = jnp.mean(y, axis=-1, keepdims=True)
    var = jnp.mean((y - mu) ** 2, axis=-1, keepdims=True)
    return gamma * (y - mu) / jnp.sqrt(var + LN_EPS) + beta


def subset_product(inner, S, index):
    """``Π_{c∈S} inner[index(c)]`` over the component axis 0 (1 for the empty set)."""
    out = None
    for c in S:
        t = inner[index(c)]
        out = t if out is None else out * t
    return jnp.ones(inner.shape[1:], inner.dtype) if out is None else out


def sum_norm_combine(C, inner, sets, index):
    """The paper's sum-normalised selector ``Σ_S c_S Π_{c∈S} inner_c / Σ_S c_S`` (``c = C²``)."""
    c = C**2
    num = sum(c[r] * subset_product(inner, S, index) for r, S in enumerate(sets))
    return num / c.sum()


def kappa_readout(a, z, counts, cond, eps, kind):
    """The paper's classifier on κ entries: ``ŷ_e = Σ_k e^{a z_{(e,)k}} n_{ek} / Σ_{e,k} e^{a z_{(e,)k}} n_{ek}``
    (``z`` ``(K,)``, or ``(d, K)`` when κ reads the key's own token), then the loss."""
    if z.ndim == 1:
        return sequence_loss(predict_from_counts(a, z, counts), cond, eps, kind)
    present = counts > 0
    zz = a * z
    zmax = jax.lax.stop_gradient(jnp.max(jnp.where(present, zz, -jnp.inf)))
    E = jnp.where(present, jnp.exp(jnp.where(present, zz, zmax) - zmax), 0.0) * counts
    return sequence_loss(jnp.sum(E, axis=-1) / jnp.sum(E), cond, eps, kind)


def rpe_attention(w, OH, pad, *, token_logits=None, mask=False, diagonal=None):
    """A head's attention over its window offsets: ``softmax_j(w_j + token_logits_j)`` per
    position, ``(n, M)`` (``w`` ``(M,)``, ``OH`` ``(n, M, d)``, ``pad`` ``(n, M)``).
    ``mask``: padded offsets are excluded from the softmax (the official code's −∞), else
    they keep their logit and carry the zero vector (the paper's zero padding). With
    ``diagonal`` ``(n,)`` (the logit of the position itself), the result is ``(n, 1 + M)``,
    the diagonal first."""
    logits = jnp.broadcast_to(w, pad.shape) if token_logits is None else w + token_logits
    if mask:
        logits = jnp.where(pad, -jnp.inf, logits)
    if diagonal is not None:
        logits = jnp.concatenate([diagonal[:, None], logits], axis=-1)
    return jax.nn.softmax(logits, axis=-1)


# ---------------------------------------------------------------------------
# The abstract window member
# ---------------------------------------------------------------------------


class AbstractWindowModel(AbstractModel):
    """A member whose κ is a function of (query window, [key token,] key window) (see the
    module docstring). Final classes implement :meth:`vectors`, :meth:`pair_kernel`,
    :meth:`inner_products`, :meth:`combine` and :meth:`readout` (and the structure)."""

    @abc.abstractmethod
    def vectors(self, p: Params, windows, own, *, query: bool, d: int):
        """Component vectors ``(n_components, n, dv)`` of n positions: their windows
        ``(n, span)`` (offset 1 first, padding `d`, the vocabulary size) and own tokens
        ``(n,)`` (read only when ``query`` is false: the query slot carries the zero vector)."""

    @abc.abstractmethod
    def pair_kernel(self, p: Params, Vq, Vk):
        """κ of every (query, key) pair, ``(nq, nk)``, from :meth:`vectors`."""

    @abc.abstractmethod
    def inner_products(self, Vq, Vk):
        """The C-independent part of :meth:`pair_kernel` (when :attr:`caches_selector`)."""

    @abc.abstractmethod
    def combine(self, C, inner):
        """:meth:`pair_kernel` from :meth:`inner_products` and C."""

    # -- final: the attention along a sequence, the table layouts -------------------------------
    def sequence_attention(self, blocks, L):
        """The relative embedding laid along the sequence; refused when the first layer reads the
        key's own token (``token``, ``full``: the attention then depends on the sequence)."""
        if self.own_token:
            no_sequence_attention(self.name)
        return window_attention(self.model, blocks, L)

    def _keys(self, windows, d: int):
        """Key windows and own tokens of a table's columns: each window once (own token 0,
        unread), or once per own token ``e`` (e-major) when κ reads it."""
        K = windows.shape[0]
        if not self.own_token:
            return windows, jnp.zeros((K,), windows.dtype)
        own = jnp.repeat(jnp.arange(d, dtype=windows.dtype), K)
        return jnp.tile(windows, (d, 1)), own

    def _flat(self, p: Params, qwin, kwin, d: int, fn):
        """`fn` of the query windows' and the keys' vectors (keys flat: own token major)."""
        kw, own = self._keys(kwin, d)
        Vq = self.vectors(p, qwin, None, query=True, d=d)
        Vk = self.vectors(p, kw, own, query=False, d=d)
        return fn(Vq, Vk)

    def _shaped(self, out, d: int):
        """A flat table ``(nq, [d·]K)`` as ``(nq, d, K)`` when κ reads the key's own token."""
        return out if not self.own_token else out.reshape(out.shape[:-1] + (d, out.shape[-1] // d))

    def _table(self, p: Params, qwin, kwin, d: int, fn):
        return self._shaped(self._flat(p, qwin, kwin, d, fn), d)

    def _all(self, d):
        return jnp.asarray(all_windows(d + 1, self.span))

    def _sparse(self, d, L):
        W = jnp.asarray(sparse_windows(d, self.span))
        r0, r1 = sparse_query_block(d, self.span, L)
        return W[r0:r1], W

    def counts_table(self, p, d):
        W = self._all(d)
        return self._table(p, W, W, d, lambda Vq, Vk: self.pair_kernel(p, Vq, Vk))

    def counts_row(self, p, q, d):
        W = self._all(d)
        return self._table(p, W[q][None], W, d, lambda Vq, Vk: self.pair_kernel(p, Vq, Vk))[0]

    def _pullback(self, p, table_fn):
        """``(table, pull)``: `pull` maps cotangents of the table with a leading batch axis to
        the gradients of its blocks, through the table's Jacobian when it has at most
        :data:`MAX_JACOBIAN` numbers (one matrix product for every batch: the batch standard
        errors at the cost of a few gradients), else by one vector-Jacobian product a batch."""
        names = self.table_blocks(p)
        blocks = {b: p.get(b) for b in names}
        fn = lambda tb: table_fn(p.with_blocks(tb))  # noqa: E731
        sizes = [int(np.prod(np.shape(blocks[b]))) for b in names]
        table = fn(blocks)
        E = table.size
        if E * sum(sizes) > MAX_JACOBIAN:
            # a few batches at a time: all 64 at once asked for 116 GB (the Full model's counts table)
            _, vjp = jax.vjp(fn, blocks)
            return table, lambda T: jax.lax.map(lambda t: vjp(t.reshape(table.shape))[0], T, batch_size=VJP_BATCH)
        J = jax.jacfwd(fn)(blocks)
        Jf = jnp.concatenate([J[b].reshape(E, n) for b, n in zip(names, sizes)], axis=-1)
        offs = np.cumsum([0] + sizes)

        def pull(T):
            g = T.reshape(T.shape[0], E) @ Jf
            return {b: g[:, offs[i] : offs[i + 1]].reshape((T.shape[0],) + np.shape(blocks[b]))
                    for i, b in enumerate(names)}  # fmt: skip

        return table, pull

    def counts_pullback(self, p, d):
        return self._pullback(p, lambda q: self.counts_table(q, d))[1]

    def sparse_table(self, p, d, L):
        Q, W = self._sparse(d, L)
        return self._table(p, Q, W, d, lambda Vq, Vk: self.pair_kernel(p, Vq, Vk))

    def sparse_jacobian(self, p, d, L):
        names = self.table_blocks(p)
        blocks = {b: p.get(b) for b in names}
        fn = lambda tb: self.sparse_table(p.with_blocks(tb), d, L)  # noqa: E731
        return fn(blocks), jax.jacfwd(fn)(blocks)

    def sparse_pullback(self, p, d, L):
        return self._pullback(p, lambda q: self.sparse_table(q, d, L))

    def counts_products(self, p, d):
        W = self._all(d)
        return self._flat(p, W, W, d, self.inner_products)

    def counts_from_products(self, C, products, d):
        return self._shaped(self.combine(C, products), d)

    def sparse_products(self, p, d, L):
        Q, W = self._sparse(d, L)
        return self._flat(p, Q, W, d, self.inner_products)

    def sparse_from_products(self, C, products, d, L):
        return self._shaped(self.combine(C, products), d)

    # -- final: the vectors layout (gflow.core.VectorFeatures) ---------------------------------
    @property
    def vector_blocks(self) -> tuple[str, ...]:
        """The blocks :meth:`vectors` reads: the first layer, which Stage II trains."""
        return self.stage_moves["II"]

    def vector_table(self, p, d, L):
        """The components' vectors of every query window of the sparse layout and of every (own
        token, window) key, ``((n_comp, nQ, dv), (n_comp, [d·]nK, dv))``."""
        Q, W = self._sparse(d, L)
        kw, own = self._keys(W, d)
        return self.vectors(p, Q, None, query=True, d=d), self.vectors(p, kw, own, query=False, d=d)

    # -- final: the positions layout -----------------------------------------------------------
    @property
    def reads_match_tensors(self) -> bool:
        return False

    def position_inputs(self, x, dtype):
        return None, None

    def _position_windows(self, X, d: int):
        T = shifted_windows(X, self.span)  # (L+1, span), -1 for padding
        return jnp.where(T < 0, d, T)

    def _position_vectors(self, p, X, d):
        W = self._position_windows(X, d)
        Vq = self.vectors(p, W[-1:], None, query=True, d=d)
        Vk = self.vectors(p, W[:-1], X, query=False, d=d)
        return Vq, Vk

    def positions_z(self, p, X, G, Gs, d):
        return self.pair_kernel(p, *self._position_vectors(p, X, d))[0]

    def positions_readout(self, p, z, X, cond, eps, kind):
        counts = jax.nn.one_hot(X, cond.shape[-1], dtype=z.dtype).T  # (d, L): each key its own window
        return self.readout(p, z, counts, cond, eps, kind)

    def positions_products(self, p, X, G, Gs, d):
        return self.inner_products(*self._position_vectors(p, X, d))

    def positions_from_products(self, C, products):
        return self.combine(C, products)[0]

    # -- final: structure shared by the window members ----------------------------------------
    @property
    def layouts(self) -> tuple[str, ...]:
        return ("counts", "positions", "sparse", "vectors")

    def auto_layout(self, d: int) -> str:
        """The paper's choice (counts up to 512 windows, then sparse, then positions). A κ table
        that also reads the key's own token (the token and Full members) is d times larger: the
        sparse layout while that table has at most 2**20 entries (``d·sparse_table_size``), else the
        vectors layout. Measured (``scripts/benchmarks/bench_members.py [--d 2] [--L 40] [--stats]``,
        N = 10⁴, one gradient):
        the Full model at d = 3, L = 100 in 108 ms sparse against 881 vectors and 755 counts, at
        d = 2 in 28 against 304 (vectors), at d = 3, L = 40 in 126 against 635; the token member
        in 17 against 42 (counts). The per-sequence statistics of a saved time cost more in sparse
        (2.3 s against 0.65 s for the Full model at d = 3, L = 40), but a flow takes tens to
        thousands of gradients per saved time."""
        if not self.own_token:
            return table_layout(d, self.span)
        return "sparse" if d * sparse_table_size(d, self.span) <= AUTO_MAX_SPARSE else "vectors"

    @property
    def has_table_hessian(self) -> bool:
        return False


def check_aligned_heads(model: ModelConfig, what: str) -> None:
    """The aligned windows' initialisation (head h on its own offset h) needs ``H <= M``."""
    if model.H > model.M:
        raise ValueError(f"model.member = {what!r} starts head h on offset h and needs model.H <= model.M, "
                         f"got H={model.H}, M={model.M}")  # fmt: skip


def eye_stack(H: int, d: int, s: float, dtype):
    """``s·I_d`` for each of H heads, ``(H, d, d)``."""
    return jnp.asarray(np.broadcast_to(s * np.eye(d), (H, d, d)).copy(), dtype)


class AbstractRPEWindowModel(
    AbstractWindowModel,
    AbstractRPECopier,
    AbstractOffsetSpan,
    AbstractCSelector,
    AbstractOwnOffsets,
    AbstractPaperStages,
):
    """The paper's layers on the window tables, of which a member changes one part: an RPE copier
    per head (``softmax(w^(h))``) whose heads span and own their offsets, the selector C with
    the sum norm, and the paper's three stages. ``"token"`` (a token-aware score) and ``"value"``
    (a value matrix per head) are this with one layer changed."""
