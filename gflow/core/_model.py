"""The two-attention-layer transformer TF(M, H, d, D) of docs/theory/mathematics.md §M2.

Everything is computed from θ-independent *match tensors* of a sequence,
never from the tensor-product features φ:

- ``G[l, i, j] = 1{x_{q-i} = x_{l-j}}`` for keys ``l = 1..L`` (query ``q = L+1``),
- ``Gs[l, i, j] = 1{x_{l-i} = x_{l-j}}`` for ``l = 1..L+1`` (``norm="layer"`` only),

with zero padding (``x_j`` for ``j <= 0`` matches nothing). For head ``h``
with attention ``s = softmax(w^(h))``, ``⟨v_q^(h), v_l^(h)⟩ = s^T G[l] s``.
The selector's kernel ``⟨φ_q, φ_l⟩ = Σ_S c_S Π_{h∈S} ⟨v_q^(h), v_l^(h)⟩`` is
the products matrix ``P[l, S]`` times ``c``.
"""

from __future__ import annotations

import itertools
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from ._data import Sample, all_windows

_NORMS = ("sum", "layer")
_WINDOWS = ("aligned", "shifted")

# The official code's per-head normalisation v ← v/(‖v‖ + HEAD_NORM_EPS).
HEAD_NORM_EPS = 1e-7


def subsets(H: int, D: int) -> tuple[tuple[int, ...], ...]:
    """The selector's index set ``𝒮 = {S ⊆ {1..H} : |S| <= D}``, empty set
    included, ordered by size and then lexicographically (docs/theory/mathematics.md §M2).

    Heads are 1-based, so a set of heads reads as a set of offsets.
    """
    out = []
    for r in range(0, D + 1):
        out.extend(itertools.combinations(range(1, H + 1), r))
    return tuple(out)


def subset_label(S: tuple[int, ...]) -> str:
    """``"∅"`` or ``"{1,2}"``."""
    return "∅" if len(S) == 0 else "{" + ",".join(map(str, S)) + "}"


class ModelConfig(eqx.Module):
    """Sizes and normalisation of TF(M, H, d, D).

    - `M`: window of the relative positional embedding (offsets ``1..M``).
    - `H`: number of heads of the first attention layer.
    - `D`: maximal size of a selected set of heads, ``0 <= D <= H``.
    - `norm`: ``"sum"`` (default, the reference simulations: ``Z = Σ_S c_S``)
      or ``"layer"`` (exact layer normalisation, ``Z = ‖φ_q‖‖φ_l‖``).
    - `head_norm`: extension, the official code's model (docs/theory/mathematics.md §M8.5):
      every head's output is normalised before the selector,
      ``v^(h) ← v^(h)/(‖v^(h)‖ + 1e-7)`` (an all-padding window, ``v = 0``,
      stays 0). Default ``False`` (the paper's model).
    - `windows`: ``"aligned"`` (default, the paper: every head attends
      offsets ``1..M``) or ``"shifted"`` (extension, the official code:
      head h attends offsets ``h..h+M−1`` with its own M weights, so the
      model reads ``span = H+M−1`` offsets).
    """

    M: int = eqx.field(static=True, default=3)
    H: int = eqx.field(static=True, default=3)
    D: int = eqx.field(static=True, default=2)
    norm: Literal["sum", "layer"] = eqx.field(static=True, default="sum")
    head_norm: bool = eqx.field(static=True, default=False)
    windows: Literal["aligned", "shifted"] = eqx.field(static=True, default="aligned")

    def __check_init__(self):
        for name in ("M", "H"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"model.{name} must be an integer >= 1, got {v!r}")
        if not isinstance(self.D, (int, np.integer)) or not 0 <= self.D <= self.H:
            raise ValueError(f"model.D must be an integer in [0, H={self.H}], got {self.D!r}")
        if self.norm not in _NORMS:
            raise ValueError(f"model.norm must be one of {_NORMS}, got {self.norm!r}")
        if self.head_norm is not True and self.head_norm is not False:
            raise ValueError(f"model.head_norm must be true or false, got {self.head_norm!r}")
        if self.windows not in _WINDOWS:
            raise ValueError(f"model.windows must be one of {_WINDOWS}, got {self.windows!r}")

    @property
    def span(self) -> int:
        """Number of offsets the copier reads: ``M`` (aligned) or ``H+M−1`` (shifted)."""
        return self.M if self.windows == "aligned" else self.H + self.M - 1

    @property
    def self_match(self) -> bool:
        """Whether the positions layout needs the self-match tensors ``Gs``
        (``‖v_l^(h)‖`` enters κ: ``norm="layer"`` or ``head_norm``)."""
        return self.norm == "layer" or bool(self.head_norm)

    def own_offset_index(self, h: int) -> int:
        """Index in ``w[h-1]`` of the entry the initialisation puts ``w₊`` on
        (head h's own offset h): ``h−1`` (aligned) or ``0`` (shifted: the
        first entry of the window ``h..h+M−1``)."""
        return h - 1 if self.windows == "aligned" else 0

    @property
    def subsets(self) -> tuple[tuple[int, ...], ...]:
        return subsets(self.H, self.D)

    @property
    def membership(self) -> np.ndarray:
        """``(|𝒮|, H)`` 0/1 matrix: ``[S, h-1] = 1{h ∈ S}``."""
        m = np.zeros((len(self.subsets), self.H))
        for r, S in enumerate(self.subsets):
            for h in S:
                m[r, h - 1] = 1.0
        return m


