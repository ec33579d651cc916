"""A linear classifier on the query's own features (``model.member = "linear_query"``;
docs/theory/mathematics.md §M10f(i)): a baseline.

The second layer is replaced by ``p = softmax(W φ̂_q)`` on the selector's features of the query
alone, ``φ̂_q = ⊕_S (|C_S|/‖C‖) ⊗_{h∈S} v_q^(h)`` (the sum-normalised feature map of the paper's
selector, Σ_S d^{|S|} numbers; the paper's RPE copier), with ``W`` ``(d, Σ_S d^{|S|})`` (block
``"W"``, starting at 0: the uniform prediction). Without attention to the context the model
can only learn what the query's window says about the next token across the prior; for a
symmetric prior, by the relabelling symmetry, the best population loss is that of the uniform
prediction, log d (the Monte Carlo sample lets it fit O(1/N) better). At W = 0 the loss does
not depend on C or w, so Stages I and II do not move: the three-stage picture has nothing to
select. Stage III trains W. The loss is that of p (``estimator.loss``); a stays unread.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ._attention import window_attention
from ._data import all_windows
from ._ops import sequence_loss
from ._paper import shifted_windows
from ._registry import register
from ._tables import check_aligned_heads, onehots, rpe_attention
from ._traits import AbstractCSelector, AbstractOffsetSpan, AbstractOwnOffsets, AbstractRPECopier


def feature_size(model, d: int) -> int:
    """``Σ_S d^{|S|}`` over the selector's sets."""
    return sum(d ** len(S) for S in model.subsets)


@register
class LinearQueryModel(AbstractRPECopier, AbstractOffsetSpan, AbstractCSelector, AbstractOwnOffsets):
    """A linear classifier on the query's features (see the module docstring)."""

    name = "linear_query"
    options = ()
    token_component = False

    @classmethod
    def check_config(cls, model) -> None:
        check_aligned_heads(model, cls.name)

    @classmethod
    def initial_extra(cls, model, init, p, *, d, L, dtype) -> dict:
        if d is None:
            raise ValueError("model.member = 'linear_query' needs the vocabulary size d for its classifier W")
        return {"W": jnp.zeros((d, feature_size(model, d)), dtype)}

    @property
    def own_token(self) -> bool:
        return False

    @property
    def layouts(self) -> tuple[str, ...]:
        return ("counts", "positions")

    def auto_layout(self, d: int) -> str:
        return "counts" if (d + 1) ** self.span <= 4096 else "positions"

    @property
    def stage_moves(self):
        return {"I": ("C",), "II": ("w",), "III": ("W",), "joint": ("w", "C", "W")}

    def block_group(self, name: str) -> str:
        return "a" if name == "W" else name

    @property
    def readout_blocks(self):
        return ()

    @property
    def caches_selector(self) -> bool:
        return False

    @property
    def has_table_hessian(self) -> bool:
        return False

    def sequence_attention(self, blocks, L):
        return window_attention(self.model, blocks, L)

    def features(self, p, windows, d):
        """``φ̂_q`` of query windows ``(n, M)``: ``(n, Σ_S d^{|S|})``."""
        OH = onehots(windows, d, p.w.dtype)
        pad = windows == d
        V = [jnp.einsum("nj,nje->ne", rpe_attention(p.w[h], OH, pad), OH) for h in range(self.model.H)]
        scale = jnp.abs(p.C) / jnp.sqrt(jnp.sum(p.C**2))
        parts = []
        for r, S in enumerate(self.model.subsets):
            t = jnp.ones((windows.shape[0], 1), p.w.dtype)
            for h in S:
                t = (t[:, :, None] * V[h - 1][:, None, :]).reshape(t.shape[0], -1)
            parts.append(scale[r] * t)
        return jnp.concatenate(parts, axis=-1)

    def _logits(self, p, windows, d):
        return self.features(p, windows, d) @ p.get("W").T  # (n, d)

    def counts_table(self, p, d):
        return self._logits(p, jnp.asarray(all_windows(d + 1, self.span)), d)

    def counts_row(self, p, q, d):
        return self._logits(p, jnp.asarray(all_windows(d + 1, self.span))[q][None], d)[0]

    def counts_pullback(self, p, d):
        names = self.table_blocks(p)
        table, vjp = jax.vjp(lambda tb: self.counts_table(p.with_blocks(tb), d), {b: p.get(b) for b in names})
        return lambda T: jax.vmap(lambda t: vjp(t.reshape(table.shape))[0])(T)

    def _no_sparse(self, *args, **kwargs):
        raise ValueError("model.member = 'linear_query' computes in estimator.layout 'counts' or 'positions'")

    sparse_table = sparse_jacobian = sparse_pullback = sparse_products = sparse_from_products = _no_sparse
    counts_products = counts_from_products = positions_products = positions_from_products = _no_sparse

    def readout(self, p, z, counts, cond, eps, kind):
        return sequence_loss(jax.nn.softmax(z), cond, eps, kind)

    @property
    def reads_match_tensors(self) -> bool:
        return False

    def position_inputs(self, x, dtype):
        return None, None

    def positions_z(self, p, X, G, Gs, d):
        T = shifted_windows(X, self.span)
        return self._logits(p, jnp.where(T < 0, d, T)[-1:], d)[0]

    def positions_readout(self, p, z, X, cond, eps, kind):
        return sequence_loss(jax.nn.softmax(z), cond, eps, kind)
