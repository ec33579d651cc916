"""Bietti et al.'s two-layer model of the birth of an induction head (``model.member = "bietti"``;
docs/guides/models.md; their ``ihead_basic_model.py``), in the one-hot idealisation of its frozen
random embeddings (high-dimensional random embeddings are nearly orthogonal: the token, the
position and layer 1's output live in separate coordinates).

Layer 1 is a softmax over the causal past with one weight per offset, ``v ∈ ℝ^L`` (block ``"v"``;
their learned ``W_K¹`` on the position embeddings; its value and output frozen, so it copies the
attended token): ``h_s = Σ_{j≤s} softmax_{j≤s}(v_{s−j}) e(x_j)``. Layer 2 matches the current
token against each position's copy, ``W_K² ∈ ℝ^{d×d}`` (block ``"WK"``, row = the query's token),
attends over ``s ≤ t`` and writes the attended token through ``W_O² ∈ ℝ^{d×d}`` (block ``"WO"``,
row = the attended token); the current token's own logits ``W_F ∈ ℝ^{d×d}`` (block ``"WF"``: the
output layer on the token's embedding, the global bigram) add:

    A_{ts} = softmax_{s≤t}(W_K²[x_t] · h_s),    logits_t = Σ_{s≤t} A_{ts} W_O²[x_s] + W_F[x_t].

With ``W_K² = β I``, ``W_O² = γ I`` and layer 1 on offset 1 this is the induction head: position t
attends to the positions whose previous token is ``x_t`` and predicts their tokens.

Choices: the start is zero (``v = 0``: uniform causal attention; ``W_K² = W_O² = W_F = 0``), or with
``model.random_init = σ > 0`` every entry of v, W_K², W_O², W_F drawn ``σ·N(0, 1)`` from a fixed seed
(0), so runs are deterministic. From zero, ``∂L/∂W_K² = 0`` while ``W_O² = 0`` (layer 2's output
does not depend on where it attends) and ``∂L/∂v = 0`` while ``W_K² = 0`` (its attention is
uniform whatever layer 1 copies): the order ``W_O² → W_K² → v`` is partly forced from zero, and is
a result only from a random start. The loss is the cross-entropy of the logits' softmax
(``estimator.loss = "ce_on_probs"``), taken where ``estimator.positions`` says: every position
(``"all"``, their ``loss_head_only = false``), the trigger outputs from their second occurrence
(``"outputs"``, their default), or the last. No selector: ``model.H = model.D = 1``; the joint
schedule trains v at ``eta_w`` and the three matrices at ``eta_a`` (``eta_w = 0`` freezes layer 1
at its start: with ``v = 0`` the one-layer model of their comparison).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ._ops import sequence_loss
from ._positional import AbstractOffsetModel, offset_attention
from ._registry import register

__all__ = ["BiettiModel", "bietti_logits", "bietti_probes"]

BLOCKS = ("WF", "WK", "WO")


def bietti_logits(blocks: dict, h, X, d: int):
    """Layer 2 and the output at every position, ``(L, d)`` (row t predicts ``x_{t+1}``), from
    layer 1's outputs ``h`` ``(L, d)`` and the tokens ``X`` ``(L,)`` (module docstring)."""
    E = jax.nn.one_hot(X, d, dtype=h.dtype)
    L = X.shape[-1]
    S = (E @ blocks["WK"]) @ h.T  # (L, L): W_K²[x_t] · h_s
    A = jax.nn.softmax(jnp.where(np.tril(np.ones((L, L), bool)), S, -jnp.inf), axis=-1)
    return A @ (E @ blocks["WO"]) + E @ blocks["WF"]


def bietti_probes(blocks: dict, triggers=None) -> dict:
    """Their memory probes of one θ (numpy blocks, a leading time axis allowed): ``probe_wo2``, the
    fraction of tokens x whose row ``W_O²[x]`` has its largest entry at x; ``probe_wk2``, the same
    for ``W_K²`` over the query tokens `triggers` (their fixed triggers; every token when
    ``None``); ``probe_wk1``, layer 1's attention on offset 1 averaged over the positions
    ``t = 2..L``. A tie counts as a miss (a zero matrix scores 0)."""

    def identity(W, rows):
        W = np.asarray(W, np.float64)[..., rows, :]  # (..., r, d): the rows probed
        top = W.max(-1)
        own = W[..., np.arange(len(rows)), rows]
        return np.mean((own == top) & (np.sum(W == top[..., None], -1) == 1), -1)

    d = np.shape(blocks["WO"])[-1]
    rows = np.arange(d) if triggers is None else np.asarray(triggers)
    v = np.asarray(blocks["v"], np.float64)
    A = offset_attention(v, v.shape[-1])
    return {"probe_wo2": identity(blocks["WO"], np.arange(d)), "probe_wk2": identity(blocks["WK"], rows),
            "probe_wk1": np.diagonal(A, offset=-1, axis1=-2, axis2=-1).mean(-1)}  # fmt: skip


@register
class BiettiModel(AbstractOffsetModel):
    """Bietti et al.'s model (see the module docstring)."""

    name = "bietti"
    options = ("random_init",)

    @classmethod
    def initial_extra(cls, model, init, p, *, d, L, dtype) -> dict:
        if L is None or d is None:
            raise ValueError("model.member = 'bietti' needs the vocabulary d and the context length L")
        sigma = float(model.random_init)
        if sigma == 0.0:
            return {"v": jnp.zeros((L,), dtype), **{b: jnp.zeros((d, d), dtype) for b in BLOCKS}}
        rng = np.random.default_rng(0)
        out = {"v": sigma * rng.normal(size=L)}
        out.update({b: sigma * rng.normal(size=(d, d)) for b in BLOCKS})
        return {k: jnp.asarray(x, dtype) for k, x in out.items()}

    @property
    def stage_moves(self):
        return {"I": ("C",), "II": ("v",), "III": BLOCKS, "joint": ("v", "C") + BLOCKS}

    @property
    def readout_blocks(self):
        return BLOCKS

    def positions_readout(self, p, z, X, cond, eps, kind):
        if kind != "ce_on_probs":
            raise ValueError("model.member = 'bietti' outputs logits: estimator.loss must be 'ce_on_probs' (their "
                             f"cross-entropy), got {kind!r}")  # fmt: skip
        lg = bietti_logits({b: p.get(b) for b in BLOCKS}, z, X, cond.shape[-1])
        return sequence_loss(lg if cond.ndim == 2 else lg[-1], cond, eps, kind)
