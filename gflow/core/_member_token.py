"""The token-aware first layer (``model.member = "token"``; docs/theory/mathematics.md §M10a).

Head h's logit at key position l over its offsets j = 1..M adds the token similarity to the
RPE: ``z_{l,j} = w^(h)_j + x̃_lᵀ B_h x̃_{l−j}``, with ``x̃`` the one-hot tokens, zero on the
query slot (which therefore attends by the RPE alone) and on padding (the paper's zero
padding: a padded offset keeps its logit ``w_j`` and carries the zero vector). ``B_h`` is a
d×d matrix per head, directly parametrised (block ``"B"``, ``model.token_form = "direct"``,
starting at ``model.token_init·I``: 0, the paper's model, by default) or factorised as the
official code does, ``B_h = Q_h K_hᵀ`` (blocks ``"Q"``, ``"K"``, each starting at
``token_init·I``; the factorised form has a saddle at small s: each factor's gradient is
proportional to the other). Everything else is the paper's model (sum-normalised selector,
classifier a). A key's attention reads its own token, so κ is a table over (query window,
key token, key window). Stage II trains the copier: w and the token matrices.
"""

from __future__ import annotations

import jax.numpy as jnp

from ._registry import register
from ._tables import (
    AbstractRPEWindowModel,
    check_aligned_heads,
    eye_stack,
    kappa_readout,
    onehots,
    rpe_attention,
    sum_norm_combine,
)


def token_matrix(p, form: str):
    """``B_h`` of every head, ``(H, d, d)``: block ``B``, or ``Q_h K_hᵀ``."""
    if form == "direct":
        return p.get("B")
    return jnp.einsum("hij,hkj->hik", p.get("Q"), p.get("K"))


@register
class TokenModel(AbstractRPEWindowModel):
    """The paper's model with a token-aware first layer (see the module docstring)."""

    name = "token"
    options = ("token_form", "token_init")
    token_component = False

    @classmethod
    def check_config(cls, model) -> None:
        check_aligned_heads(model, cls.name)

    @classmethod
    def initial_extra(cls, model, init, p, *, d, L, dtype) -> dict:
        if d is None:
            raise ValueError("model.member = 'token' needs the vocabulary size d for its d×d token matrices")
        s = float(model.token_init)
        if model.token_form == "direct":
            return {"B": eye_stack(model.H, d, s, dtype)}
        return {"Q": eye_stack(model.H, d, s, dtype), "K": eye_stack(model.H, d, s, dtype)}

    @property
    def first_layer_extra(self):
        return ("B",) if self.model.token_form == "direct" else ("Q", "K")

    @property
    def own_token(self) -> bool:
        return True

    def vectors(self, p, windows, own, *, query, d):
        OH = onehots(windows, d, p.w.dtype)  # (n, M, d)
        pad = windows == d
        B = token_matrix(p, self.model.token_form)  # (H, d, d)
        out = []
        for h in range(self.model.H):
            tl = None
            if not query:
                # x̃_lᵀ B_h x̃_{l−j} = B_h[own, x_{l−j}] (0 on padding)
                tl = jnp.einsum("nje,ne->nj", OH, B[h][own])
            s = rpe_attention(p.w[h], OH, pad, token_logits=tl)
            out.append(jnp.einsum("nj,nje->ne", s, OH))
        return jnp.stack(out)

    def inner_products(self, Vq, Vk):
        return jnp.einsum("cqe,cke->cqk", Vq, Vk)

    def combine(self, C, inner):
        return sum_norm_combine(C, inner, self.model.subsets, lambda h: h - 1)

    def pair_kernel(self, p, Vq, Vk):
        return self.combine(p.C, self.inner_products(Vq, Vk))

    def readout(self, p, z, counts, cond, eps, kind):
        return kappa_readout(p.a, z, counts, cond, eps, kind)
