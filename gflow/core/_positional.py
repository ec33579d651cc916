"""The members whose first layer depends on the position itself (absolute positional bands,
Nichani et al.'s causal scores, Edelman et al.'s offset weights): they compute in the positions
layout only, and share everything but their first layer and readout
(:class:`AbstractPositionalModel`); those whose κ is the selector's average of per-set products
(absolute, nichani) share that too (:class:`AbstractSelectorPositionalModel`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ._ops import softmax_any
from ._traits import AbstractCSelector, AbstractOffsetSpan, AbstractOwnOffsets


def offset_attention(v, L: int):
    """``softmax_{j≤s}(v_{s−j})`` of every position s, ``(..., L, L)`` (row s, column j; the future
    masked): one weight per offset ``0..L−1``; numpy in, numpy out; JAX in, JAX out."""
    xp = jnp if isinstance(v, jax.Array) else np
    s, j = np.arange(L)[:, None], np.arange(L)[None, :]
    return softmax_any(xp.where(j <= s, v[..., np.clip(s - j, 0, L - 1)], -xp.inf))


class AbstractPositionalModel(AbstractOffsetSpan, AbstractCSelector, AbstractOwnOffsets):
    """A member computed in ``estimator.layout = "positions"`` only, its selector the paper's C
    (its shares ``c/Σc``), each head reading the offset of its number (the span, the shares and
    the sets' offsets from :mod:`gflow.core._traits`). Its concrete methods are
    final; a member implements its blocks, stages, the copier the events read, its attention
    along the sequence and the positions layout's κ and readout."""

    @property
    def own_token(self) -> bool:
        return False

    @property
    def layouts(self) -> tuple[str, ...]:
        return ("positions",)

    def auto_layout(self, d: int) -> str:
        return "positions"

    @property
    def has_table_hessian(self) -> bool:
        return False

    # -- no table layouts: κ depends on the position -----------------------------------------------
    def _no_table(self, *args, **kwargs):
        raise ValueError(f"model.member = {self.name!r} computes in estimator.layout = 'positions' only")

    counts_table = counts_row = counts_pullback = sparse_table = sparse_jacobian = sparse_pullback = _no_table
    counts_products = counts_from_products = sparse_products = sparse_from_products = readout = _no_table


class AbstractSelectorPositionalModel(AbstractPositionalModel):
    """A positions-only member whose κ is the paper's selector average of per-set products,
    ``κ_l = Σ_S c_S P[l, S] / Σc`` with ``c = C²``: a member implements the products
    (:meth:`positions_products`, C-independent, so a Stage I caches them) and its readout."""

    @property
    def caches_selector(self) -> bool:
        return True

    def positions_from_products(self, C, products):
        c = C**2
        return products @ c / c.sum()

    def positions_z(self, p, X, G, Gs, d):
        return self.positions_from_products(p.C, self.positions_products(p, X, G, Gs, d))


class AbstractOffsetModel(AbstractPositionalModel):
    """A positions-only member without a selector (one head, ``model.H = model.D = 1``) whose first
    layer is a softmax over the causal past with one weight per offset, the block ``"v"`` ``(L,)``
    (:func:`offset_attention`; Edelman et al.'s and Bietti et al.'s models): ``z`` of the
    positions layout is layer 1's output ``h_s = Σ_{j≤s} softmax_{j≤s}(v_{s−j}) e(x_j)``, ``(L, d)``.
    A member implements its blocks, stages and readout; it predicts at every position and outputs
    logits (scored by the cross-entropy of their softmax)."""

    token_component = False
    empty_set = False
    every_position = True
    outputs_logits = True

    @classmethod
    def check_config(cls, model) -> None:
        if model.H != 1 or model.D != 1:
            raise ValueError(f"model.member = {cls.name!r} has one head and no selector: model.H and model.D must "
                             f"be 1, got H={model.H}, D={model.D}")  # fmt: skip

    def block_group(self, name: str) -> str:
        return {"v": "w", "w": "w", "C": "C"}.get(name, "a")

    @property
    def caches_selector(self) -> bool:
        return False

    def sequence_attention(self, blocks, L):
        return offset_attention(np.asarray(blocks["v"], np.float64), L)[None]

    def query_attention(self, blocks):
        """The last position's attention on the offsets ``1..M`` before it, ``(1, M)``."""
        v = blocks["v"]
        L = v.shape[-1]
        row = offset_attention(v, L)[..., L - 1, :]  # over positions j = 1..L
        xp = jnp if isinstance(v, jax.Array) else np
        cols = [row[..., L - 1 - j] if j < L else xp.zeros(row.shape[:-1]) for j in range(1, self.model.M + 1)]
        return xp.stack(cols, axis=-1)[..., None, :]

    positions_products = positions_from_products = AbstractPositionalModel._no_table  # no selector to cache

    @property
    def reads_match_tensors(self) -> bool:
        return False

    def position_inputs(self, x, dtype):
        return None, None

    def positions_z(self, p, X, G, Gs, d):
        v = p.get("v")
        if v.shape[-1] != X.shape[-1]:
            raise ValueError(f"model.member = {self.name!r} was trained at L = {v.shape[-1]}: its offset weights "
                             f"cannot read a context of L = {X.shape[-1]}")  # fmt: skip
        E = jax.nn.one_hot(X, d, dtype=v.dtype)
        return offset_attention(v, X.shape[-1]) @ E  # h_s, (L, d)