class InitConfig(eqx.Module):
    """The paper's initialisation (docs/theory/mathematics.md §M4): ``w^(h)_i = w_plus`` if ``i = h``
    else ``w_minus``; ``C_S = c0`` for every S; ``a = a0``. With
    ``model.windows = "shifted"``, ``w_plus`` sits on the first entry of head
    h's window (offset h), as in the official code.

    - `w_plus`: the RPE weight of head h on its own offset h (default 3).
    - `w_minus`: the RPE weight on every other offset (default 0.1).
    - `c0`: every selector weight ``C_S`` (non-zero; default 0.01, so ``c_S = 10⁻⁴``).
    - `a0`: the classifier scale ``a`` (default 0.01).
    """

    w_plus: float = 3.0
    w_minus: float = 0.1
    c0: float = 0.01
    a0: float = 0.01

    def __check_init__(self):
        for name in ("w_plus", "w_minus", "c0", "a0"):
            if not np.isfinite(getattr(self, name)):
                raise ValueError(f"init.{name} must be finite, got {getattr(self, name)!r}")
        if self.c0 == 0:
            raise ValueError("init.c0 must be non-zero (c_S = c0² would vanish and Σc = 0), got 0")


class Params(eqx.Module):
    """θ = (w, C, a): RPE weights ``(H, M)``, selector weights ``(|𝒮|,)`` with
    ``c_S = C_S²``, classifier scale (scalar)."""

    w: Float[Array, "H M"]
    C: Float[Array, " nS"]
    a: Float[Array, ""]

    @property
    def s(self) -> Float[Array, "H M"]:
        """Copier attention ``s^(h) = softmax(w^(h))``."""
        return jax.nn.softmax(self.w, axis=-1)

    @property
    def c(self) -> Float[Array, " nS"]:
        return self.C**2

    @property
    def c_frac(self) -> Float[Array, " nS"]:
        """``c / Σc``."""
        c = self.C**2
        return c / c.sum()


def flatten(p: Params) -> Float[Array, " P"]:
    """θ as one vector: ``w`` row-major, ``C``, ``a`` (P = H·M + |𝒮| + 1)."""
    return jnp.concatenate([jnp.ravel(p.w), jnp.ravel(p.C), jnp.reshape(p.a, (1,))])


def unflatten(x: Float[Array, " P"], H: int, M: int) -> Params:
    """The inverse of :func:`flatten`."""
    k = H * M
    return Params(w=x[:k].reshape(H, M), C=x[k:-1], a=x[-1])


def init_params(model: ModelConfig, init: InitConfig = InitConfig(), *, dtype=jnp.float64) -> Params:
    """The paper's initialisation: head h starts on offset h (aligned windows
    require ``H <= M``; shifted windows put ``w_plus`` on ``w[h-1, 0]``)."""
    if model.windows == "aligned" and model.H > model.M:
        raise ValueError(f"the paper's initialisation needs model.H <= model.M, got H={model.H}, M={model.M}")
    eye = np.zeros((model.H, model.M))
    eye[np.arange(model.H), [model.own_offset_index(h) for h in range(1, model.H + 1)]] = 1.0
    w = jnp.asarray(init.w_minus + (init.w_plus - init.w_minus) * eye, dtype)
    C = jnp.full((len(model.subsets),), init.c0, dtype)
    return Params(w=w, C=C, a=jnp.asarray(init.a0, dtype))


def copier_matrix(w: Float[Array, "H M"], model: ModelConfig) -> Float[Array, "H span"]:
    """Head h's attention over the ``span`` offsets the model reads:
    ``softmax(w^(h))`` on offsets ``1..M`` (aligned) or ``h..h+M−1``
    (shifted), zero elsewhere. Then ``v_l^(h) = Σ_i S[h, i-1] e(x_{l-i})``."""
    s = jax.nn.softmax(w, axis=-1)
    if model.windows == "aligned":
        return s
    span = model.span
    return jnp.stack([jnp.pad(s[h], (h, span - model.M - h)) for h in range(model.H)])


def _safe_norm(sq):
    """``sqrt(sq)`` with a zero (not NaN) gradient at ``sq = 0`` (an all-padding window)."""
    pos = sq > 0
    return jnp.where(pos, jnp.sqrt(jnp.where(pos, sq, 1.0)), 0.0)


