"""Per-sequence building blocks shared by every layout and member: the sequence loss, the
unseen mass, and :func:`seqmap` (a map over the sequence axis, chunked on request)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float


def sequence_loss(yhat: Float[Array, " d"], cond: Float[Array, " d"], eps, kind: str) -> Float[Array, ""]:
    """Rao–Blackwellised loss of one sequence, ``-Σ_e π(e|z_q) log(ŷ_e + ε)``
    (``kind="log"``), or ``-Σ_e π(e|z_q) log softmax(ŷ)_e``
    (``kind="ce_on_probs"``)."""
    if kind == "log":
        return -jnp.sum(cond * jnp.log(yhat + eps))
    return -jnp.sum(cond * jax.nn.log_softmax(yhat))


def unseen_mass(X, cond: Float[Array, " d"]) -> Float[Array, ""]:
    """``Σ_e π(e|z_q) 1{e absent from x_1..x_L}``: the target mass the model
    cannot predict for any θ (``ŷ_e = 0``), whose loss is capped by ε. With the targets of every
    position (``cond`` ``(L, d)``, ``estimator.positions = "all"``), position t's mass on the tokens
    absent from ``x_1..x_t``, summed (the targets carry the positions' weights)."""
    onehot = jax.nn.one_hot(X, cond.shape[-1], dtype=cond.dtype)
    seen = onehot.max(0) if cond.ndim == 1 else jax.lax.cummax(onehot, axis=0)
    return jnp.sum(cond * (1.0 - seen))


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


def softmax_any(x):
    """``softmax`` over the last axis: ``jax.nn.softmax`` of a JAX array, the same formula in
    numpy for a numpy array (the trajectory's derived arrays are numpy)."""
    if isinstance(x, jax.Array):
        return jax.nn.softmax(x, axis=-1)
    z = x - x.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def c_shares(C, normalising=None):
    """``c_S/Σc`` (``c = C²``), the sum over the sets of `normalising` (a boolean mask; all by
    default) and 0 on the others; numpy in, numpy out."""
    c = C**2
    if normalising is None:
        return c / c.sum(-1, keepdims=True)
    xp = jnp if isinstance(C, jax.Array) else np
    c = xp.where(xp.asarray(normalising), c, 0.0)
    return c / c.sum(-1, keepdims=True)
