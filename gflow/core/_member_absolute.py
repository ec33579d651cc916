"""Absolute positional embeddings (``model.member = "absolute"``; docs/theory/mathematics.md §M10d).

Head h's logit at position l = 1..L+1 (the query l = L+1) over its offsets j = 1..M is a free
band ``A_h[l, j]`` (block ``"pos"``, ``(H, L+1, M)``) instead of the relative ``w^(h)_j``, started
at the RPE's Toeplitz values ``A_h[l, j] = w^(h)_j`` so that the flow starts at the paper's model;
``v_l^(h) = Σ_j softmax(A_h[l])_j e(x_{l−j})`` (zero padding), and the selector and classifier
are the paper's. Along the band the RPE is the special case ``A_h[l, j] = w^(h)_j`` for every l,
so at a Toeplitz A the RPE gradient is the sum of A's gradient along each diagonal
(``Σ_l ∂L̂/∂A_h[l, j] = ∂L̂/∂w^(h)_j``, tested); :func:`toeplitz_defect` measures how far the
flow leaves that subspace. The features now depend on the position l, so this member computes
in the positions layout only (its cost: docs/performance.md). Block ``w`` stays in θ unread.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import _paper
from ._ops import sequence_loss, softmax_any
from ._positional import AbstractSelectorPositionalModel
from ._registry import register


def toeplitz_defect(pos) -> float:
    """``‖A − Π_T A‖ / ‖A‖`` over every head, ``Π_T`` the projection onto bands constant along
    the position l (each offset's mean over l): 0 for the RPE's Toeplitz bands."""
    A = np.asarray(pos, np.float64)
    P = np.broadcast_to(A.mean(axis=-2, keepdims=True), A.shape)
    return float(np.linalg.norm(A - P) / np.linalg.norm(A))


@register
class AbsoluteModel(AbstractSelectorPositionalModel):
    """The paper's model with absolute positional embeddings (see the module docstring)."""

    name = "absolute"
    options = ()
    token_component = False

    @classmethod
    def check_config(cls, model) -> None:
        if model.H > model.M:
            raise ValueError(f"model.member = 'absolute' starts head h on offset h and needs model.H <= model.M, "
                             f"got H={model.H}, M={model.M}")  # fmt: skip

    @classmethod
    def initial_extra(cls, model, init, p, *, d, L, dtype) -> dict:
        if L is None:
            raise ValueError("model.member = 'absolute' needs the context length L for its (H, L+1, M) position bands")
        return {"pos": jnp.broadcast_to(p.w[:, None, :], (model.H, L + 1, model.M)).astype(dtype)}

    @property
    def stage_moves(self):
        return {"I": ("C",), "II": ("pos",), "III": ("a",), "joint": ("pos", "C", "a")}

    def block_group(self, name: str) -> str:
        return "w" if name == "pos" else name

    @property
    def readout_blocks(self):
        return ("a",)

    def sequence_attention(self, blocks, L):
        """``softmax(A_h[l])`` over the offsets ``1..M`` of position l (the window's padding
        before position 1 keeps its share)."""
        out = np.zeros((self.model.H, L, L))
        s = softmax_any(np.asarray(blocks["pos"], np.float64))[:, :L]  # (H, L, M): position l over offsets 1..M
        for k in range(self.model.M):
            rows = np.arange(k + 1, L)
            out[:, rows, rows - (k + 1)] = s[:, rows, k]
        return out

    def query_attention(self, blocks):
        return softmax_any(blocks["pos"][..., -1, :])

    # -- the positions layout ------------------------------------------------------------------
    @property
    def reads_match_tensors(self) -> bool:
        return True

    def position_inputs(self, x, dtype):
        return _paper.match_tensors(x, self.model.M, self_match=False, dtype=dtype)

    def positions_products(self, p, X, G, Gs, d):
        pos = p.get("pos")
        if pos.shape[-2] != X.shape[-1] + 1:
            raise ValueError(f"model.member = 'absolute' was trained at L = {pos.shape[-2] - 1}: its position "
                             f"bands cannot read a context of L = {X.shape[-1]}")  # fmt: skip
        s = jax.nn.softmax(pos, axis=-1)  # (H, L+1, M)
        sq, sk = s[:, -1], s[:, :-1]  # the query's and every key's attention
        M = self.model.M
        Gm = G.reshape(G.shape[0], M, M)  # [l, i, j] = 1{x_{q−i} = x_{l−j}}
        inner = jnp.einsum("hi,lij,hlj->lh", sq, Gm, sk)
        return _paper.subset_products(inner, self.model.membership)

    def positions_readout(self, p, z, X, cond, eps, kind):
        return sequence_loss(_paper.predict_from_kappa(p.a, z, X, cond.shape[-1]), cond, eps, kind)