def head_norm_scale(sq):
    """``1/(‖v‖ + 1e-7)`` from ``‖v‖²`` (the official code's per-head normalisation)."""
    return 1.0 / (_safe_norm(sq) + HEAD_NORM_EPS)


# ---------------------------------------------------------------------------
# Match tensors
# ---------------------------------------------------------------------------


def _shifted(X: Int[Array, " L"], M: int) -> Int[Array, "L1 M"]:
    """``T[l-1, i-1] = x_{l-i}`` for ``l = 1..L+1``, ``i = 1..M``; -1 for padding."""
    L = X.shape[0]
    pad = jnp.concatenate([jnp.full((M,), -1, X.dtype), X])  # x_j at index M + j - 1
    l = np.arange(1, L + 2)[:, None]
    i = np.arange(1, M + 1)[None, :]
    return pad[M + l - i - 1]


def match_tensors(X: Int[Array, " L"], M: int, *, self_match: bool, dtype=jnp.float64):
    """Match tensors of one sequence (see module docstring)."""
    T = _shifted(X, M)  # (L+1, M)
    q = T[-1]  # query's offsets x_{q-i}
    G = (q[None, :, None] == T[:-1, None, :]) & (q[None, :, None] >= 0)
    G = G.reshape(X.shape[0], M * M).astype(dtype)
    Gs = None
    if self_match:
        Gs = (T[:, :, None] == T[:, None, :]) & (T[:, :, None] >= 0)
        Gs = Gs.reshape(X.shape[0] + 1, M * M).astype(dtype)
    return G, Gs


class PositionFeatures(eqx.Module):
    """Per-position inputs of the model (the general layout).

    - `X`: tokens ``(N, L)``.
    - `G`: query–key match tensor, ``(N, L, span*span)`` (flattened ``(i, j)``;
      ``span = model.span``, M for aligned windows).
    - `Gs`: self-match tensor of positions ``1..L+1``, ``(N, L+1, span*span)``,
      or ``None`` unless ``model.self_match`` (``norm="layer"`` or ``head_norm``).
    - `cond`: the target: ``π(· | z_q)``, or ``e(y)`` for ``estimator.target = "drawn"``, ``(N, d)``.
    """

    X: Int[Array, "N L"]
    G: Float[Array, "N L MM"]
    Gs: Float[Array, "N L1 MM"] | None
    cond: Float[Array, "N d"]


class CountFeatures(eqx.Module):
    """Window counts of each sequence (the fast layout, exact).

    - `qcode`: code of the query's window, ``(N,)``.
    - `counts`: ``counts[n, e, k] = #{l <= L : window of l is k, x_l = e}``,
      ``(N, d, (d+1)**span)`` (windows last: the loss reduces over them;
      ``span = model.span``: the window is every offset the copier reads).
    - `cond`: the target, as in :class:`PositionFeatures`.
    """

    qcode: Int[Array, " N"]
    counts: Float[Array, "N d K"]
    cond: Float[Array, "N d"]


class HeadFeatures(PositionFeatures):
    """Per-position, per-head window codes (the ``"heads"`` layout, exact).

    Head h's inner product ``⟨v_q^(h), v_l^(h)⟩`` depends only on the M
    offsets head h reads (``1..M``, or ``h..h+M−1`` with shifted windows),
    so it is a θ-dependent table ``T_h`` over pairs of the ``(d+1)**M``
    padded head windows (:func:`head_tables`), and a position enters only
    through its H head-window codes. Cost per sequence ``O(L·(H + |𝒮|))``,
    independent of the span: the layout for shifted windows, where the counts
    table over ``(d+1)**(H+M−1)`` windows is large.

    A :class:`PositionFeatures` whose `G` holds the key codes ``(N, L, H)``
    and `Gs` the query codes ``(N, H)`` (ints) instead of match tensors;
    `X` and `cond` as there.
    """


class SparseCountFeatures(PositionFeatures):
    """Each sequence's counts over its own distinct key windows (the
    ``"sparse"`` layout, exact).

    The counts layout for a large span: κ is tabulated on windows of all
    ``span`` offsets (:func:`sparse_kappa_table`), but only on the windows a
    sequence can show (padding only on the offsets before its start:
    ``Σ_p d**(span−p)`` key windows, ``d**span`` query windows once
    ``L >= span``, instead of ``(d+1)**span`` each), and each sequence keeps
    counts only on the ``U`` distinct windows it holds (``U`` = the most any
    sequence of the sample holds, ``<= min(L, Σ_p d**(span−p))``).

    A :class:`PositionFeatures` (so `X` and `cond` as there, and everything
    that reads the tokens works) whose `G` holds the key windows ``(N, U)``
    (ints, columns of the table; unused slots 0) and `Gs` the query window
    ``(N,)`` (ints, rows of the table), plus

    - `counts`: ``counts[n, e, u] = #{l <= L : window of l is G[n, u], x_l = e}``,
      ``(N, d, U)`` (0 in unused slots).
    """

    counts: Float[Array, "N d U"] = None


