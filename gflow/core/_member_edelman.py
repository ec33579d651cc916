"""Edelman et al.'s minimal model of the statistical induction head (``model.member = "edelman"``;
docs/guides/models.md; their ``mingpt/min_model.py``).

One-hot tokens. Layer 1 is a softmax over the causal past with one weight per offset, ``v ∈ ℝ^L``
(block ``"v"``, offsets ``0..L−1``): position s's output is

    h_s = Σ_{j≤s} softmax_{j≤s}(v_{s−j}) e(x_j).

Layer 2 is linear attention with ``W ∈ ℝ^{d×d}`` (block ``"W"``): the query is the last token
``x_L``, every position ``s ≤ L`` is a key, and the logits are

    logits = Σ_{s≤L} (x_Lᵀ W h_s) e(x_s),

scored by the cross-entropy of their softmax (``estimator.loss = "ce_on_probs"``; the member
refuses ``"log"``, whose ``log ŷ`` of logits means nothing). Their start: ``v = 0``, every entry of
W at 0.01. By the relabelling symmetry W stays in span{I, 11ᵀ} from such a start: the 11ᵀ part
counts the context's unigram, the I part the bigram through layer 1's copy of the previous token.

Choices: the future is masked (the repository discards its ``masked_fill`` result, so its layer 1
also reads the future positions, which a causal model must not); the loss is taken where
``estimator.positions`` takes it: the last token, or (``"all"``, as they train) every position t,
whose logits are ``Σ_{s≤t} (x_tᵀ W h_s) e(x_s)`` (:func:`logits_all`), at the cost of the last
token's (layer 1 computes every h_s either way). The model has no selector (its one set is {1},
``model.H = model.D = 1``), so a staged run's Stage I ends at its start; Stage II trains v,
Stage III W, and the joint schedule both (v at ``eta_w``, W at ``eta_a``), as they train.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ._ops import sequence_loss
from ._positional import AbstractOffsetModel, offset_attention
from ._registry import register

__all__ = ["EdelmanModel", "logits", "logits_all", "offset_attention"]

#: the start of every entry of W (their ``torch.nn.init.constant_(self.W.weight, 0.01)``)
W0 = 0.01


def logits(W, h, X, d: int):
    """Layer 2: ``Σ_{s≤L} (x_Lᵀ W h_s) e(x_s)`` from layer 1's outputs ``h`` ``(L, d)``."""
    E = jax.nn.one_hot(X, d, dtype=h.dtype)
    return E.T @ (h @ W.T @ E[-1])


def logits_all(W, h, X, d: int):
    """Layer 2 at every position t: ``Σ_{s≤t} (x_tᵀ W h_s) e(x_s)``, ``(L, d)`` (row t): with
    ``r_s = W h_s``, entry a of row t is ``Σ_{s≤t, x_s=a} r_s[x_t]``, one running sum over s of
    ``e(x_s) r_s[c]`` per query token c, read at the rows with ``x_t = c``: O(L d²), no L × L array.
    (One ``(L, d)`` running sum per c costs 0.7–0.8× the ``(L, d, d)`` running sum of
    ``e(x_s) h_sᵀ`` per gradient: scripts/benchmarks/bench_positions.py.)"""
    E = jax.nn.one_hot(X, d, dtype=h.dtype)
    r = h @ W.T  # (L, d): r[s, c] = e_cᵀ W h_s
    return sum(E[:, c : c + 1] * jnp.cumsum(E * r[:, c : c + 1], axis=0) for c in range(d))


@register
class EdelmanModel(AbstractOffsetModel):
    """Edelman et al.'s minimal model (see the module docstring)."""

    name = "edelman"
    options = ()

    @classmethod
    def initial_extra(cls, model, init, p, *, d, L, dtype) -> dict:
        if L is None or d is None:
            raise ValueError("model.member = 'edelman' needs the vocabulary d and the context length L for v and W")
        return {"v": jnp.zeros((L,), dtype), "W": jnp.full((d, d), W0, dtype)}

    @property
    def stage_moves(self):
        return {"I": ("C",), "II": ("v",), "III": ("W",), "joint": ("v", "C", "W")}

    @property
    def readout_blocks(self):
        return ("W",)

    def positions_readout(self, p, z, X, cond, eps, kind):
        if kind != "ce_on_probs":
            raise ValueError("model.member = 'edelman' outputs logits: estimator.loss must be 'ce_on_probs' (their "
                             f"cross-entropy), got {kind!r}")  # fmt: skip
        if cond.ndim == 2:  # estimator.positions = "all": every position's weighted target
            return sequence_loss(logits_all(p.get("W"), z, X, cond.shape[-1]), cond, eps, kind)
        return sequence_loss(logits(p.get("W"), z, X, cond.shape[-1]), cond, eps, kind)
