"""The sample layouts: how the θ-independent inputs of every sequence are stored, and how a
loss on them is evaluated (docs/theory/computation.md).

Each layout is a class holding one sample's arrays (:class:`CountFeatures`,
:class:`SparseCountFeatures`, :class:`PositionFeatures`, :class:`HeadFeatures`) with the
methods the estimator calls — the per-sequence losses, their gradients, the batch gradients
behind the standard errors, the unseen mass, the caches of a stage — written once per layout
in terms of a few primitives of the model's member (``loss.member``, docs/guides/models.md):
its κ table and readout for the table layouts, its per-position kernel for the positions
layout. So a new member supplies its primitives and every layout, every estimator method and
every solver work for it; a new layout is one class here.

:func:`features` builds a layout's arrays from a :class:`~gflow.core.Sample`;
:data:`LAYOUTS` names them.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from ._data import Sample
from ._members import member_of
from ._model import ModelConfig, Params
from ._ops import seqmap, unseen_mass
from ._paper import (
    head_window_codes,
    sparse_query_block,
    sparse_window_blocks,
    sparse_window_index,
    window_code_count,
    window_codes,
)

LAYOUTS = ("counts", "positions", "heads", "sparse", "vectors")


def _readout_mean(loss, p, rows, counts, cond):
    """A stage's loss when only the readout moves: the readout of every sequence's cached
    attention row, averaged (the stage caches of the table layouts)."""
    fn = lambda row, c, y: loss.member.readout(p, row, c, y, loss.eps, loss.kind)  # noqa: E731
    return jnp.mean(seqmap(fn, (rows, counts, cond), loss.chunk))


def _segment_mean(x, bid, B: int, nb):
    return jax.ops.segment_sum(x, bid, num_segments=B) / nb.reshape((B,) + (1,) * (x.ndim - 1))


class PositionFeatures(eqx.Module):
    """Per-position inputs of the model (the general layout).

    - `X`: tokens ``(N, L)``.
    - `G`: query–key match tensor, ``(N, L, span*span)`` (flattened ``(i, j)``;
      ``span = model.span``, M for aligned windows), for the paper's model; ``None`` for the
      members that read the tokens themselves.
    - `Gs`: self-match tensor of positions ``1..L+1``, ``(N, L+1, span*span)``,
      or ``None`` unless ``model.self_match`` (``norm="layer"`` or ``head_norm``).
    - `cond`: the target: ``π(· | z_q)``, or ``e(y)`` for ``estimator.target = "drawn"``, ``(N, d)``.
    """

    X: Int[Array, "N L"]
    G: Float[Array, "N L MM"] | None
    Gs: Float[Array, "N L1 MM"] | None
    cond: Float[Array, "N d"]

    name = "positions"
    has_table = False

    @property
    def tokens(self):
        """The tokens ``x_1..x_L`` of every sequence, ``(N, L)``."""
        return self.X

    def _args(self):
        return (self.X, self.G, self.Gs, self.cond)

    def per_sequence(self, loss, params):
        m = loss.member
        fn = lambda X, G, Gs, cond: m.positions_loss(params, X, G, Gs, cond, loss.eps, loss.kind)  # noqa: E731
        return seqmap(fn, self._args(), loss.chunk)

    def per_sequence_grads(self, loss, params):
        m = loss.member
        vg = jax.value_and_grad(lambda p, X, G, Gs, cond: m.positions_loss(p, X, G, Gs, cond, loss.eps, loss.kind))
        return seqmap(lambda *xs: vg(params, *xs), self._args(), loss.chunk)

    def batch_grads(self, loss, params, B: int, bid, n_b):
        return _batched_grads(self, loss, params, B)

    def unseen(self, chunk: int):
        return jnp.mean(seqmap(unseen_mass, (self.X, self.cond), chunk))

    # -- a stage's caches (gflow.core.StageLoss) ---------------------------------------------
    def stage_cache(self, loss, params, moves):
        m, ch = loss.member, loss.chunk
        if set(moves) <= set(m.readout_blocks):
            return seqmap(lambda X, G, Gs: m.positions_z(params, X, G, Gs, loss.d), (self.X, self.G, self.Gs), ch)
        if moves == ("C",) and m.caches_selector:
            return seqmap(lambda X, G, Gs: m.positions_products(params, X, G, Gs, loss.d), (self.X, self.G, self.Gs), ch)
        return None

    def stage_loss(self, loss, frozen, moves, cache, y):
        m, ch = loss.member, loss.chunk
        p = frozen.with_blocks(y)
        if set(moves) <= set(m.readout_blocks):
            def one(z, X, cond):
                return m.positions_readout(p, z, X, cond, loss.eps, loss.kind)
        else:
            def one(prods, X, cond):
                z = m.positions_from_products(y["C"], prods)
                return m.positions_readout(p, z, X, cond, loss.eps, loss.kind)
        return jnp.mean(seqmap(one, (cache, self.X, self.cond), ch))


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

    name = "counts"
    has_table = True

    def _args(self):
        return (self.qcode, self.counts, self.cond)

    def per_sequence(self, loss, params):
        m = loss.member
        table = m.counts_table(params, loss.d)
        fn = lambda q, counts, cond: m.readout(params, table[q], counts, cond, loss.eps, loss.kind)  # noqa: E731
        return seqmap(fn, self._args(), loss.chunk)

    def per_sequence_grads(self, loss, params):
        m = loss.member

        # Each sequence needs only its query's row of the κ table.
        def one(p, q, counts, cond):
            return m.readout(p, m.counts_row(p, q, loss.d), counts, cond, loss.eps, loss.kind)

        vg = jax.value_and_grad(one)
        return seqmap(lambda *xs: vg(params, *xs), self._args(), loss.chunk)

    def batch_grads(self, loss, params, B: int, bid, n_b):
        m = loss.member
        table = m.counts_table(params, loss.d)
        g1 = jax.value_and_grad(m.readout_of(params), argnums=(0, 1))
        r0 = m.readout_args(params)
        fn = lambda q, counts, cond: g1(r0, table[q], counts, cond, loss.eps, loss.kind)  # noqa: E731
        ls, (gr, grow) = seqmap(fn, self._args(), loss.chunk)
        Q = table.shape[0]
        T = jax.ops.segment_sum(grow, jnp.asarray(bid) * Q + self.qcode, num_segments=B * Q)
        T = T.reshape((B,) + table.shape) / jnp.asarray(n_b, T.dtype).reshape((B,) + (1,) * table.ndim)
        gb = m.counts_pullback(params, loss.d)(T)
        nb = jnp.asarray(n_b, ls.dtype)
        gb.update({b: _segment_mean(v, jnp.asarray(bid), B, nb) for b, v in gr.items()})
        return _complete(params, gb, B), ls

    def unseen(self, chunk: int):
        seen = self.counts.sum(-1) > 0
        return jnp.mean(jnp.sum(jnp.where(seen, 0.0, self.cond), -1))

    # -- the κ table's view of each sequence (gflow.core.table_hessian, grad_hvp) ------------
    def table_view(self, loss):
        """``(T(w, C) flattened, each sequence's row, the table's shape, by row?)`` for the second
        derivatives through the κ table (``gflow.core.table_hessian``)."""
        K = self.counts.shape[-1]
        m = loss.member
        return (lambda w, C: jnp.ravel(m.counts_table(wc_params(w, C), loss.d))), self.qcode, (K, K), True

    # -- a stage's caches ---------------------------------------------------------------------
    def stage_cache(self, loss, params, moves):
        m = loss.member
        if set(moves) <= set(m.readout_blocks):
            return m.counts_table(params, loss.d)[self.qcode]
        if moves == ("C",) and m.caches_selector:
            return m.counts_products(params, loss.d)
        return None

    def stage_loss(self, loss, frozen, moves, cache, y):
        m, ch = loss.member, loss.chunk
        p = frozen.with_blocks(y)
        if set(moves) <= set(m.readout_blocks):
            return _readout_mean(loss, p, cache, self.counts, self.cond)
        table = m.counts_from_products(y["C"], cache, loss.d)
        fn = lambda q, counts, cond: m.readout(p, table[q], counts, cond, loss.eps, loss.kind)  # noqa: E731
        return jnp.mean(seqmap(fn, self._args(), ch))


class HeadFeatures(PositionFeatures):
    """Per-position, per-head window codes (the ``"heads"`` layout, exact; the paper's model).

    Head h's inner product ``⟨v_q^(h), v_l^(h)⟩`` depends only on the M
    offsets head h reads (``1..M``, or ``h..h+M−1`` with shifted windows),
    so it is a θ-dependent table ``T_h`` over pairs of the ``(d+1)**M``
    padded head windows (``head_tables``), and a position enters only
    through its H head-window codes. Cost per sequence ``O(L·(H + |𝒮|))``,
    independent of the span: the layout for shifted windows, where the counts
    table over ``(d+1)**(H+M−1)`` windows is large.

    A :class:`PositionFeatures` whose `G` holds the key codes ``(N, L, H)``
    and `Gs` the query codes ``(N, H)`` (ints) instead of match tensors;
    `X` and `cond` as there.
    """

    name = "heads"

    def per_sequence(self, loss, params):
        m = loss.member
        tab = m.head_tables(params, loss.d)
        fn = lambda X, hk, hq, cond: m.heads_loss(params.a, params.C, tab, X, hk, hq, cond, loss.eps, loss.kind)  # noqa: E731
        return seqmap(fn, self._args(), loss.chunk)

    def per_sequence_grads(self, loss, params):
        m = loss.member

        def one_h(p, X, hk, hq, cond):
            tab = m.head_tables(p, loss.d)
            return m.heads_loss(p.a, p.C, tab, X, hk, hq, cond, loss.eps, loss.kind)

        vg = jax.value_and_grad(one_h)
        return seqmap(lambda *xs: vg(params, *xs), self._args(), loss.chunk)

    def stage_cache(self, loss, params, moves):
        if moves not in (("a",), ("C",)):
            return None
        m = loss.member
        tab = m.head_tables(params, loss.d)
        prods = lambda hk, hq: m.heads_products(tab, hk, hq)  # noqa: E731
        if moves == ("a",):
            fn = lambda hk, hq: m.positions_from_products(params.C, prods(hk, hq))  # noqa: E731
        else:
            fn = prods
        return seqmap(fn, (self.G, self.Gs), loss.chunk)


class SparseCountFeatures(PositionFeatures):
    """Each sequence's counts over its own distinct key windows (the
    ``"sparse"`` layout, exact).

    The counts layout for a large span: κ is tabulated on windows of all
    ``span`` offsets (``sparse_kappa_table``), but only on the windows a
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

    name = "sparse"
    has_table = True

    def _sargs(self):
        return (self.Gs, self.G, self.counts, self.cond)

    def _table(self, loss, params):
        return loss.member.sparse_table(params, loss.d, self.X.shape[-1])

    def _jacobian(self, loss, params):
        """The sparse table, its Jacobian as one row of ``dκ/d(table blocks)`` per entry
        ``(E, Σ sizes)`` (the member's table blocks in order), and the map from such a row
        (and the readout blocks' gradients) to a θ-shaped gradient."""
        m = loss.member
        table, Jd = m.sparse_jacobian(params, loss.d, self.X.shape[-1])
        E = table.size
        names = tuple(Jd)
        sizes = [int(np.prod(params.get(b).shape)) for b in names]
        J = jnp.concatenate([Jd[b].reshape(E, n) for b, n in zip(names, sizes)], axis=-1)
        offs = np.cumsum([0] + sizes)

        def unflat(g, gr):
            out = {b: g[..., offs[i] : offs[i + 1]].reshape(g.shape[:-1] + params.get(b).shape)
                   for i, b in enumerate(names)}  # fmt: skip
            return _complete(params, {**out, **gr}, g.shape[:-1])

        return table, J, unflat

    def _entries(self, table, q, keys):
        """A sequence's entries of the sparse table: ``(U,)`` or ``(d, U)``. Read from the
        flattened table at :meth:`_flat_index` (one gather of scalars: under ``vmap`` the nested
        ``table[q][:, keys]`` became a batched gather whose transpose, a scatter into the table,
        cost 60 ms of the official Full model's 80 ms gradient; this one costs 6)."""
        return jnp.reshape(table, (-1,))[self._flat_index(table, q, keys)]

    def _flat_index(self, table, q, keys):
        """Row indices of a sequence's entries in the flattened table (as :meth:`_entries`)."""
        if table.ndim == 2:
            return q * table.shape[1] + keys
        d, K = table.shape[1:]
        return (q * d + jnp.arange(d)[:, None]) * K + keys[None, :]

    def per_sequence(self, loss, params):
        m = loss.member
        table = self._table(loss, params)
        fn = lambda q, keys, counts, cond: m.readout(params, self._entries(table, q, keys), counts, cond, loss.eps,  # noqa: E731
                                                     loss.kind)  # fmt: skip
        return seqmap(fn, self._sargs(), loss.chunk)

    def per_sequence_grads(self, loss, params):
        # The gradient with respect to a sequence's κ entries, mapped to the table's blocks by
        # the Jacobian of the κ table at those entries.
        m = loss.member
        table, J, unflat = self._jacobian(loss, params)
        g1 = jax.value_and_grad(m.readout_of(params), argnums=(0, 1))
        r0 = m.readout_args(params)

        def one_s(q, keys, counts, cond):
            ls, (gr, grow) = g1(r0, self._entries(table, q, keys), counts, cond, loss.eps, loss.kind)
            idx = self._flat_index(table, q, keys)
            return ls, unflat(jnp.reshape(grow, (-1,)) @ J[jnp.reshape(idx, (-1,))], gr)

        return seqmap(one_s, self._sargs(), loss.chunk)

    def batch_grads(self, loss, params, B: int, bid, n_b):
        size = self.table_size(loss)
        # a large table, or one much larger than the sample: per-sequence gradients, summed per batch
        if B * size > min(MAX_BATCH_TABLE, BATCH_TABLE_PER_ENTRY * int(np.prod(self.counts.shape))):
            ls, gs = self.per_sequence_grads(loss, params)
            nb = jnp.asarray(n_b, ls.dtype)
            return jax.tree.map(lambda x: _segment_mean(x, jnp.asarray(bid), B, nb), gs), ls
        # As for counts: the per-sequence gradients with respect to (the readout blocks, the
        # sequence's κ entries) summed per batch on the table, then mapped to the table's
        # blocks by the table's Jacobian.
        m = loss.member
        table, pull = m.sparse_pullback(params, loss.d, self.X.shape[-1])
        g1 = jax.value_and_grad(m.readout_of(params), argnums=(0, 1))
        r0 = m.readout_args(params)
        fn = lambda q, keys, counts, cond: g1(r0, self._entries(table, q, keys), counts, cond, loss.eps, loss.kind)  # noqa: E731
        ls, (gr, grow) = seqmap(fn, self._sargs(), loss.chunk)
        nb = jnp.asarray(n_b, ls.dtype)
        E = table.size
        idx = jax.vmap(lambda q, keys: self._flat_index(table, q, keys))(self.Gs, self.G)
        seg = jnp.asarray(bid).reshape((-1,) + (1,) * (idx.ndim - 1)) * E + idx
        T = jax.ops.segment_sum(grow.reshape(-1), seg.reshape(-1), num_segments=B * E)
        gb = {b: g / nb.reshape((B,) + (1,) * (g.ndim - 1)) for b, g in pull(T.reshape(B, E)).items()}
        gb.update({b: _segment_mean(v, jnp.asarray(bid), B, nb) for b, v in gr.items()})
        return _complete(params, gb, B), ls

    def table_size(self, loss) -> int:
        """Entries of this sample's sparse κ table (query windows × windows; × d when the
        member's key features read the key's own token)."""
        m = loss.member
        r0, r1 = sparse_query_block(loss.d, m.span, self.X.shape[-1])
        return (r1 - r0) * int(sparse_window_blocks(loss.d, m.span)[-1]) * (loss.d if m.own_token else 1)

    def table_view(self, loss):
        """``(T(w, C) flattened, each sequence's entries, the table's shape, by row?)`` for the
        second derivatives through the κ table (``gflow.core.table_hessian``)."""
        L = self.X.shape[-1]
        m = loss.member
        table = lambda w, C: m.sparse_table(wc_params(w, C), loss.d, L)  # noqa: E731
        shape = jax.eval_shape(table, jnp.zeros((m.model.H, m.model.M)), jnp.zeros(len(m.model.subsets))).shape
        return (lambda w, C: jnp.ravel(table(w, C))), self.Gs[:, None] * shape[1] + self.G, tuple(shape), False

    def stage_cache(self, loss, params, moves):
        m = loss.member
        if set(moves) <= set(m.readout_blocks):
            table = self._table(loss, params)
            return jax.vmap(lambda q, keys: self._entries(table, q, keys))(self.Gs, self.G)  # each sequence's κ
        if moves == ("C",) and m.caches_selector:
            return m.sparse_products(params, loss.d, self.X.shape[-1])
        return None

    def stage_loss(self, loss, frozen, moves, cache, y):
        m, ch = loss.member, loss.chunk
        p = frozen.with_blocks(y)
        if set(moves) <= set(m.readout_blocks):
            return _readout_mean(loss, p, cache, self.counts, self.cond)
        table = m.sparse_from_products(y["C"], cache, loss.d, self.X.shape[-1])
        fn = lambda q, keys, counts, cond: m.readout(p, self._entries(table, q, keys), counts, cond, loss.eps,  # noqa: E731
                                                     loss.kind)  # fmt: skip
        return jnp.mean(seqmap(fn, self._sargs(), ch))

    def padded_to(self, U: int) -> SparseCountFeatures:
        """The same features with `U` window slots (unused slots: window 0, zero counts, which
        the loss ignores), so that samples of one configuration stack."""
        w = [(0, 0)] * (self.counts.ndim - 1) + [(0, U - self.counts.shape[-1])]
        return eqx.tree_at(lambda f: (f.G, f.counts), self, (jnp.pad(self.G, w[1:]), jnp.pad(self.counts, w)))