def features(sample: Sample, model: ModelConfig, *, layout: str = "counts", dtype=jnp.float64):
    """θ-independent inputs of every sequence of a sample (computed once).

    ``layout="counts"`` gives :class:`CountFeatures`, ``"positions"``
    :class:`PositionFeatures`, ``"heads"`` :class:`HeadFeatures`, ``"sparse"``
    :class:`SparseCountFeatures`. All give the same loss to rounding.
    """
    if layout == "counts":
        return _count_features(sample.X, sample.cond, model, dtype)
    if layout == "sparse":
        return _sparse_features(sample.X, sample.cond, model, dtype)
    if layout == "positions":
        return _position_features(sample.X, sample.cond, model, dtype)
    if layout == "heads":
        return _head_features(sample.X, sample.cond, model, dtype)
    raise ValueError(
        f"estimator.layout must be one of ('auto', 'counts', 'positions', 'heads', 'sparse'), got {layout!r}"
    )


def head_window_codes(X: Int[Array, " L"], model: ModelConfig, d: int) -> Int[Array, "L1 H"]:
    """Code of head h's window at every position ``l = 1..L+1``: the tokens
    ``(x_{l-o})`` at the M offsets o head h reads (first offset most
    significant; padding is symbol ``d``), as in :func:`window_codes`."""
    T = _shifted(X, model.span)
    T = jnp.where(T < 0, d, T)
    radix = jnp.asarray((d + 1) ** np.arange(model.M - 1, -1, -1), T.dtype)
    starts = [0 if model.windows == "aligned" else h for h in range(model.H)]
    return jnp.stack([(T[:, s0 : s0 + model.M] * radix).sum(-1) for s0 in starts], axis=-1)


@eqx.filter_jit
def _head_features(X, cond, model, dtype):
    d = cond.shape[-1]
    codes = jax.vmap(lambda x: head_window_codes(x, model, d))(X)  # (N, L+1, H)
    return HeadFeatures(X=X, G=codes[:, :-1], Gs=codes[:, -1], cond=cond.astype(dtype))


def head_tables(w: Float[Array, "H M"], model: ModelConfig, d: int) -> Float[Array, "H K1 K1"]:
    """``T[h, a, b] = ⟨v^(h)(a), v^(h)(b)⟩`` over pairs of head windows
    (``(d+1)**M`` each): ``v^(h)(a) = Σ_j softmax(w^(h))_j e(a_j)``, divided
    by ``‖v^(h)‖ + 1e-7`` with ``model.head_norm``."""
    s = jax.nn.softmax(w, axis=-1)
    OH = jnp.asarray(window_onehots(d, model.M), w.dtype)  # (K1, M, d)
    V = jnp.einsum("hj,kje->hke", s, OH)
    if model.head_norm:
        V = V * head_norm_scale(jnp.sum(V * V, -1))[..., None]
    return jnp.einsum("hae,hbe->hab", V, V)


def head_products(tab: Float[Array, "H K1 K1"], hk: Int[Array, "L H"], hq: Int[Array, " H"], model: ModelConfig):
    """:func:`products` in the ``"heads"`` layout: ``P[l, S] = Π_{h∈S} T_h[q_h, k_{l,h}]``
    and, for ``norm="layer"``, the self products ``Π_{h∈S} T_h[k_{l,h}, k_{l,h}]``
    of positions 1..L+1."""
    hidx = np.arange(model.H)
    P = subset_products(tab[hidx, hq[None, :], hk], model.membership)
    Ps = None
    if model.norm == "layer":
        allk = jnp.concatenate([hk, hq[None]], axis=0)
        Ps = subset_products(tab[hidx, allk, allk], model.membership)
    return P, Ps


@eqx.filter_jit
def _position_features(X, cond, model, dtype):
    G, Gs = jax.vmap(lambda x: match_tensors(x, model.span, self_match=model.self_match, dtype=dtype))(X)
    return PositionFeatures(X=X, G=G, Gs=Gs, cond=cond.astype(dtype))


@eqx.filter_jit
def _count_features(X, cond, model, dtype):
    d = cond.shape[-1]
    K = window_code_count(d, model.span)

    def one(x):
        codes = window_codes(x, model.span, d)
        cnt = jnp.zeros(d * K, dtype).at[x * K + codes[:-1]].add(1.0)
        return codes[-1], cnt.reshape(d, K)

    qcode, counts = jax.vmap(one)(X)
    return CountFeatures(qcode=qcode, counts=counts, cond=cond.astype(dtype))


