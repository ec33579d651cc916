"""Second derivatives of ``L̂`` through the κ table (docs/theory/mathematics.md §M9).

In the counts and sparse layouts a sequence sees θ = (w, C, a) only through
``z = a·T[e]`` at its own table entries ``e`` (``T = T(w, C)``, the κ table: a
few thousand numbers, no sequence in it), and its loss is
``f(ŷ)``, ``ŷ_e = Σ_k A_{ek}`` with ``A_{ek} = e^{z_k} n_{ek} / Σ_j e^{z_j} n_j``
(``n_{ek}``: how often window k is followed by e). With ``p_k = Σ_e A_{ek}``,
``D = ∂ŷ/∂z = A − ŷ pᵀ``, ``g_y = ∂f/∂ŷ``, ``H_y = ∂²f/∂ŷ²`` (d × d) and
``u = ∂f/∂z = Dᵀ g_y``, the Hessian in z is, exactly,

    ∂²f/∂z² = Dᵀ H_y D + diag(u) − p uᵀ − u pᵀ,

a diagonal plus a term of rank d + 2. Summed over sequences and pulled back to θ
by ``J_z = ∂z/∂θ = [a ∂T/∂(w, C), T]`` (one row per table entry):

    ∇²L̂ = (1/N) Σ_n (V_nᵀ H_y V_n − x_n y_nᵀ − y_n x_nᵀ) + J_zᵀ diag(Ū) J_z + ∇²_θ ψ(θ; Ū),

with ``V_n = D_n J_z`` (d × dim θ), ``x_n = J_zᵀ p_n``, ``y_n = V_nᵀ g_y``,
``Ū = (1/N) Σ_n u_n`` summed onto the table entries, and ``ψ(θ; U) = a Σ_e U_e
T_e(w, C)`` (U held fixed: the second derivatives of the table itself). Every
per-sequence term costs O(d · K · dim θ), one pass over the sample, instead of
``dim θ`` Hessian-vector products through it; a Hessian-vector product is one
more pass (:func:`grad_hvp`). :func:`has_table` says which losses have this form.
"""

from __future__ import annotations

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp

from ._loss import PopulationLoss
from ._model import Params, flatten, unflatten
from ._ops import seqmap
from ._paper import window_weights

# the most numbers table_hessian's per-sequence gathers of J_z hold at once (128 MB in float64)
_GATHER_MAX = 2**24


def has_table(loss) -> bool:
    """Whether `loss` is a :class:`PopulationLoss` whose sequences see θ only through the
    κ table (the ``"counts"`` and ``"sparse"`` layouts): :func:`table_hessian` and
    :func:`grad_hvp` apply to it."""
    return isinstance(loss, PopulationLoss) and loss.member.has_table_hessian and loss.feats.has_table


class _Table(eqx.Module):
    """The κ table as a function of ``(w, C)``, flat ``(E,)``, and how each sequence reads it:
    ``rows[n]`` (its query window's row, counts layout; or its own entries, sparse), with
    :meth:`gather` (a flat table vector at a sequence's entries) and :meth:`scatter` (per-sequence
    values summed onto the flat table)."""

    fn: Callable
    rows: jax.Array
    shape: tuple[int, int] = eqx.field(static=True)
    by_row: bool = eqx.field(static=True)

    def __call__(self, w, C):
        return self.fn(w, C)

    def gather(self, vec, rows):
        """``vec`` ``(E, ...)`` at a sequence's entries: ``(K, ...)``."""
        return vec.reshape(self.shape + vec.shape[1:])[rows] if self.by_row else vec[rows]

    def scatter(self, x):
        """``Σ_n`` of per-sequence values ``x`` ``(N, K)`` onto the flat table.

        Counts layout: whole rows, summed in the order of their rows (a sorted segment sum
        of the permuted rows: XLA fused the values' own computation into an unsorted row
        scatter and ran the field's second pass 2.5x slower). Sparse layout: entry by entry
        (sorting its N·K entries costs more than it saves)."""
        if not self.by_row:
            n = self.shape[0] * self.shape[1]
            return jax.ops.segment_sum(x.reshape(-1), self.rows.reshape(-1), num_segments=n)
        order = jnp.argsort(self.rows)
        out = jax.ops.segment_sum(
            x[order], self.rows[order], num_segments=self.shape[0], indices_are_sorted=True
        )
        return out.reshape(-1)


