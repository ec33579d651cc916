"""The paper's transformer TF(M, H, d, D) (docs/theory/mathematics.md §M2), computed from
θ-independent tables of the sample, never from the tensor-product features φ.

- ``G[l, i, j] = 1{x_{q-i} = x_{l-j}}`` for keys ``l = 1..L`` (query ``q = L+1``),
- ``Gs[l, i, j] = 1{x_{l-i} = x_{l-j}}`` for ``l = 1..L+1`` (``norm="layer"`` only),

with zero padding (``x_j`` for ``j <= 0`` matches nothing). For head ``h``
with attention ``s = softmax(w^(h))``, ``⟨v_q^(h), v_l^(h)⟩ = s^T G[l] s``.
The selector's kernel ``⟨φ_q, φ_l⟩ = Σ_S c_S Π_{h∈S} ⟨v_q^(h), v_l^(h)⟩`` is
the products matrix ``P[l, S]`` times ``c``. The same kernel is tabulated on pairs of
windows (the counts layout), on the windows a sequence can show (the sparse layout) and
per head (the heads layout). :class:`gflow.core.PaperModel` is the member of the model
family that computes with these functions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from ._data import all_windows
from ._model import ModelConfig, Params

# The official code's per-head normalisation v ← v/(‖v‖ + HEAD_NORM_EPS).
HEAD_NORM_EPS = 1e-7


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


def shifted_windows(X: Int[Array, " L"], M: int) -> Int[Array, "L1 M"]:
    """``T[l-1, i-1] = x_{l-i}`` for ``l = 1..L+1``, ``i = 1..M``; -1 for padding."""
    L = X.shape[0]
    pad = jnp.concatenate([jnp.full((M,), -1, X.dtype), X])  # x_j at index M + j - 1
    l = np.arange(1, L + 2)[:, None]
    i = np.arange(1, M + 1)[None, :]
    return pad[M + l - i - 1]


def match_tensors(X: Int[Array, " L"], M: int, *, self_match: bool, dtype=jnp.float64):
    """Match tensors of one sequence (see module docstring)."""
    T = shifted_windows(X, M)  # (L+1, M)
    q = T[-1]  # query's offsets x_{q-i}
    G = (q[None, :, None] == T[:-1, None, :]) & (q[None, :, None] >= 0)
    G = G.reshape(X.shape[0], M * M).astype(dtype)
    Gs = None
    if self_match:
        Gs = (T[:, :, None] == T[:, None, :]) & (T[:, :, None] >= 0)
        Gs = Gs.reshape(X.shape[0] + 1, M * M).astype(dtype)
    return G, Gs


def head_window_codes(X: Int[Array, " L"], model: ModelConfig, d: int) -> Int[Array, "L1 H"]:
    """Code of head h's window at every position ``l = 1..L+1``: the tokens
    ``(x_{l-o})`` at the M offsets o head h reads (first offset most
    significant; padding is symbol ``d``), as in :func:`window_codes`."""
    T = shifted_windows(X, model.span)
    T = jnp.where(T < 0, d, T)
    radix = jnp.asarray((d + 1) ** np.arange(model.M - 1, -1, -1), T.dtype)
    starts = [0 if model.windows == "aligned" else h for h in range(model.H)]
    return jnp.stack([(T[:, s0 : s0 + model.M] * radix).sum(-1) for s0 in starts], axis=-1)


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


# ---------------------------------------------------------------------------
# The kernel tabulated on windows (the fast path)
# ---------------------------------------------------------------------------
#
# ``G[l]`` depends on a sequence only through the query's window
# ``(x_{q-1}, …, x_{q-M})`` and key l's window ``(x_{l-1}, …, x_{l-M})``, with
# symbol ``d`` standing for padding. So κ is a θ-dependent table over pairs of
# windows, and the sample enters only through which windows occur with which
# next token (the counts in :class:`gflow.core.CountFeatures`). Exact, and independent of
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
    T = shifted_windows(X, M)
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
    T = shifted_windows(X, span)  # (L+1, span), -1 for padding
    p = jnp.sum(T < 0, axis=-1)  # padded offsets (a suffix of the window)
    i = np.arange(span)[None, :]
    real = i < (span - p)[:, None]
    expo = jnp.where(real, span - p[:, None] - 1 - i, 0)
    code = jnp.sum(jnp.where(real, T * jnp.asarray(d, T.dtype) ** expo, 0), axis=-1)
    return jnp.asarray(sparse_window_blocks(d, span), T.dtype)[p] + code


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
    (see :class:`gflow.core.CountFeatures`); the same ``ŷ`` as :func:`predict_from_kappa`,
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