# ---------------------------------------------------------------------------
# The kernel tabulated on windows (the fast path)
# ---------------------------------------------------------------------------
#
# ``G[l]`` depends on a sequence only through the query's window
# ``(x_{q-1}, …, x_{q-M})`` and key l's window ``(x_{l-1}, …, x_{l-M})``, with
# symbol ``d`` standing for padding. So κ is a θ-dependent table over pairs of
# windows, and the sample enters only through which windows occur with which
# next token (the counts in :class:`CountFeatures`). Exact, and independent of
# L: ``(d+1)**M`` windows per side.


def window_code_count(d: int, M: int) -> int:
    """Number of windows over the padded alphabet, ``(d+1)**M``."""
    return (d + 1) ** M


def window_onehots(d: int, M: int) -> np.ndarray:
    """``OH[k, j-1, e] = 1{window k has token e at offset j}``, ``((d+1)**M, M, d)``;
    padding (symbol ``d``) is the zero vector, as ``e(x_j) = 0`` for ``j <= 0``."""
    W = all_windows(d + 1, M)
    return (W[:, :, None] == np.arange(d)[None, None, :]).astype(np.float64)


def window_codes(X: Int[Array, " L"], M: int, d: int) -> Int[Array, " L1"]:
    """Code of the window ``(x_{l-1}, …, x_{l-M})`` of every position ``l = 1..L+1``
    (offset 1 most significant; padding is symbol ``d``)."""
    T = _shifted(X, M)
    T = jnp.where(T < 0, d, T)
    return (T * jnp.asarray((d + 1) ** np.arange(M - 1, -1, -1), T.dtype)).sum(-1)


def window_vectors(w: Float[Array, "H M"], model: ModelConfig, d: int) -> Float[Array, "H K d"]:
    """``v^(h)`` of every padded window of ``span`` offsets,
    ``Σ_j S[h, j-1] e(x_{-j})`` (:func:`copier_matrix`), divided by
    ``‖v^(h)‖ + 1e-7`` with ``model.head_norm``."""
    S = copier_matrix(w, model)
    OH = jnp.asarray(window_onehots(d, model.span), w.dtype)
    V = jnp.einsum("hj,kje->hke", S, OH)  # (H, K, d)
    if model.head_norm:
        V = V * head_norm_scale(jnp.sum(V * V, -1))[..., None]
    return V


def window_products(w: Float[Array, "H M"], model: ModelConfig, d: int) -> Float[Array, "K K nS"]:
    """``P[q, k, S] = Π_{h∈S} ⟨v^(h)(window q), v^(h)(window k)⟩`` for every pair
    of padded windows: the w-dependent part of κ.

    ``v^(h)`` of a window is :func:`window_vectors`, so the inner products
    are a Gram matrix per head.
    """
    V = window_vectors(w, model, d)  # (H, K, d)
    inner = jnp.einsum("hqe,hke->qkh", V, V)  # (K, K, H)
    m = jnp.asarray(model.membership, w.dtype)
    # where(), not 1 + m (inner - 1): the latter rounds inner products below 1e-16 to 0.
    return jnp.prod(jnp.where(m[None, None] > 0, inner[:, :, None, :], 1.0), axis=-1)


def kappa_from_window_products(C: Float[Array, " nS"], P: Float[Array, "K K nS"], model: ModelConfig):
    """κ on window pairs from :func:`window_products` (docs/theory/mathematics.md §M2's normalisations)."""
    c = C**2
    num = P @ c
    if model.norm == "sum":
        return num / c.sum()
    idx = np.arange(P.shape[0])
    sq = P[idx, idx] @ c  # ‖φ‖² of each window
    tiny = jnp.finfo(sq.dtype).tiny
    return num / jnp.sqrt(jnp.maximum(sq[:, None] * sq[None, :], tiny))


def kappa_row(w: Float[Array, "H M"], C: Float[Array, " nS"], q, model: ModelConfig, d: int) -> Float[Array, " K"]:
    """One row ``κ[q, :]`` of :func:`kappa_table` (for per-sequence gradients)."""
    V = window_vectors(w, model, d)  # (H, K, d)
    m = jnp.asarray(model.membership, w.dtype)
    prod = lambda inner: jnp.prod(jnp.where(m[None] > 0, inner[:, None, :], 1.0), axis=-1)  # noqa: E731
    P = prod(jnp.einsum("he,hke->kh", V[:, q], V))  # (K, nS)
    c = C**2
    num = P @ c
    if model.norm == "sum":
        return num / c.sum()
    sq = prod(jnp.einsum("hke,hke->kh", V, V)) @ c
    tiny = jnp.finfo(sq.dtype).tiny
    return num / jnp.sqrt(jnp.maximum(sq * sq[q], tiny))