def _table(loss: PopulationLoss) -> _Table:
    return _Table(*loss.feats.table_view(loss))


def outer_derivatives(yhat, cond, eps, kind: str):
    """``g_y = ∂f/∂ŷ`` and ``H_y = ∂²f/∂ŷ² = diag(h) − m σσᵀ`` of one sequence's
    :func:`~gflow.core.sequence_loss` ``f``, in closed form, as ``(g_y, h, σ, m)``:
    ``"log"``, ``f = −Σ_e c_e log(ŷ_e + ε)``: ``g_y = −c/(ŷ + ε)``, ``h = c/(ŷ + ε)²``,
    ``m = 0``; ``"ce_on_probs"``, ``f = −Σ_e c_e log softmax(ŷ)_e``: ``g_y = mσ − c``,
    ``h = mσ``, with ``σ = softmax(ŷ)`` and ``m = Σ_e c_e``."""
    if kind == "log":
        r = 1.0 / (yhat + eps)
        return -cond * r, cond * r * r, jnp.zeros_like(yhat), jnp.zeros((), yhat.dtype)
    s = jax.nn.softmax(yhat)
    m = jnp.sum(cond)
    return m * s - cond, m * s, s, m


def _hy(h, s, m, x):
    """``H_y x`` for ``H_y = diag(h) − m σσᵀ`` (:func:`outer_derivatives`)."""
    return h * x - m * s * jnp.sum(s * x)


def _sequence_parts(loss: PopulationLoss, a, row, counts, cond):
    """One sequence at its table row ``row`` (K,): ``A`` (d, K), ``ŷ``, ``p``, ``g_y``,
    ``H_y`` as ``(h, σ, m)``, ``u``. Products are written elementwise and reduced (under
    vmap, XLA's batched matrix-vector products of these tiny shapes were several times
    slower)."""
    E, n = window_weights(a, row, counts)
    A = E * counts / jnp.sum(E * n)
    yhat = jnp.sum(A, axis=-1)
    p = jnp.sum(A, axis=0)
    gy, h, s, m = outer_derivatives(yhat, cond, loss.eps, loss.kind)
    u = jnp.sum(gy[:, None] * A, axis=0) - p * jnp.sum(gy * yhat)
    return A, yhat, p, gy, (h, s, m), u


def _psi_grad(T_fn, theta: Params, U) -> Params:
    """``∇_θ ψ(θ; U)``, ``ψ = a Σ_e U_e T_e(w, C)`` (U fixed): ``(a J_Tᵀ U, Uᵀ T)``."""
    T, vjp = jax.vjp(T_fn, theta.w, theta.C)
    gw, gC = vjp(theta.a * U)
    return Params(w=gw, C=gC, a=jnp.sum(U * T))


