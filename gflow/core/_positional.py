"""The members whose first layer depends on the position itself (absolute positional bands,
Nichani et al.'s causal scores, Edelman et al.'s offset weights): they compute in the positions
layout only, and share everything but their first layer and readout
(:class:`AbstractPositionalModel`); those whose κ is the selector's average of per-set products
(absolute, nichani) share that too (:class:`AbstractSelectorPositionalModel`)."""

from __future__ import annotations

from ._traits import AbstractCSelector, AbstractOffsetSpan, AbstractOwnOffsets


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