def kappa_table(w: Float[Array, "H M"], C: Float[Array, " nS"], model: ModelConfig, d: int):
    """κ for every (query window, key window) pair, ``((d+1)**span, (d+1)**span)``."""
    return kappa_from_window_products(C, window_products(w, model, d), model)


# ---------------------------------------------------------------------------
# The kernel tabulated on the windows a sequence can show (the sparse layout)
# ---------------------------------------------------------------------------
#
# Position l's window (x_{l-1}, …, x_{l-span}) has padding exactly on the
# offsets l..span, so it is one of the "suffix-padded" windows: p = 0..span
# padded offsets (block p, d**(span−p) windows, in mixed-radix order of the
# real tokens, offset 1 most significant). The query's window has
# p_q = max(0, span − L) padded offsets.


def sparse_window_blocks(d: int, span: int) -> np.ndarray:
    """Start of block p (``p`` padded offsets) in the sparse windows' order,
    ``p = 0..span+1`` (the last entry is the number of windows,
    ``Σ_p d**(span−p)``)."""
    return np.concatenate([[0], np.cumsum([d ** (span - p) for p in range(span + 1)])]).astype(np.int64)


def sparse_windows(d: int, span: int) -> np.ndarray:
    """Every window a sequence can show, ``(Σ_p d**(span−p), span)``, block by
    block (:func:`sparse_window_blocks`); padding is symbol ``d``."""
    blocks = []
    for p in range(span + 1):
        W = all_windows(d, span - p).reshape(d ** (span - p), span - p)
        blocks.append(np.concatenate([W, np.full((W.shape[0], p), d, W.dtype)], axis=1))
    return np.concatenate(blocks, axis=0)


def sparse_query_block(d: int, span: int, L: int) -> tuple[int, int]:
    """``(r0, r1)``: the query's windows are sparse windows ``r0..r1−1``
    (block ``p_q = max(0, span − L)``)."""
    b = sparse_window_blocks(d, span)
    p = max(0, span - L)
    return int(b[p]), int(b[p + 1])


def sparse_window_index(X: Int[Array, " L"], span: int, d: int) -> Int[Array, " L1"]:
    """Index among :func:`sparse_windows` of the window of every position
    ``l = 1..L+1``."""
    T = _shifted(X, span)  # (L+1, span), -1 for padding
    p = jnp.sum(T < 0, axis=-1)  # padded offsets (a suffix of the window)
    i = np.arange(span)[None, :]
    real = i < (span - p)[:, None]
    expo = jnp.where(real, span - p[:, None] - 1 - i, 0)
    code = jnp.sum(jnp.where(real, T * jnp.asarray(d, T.dtype) ** expo, 0), axis=-1)
    return jnp.asarray(sparse_window_blocks(d, span), T.dtype)[p] + code


def _sparse_slots(x, span: int, d: int, U: int, r0: int, dtype):
    """One sequence's (query row, key windows (U,), counts (d, U), number of distinct windows)."""
    idx = sparse_window_index(x, span, d)
    k = idx[:-1]
    order = jnp.argsort(k, stable=True)
    sk = k[order]
    first = jnp.concatenate([jnp.ones((1,), bool), sk[1:] != sk[:-1]])
    slot = jnp.zeros_like(k).at[order].set(jnp.cumsum(first) - 1)
    keys = jnp.zeros((U,), k.dtype).at[slot].set(k, mode="drop")
    counts = jnp.zeros((d, U), dtype).at[x, slot].add(1.0, mode="drop")
    return idx[-1] - r0, keys, counts, jnp.sum(first)


@eqx.filter_jit
def _sparse_distinct(X, span: int, d: int):
    return jax.vmap(lambda x: _sparse_slots(x, span, d, 1, 0, jnp.float32)[3])(X)


@eqx.filter_jit
def _sparse_build(X, cond, span: int, d: int, U: int, r0: int, dtype):
    q, keys, counts, _ = jax.vmap(lambda x: _sparse_slots(x, span, d, U, r0, dtype))(X)
    return SparseCountFeatures(X=X, G=keys, Gs=q, cond=cond.astype(dtype), counts=counts)


def _sparse_features(X, cond, model, dtype):
    """:class:`SparseCountFeatures`. ``U`` is the most distinct windows a
    sequence of the sample holds when the tokens are concrete, else (under
    a trace) its bound ``min(L, number of sparse windows)``."""
    d, span, L = cond.shape[-1], model.span, X.shape[-1]
    nK = int(sparse_window_blocks(d, span)[-1])
    if isinstance(X, jax.core.Tracer):
        U = min(L, nK)
    else:
        U = max(1, int(jnp.max(_sparse_distinct(X, span, d))))
    return _sparse_build(X, cond, span, d, U, sparse_query_block(d, span, L)[0], dtype)


