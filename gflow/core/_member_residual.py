"""A residual stream in the next-token framing (``model.member = "residual"``;
docs/theory/mathematics.md §M10e).

In the next-token framing every position carries its own token in the residual stream and
predicts the next one; the query is the last position, carrying ``x_L``, and a key l (a
position with a known next token) contributes that next token. Indexed as the paper indexes
its keys (key l predicts ``x_l``), the residual stream of key l carries ``x_{l−1}`` and the
query's carries ``x_L``: component 0 of the selector, ``⟨v_q^(0), v_l^(0)⟩ = 1{x_L = x_{l−1}}``,
exactly one-hot and untrained. The heads are the paper's (RPE copier over offsets 1..M, zero
padding), and the selector's sets may contain the token itself:
``κ_l = Σ_S c_S Π_{c∈S} ⟨v_q^(c), v_l^(c)⟩ / Σ_S c_S`` over S ⊆ {0, 1..H}, |S| ≤ D. With the
sets holding 0 at ``c_S = 0`` this is the paper's model. With one-hot copiers, component 0
reads offset 1 and head h offset h, so {0, 2} and {1, 2} both read the parents (1, 2):
the residual stream competes with the copier for the offset-1 parent.
"""

from __future__ import annotations

import jax.numpy as jnp

from ._registry import register
from ._tables import (
    AbstractWindowModel,
    check_aligned_heads,
    kappa_readout,
    onehots,
    rpe_attention,
    sum_norm_combine,
)
from ._traits import AbstractCSelector, AbstractOffsetSpan, AbstractPaperStages, AbstractRPECopier


@register
class ResidualModel(
    AbstractWindowModel,
    AbstractRPECopier,
    AbstractOffsetSpan,
    AbstractCSelector,
    AbstractPaperStages,
):
    """The paper's model with the token itself as a selector component (see the module docstring)."""

    name = "residual"
    options = ()
    token_component = True

    @classmethod
    def check_config(cls, model) -> None:
        check_aligned_heads(model, cls.name)

    @classmethod
    def initial_extra(cls, model, init, p, *, d, L, dtype) -> dict:
        return {}

    @property
    def first_layer_extra(self):
        return ()

    @property
    def own_token(self) -> bool:
        return False

    def heads_of(self, S):
        return tuple(h for h in S if h != 0)

    def set_offsets(self, S):
        return tuple(sorted({1 if c == 0 else c for c in S}))

    def vectors(self, p, windows, own, *, query, d):
        OH = onehots(windows, d, p.w.dtype)  # (n, M, d)
        pad = windows == d
        comps = [OH[:, 0]]  # the residual stream: the token at offset 1 (zero on padding)
        for h in range(self.model.H):
            comps.append(jnp.einsum("nj,nje->ne", rpe_attention(p.w[h], OH, pad), OH))
        return jnp.stack(comps)

    def inner_products(self, Vq, Vk):
        return jnp.einsum("cqe,cke->cqk", Vq, Vk)

    def combine(self, C, inner):
        return sum_norm_combine(C, inner, self.model.subsets, lambda c: c)

    def pair_kernel(self, p, Vq, Vk):
        return self.combine(p.C, self.inner_products(Vq, Vk))

    def readout(self, p, z, counts, cond, eps, kind):
        return kappa_readout(p.a, z, counts, cond, eps, kind)
