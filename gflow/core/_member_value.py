"""A value matrix per head, and the official LayerNorm after it (``model.member = "value"``;
docs/theory/mathematics.md §M10b).

Head h's output is ``v_l^(h) = LN((Σ_j s^(h)_j x̃_{l−j})ᵀ W_OV,h)`` with the paper's RPE copier
``s^(h) = softmax(w^(h))`` (aligned windows, zero padding), ``W_OV,h`` a d×d matrix per head
(block ``"V"``, starting at ``model.value_init·I``: I, the paper's model, by default) and, with
``model.layernorm = true``, the official ``nn.LayerNorm(d)`` shared by the heads:
``LN(u) = γ ⊙ (u − ū1)/√(var(u) + 10⁻⁵) + β`` with trainable γ, β (blocks ``"gamma"``,
``"beta"``, starting at 1 and 0). Without the LayerNorm and with ``W_OV = I`` this is the
paper's model. A head whose W_OV,h has equal entries gives u ∝ 1, so LN(u) = β for every
token: the head carries no information (the official runs' dead head). The selector and
classifier are the paper's (sum norm, scale a). Stage II trains the first layer: w, the
value matrices and the LayerNorm.
"""

from __future__ import annotations

import jax.numpy as jnp

from ._registry import register
from ._tables import (
    AbstractRPEWindowModel,
    check_aligned_heads,
    eye_stack,
    kappa_readout,
    layer_norm,
    onehots,
    rpe_attention,
    sum_norm_combine,
)


@register
class ValueModel(AbstractRPEWindowModel):
    """The paper's model with a value matrix per head and an optional LayerNorm."""

    name = "value"
    options = ("value_init", "layernorm")
    token_component = False

    @classmethod
    def check_config(cls, model) -> None:
        check_aligned_heads(model, cls.name)

    @classmethod
    def initial_extra(cls, model, init, p, *, d, L, dtype) -> dict:
        if d is None:
            raise ValueError("model.member = 'value' needs the vocabulary size d for its d×d value matrices")
        out = {"V": eye_stack(model.H, d, float(model.value_init), dtype)}
        if model.layernorm:
            out.update(gamma=jnp.ones((d,), dtype), beta=jnp.zeros((d,), dtype))
        return out

    @property
    def first_layer_extra(self):
        return ("V", "beta", "gamma") if self.model.layernorm else ("V",)

    @property
    def own_token(self) -> bool:
        return False

    def vectors(self, p, windows, own, *, query, d):
        V = p.get("V")
        OH = onehots(windows, d, p.w.dtype)
        pad = windows == d
        out = []
        for h in range(self.model.H):
            u = jnp.einsum("nj,nje->ne", rpe_attention(p.w[h], OH, pad), OH)
            y = u @ V[h]
            out.append(layer_norm(y, p.get("gamma"), p.get("beta")) if self.model.layernorm else y)
        return jnp.stack(out)

    def inner_products(self, Vq, Vk):
        return jnp.einsum("cqe,cke->cqk", Vq, Vk)

    def combine(self, C, inner):
        return sum_norm_combine(C, inner, self.model.subsets, lambda h: h - 1)

    def pair_kernel(self, p, Vq, Vk):
        return self.combine(p.C, self.inner_products(Vq, Vk))

    def readout(self, p, z, counts, cond, eps, kind):
        return kappa_readout(p.a, z, counts, cond, eps, kind)