def sparse_window_products(w: Float[Array, "H M"], model: ModelConfig, d: int, L: int):
    """The w-dependent part of :func:`sparse_kappa_table`:
    ``P[S, q, k] = Π_{h∈S} ⟨v^(h)(query window q), v^(h)(window k)⟩``
    (``(|𝒮|, nQ, nK)``) and, for ``norm="layer"``, the self products
    ``Ps[S, k] = Π_{h∈S} ‖v^(h)(window k)‖²`` (``(|𝒮|, nK)``, else ``None``);
    ``v^(h)`` as in :func:`window_vectors` (``head_norm`` included)."""
    V = _sparse_vectors(w, model, d)  # (H, nK, d)
    r0, r1 = sparse_query_block(d, model.span, L)
    inner = jnp.einsum("hqe,hke->hqk", V[:, r0:r1], V)  # (H, nQ, nK)
    P = jnp.moveaxis(subset_products(jnp.moveaxis(inner, 0, -1), model.membership), -1, 0)
    Ps = None
    if model.norm == "layer":
        Ps = subset_products(jnp.sum(V * V, -1).T, model.membership).T  # (nS, nK)
    return P, Ps


def kappa_from_sparse_products(C: Float[Array, " nS"], P, Ps, model: ModelConfig, r0: int):
    """κ on (query window, sparse window) pairs from :func:`sparse_window_products`
    (``r0``: the first query window, :func:`sparse_query_block`)."""
    c = C**2
    num = jnp.tensordot(c, P, axes=1)  # (nQ, nK)
    if model.norm == "sum":
        return num / c.sum()
    sq = c @ Ps  # ‖φ‖² of every window
    tiny = jnp.finfo(sq.dtype).tiny
    return num / jnp.sqrt(jnp.maximum(sq[r0 : r0 + num.shape[0], None] * sq[None, :], tiny))


def _sparse_vectors(w, model: ModelConfig, d: int):
    """``v^(h)`` of every sparse window, ``(H, nK, d)`` (as :func:`window_vectors`)."""
    OH = jnp.asarray(sparse_windows(d, model.span)[:, :, None] == np.arange(d), w.dtype)  # (nK, span, d)
    V = jnp.einsum("hj,kje->hke", copier_matrix(w, model), OH)
    if model.head_norm:
        V = V * head_norm_scale(jnp.sum(V * V, -1))[..., None]
    return V



def _selector_products(c, subsets, per_head):
    """``Σ_S c_S Π_{h∈S} per_head[h−1]`` (the empty product 1), in a fixed order."""
    out = 0.0
    for r, S in enumerate(subsets):
        t = c[r]
        for h in S:
            t = t * per_head[h - 1]
        out = out + t
    return out

def sparse_kappa_table(w: Float[Array, "H M"], C: Float[Array, " nS"], model: ModelConfig, d: int, L: int):
    """κ for every (query window, sparse window) pair, ``(nQ, nK)``: rows the
    ``d**(span − p_q)`` query windows, columns the :func:`sparse_windows`.

    The same numbers as :func:`kappa_from_sparse_products` of
    :func:`sparse_window_products` (to rounding), written elementwise on the
    ``(nQ, nK)`` grid so that XLA fuses it (with its Jacobian, for the
    per-sequence gradients) into a few passes."""
    V = _sparse_vectors(w, model, d)
    r0, r1 = sparse_query_block(d, model.span, L)
    Vq = V[:, r0:r1]
    inner = [sum(Vq[h, :, None, e] * V[h, None, :, e] for e in range(d)) for h in range(model.H)]
    c = C**2
    num = _selector_products(c, model.subsets, inner)
    if model.norm == "sum":
        return jnp.broadcast_to(num / c.sum(), (r1 - r0, V.shape[1]))
    n2 = jnp.sum(V * V, -1)  # (H, nK)
    sq = _selector_products(c, model.subsets, n2)
    sq = jnp.broadcast_to(sq, (V.shape[1],))
    tiny = jnp.finfo(sq.dtype).tiny
    return num / jnp.sqrt(jnp.maximum(sq[r0:r1, None] * sq[None, :], tiny))


# ---------------------------------------------------------------------------
# The forward map, one sequence at a time (batch with vmap)
# ---------------------------------------------------------------------------


def head_inner(w: Float[Array, "H M"], G: Float[Array, "L MM"], model: ModelConfig | None = None) -> Float[Array, "L H"]:
    """``⟨v_q^(h), v_l^(h)⟩ = Σ_ij s_hi s_hj G[l, i, j]`` with ``s`` the
    :func:`copier_matrix` of `model` (``softmax(w)`` when `model` is None)."""
    s = jax.nn.softmax(w, axis=-1) if model is None else copier_matrix(w, model)
    ss = (s[:, :, None] * s[:, None, :]).reshape(s.shape[0], -1)  # (H, M*M)
    return G @ ss.T


