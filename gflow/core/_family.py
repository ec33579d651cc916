"""The model family: one abstract class, :class:`AbstractModel`, that every member of the
family implements (docs/guides/models.md, docs/theory/mathematics.md §M10).

A member is a final ``eqx.Module`` holding its :class:`~gflow.core.ModelConfig`. It declares

- its **parameters**: the blocks beyond θ = (w, C, a) (:meth:`AbstractModel.initial_extra`,
  their shapes from the sizes), which time scale of the schedule moves each block
  (:meth:`AbstractModel.block_group`), and **what each stage trains**
  (:attr:`AbstractModel.stage_moves`);
- what the staged flow's **events and reports read**: the selector's shares (Stage I), the
  copier's attention of the query on each head's own offset (Stage II);
- its **κ computation per sample layout** (docs/theory/computation.md): the κ table on window
  pairs and its Jacobian (the counts and sparse layouts), the per-position kernel (the
  positions layout), the readout (the second layer and the loss of one sequence), and the
  C-independent products a Stage I may cache.

The layouts (``gflow.core.CountFeatures``, …) are written once in terms of these primitives, so
every estimator method, solver, check and command works for every member. Adding a member is
one module with its final class, decorated with ``gflow.core._registry.register``, and one
import line in ``gflow/core/_members.py``.
"""

from __future__ import annotations

import abc
from typing import ClassVar

import equinox as eqx

from ._model import InitConfig, ModelConfig, Params


