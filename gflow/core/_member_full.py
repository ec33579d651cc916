"""The official code's Full model (``model.member = "full"``; docs/theory/mathematics.md §M10c):
``TwoLayerTransformer`` of ``RPE/model.py`` in the paper's official repository, computed as
that code computes it.

First layer (``RPEAttention``), per head h = 1..H, at every position l = 1..L+1 (the query
slot q = L+1 carries the zero vector, ``x̃_q = 0``):

- head h attends the offsets h..h+M−1 (the official windows; ``RPE/model.py`` has M = H) with
  logits ``w^(h)_j + x̃_lᵀ B_h x̃_{l−o}``, ``B_h = Q_h K_hᵀ`` (blocks ``"Q"``, ``"K"``), and the
  position itself (the diagonal) with logit ``10⁻⁶ + x̃_lᵀ B_h x̃_l``; offsets before the
  sequence's start are masked out of the softmax (the official −∞), not zero-padded;
- ``v_l^(h) = LN((Σ_o s_{l,o} x̃_{l−o})ᵀ W_OV,h)`` (block ``"V"``, ``V[h][i, j] = o_v_proj[i, j, h]``)
  with one ``nn.LayerNorm(d)`` shared by the heads (blocks ``"gamma"``, ``"beta"``; ε = 10⁻⁵).

Second layer (``PolyKernelMultiHeadAttention``, ``max_individual_degree = 1``,
``low_degree = D``): components 0 (the token ``x̃_l`` itself, zero on the query) and 1..H (the
heads); for every set S ⊆ {0, 1..H} with |S| ≤ D,
``κ_l = Σ_S C_S² Π_{c∈S} (relu⟨u_q^(c), u_l^(c)⟩ + 10⁻²⁴) / Σ_{S: 0∉S} C_S²``,
then ``ŷ = Σ_l softmax_l(a κ_l) e(x_l)``. With ``model.norm = "layer"`` the kernel is normalised
as the official ``standard_LN = True`` does (``TwoLayerTransformer`` until 2024-08-27, the code
the stored runs of ``RPE/results_paper/NGram/Full_*`` were made with): by
``max(‖φ_q‖‖φ_l‖, 10⁻⁶)``, ``‖φ_l‖² = Σ_S C_S² Π_{c∈S} (‖u_l^(c)‖² + 10⁻²⁴)`` over every set
(the token's included: a key's token has norm 1, the query's 0). The sets holding the token contribute 10⁻²⁴-small
terms (the query's token is zero); their C stays in θ, as in the official code, and their
share is reported as 0. Initialisation as ``RPE/train.py``: ``w`` w₋ everywhere but w₊ on each
head's own offset h, ``C_S = c₀``, ``a = a₀``, ``Q_h = K_h = W_OV,h = model.proj_init·I``,
γ = 1, β = 0. Trained jointly in ``RPE/train.py`` (full-batch SGD, every block at one rate);
the staged schedule trains C (I), the whole first layer (II), a (III).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ._ops import c_shares, softmax_any
from ._registry import register
from ._tables import (
    DIAGONAL_LOGIT,
    OFFICIAL_FLOOR,
    AbstractWindowModel,
    eye_stack,
    kappa_readout,
    layer_norm,
    onehots,
    rpe_attention,
    subset_product,
)
from ._traits import AbstractPaperStages

_FIRST = ("w", "K", "Q", "V", "beta", "gamma")
# the official standard_LN's floor on ‖φ_q‖‖φ_l‖ (clamp(min=1e-6))
NORM_CLAMP = 1e-6


@register
class FullModel(AbstractWindowModel, AbstractPaperStages):
    """The official ``TwoLayerTransformer`` (see the module docstring)."""

    name = "full"
    options = ("proj_init", "norm")
    token_component = True
    token_sets_normalise = False
    switching = True

    @classmethod
    def check_config(cls, model) -> None:
        return None

    @classmethod
    def initial_extra(cls, model, init, p, *, d, L, dtype) -> dict:
        if d is None:
            raise ValueError("model.member = 'full' needs the vocabulary size d for its d×d matrices")
        s = float(model.proj_init)
        return {"Q": eye_stack(model.H, d, s, dtype), "K": eye_stack(model.H, d, s, dtype),
                "V": eye_stack(model.H, d, s, dtype), "gamma": jnp.ones((d,), dtype), "beta": jnp.zeros((d,), dtype)}  # fmt: skip

    @property
    def span(self) -> int:
        return self.model.H + self.model.M - 1

    @property
    def own_token(self) -> bool:
        return True

    @property
    def first_layer_extra(self):
        return _FIRST[1:]

    def shares(self, blocks):
        return c_shares(blocks["C"], np.asarray(self.normalising()))

    def query_attention(self, blocks):
        # the query's attention over each head's M offsets (its diagonal, the zero vector, takes the rest)
        w = blocks["w"]
        xp = jnp if isinstance(w, jax.Array) else np
        logits = xp.concatenate([xp.full(w.shape[:-1] + (1,), DIAGONAL_LOGIT, w.dtype), w], axis=-1)
        return softmax_any(logits)[..., 1:]

    def heads_of(self, S):
        return tuple(h for h in S if h != 0)

    def set_offsets(self, S):
        return None if 0 in S else tuple(S)

    def vectors(self, p, windows, own, *, query, d):
        V = p.get("V")
        H, M = self.model.H, self.model.M
        dt = p.w.dtype
        OH = onehots(windows, d, dt)  # (n, span, d)
        pad = windows == d
        B = jnp.einsum("hij,hkj->hik", p.get("Q"), p.get("K"))
        n = windows.shape[0]
        own_oh = jnp.zeros((n, d), dt) if query else jax.nn.one_hot(own, d, dtype=dt)
        comps = [own_oh]  # component 0: the token x̃_l (zero on the query)
        for h in range(H):
            oh, pd = OH[:, h : h + M], pad[:, h : h + M]
            xB = own_oh @ B[h]  # x̃_lᵀ B_h, (n, d)
            tl = jnp.einsum("nje,ne->nj", oh, xB)
            diag = DIAGONAL_LOGIT + jnp.sum(xB * own_oh, -1)
            s = rpe_attention(p.w[h], oh, pd, token_logits=tl, mask=True, diagonal=diag)  # (n, 1+M)
            u = s[:, :1] * own_oh + jnp.einsum("nj,nje->ne", s[:, 1:], oh)
            comps.append(layer_norm(u @ V[h], p.get("gamma"), p.get("beta")))
        return jnp.stack(comps)

    def inner_products(self, Vq, Vk):
        inner = jnp.einsum("cqe,cke->cqk", Vq, Vk)
        if self.model.norm == "sum":
            return inner
        # the feature norms of the official standard_LN: Σ_S C² Π_{c∈S} (‖u^(c)‖² + 10⁻²⁴), query and key
        return inner, jnp.sum(Vq * Vq, -1), jnp.sum(Vk * Vk, -1)

    def _selector(self, c, x):
        return sum(c[r] * subset_product(x, S, lambda k: k) for r, S in enumerate(self.model.subsets))

    def combine(self, C, inner):
        c = C**2
        if self.model.norm == "sum":
            x = jax.nn.relu(inner) + OFFICIAL_FLOOR
            return self._selector(c, x) / jnp.sum(jnp.where(np.asarray(self.normalising()), c, 0.0))
        inner, q2, k2 = inner
        num = self._selector(c, jax.nn.relu(inner) + OFFICIAL_FLOOR)
        nq = jnp.sqrt(self._selector(c, q2 + OFFICIAL_FLOOR))  # (nq,)
        nk = jnp.sqrt(self._selector(c, k2 + OFFICIAL_FLOOR))  # (..., nk)
        return num / jnp.maximum(nq[:, None] * nk[None, :], NORM_CLAMP)

    def pair_kernel(self, p, Vq, Vk):
        return self.combine(p.C, self.inner_products(Vq, Vk))

    def readout(self, p, z, counts, cond, eps, kind):
        return kappa_readout(p.a, z, counts, cond, eps, kind)