def subset_products(inner: Float[Array, "L H"], membership: np.ndarray) -> Float[Array, "L nS"]:
    """``P[l, S] = Π_{h∈S} inner[l, h]`` (1 for the empty set)."""
    # Explicit products of the member columns (not 1 + m (inner - 1), which
    # rounds inner products below 1e-16 to 0; not a masked jnp.prod, whose
    # backward pass is several times slower).
    cols = []
    for row in np.asarray(membership):
        idx = np.flatnonzero(row)
        if len(idx) == 0:
            cols.append(jnp.ones(inner.shape[:-1], inner.dtype))
            continue
        v = inner[..., idx[0]]
        for i in idx[1:]:
            v = v * inner[..., i]
        cols.append(v)
    return jnp.stack(cols, axis=-1)


def products(w, G, Gs, model: ModelConfig):
    """The θ_w-dependent part of the kernel: ``P`` (keys) and, for
    ``norm="layer"``, ``Ps`` (self products of positions 1..L+1).

    With ``head_norm`` every inner product is divided by
    ``(‖v_q^(h)‖ + 1e-7)(‖v_l^(h)‖ + 1e-7)``, ``‖v_l^(h)‖² = s^T Gs[l] s``."""
    inner = head_inner(w, G, model)
    self_inner = head_inner(w, Gs, model) if model.self_match else None
    if model.head_norm:
        r = head_norm_scale(self_inner)  # (L+1, H)
        inner = inner * r[:-1] * r[-1]
        self_inner = self_inner * r * r
    P = subset_products(inner, model.membership)
    Ps = None
    if model.norm == "layer":
        Ps = subset_products(self_inner, model.membership)
    return P, Ps


def kappa_from_products(C, P, Ps, model: ModelConfig) -> Float[Array, " L"]:
    """The selector's normalised kernel κ_l (docs/theory/mathematics.md §M2)."""
    c = C**2
    num = P @ c
    if model.norm == "sum":
        return num / c.sum()
    sq = Ps @ c  # ‖φ_l‖² for l = 1..L+1
    # ‖φ_l‖² >= c_∅ > 0; the floor only guards an all-zero C.
    tiny = jnp.finfo(sq.dtype).tiny
    return num / jnp.sqrt(jnp.maximum(sq[:-1] * sq[-1], tiny))


def kappa(params: Params, G, Gs, model: ModelConfig) -> Float[Array, " L"]:
    P, Ps = products(params.w, G, Gs, model)
    return kappa_from_products(params.C, P, Ps, model)


def predict_from_kappa(a, kap: Float[Array, " L"], X: Int[Array, " L"], d: int) -> Float[Array, " d"]:
    """Attention layer 2: ``ŷ = Σ_l softmax_l(a κ_l) e(x_l)``."""
    attn = jax.nn.softmax(a * kap)
    return jax.nn.one_hot(X, d, dtype=attn.dtype).T @ attn


def predict_from_counts(a, row: Float[Array, " K"], counts: Float[Array, "d K"]) -> Float[Array, " d"]:
    """Attention layer 2 on window counts: ``ŷ_e = Σ_k e^{a κ_k} n_{e,k} / Σ_k e^{a κ_k} n_k``,
    with ``row[k] = κ(query window, window k)`` and ``counts[e, k] = n_{e,k}``
    (see :class:`CountFeatures`); the same ``ŷ`` as :func:`predict_from_kappa`,
    grouped by key window."""
    E, n = window_weights(a, row, counts)
    # Elementwise products reduced over the windows (the last axis): under
    # vmap this is about twice as fast as the matrix-vector products.
    return jnp.sum(E * counts, axis=-1) / jnp.sum(E * n, axis=-1)


def window_weights(a, row: Float[Array, " K"], counts: Float[Array, "d K"]):
    """``(E, n)``: ``E_k = e^{a κ_k − max}`` on the windows present in the sequence (0 on
    the absent ones; the max over the present ones, held constant under differentiation)
    and ``n_k = Σ_e n_{e,k}``, the weights of :func:`predict_from_counts`."""
    n = counts.sum(0)
    present = n > 0
    z = a * row
    zmax = jax.lax.stop_gradient(jnp.max(jnp.where(present, z, -jnp.inf)))
    # double where: absent windows must not feed exp() an overflow whose
    # (masked) gradient would still be NaN.
    return jnp.where(present, jnp.exp(jnp.where(present, z, zmax) - zmax), 0.0), n


def predict(params: Params, X: Int[Array, " L"], model: ModelConfig, d: int) -> Float[Array, " d"]:
    """ŷ for one raw sequence ``X = (x_1..x_L)`` from its match tensors (the
    reference implementation of docs/theory/mathematics.md §M2; the loss uses precomputed features)."""
    G, Gs = match_tensors(X, model.span, self_match=model.self_match, dtype=params.w.dtype)
    return predict_from_kappa(params.a, kappa(params, G, Gs, model), X, d)