class VectorFeatures(SparseCountFeatures):
    """The sparse layout's arrays, κ computed per sequence from the first layer's outputs (the
    ``"vectors"`` layout, exact; the members of ``gflow.AbstractWindowModel``).

    The same arrays as :class:`SparseCountFeatures` (each sequence's query window, its distinct
    key windows and their counts). What is tabulated is not κ on every (query window, [own
    token,] window) pair — 265,356 numbers for the official Full model — but the components'
    vectors of every query window and of every (own token, window) key, ``(n_comp, nQ + d·nK,
    dv)``: 16,020 numbers there; each sequence computes its own κ entries from its rows (its
    query's and its d·U keys'). The batch gradients then sum each batch's cotangents on those
    rows and pull them back through the vectors once a batch: the standard errors at the cost of
    about one gradient, where the κ table's Jacobian costs dim θ of them.
    """

    name = "vectors"
    has_table = False

    def _rows(self, loss, q, keys):
        """A sequence's query row and key rows in the member's vector table ``(nQ + d·nK)``."""
        m = loss.member
        nQ, nK = self._sizes(loss)
        if not m.own_token:
            return q, nQ + keys
        return q, nQ + (jnp.arange(loss.d)[:, None] * nK + keys[None, :]).reshape(-1)

    def _sizes(self, loss):
        L = self.X.shape[-1]
        r0, r1 = sparse_query_block(loss.d, loss.member.span, L)
        return r1 - r0, int(sparse_window_blocks(loss.d, loss.member.span)[-1])

    def _z(self, loss, p, V, q, keys):
        """A sequence's κ entries ``(U,)`` or ``(d, U)`` from the vector table `V` ``(n_comp, R, dv)``."""
        m = loss.member
        iq, ik = self._rows(loss, q, keys)
        z = m.pair_kernel(p, V[:, iq][:, None], V[:, ik])[0]
        return z.reshape(loss.d, -1) if m.own_token else z

    def _vtable(self, loss, p):
        Vq, Vk = loss.member.vector_table(p, loss.d, self.X.shape[-1])
        return jnp.concatenate([Vq, Vk], axis=1)

    def per_sequence(self, loss, params):
        m = loss.member
        V = self._vtable(loss, params)
        fn = lambda q, keys, counts, cond: m.readout(params, self._z(loss, params, V, q, keys), counts, cond,  # noqa: E731
                                                     loss.eps, loss.kind)  # fmt: skip
        return seqmap(fn, self._sargs(), loss.chunk)

    def _local(self, loss, params):
        """The per-sequence loss as a function of (the blocks it reads besides the vectors, its
        query row, its key rows), and those blocks at `params`."""
        m = loss.member
        vb = set(m.vector_blocks)
        own = {b: params.get(b) for b in params.names if b not in vb}

        def one(r, vq, vk, counts, cond):
            p = params.with_blocks(r)
            z = m.pair_kernel(p, vq[:, None], vk)[0]
            z = z.reshape(loss.d, -1) if m.own_token else z
            return m.readout(p, z, counts, cond, loss.eps, loss.kind)

        return one, own

    def _row_grads(self, loss, params, V):
        one, own = self._local(loss, params)
        g1 = jax.value_and_grad(one, argnums=(0, 1, 2))

        def f(q, keys, counts, cond):
            iq, ik = self._rows(loss, q, keys)
            ls, (gr, gq, gk) = g1(own, V[:, iq], V[:, ik], counts, cond)
            return ls, gr, gq, gk, iq, ik

        return seqmap(f, self._sargs(), loss.chunk)

    def batch_grads(self, loss, params, B: int, bid, n_b):
        m = loss.member
        V = self._vtable(loss, params)
        ls, gr, gq, gk, iq, ik = self._row_grads(loss, params, V)
        nb = jnp.asarray(n_b, ls.dtype)
        R = V.shape[1]
        b = jnp.asarray(bid)
        rows = jnp.concatenate([(b * R + iq)[:, None], b[:, None] * R + ik], axis=1)  # (N, 1 + k)
        cot = jnp.concatenate([gq[:, :, None], gk], axis=2)  # (N, n_comp, 1 + k, dv)
        cot = jnp.moveaxis(cot, 1, 2).reshape(-1, V.shape[0], V.shape[2])  # rows, then (n_comp, dv)
        T = jax.ops.segment_sum(cot, rows.reshape(-1), num_segments=B * R)  # (B·R, n_comp, dv)
        T = jnp.moveaxis(T.reshape(B, R, V.shape[0], V.shape[2]), 2, 1)  # (B, n_comp, R, dv)
        names = tuple(m.vector_blocks)
        _, vjp = jax.vjp(lambda vb: self._vtable(loss, params.with_blocks(vb)), {k: params.get(k) for k in names})
        gv = jax.vmap(lambda t: vjp(t)[0])(T)
        gb = {k: g / nb.reshape((B,) + (1,) * (g.ndim - 1)) for k, g in gv.items()}
        gb.update({k: _segment_mean(v, b, B, nb) for k, v in gr.items()})
        return _complete(params, gb, B), ls

    def per_sequence_grads(self, loss, params):
        m = loss.member
        V = self._vtable(loss, params)
        ls, gr, gq, gk, iq, ik = self._row_grads(loss, params, V)
        names = tuple(m.vector_blocks)
        fn = lambda vb: self._vtable(loss, params.with_blocks(vb))  # noqa: E731
        J = jax.jacfwd(fn)({k: params.get(k) for k in names})  # (n_comp, R, dv, *block)
        sizes = [int(np.prod(np.shape(params.get(k)))) for k in names]
        Jf = jnp.concatenate([J[k].reshape(J[k].shape[:3] + (n,)) for k, n in zip(names, sizes)], axis=-1)
        offs = np.cumsum([0] + sizes)

        def one(gq, gk, iq, ik):
            g = jnp.einsum("cd,cdp->p", gq, Jf[:, iq]) + jnp.einsum("ckd,ckdp->p", gk, Jf[:, ik])
            return {k: g[offs[i] : offs[i + 1]].reshape(np.shape(params.get(k))) for i, k in enumerate(names)}

        gv = seqmap(one, (gq, gk, iq, ik), loss.chunk)
        return ls, _complete(params, {**gv, **gr}, loss.N)

    def stage_cache(self, loss, params, moves):
        m = loss.member
        if set(moves) <= set(m.readout_blocks):
            V = self._vtable(loss, params)
            return jax.vmap(lambda q, keys: self._z(loss, params, V, q, keys))(self.Gs, self.G)
        if not set(moves) & set(m.vector_blocks):  # the vectors are frozen: tabulate them once
            return self._vtable(loss, params)
        return None

    def stage_loss(self, loss, frozen, moves, cache, y):
        m, ch = loss.member, loss.chunk
        p = frozen.with_blocks(y)
        if set(moves) <= set(m.readout_blocks):
            return _readout_mean(loss, p, cache, self.counts, self.cond)
        fn = lambda q, keys, counts, cond: m.readout(p, self._z(loss, p, cache, q, keys), counts, cond, loss.eps,  # noqa: E731
                                                     loss.kind)  # fmt: skip
        return jnp.mean(seqmap(fn, self._sargs(), ch))

    def table_size(self, loss) -> int:
        nQ, nK = self._sizes(loss)
        return nQ + nK * (loss.d if loss.member.own_token else 1)


