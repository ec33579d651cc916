"""The paper's model TF(M, H, d, D) as a member of the model family (``model.member =
"paper"``, the default; docs/theory/mathematics.md §M2), with its extensions for the official
code's simplified model (``model.norm``, ``model.head_norm``, ``model.windows``, §M8.5).

θ = (w, C, a) and nothing more; Stage I trains C, Stage II w, Stage III a. Every layout
(counts, sparse, positions, heads) computes with the functions of ``gflow.core._paper``."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from . import _paper
from ._attention import window_attention
from ._model import ModelConfig
from ._ops import sequence_loss
from ._registry import register
from ._traits import AbstractCSelector, AbstractPaperStages, AbstractRPECopier

# Largest number of padded windows (d+1)**span for which layout="auto" tabulates κ on window
# pairs: the table is ((d+1)**span)**2 entries, the counts (d+1)**span * d per sequence.
AUTO_MAX_WINDOWS = 512
# Largest sparse κ table (query windows × sparse windows) for which layout="auto" picks
# "sparse": 2**20 entries (8 MB in float64; its Jacobian, for the per-sequence gradients, is
# dim(w) + |𝒮| times that).
AUTO_MAX_SPARSE = 2**20


def power_at_most(base: int, exp: int, limit: int) -> bool:
    """``base**exp <= limit`` for ``base >= 2``, in at most ``log2(limit) + 1`` multiplications
    (never computing a huge power: M = 10**30 must not hang)."""
    x = 1
    for _ in range(int(exp)):
        x *= base
        if x > limit:
            return False
    return True


def sparse_table_size(d: int, span: int) -> int:
    """Entries of the sparse layout's κ table at ``L >= span``:
    ``d**span`` query windows × ``Σ_{p=0..span} d**(span−p)`` windows."""
    return d**span * sum(d ** (span - p) for p in range(span + 1))


def table_layout(d: int, span: int) -> str:
    """``"counts"`` when ``(d+1)**span <= 512``, else ``"sparse"`` when its κ table has at
    most ``2**20`` entries (:func:`sparse_table_size`: 88,452 for d = 3 and the official
    code's span 5), else ``"positions"``."""
    if power_at_most(d + 1, span, AUTO_MAX_WINDOWS):
        return "counts"
    return "sparse" if sparse_table_size(d, span) <= AUTO_MAX_SPARSE else "positions"


@register
class PaperModel(AbstractRPECopier, AbstractCSelector, AbstractPaperStages):
    """The paper's TF(M, H, d, D): RPE copier ``s^(h) = softmax(w^(h))``, selector
    ``κ_l = Σ_S c_S Π_{h∈S}⟨v_q^(h), v_l^(h)⟩ / Z``, classifier ``softmax_l(a κ_l)``."""

    name = "paper"
    options = ("norm", "head_norm", "windows")
    token_component = False

    @classmethod
    def check_config(cls, model: ModelConfig) -> None:
        return None

    @classmethod
    def initial_extra(cls, model, init, p, *, d, L, dtype) -> dict:
        return {}

    # -- structure -----------------------------------------------------------------------------
    @property
    def first_layer_extra(self):
        return ()

    @property
    def span(self) -> int:
        return self.model.span

    @property
    def own_token(self) -> bool:
        return False

    @property
    def layouts(self) -> tuple[str, ...]:
        return ("counts", "positions", "heads", "sparse")

    def auto_layout(self, d: int) -> str:
        return table_layout(d, self.span)

    @property
    def has_table_hessian(self) -> bool:
        return True

    # -- events and reports --------------------------------------------------------------------
    def sequence_attention(self, blocks, L):
        return window_attention(self.model, blocks, L)

    def heads_of(self, S):
        return tuple(S)

    def set_offsets(self, S):
        # aligned windows: head h's one-hot copier sits on offset h (w[h−1, h−1]); shifted windows:
        # head h reads offsets h..h+M−1 and its copier sits on the first, offset h (w[h−1, 0]).
        # Either way the set of heads S copies the parent offsets S.
        return tuple(S)

    # -- the table layouts ---------------------------------------------------------------------
    def counts_table(self, p, d):
        return _paper.kappa_table(p.w, p.C, self.model, d)

    def counts_row(self, p, q, d):
        return _paper.kappa_row(p.w, p.C, q, self.model, d)

    def counts_pullback(self, p, d):
        Jw, JC = jax.jacfwd(lambda w, C: _paper.kappa_table(w, C, self.model, d), argnums=(0, 1))(p.w, p.C)
        return lambda T: {"w": jnp.einsum("bqk,qkhm->bhm", T, Jw), "C": jnp.einsum("bqk,qks->bs", T, JC)}

    def sparse_table(self, p, d, L):
        return _paper.sparse_kappa_table(p.w, p.C, self.model, d, L)

    def sparse_jacobian(self, p, d, L):
        fn = lambda w, C: _paper.sparse_kappa_table(w, C, self.model, d, L)  # noqa: E731
        table = fn(p.w, p.C)
        Jw, JC = jax.jacfwd(fn, argnums=(0, 1))(p.w, p.C)
        return table, {"w": Jw, "C": JC}

    def sparse_pullback(self, p, d, L):
        table, J = self.sparse_jacobian(p, d, L)
        E, nw = table.size, p.w.size
        Jf = jnp.concatenate([J["w"].reshape(E, nw), J["C"].reshape(E, -1)], axis=-1)

        def pull(T):
            g = T @ Jf
            return {"w": g[..., :nw].reshape(g.shape[:-1] + p.w.shape), "C": g[..., nw:]}

        return table, pull

    def counts_products(self, p, d):
        return _paper.window_products(p.w, self.model, d)

    def counts_from_products(self, C, products, d):
        return _paper.kappa_from_window_products(C, products, self.model)

    def sparse_products(self, p, d, L):
        return _paper.sparse_window_products(p.w, self.model, d, L)

    def sparse_from_products(self, C, products, d, L):
        r0 = _paper.sparse_query_block(d, self.model.span, L)[0]
        return _paper.kappa_from_sparse_products(C, *products, self.model, r0)

    def readout(self, p, z, counts, cond, eps, kind):
        return sequence_loss(_paper.predict_from_counts(p.a, z, counts), cond, eps, kind)

    # -- the positions layout ------------------------------------------------------------------
    @property
    def reads_match_tensors(self) -> bool:
        return True

    def position_inputs(self, x, dtype):
        return _paper.match_tensors(x, self.model.span, self_match=self.model.self_match, dtype=dtype)

    def positions_z(self, p, X, G, Gs, d):
        return _paper.kappa(p, G, Gs, self.model)

    def positions_readout(self, p, z, X, cond, eps, kind):
        return sequence_loss(_paper.predict_from_kappa(p.a, z, X, cond.shape[-1]), cond, eps, kind)

    def positions_products(self, p, X, G, Gs, d):
        return _paper.products(p.w, G, Gs, self.model)

    def positions_from_products(self, C, products):
        return _paper.kappa_from_products(C, products[0], products[1], self.model)

    # -- the heads layout (this member only) ---------------------------------------------------
    def head_tables(self, p, d):
        return _paper.head_tables(p.w, self.model, d)

    def heads_products(self, tab, hk, hq):
        return _paper.head_products(tab, hk, hq, self.model)

    def heads_loss(self, a, C, tab, X, hk, hq, cond, eps, kind):
        P, Ps = _paper.head_products(tab, hk, hq, self.model)
        kap = _paper.kappa_from_products(C, P, Ps, self.model)
        return sequence_loss(_paper.predict_from_kappa(a, kap, X, cond.shape[-1]), cond, eps, kind)