class AbstractModel(eqx.Module):
    """A member of the model family (see the module docstring). Every method is abstract or
    final (equinox's abstract/final pattern): a member implements the abstract ones."""

    model: ModelConfig = eqx.field(static=True)

    # -- the class: its name, the options it reads, its checks and its extra blocks ----------
    name: ClassVar[str]
    # the ModelConfig options (beyond M, H, D) this member reads; the others must stay default
    options: ClassVar[tuple[str, ...]]
    # whether the selector's sets may hold component 0, the position's own token
    token_component: ClassVar[bool]
    # whether the selector's sets hold the empty set ∅ (every member's but Nichani et al.'s, which
    # has no selector: its one set is {1}, so c/Σc ≡ 1 and Stage I ends at its start)
    empty_set: ClassVar[bool] = True
    # whether the selector's one set is every head, {1..H} (Nichani et al.'s, whose heads all feed
    # one match: c/Σc ≡ 1); else the sets of size 1..D (and ∅ with empty_set)
    one_set: ClassVar[bool] = False
    # whether the member predicts at every position (estimator.positions = "all"): its positions_readout
    # then reads the targets of every position, (L, d), and returns their weighted sum
    every_position: ClassVar[bool] = False
    # whether the member's output ŷ is logits (edelman): its loss is then the cross-entropy of
    # softmax(ŷ), and the ladder scores the baselines' probabilities with the log loss
    outputs_logits: ClassVar[bool] = False
    # whether the sets holding the token component normalise κ (Σc runs over them): the Full
    # model's official κ leaves them out (its token sets' shares are then always 0)
    token_sets_normalise: ClassVar[bool] = True
    # whether the member's field switches: a relu of the parameters in its second layer (the Full
    # model's relu⟨u_q, u_l⟩), so that its flow may slide along a switching surface, where an adaptive
    # solver's steps collapse (docs/results/official-full.md); its runs integrate by GD's fixed step
    switching: ClassVar[bool] = False

    @classmethod
    @abc.abstractmethod
    def check_config(cls, model: ModelConfig) -> None:
        """``ValueError`` naming the key if `model` is not a valid configuration of this member."""

    @classmethod
    @abc.abstractmethod
    def initial_extra(cls, model: ModelConfig, init: InitConfig, p: Params, *, d, L, dtype) -> dict:
        """The extra blocks at the start, ``{name: array}`` (``{}`` for the paper's model);
        `p` is the paper's θ₀ = (w, C, a) of `model`."""

    # -- structure ---------------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def span(self) -> int:
        """Offsets a key's window holds in the table layouts."""

    @property
    @abc.abstractmethod
    def own_token(self) -> bool:
        """Whether a key's second-layer feature reads its own token ``x_l`` (then the κ table is
        ``(Q, d, K)``: query window × own token × key window; else ``(Q, K)``)."""

    @property
    @abc.abstractmethod
    def layouts(self) -> tuple[str, ...]:
        """The sample layouts this member computes in (``estimator.layout``)."""

    @abc.abstractmethod
    def auto_layout(self, d: int) -> str:
        """The layout ``estimator.layout = "auto"`` picks for vocabulary size `d`."""

    @property
    @abc.abstractmethod
    def stage_moves(self) -> dict[str, tuple[str, ...]]:
        """What each stage trains: ``{"I": blocks, "II": blocks, "III": blocks, "joint": blocks}``."""

    @abc.abstractmethod
    def block_group(self, name: str) -> str:
        """The time scale that moves block `name`: ``"w"`` (``schedule.eta_w``: the first layer),
        ``"C"`` (``eta_C``: the selector) or ``"a"`` (``eta_a``: the classifier)."""

    @abc.abstractmethod
    def sequence_attention(self, blocks: dict, L: int):
        """The first layer's attention laid along a sequence of length `L`, ``(H, L, L)`` numpy
        (head h's weight of position l on position j), from the blocks of θ;
        ``ValueError`` when the first layer reads the tokens (``gflow.attention``)."""

    @property
    @abc.abstractmethod
    def readout_blocks(self) -> tuple[str, ...]:
        """The blocks only the readout (second layer) reads; the κ table reads the others."""

    @property
    @abc.abstractmethod
    def caches_selector(self) -> bool:
        """Whether a stage moving only C may cache the C-independent products
        (:meth:`counts_products`, …)."""

    @property
    @abc.abstractmethod
    def has_table_hessian(self) -> bool:
        """Whether the second derivatives through the κ table apply (``gflow.core.table_hessian``)."""

    # -- what the events and the reports read ------------------------------------------------
    def normalising(self) -> tuple[bool, ...]:
        """Which sets of 𝒮 normalise κ (``Σc`` runs over them; the shares of the others are 0):
        every set, but those holding the token component when :attr:`token_sets_normalise` is
        false (the Full model)."""
        return tuple(self.token_sets_normalise or 0 not in S for S in self.model.subsets)

    @abc.abstractmethod
    def shares(self, blocks: dict):
        """The selector's shares (``c_S/Σc`` over the sets that normalise κ), ``(|𝒮|,)``, from
        the blocks it reads (a dict of block name → array; the moving blocks of Stage I suffice)."""

    @abc.abstractmethod
    def query_attention(self, blocks: dict):
        """Each head's attention from the query over the offsets it reads, ``(H, M)`` (the
        copier; the moving blocks of Stage II suffice)."""

    @abc.abstractmethod
    def heads_of(self, S: tuple[int, ...]) -> tuple[int, ...]:
        """The heads of a selected set whose concentration ends Stage II."""

    @abc.abstractmethod
    def set_offsets(self, S: tuple[int, ...]) -> tuple[int, ...] | None:
        """The parent offsets the set reads with one-hot copiers (``None``: a set of no
        parents, e.g. one holding a component that is zero on the query)."""

    def gih_offsets(self, S) -> tuple[int, ...] | None:
        """The parent offsets whose GIH stands for `S`: a set of this model's 𝒮 through
        :meth:`set_offsets` (the residual member's {0,2} reads {1,2}; ``None``: it reads none),
        any other tuple taken as offsets itself."""
        S = tuple(S)
        return self.set_offsets(S) if S in self.model.subsets else S

    # -- κ in the table layouts --------------------------------------------------------------
    @abc.abstractmethod
    def counts_table(self, p: Params, d: int):
        """κ on every (query window, [own token,] key window) of the counts layout."""

    @abc.abstractmethod
    def counts_row(self, p: Params, q, d: int):
        """One query window's row of :meth:`counts_table` (per-sequence gradients)."""

    @abc.abstractmethod
    def counts_pullback(self, p: Params, d: int):
        """A function mapping cotangents of :meth:`counts_table` with a leading batch axis to
        ``{block: gradient}`` of the table's blocks (the batch gradients)."""

    @abc.abstractmethod
    def sparse_table(self, p: Params, d: int, L: int):
        """κ on every (query window, [own token,] window a sequence can show) (sparse layout)."""

    @abc.abstractmethod
    def sparse_jacobian(self, p: Params, d: int, L: int):
        """``(table, {block: ∂table/∂block})`` of :meth:`sparse_table` (per-sequence gradients)."""

    @abc.abstractmethod
    def sparse_pullback(self, p: Params, d: int, L: int):
        """``(table, pull)``: :meth:`sparse_table` and a function mapping flat cotangents of it
        with a leading batch axis, ``(B, table.size)``, to ``{block: gradient}`` (the batch
        gradients)."""

    @abc.abstractmethod
    def counts_products(self, p: Params, d: int):
        """The C-independent part of :meth:`counts_table` (when :attr:`caches_selector`)."""

    @abc.abstractmethod
    def counts_from_products(self, C, products, d: int):
        """:meth:`counts_table` from :meth:`counts_products` and C."""

    @abc.abstractmethod
    def sparse_products(self, p: Params, d: int, L: int):
        """The C-independent part of :meth:`sparse_table`."""

    @abc.abstractmethod
    def sparse_from_products(self, C, products, d: int, L: int):
        """:meth:`sparse_table` from :meth:`sparse_products` and C."""

    @abc.abstractmethod
    def readout(self, p: Params, z, counts, cond, eps, kind: str):
        """One sequence's loss from its κ entries `z` (``(K,)`` or ``(d, K)``) and its counts
        ``(d, K)`` (``counts[e, k]``: how often key window k holds token e)."""

    # -- κ in the positions layout -----------------------------------------------------------
    @property
    @abc.abstractmethod
    def reads_match_tensors(self) -> bool:
        """Whether the positions layout stores match tensors for this member
        (:meth:`position_inputs`); else only the tokens."""

    @abc.abstractmethod
    def position_inputs(self, x, dtype):
        """``(G, Gs)`` of one sequence (when :attr:`reads_match_tensors`)."""

    @abc.abstractmethod
    def positions_z(self, p: Params, X, G, Gs, d: int):
        """κ of every key ``l = 1..L`` of one sequence, ``(L,)`` (`d`: the vocabulary size)."""

    @abc.abstractmethod
    def positions_readout(self, p: Params, z, X, cond, eps, kind: str):
        """One sequence's loss from :meth:`positions_z`."""

    @abc.abstractmethod
    def positions_products(self, p: Params, X, G, Gs, d: int):
        """The C-independent part of :meth:`positions_z` (when :attr:`caches_selector`)."""

    @abc.abstractmethod
    def positions_from_products(self, C, products):
        """:meth:`positions_z` from :meth:`positions_products` and C."""

    # -- final methods -------------------------------------------------------------------------
    def positions_loss(self, p: Params, X, G, Gs, cond, eps, kind: str):
        """One sequence's loss in the positions layout."""
        return self.positions_readout(p, self.positions_z(p, X, G, Gs, cond.shape[-1]), X, cond, eps, kind)

    def readout_args(self, p: Params) -> dict:
        """The readout's own blocks of θ, ``{name: array}``."""
        return {b: p.get(b) for b in self.readout_blocks}

    def readout_of(self, p: Params):
        """:meth:`readout` as a function of (its own blocks, z, counts, cond, eps, kind), the
        table's blocks fixed at `p` (for gradients with respect to (readout blocks, z))."""
        return lambda r, z, counts, cond, eps, kind: self.readout(p.with_blocks(r), z, counts, cond, eps, kind)

    def table_blocks(self, p: Params) -> tuple[str, ...]:
        """The blocks of θ the κ table reads (every block the readout does not)."""
        return tuple(b for b in p.names if b not in self.readout_blocks)

    @property
    def subsets(self) -> tuple[tuple[int, ...], ...]:
        return self.model.subsets

    def block_names(self, p: Params) -> tuple[str, ...]:
        return p.names
