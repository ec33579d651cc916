"""The stationary law of a row-stochastic matrix (the n-gram window chain's, a graph's roots'),
exact to rounding by the GTH state reduction."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float


def stationary_distribution(P: Float[Array, "S S"]) -> Float[Array, " S"]:
    """Stationary law ``μ P = μ`` of a row-stochastic matrix by the
    Grassmann–Taksar–Heyman (GTH) state reduction.

    GTH uses no subtractions, so it stays accurate to rounding even for nearly
    reducible chains (a ``Dirichlet(0.1)`` kernel often has entries of
    ``1e-10`` and below, where ``solve(I - P^T)`` loses most digits).
    Requires the chain to have a single recurrent class reachable from every
    state (true whenever ``π > 0``). Where rounding has made ``π`` reducible
    (exact 0s and 1s) and GTH would divide by 0, the limit of the chain from
    the uniform law is returned instead (:func:`_limit_law`).
    """
    n = P.shape[0]
    idx = jnp.arange(n)

    def reduce(i, A):
        k = n - 1 - i  # eliminate state k (n-1 down to 1)
        below = idx < k
        s = jnp.sum(jnp.where(below, A[k, :], 0.0))
        col = jnp.where(below, A[:, k] / s, 0.0)
        row = jnp.where(below, A[k, :], 0.0)
        A = A + jnp.outer(col, row) * (below[:, None] & below[None, :])
        A = A.at[:, k].set(jnp.where(below, col, A[:, k]))
        return A

    A = jax.lax.fori_loop(0, n - 1, reduce, P)

    def back(k, mu):
        val = jnp.sum(jnp.where(idx < k, mu * A[:, k], 0.0))
        return mu.at[k].set(val)

    mu = jax.lax.fori_loop(1, n, back, jnp.zeros(n, P.dtype).at[0].set(1.0))
    mu = mu / mu.sum()
    # A kernel with rows of exact 0s and 1s in floating point (Dirichlet(α) draws at α ≲ 0.01
    # underflow) can make a state that leads only to itself: GTH then divides by 0. There the
    # law is the limit of the chain from the uniform law, P^(2^64) by repeated squaring (the
    # stationary law when one closed class remains, as for a kernel whose positive entries
    # underflowed). Every chain GTH solves keeps its bits.
    return jax.lax.cond(jnp.all(jnp.isfinite(mu)), lambda: mu, lambda: _limit_law(P))


def _limit_law(P: Float[Array, "S S"]) -> Float[Array, " S"]:
    """``u P^(2^64)`` for the uniform ``u``: the chain's limiting law from a uniform start (each
    square's rows renormalised: rounding's (1 + ε)^(2^k) would otherwise overflow)."""

    def square(_, Q):
        Q = Q @ Q
        return Q / Q.sum(axis=1, keepdims=True)

    Q = jax.lax.fori_loop(0, 64, square, P)
    mu = jnp.full(P.shape[0], 1.0 / P.shape[0], P.dtype) @ Q
    return mu / mu.sum()
