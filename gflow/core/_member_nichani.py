"""Nichani, Damian and Lee's reduced two-layer model (``model.member = "nichani"``;
docs/guides/models.md, docs/theory/mathematics.md §M10).

Layer 1 is a causal position-score matrix per head, ``A⁽¹⁾_h ∈ ℝ^{L×L}`` (block ``"A1"``,
``(H, L, L)``, entries above the diagonal unread): position l's output is
``v_l^(h) = Σ_{j≤l} softmax_{j≤l}(A⁽¹⁾_h[l, j]) e(x_j)`` (position ``k`` is index ``k−1``). Layer 2
is the token match of the query ``x_L`` against each position's copied token, scaled by the
paper's ``a`` (their β), and outputs the attention average of one-hot tokens:

    κ_l = ⟨e(x_L), v_l^(1)⟩,      ŷ = Σ_{l<L} softmax_l(a κ_l) e(x_l),

their reduced model ``ŷ = Σ_l softmax(β ⟨e(x_L), v_l⟩) e(x_l)``: a position whose parent's token
equals the query's passes its own token on.

**H heads** (``model.H = model.D = H``, for the k-parent graphs of ``data.graph_parents = k``,
their ``CatFormer(heads=[k, 1])``): head 1 matches the query's own token as above, and head
``h ≥ 2`` matches the query position's own copy ``v_L^(h)`` (row L of ``A⁽¹⁾_h``, which may attend
to the query itself) against the keys' copies; the heads' matches add,

    κ_l = ⟨e(x_L), v_l^(1)⟩ + Σ_{h≥2} ⟨v_L^(h), v_l^(h)⟩,

as their second layer reads the concatenated heads with one bilinear score (a sum over heads,
where the paper's model multiplies them). On their graphs the target's nearest parent is the
query x_L itself (chain, heap), which head 1 reads; the other parents' tokens the query must copy. The keys are the positions before the query, as the
paper's query ``L+1`` is not its own key (with the query as a key, ``κ_L = 1`` whenever row L
attends to itself and the model predicts the query's own token). It has no selector: its one set is {1} (``model.H =
model.D = 1``; C is kept in θ with ``c/Σc ≡ 1``), so a staged run's Stage I ends at its start by
its event, and Stages II and III are their Algorithm 1: ``A⁽¹⁾`` at the small fixed ``a``, then ``a``.

Choices (the repository is silent or differs):

- **one head** by default (``model.H = 1``): the query has one parent, itself; H heads for the
  k-parent graphs, the heads' matches summed (above);
- **the start** ``A⁽¹⁾ = 0`` (uniform causal attention) with one head, as their ``CatFormer``
  starts; with H ≥ 2 heads their notebook's ``10⁻⁴·N(0, 1)`` entries, drawn from a fixed seed (0)
  so that runs are deterministic and heads 2..H, which are exchangeable, separate; ``w`` stays in
  θ unread;
- **Stage II's event**: the model does not know the graph, so the copier's concentration the event
  reads is the attention of a position on the position ``j`` before it, averaged over the
  positions ``l = j+1..L`` (:meth:`NichaniModel.query_attention`, ``(H, M)``): on the chain graph
  it reaches ``1 − δ`` at offset 1; on another graph Stage II runs its whole duration.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import _paper
from ._ops import sequence_loss, softmax_any
from ._positional import AbstractSelectorPositionalModel
from ._registry import register


def causal_attention(A):
    """``softmax_{j≤l}(A[..., l, j])`` over the last axis, the future masked: ``(..., L, L)``
    (numpy in, numpy out; JAX in, JAX out)."""
    xp = jnp if isinstance(A, jax.Array) else np
    L = A.shape[-1]
    return softmax_any(xp.where(np.tril(np.ones((L, L), bool)), A, -xp.inf))


@register
class NichaniModel(AbstractSelectorPositionalModel):
    """Nichani et al.'s reduced model (see the module docstring)."""

    name = "nichani"
    options = ()
    token_component = False
    empty_set = False
    one_set = True

    @classmethod
    def check_config(cls, model) -> None:
        if model.D != model.H:
            raise ValueError(f"model.member = 'nichani' has no selector (its one set is every head, {{1..H}}): "
                             f"model.D must equal model.H = {model.H}, got {model.D}")  # fmt: skip

    @classmethod
    def initial_extra(cls, model, init, p, *, d, L, dtype) -> dict:
        if L is None:
            raise ValueError("model.member = 'nichani' needs the context length L for its (H, L, L) position scores")
        if model.H == 1:
            return {"A1": jnp.zeros((model.H, L, L), dtype)}
        return {"A1": jnp.asarray(1e-4 * np.random.default_rng(0).normal(size=(model.H, L, L)), dtype)}

    @property
    def stage_moves(self):
        return {"I": ("C",), "II": ("A1",), "III": ("a",), "joint": ("A1", "C", "a")}

    def block_group(self, name: str) -> str:
        return "w" if name == "A1" else name

    @property
    def readout_blocks(self):
        return ("a",)

    def sequence_attention(self, blocks, L):
        return causal_attention(np.asarray(blocks["A1"], np.float64))

    def query_attention(self, blocks):
        A = blocks["A1"]
        xp = jnp if isinstance(A, jax.Array) else np
        L, s = A.shape[-1], causal_attention(A)
        cols = [xp.diagonal(s, offset=-j, axis1=-2, axis2=-1).mean(-1) if j < L else xp.zeros(A.shape[:-2])
                for j in range(1, self.model.M + 1)]  # fmt: skip
        return xp.stack(cols, axis=-1)

    # -- the positions layout ------------------------------------------------------------------
    @property
    def reads_match_tensors(self) -> bool:
        return False

    def position_inputs(self, x, dtype):
        return None, None

    def positions_products(self, p, X, G, Gs, d):
        A = p.get("A1")
        if A.shape[-1] != X.shape[-1]:
            raise ValueError(f"model.member = 'nichani' was trained at L = {A.shape[-1]}: its position scores "
                             f"cannot read a context of L = {X.shape[-1]}")  # fmt: skip
        s = causal_attention(A)
        match = (X == X[-1]).astype(A.dtype)  # 1{x_j = x_L}
        if A.shape[0] == 1:
            inner = jnp.einsum("hlj,j->lh", s, match)  # ⟨e(x_L), v_l^(1)⟩
            return _paper.subset_products(inner, self.model.membership)
        first = s[0] @ match  # head 1: ⟨e(x_L), v_l^(1)⟩
        V = jnp.einsum("hlj,jd->hld", s[1:], jax.nn.one_hot(X, d, dtype=A.dtype))  # heads 2..H: v_l^(h)
        rest = jnp.einsum("hld,hd->l", V, V[:, -1])  # Σ_{h≥2} ⟨v_L^(h), v_l^(h)⟩
        return (first + rest)[:, None]

    def positions_readout(self, p, z, X, cond, eps, kind):
        # layer 2's keys are the positions before the query (the query is not its own key)
        return sequence_loss(_paper.predict_from_kappa(p.a, z[:-1], X[:-1], cond.shape[-1]), cond, eps, kind)
