"""A linear output matrix on the attended average (``model.member = "linear_output"``;
docs/theory/mathematics.md §M10f(ii)).

The paper's model up to its attended average ``ŷ_att = Σ_l softmax_l(a κ_l) e(x_l)``, then a
d×d output matrix and a softmax: ``p = softmax(W_O ŷ_att)`` (block ``"O"``, starting at
``model.omega0·I``). By the relabelling symmetry of the prior ``W_O`` stays in span{I, 11ᵀ},
and ``11ᵀ`` is invisible under the softmax, so the effective parameter is one temperature ω
(``W_O = ωI``); the loss is that of ``p`` (the log loss −Σ π(e|z_q) log(p_e + ε), or
``ce_on_probs`` on p). Stage III trains the classifier: a and W_O.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ._ops import sequence_loss
from ._paper import predict_from_counts
from ._registry import register
from ._tables import AbstractWindowModel, check_aligned_heads, onehots, rpe_attention, sum_norm_combine
from ._traits import AbstractCSelector, AbstractOffsetSpan, AbstractOwnOffsets, AbstractRPECopier


@register
class LinearOutputModel(
    AbstractWindowModel,
    AbstractRPECopier,
    AbstractOffsetSpan,
    AbstractCSelector,
    AbstractOwnOffsets,
):
    """The paper's model with an output matrix on the attended average (see the module docstring)."""

    name = "linear_output"
    options = ("omega0",)
    token_component = False

    @classmethod
    def check_config(cls, model) -> None:
        check_aligned_heads(model, cls.name)

    @classmethod
    def initial_extra(cls, model, init, p, *, d, L, dtype) -> dict:
        if d is None:
            raise ValueError("model.member = 'linear_output' needs the vocabulary size d for its d×d output matrix")
        return {"O": float(model.omega0) * jnp.eye(d, dtype=dtype)}

    @property
    def own_token(self) -> bool:
        return False

    @property
    def stage_moves(self):
        return {"I": ("C",), "II": ("w",), "III": ("a", "O"), "joint": ("w", "C", "a", "O")}

    def block_group(self, name: str) -> str:
        return "a" if name == "O" else name

    @property
    def caches_selector(self) -> bool:
        return True

    @property
    def readout_blocks(self):
        return ("a", "O")

    def vectors(self, p, windows, own, *, query, d):
        OH = onehots(windows, d, p.w.dtype)
        pad = windows == d
        return jnp.stack([jnp.einsum("nj,nje->ne", rpe_attention(p.w[h], OH, pad), OH) for h in range(self.model.H)])

    def inner_products(self, Vq, Vk):
        return jnp.einsum("cqe,cke->cqk", Vq, Vk)

    def combine(self, C, inner):
        return sum_norm_combine(C, inner, self.model.subsets, lambda h: h - 1)

    def pair_kernel(self, p, Vq, Vk):
        return self.combine(p.C, self.inner_products(Vq, Vk))

    def readout(self, p, z, counts, cond, eps, kind):
        yatt = predict_from_counts(p.a, z, counts)
        return sequence_loss(jax.nn.softmax(p.get("O") @ yatt), cond, eps, kind)