def table_hessian(loss: PopulationLoss, params: Params) -> jax.Array:
    """The dense Hessian ``∇²L̂`` at `params`, ``(P, P)`` in flat θ's order (w row-major,
    C, a), by the structure in the module docstring (a loss with :func:`has_table`). The
    same matrix as ``jax.hessian`` of the loss, to rounding, at the cost of a few
    gradients."""
    tab = _table(loss)
    f = loss.feats
    w, C, a = params.w, params.C, params.a
    T = tab(w, C)
    Jw, JC = jax.jacfwd(tab, argnums=(0, 1))(w, C)
    Jz = jnp.concatenate([a * Jw.reshape(T.shape[0], w.size), a * JC, T[:, None]], axis=-1)  # (E, P)

    def one(rows, counts, cond):
        A, yhat, p, gy, (h, s, m), u = _sequence_parts(loss, a, tab.gather(T, rows), counts, cond)
        B = A @ tab.gather(Jz, rows)  # (d, P)
        x = jnp.sum(B, axis=0)
        V = B - yhat[:, None] * x[None, :]
        return V, x, jnp.sum(gy[:, None] * V, axis=0), h, jnp.sqrt(m) * jnp.sum(s[:, None] * V, axis=0), u

    N, K = f.counts.shape[0], f.counts.shape[-1]
    # each sequence gathers its K rows of J_z (K × dim θ): in chunks when the sample's
    # gathers would pass _GATHER_MAX numbers (N = 10⁶ at the default: 1.1·10⁹), else at once
    chunk = loss.chunk or (
        0 if N * K * Jz.shape[1] <= _GATHER_MAX else max(1, _GATHER_MAX // (K * Jz.shape[1]))
    )
    V, x, y, h, sV, u = seqmap(one, (tab.rows, f.counts, f.cond), chunk)
    # Σ_n V_nᵀ H_y V_n with H_y = diag(h) − m σσᵀ
    gn = (jnp.einsum("nep,ne,neq->pq", V, h, V) - sV.T @ sV - x.T @ y - y.T @ x) / N
    U = tab.scatter(u) / N
    diag = (Jz * U[:, None]).T @ Jz

    def psi(th):
        q = unflatten(th, *w.shape)
        return q.a * jnp.sum(U * tab(q.w, q.C))

    return gn + diag + jax.hessian(psi)(flatten(params))


def grad_hvp(
    loss: PopulationLoss, params: Params, direction: Callable[[Params], Params]
) -> tuple[Params, Params]:
    """``g = ∇L̂`` and ``H v`` with ``v = direction(g)`` (``H = ∇²L̂``), at `params`, by the
    structure in the module docstring (a loss with :func:`has_table`): two passes over the
    sample and a few products with the table's Jacobian, no Hessian formed. `g` is
    ``∇L̂`` to rounding (summed on the table, not by ``jax.grad``). The first pass's
    per-sequence arrays (as many numbers as the counts) are kept for the second; with
    ``estimator.chunk`` both passes run chunk by chunk and the second recomputes them,
    so the working memory stays O(chunk)."""
    tab = _table(loss)
    f = loss.feats
    w, C, a = params.w, params.C, params.a
    T = tab(w, C)
    N = f.counts.shape[0]

    def one(rows, counts, cond):
        return _sequence_parts(loss, a, tab.gather(T, rows), counts, cond)

    def two(dZ, rows, parts):  # one sequence's (∂²f/∂z²) δz, δz = J_z v at its entries
        A, yhat, p, _, Hy, u = parts
        dz = tab.gather(dZ, rows)
        s1 = jnp.sum(A * dz, axis=-1)  # D δz = s1 − ŷ π
        pi = jnp.sum(s1)
        r = _hy(*Hy, s1 - yhat * pi)
        return jnp.sum(r[:, None] * A, axis=0) - p * jnp.sum(r * yhat) + u * dz - p * jnp.sum(u * dz) - u * pi

    args = (tab.rows, f.counts, f.cond)
    if loss.chunk:  # O(chunk) memory, as estimator.chunk promises: the second pass recomputes the first's
        parts = None
        u = seqmap(lambda *xs: one(*xs)[-1], args, loss.chunk)
    else:  # the first pass's arrays (N·d·K numbers, as the counts) are kept for the second
        parts = seqmap(one, args, 0)
        u = parts[-1]
    U = tab.scatter(u) / N
    g, tangent = jax.linearize(lambda th: _psi_grad(tab, th, U), params)
    v = direction(g)
    dT = jax.jvp(tab, (w, C), (v.w, v.C))[1]
    dZ = a * dT + v.a * T
    if loss.chunk:
        Wn = seqmap(lambda rows, counts, cond: two(dZ, rows, one(rows, counts, cond)), args, loss.chunk)
    else:
        Wn = seqmap(lambda rows, *ps: two(dZ, rows, ps), (tab.rows, *parts), 0)
    W = tab.scatter(Wn) / N
    hv = jax.tree.map(jnp.add, _psi_grad(tab, params, W), tangent(v))
    return g, hv
