"""What members share, one piece per abstract class (equinox's abstract/final pattern: a
concrete method here is never overridden). A member inherits the pieces it has, beside its
layout's class (``AbstractWindowModel``, ``AbstractPositionalModel``), and its module holds only
what makes it different:

- :class:`AbstractRPECopier`: its first layer is the paper's relative embedding ``w`` ``(H, M)``,
  each head's copier ``softmax(w_h)`` (the events and the Stage II rows read it);
- :class:`AbstractOffsetSpan`: each head reads the offsets ``1..M`` of its window (span ``M``);
- :class:`AbstractCSelector`: its selector is the paper's C, shares ``c/Σc`` with ``c = C²``;
- :class:`AbstractOwnOffsets`: a set of heads is a set of offsets (head h's copier sits on
  offset h);
- :class:`AbstractPaperStages`: the paper's three stages over its blocks: Stage I moves C,
  Stage II the first layer (``w`` and the member's ``first_layer_extra`` blocks, all in the
  group ``w`` of the schedule's rates), Stage III the scalar ``a``, the only readout block; the
  selector's products are cached through Stage I.
"""

from __future__ import annotations

import abc

from ._family import AbstractModel
from ._ops import c_shares, softmax_any


class AbstractRPECopier(AbstractModel):
    """The first layer is the paper's relative embedding ``w``: the copier is ``softmax(w)``."""

    def query_attention(self, blocks):
        return softmax_any(blocks["w"])


class AbstractOffsetSpan(AbstractModel):
    """Each head reads the offsets ``1..M``: the windows span ``M`` positions."""

    @property
    def span(self) -> int:
        return self.model.M


class AbstractCSelector(AbstractModel):
    """The selector is the paper's C: shares ``c/Σc``, ``c = C²``."""

    def shares(self, blocks):
        return c_shares(blocks["C"])


class AbstractOwnOffsets(AbstractModel):
    """Head h reads offset h: a set of heads is the set of offsets of the same numbers."""

    def heads_of(self, S):
        return tuple(S)

    def set_offsets(self, S):
        return tuple(S)


class AbstractPaperStages(AbstractModel):
    """The paper's stages over (first layer, C, a), the selector's products cached in Stage I."""

    @property
    @abc.abstractmethod
    def first_layer_extra(self) -> tuple[str, ...]:
        """The member's blocks beside ``w`` that move with the first layer (group ``w``)."""

    @property
    def stage_moves(self):
        first = ("w",) + tuple(self.first_layer_extra)
        return {"I": ("C",), "II": first, "III": ("a",), "joint": first + ("C", "a")}

    def block_group(self, name: str) -> str:
        return name if name in ("w", "C", "a") else "w"

    @property
    def caches_selector(self) -> bool:
        return True

    @property
    def readout_blocks(self):
        return ("a",)