# Largest (batches × sparse table entries) for which the batch gradients of the sparse layout are
# summed on the table (as for counts; 268 MB of float64 at most); above, per sequence. And at most
# this many per (sequence, [key token,] window) entry of the sample: about 80 ns a table number
# (Jacobian product included) against 4 µs a sequence's entry (the official Full model at N = 9,000:
# 1.4 s on the table, 6.8 s per sequence; at N = 500, L = 30 the sequences are cheaper)
MAX_BATCH_TABLE = 2**25
BATCH_TABLE_PER_ENTRY = 50


def wc_params(w, C) -> Params:
    """A θ with only ``(w, C)`` meaningful (the κ table of the paper's model reads nothing else)."""
    return Params(w=w, C=C, a=jnp.zeros((), w.dtype))


def _complete(params, gb: dict, lead):
    """A θ-shaped gradient from the blocks in `gb` (leading shape `lead`), zero elsewhere."""
    lead = (lead,) if isinstance(lead, int) else tuple(lead)
    full = {b: gb[b] if b in gb else jnp.zeros(lead + jnp.shape(v), jnp.result_type(v))
            for b, v in params.blocks().items()}  # fmt: skip
    return params.from_blocks(full)


def _batched_grads(feats, loss, params, B: int):
    """Batch-mean gradients by one vmapped gradient per batch (the positions and heads layouts)."""
    N = loss.N
    nb = -(-N // B)
    idx = np.arange(B * nb)
    real = idx < N
    order = np.where(real, idx, 0).reshape(nb, B).T  # (B, nb), batch b holds n ≡ b mod B
    wts = jnp.asarray(real.reshape(nb, B).T, loss.eps.dtype)
    feats_b = jax.tree.map(lambda x: x[order], feats)

    def batch_loss(p, fb, wb):
        sub = eqx.tree_at(lambda L: L.feats, loss, fb)
        return jnp.sum(wb * sub.per_sequence(p)) / jnp.sum(wb)

    return jax.vmap(jax.grad(batch_loss), in_axes=(None, 0, 0))(params, feats_b, wts), None


# ---------------------------------------------------------------------------
# Building a layout's arrays
# ---------------------------------------------------------------------------


@eqx.filter_jit
def _position_features(X, cond, member, dtype):
    G, Gs = jax.vmap(lambda x: member.position_inputs(x, dtype))(X) if member.reads_match_tensors else (None, None)
    return PositionFeatures(X=X, G=G, Gs=Gs, cond=cond.astype(dtype))


@eqx.filter_jit
def _count_features(X, cond, span: int, dtype):
    d = cond.shape[-1]
    K = window_code_count(d, span)

    def one(x):
        codes = window_codes(x, span, d)
        cnt = jnp.zeros(d * K, dtype).at[x * K + codes[:-1]].add(1.0)
        return codes[-1], cnt.reshape(d, K)

    qcode, counts = jax.vmap(one)(X)
    return CountFeatures(qcode=qcode, counts=counts, cond=cond.astype(dtype))


@eqx.filter_jit
def _head_features(X, cond, model, dtype):
    d = cond.shape[-1]
    codes = jax.vmap(lambda x: head_window_codes(x, model, d))(X)  # (N, L+1, H)
    return HeadFeatures(X=X, G=codes[:, :-1], Gs=codes[:, -1], cond=cond.astype(dtype))


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
def _sparse_build(X, cond, span: int, d: int, U: int, r0: int, dtype, cls=SparseCountFeatures):
    q, keys, counts, _ = jax.vmap(lambda x: _sparse_slots(x, span, d, U, r0, dtype))(X)
    return cls(X=X, G=keys, Gs=q, cond=cond.astype(dtype), counts=counts)


def _sparse_features(X, cond, span: int, dtype, cls=SparseCountFeatures):
    """:class:`SparseCountFeatures`. ``U`` is the most distinct windows a
    sequence of the sample holds when the tokens are concrete, else (under
    a trace) its bound ``min(L, number of sparse windows)``."""
    d, L = cond.shape[-1], X.shape[-1]
    nK = int(sparse_window_blocks(d, span)[-1])
    if isinstance(X, jax.core.Tracer):
        U = min(L, nK)
    else:
        U = max(1, int(jnp.max(_sparse_distinct(X, span, d))))
    return _sparse_build(X, cond, span, d, U, sparse_query_block(d, span, L)[0], dtype, cls)


def count_features_flat(Xt, L: int, cond, span: int, dtype) -> CountFeatures:
    """:func:`features` with ``layout="counts"`` for a batch of n sequences given
    position-major, ``Xt`` ``(L, n)`` or ``(L+1, n)`` (a last row, the targets, is not read),
    as the fresh sampler draws them: one flat scatter-add of the n·L (token, window) pairs
    instead of a vmapped scatter per sequence (identical integers, whatever the order of
    the additions; several times faster at n = 10³–10⁴; tested equal)."""
    n = Xt.shape[1]
    d = cond.shape[-1]
    S = span
    K = window_code_count(d, S)
    X = Xt[:L]
    Xp = jnp.concatenate([jnp.full((S, n), d, X.dtype), X], axis=0)  # x_j at row S + j − 1
    # window of l = 1..L+1: (x_{l−1}, …, x_{l−S}), offset 1 most significant, padding d
    codes = sum(Xp[S - i : S - i + L + 1] * (d + 1) ** (S - i) for i in range(1, S + 1))  # (L+1, n)
    idx = (jnp.arange(n, dtype=X.dtype)[None, :] * (d * K) + X * K + codes[:L]).reshape(-1)
    counts = jnp.zeros(n * d * K, dtype).at[idx].add(1.0).reshape(n, d, K)
    return CountFeatures(qcode=codes[L], counts=counts, cond=cond.astype(dtype))


def features_time_major(Xt, sample: Sample, member, *, layout: str, dtype=jnp.float64):
    """:func:`features` of `sample` whose tokens are also given position-major, ``Xt``
    ``(L+1, n)`` (as the fresh sampler of online SGD draws them): the counts layout is then
    built by :func:`count_features_flat` (the same integers, faster), every other layout by
    :func:`features`."""
    if isinstance(member, ModelConfig):
        member = member_of(member)
    if layout == "counts" and layout in member.layouts:
        return count_features_flat(Xt, sample.X.shape[-1], sample.cond, member.span, dtype)
    return features(sample, member, layout=layout, dtype=dtype)


def features(sample: Sample, member, *, layout: str = "counts", dtype=jnp.float64):
    """θ-independent inputs of every sequence of a sample (computed once), for the model
    family's `member` (``gflow.core.member_of(model)``; a :class:`~gflow.core.ModelConfig`
    is accepted too and means its member).

    ``layout="counts"`` gives :class:`CountFeatures`, ``"positions"``
    :class:`PositionFeatures`, ``"heads"`` :class:`HeadFeatures`, ``"sparse"``
    :class:`SparseCountFeatures`, ``"vectors"`` :class:`VectorFeatures`. All give the same loss to
    rounding.
    """
    if isinstance(member, ModelConfig):
        member = member_of(member)
    if layout not in member.layouts:
        raise ValueError(f"estimator.layout must be one of {('auto',) + member.layouts} for model.member = "
                         f"{member.name!r}, got {layout!r}")  # fmt: skip
    if layout == "counts":
        return _count_features(sample.X, sample.cond, member.span, dtype)
    if layout == "sparse":
        return _sparse_features(sample.X, sample.cond, member.span, dtype)
    if layout == "vectors":
        return _sparse_features(sample.X, sample.cond, member.span, dtype, VectorFeatures)
    if layout == "positions":
        return _position_features(sample.X, sample.cond, member, dtype)
    return _head_features(sample.X, sample.cond, member.model, dtype)

