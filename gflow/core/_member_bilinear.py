"""A bilinear second layer (``model.member = "bilinear"``; docs/theory/mathematics.md §M10f(iii)).

In place of the selector's kernel, the second layer's logit is bilinear in the heads' outputs
concatenated, ``φ_l = (v_l^(1), …, v_l^(H)) ∈ ℝ^{Hd}`` (the paper's RPE copier, zero padding):
``κ_l = φ_qᵀ A φ_l / ‖A‖_F`` (block ``"A"``, ``(Hd, Hd)``, starting at the identity), and the
classifier is the paper's ``softmax_l(a κ_l)``. Normalised by ``‖A‖_F`` the kernel depends on A
only through its direction, as the paper's depends on C only through c/Σc, so the flow keeps
‖A‖ fixed and a is the temperature. κ is linear in each head: there is no product across
heads, so a conjunction of two parents is only approached through the sum of the two heads'
matches at large a. Stage I trains A (the selection: which head blocks carry weight),
Stage II w, Stage III a. The selector's shares report A's blocks on the paper's sets: ``{h}``
the diagonal block ``A_hh``, ``{h, h'}`` the two blocks between the heads, each as its part of
``‖A‖²_F`` (∅ and larger sets: 0). Block C stays in θ unread.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ._registry import register
from ._tables import AbstractWindowModel, check_aligned_heads, kappa_readout, onehots, rpe_attention
from ._traits import AbstractOffsetSpan, AbstractOwnOffsets, AbstractRPECopier


@register
class BilinearModel(AbstractWindowModel, AbstractRPECopier, AbstractOffsetSpan, AbstractOwnOffsets):
    """The paper's copier with a bilinear second layer (see the module docstring)."""

    name = "bilinear"
    options = ()
    token_component = False

    @classmethod
    def check_config(cls, model) -> None:
        check_aligned_heads(model, cls.name)

    @classmethod
    def initial_extra(cls, model, init, p, *, d, L, dtype) -> dict:
        if d is None:
            raise ValueError("model.member = 'bilinear' needs the vocabulary size d for its (Hd, Hd) matrix")
        return {"A": jnp.eye(model.H * d, dtype=dtype)}

    @property
    def own_token(self) -> bool:
        return False

    @property
    def stage_moves(self):
        return {"I": ("A",), "II": ("w",), "III": ("a",), "joint": ("w", "A", "a")}

    def block_group(self, name: str) -> str:
        return "C" if name == "A" else name

    @property
    def readout_blocks(self):
        return ("a",)

    @property
    def caches_selector(self) -> bool:
        return False

    def shares(self, blocks):
        A = blocks["A"]
        xp = jnp if isinstance(A, jax.Array) else np
        H = self.model.H
        d = A.shape[-1] // H
        E = (A.reshape(A.shape[:-2] + (H, d, H, d)) ** 2).sum(axis=(-3, -1))  # (..., H, H) block energies
        out = []
        for S in self.model.subsets:
            if len(S) == 1:
                out.append(E[..., S[0] - 1, S[0] - 1])
            elif len(S) == 2:
                out.append(E[..., S[0] - 1, S[1] - 1] + E[..., S[1] - 1, S[0] - 1])
            else:
                out.append(xp.zeros(E.shape[:-2], E.dtype))
        sh = xp.stack(out, axis=-1)
        return sh / E.sum(axis=(-2, -1))[..., None]

    def vectors(self, p, windows, own, *, query, d):
        OH = onehots(windows, d, p.w.dtype)
        pad = windows == d
        return jnp.stack([jnp.einsum("nj,nje->ne", rpe_attention(p.w[h], OH, pad), OH) for h in range(self.model.H)])

    def pair_kernel(self, p, Vq, Vk):
        A = p.get("A")
        phq = jnp.moveaxis(Vq, 0, 1).reshape(Vq.shape[1], -1)  # (nq, H·d)
        phk = jnp.moveaxis(Vk, 0, 1).reshape(Vk.shape[1], -1)
        return (phq @ A @ phk.T) / jnp.sqrt(jnp.sum(A * A))

    def inner_products(self, Vq, Vk):
        raise ValueError("model.member = 'bilinear' has no selector C to cache (caches_selector is false)")

    def combine(self, C, inner):
        raise ValueError("model.member = 'bilinear' has no selector C to cache (caches_selector is false)")

    def readout(self, p, z, counts, cond, eps, kind):
        return kappa_readout(p.a, z, counts, cond, eps, kind)
