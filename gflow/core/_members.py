"""The members of the model family (docs/guides/models.md): importing this module registers
every one of them (``gflow.core._registry.MEMBERS``). To add a member, write its module and
add its import here (and its name to :data:`ORDER`, the order the docs and messages list)."""

from __future__ import annotations

import numpy as np

from . import (  # noqa: F401  (each import registers its member)
    _member_absolute,  # "absolute": absolute positional embeddings
    _member_bietti,  # "bietti": Bietti et al.'s birth of an induction head (triggers)
    _member_bilinear,  # "bilinear": a bilinear second layer
    _member_edelman,  # "edelman": Edelman et al.'s minimal model (linear attention)
    _member_full,  # "full": the official code's Full model
    _member_linear_output,  # "linear_output": an output matrix on the attended average
    _member_linear_query,  # "linear_query": a linear classifier on the query's features
    _member_nichani,  # "nichani": Nichani et al.'s reduced model (causal position scores)
    _member_paper,  # "paper": the paper's model
    _member_residual,  # "residual": a residual stream, next-token framing
    _member_token,  # "token": a token-aware first layer
    _member_value,  # "value": a value matrix per head and LayerNorm
)
from ._model import ModelConfig
from ._registry import MEMBERS

ORDER = ("paper", "token", "value", "full", "absolute", "residual", "linear_query", "linear_output", "bilinear", "nichani", "edelman", "bietti")
_registered = dict(MEMBERS)
MEMBERS.clear()
MEMBERS.update({n: _registered[n] for n in ORDER if n in _registered})
MEMBERS.update({n: c for n, c in _registered.items() if n not in MEMBERS})


def member_of(model: ModelConfig):
    """The member of the model family that `model` configures (``model.member``), an
    instance of its final class (``gflow.core.PaperModel``, …)."""
    return MEMBERS[model.member](model)


def sequence_attention(model: ModelConfig, blocks: dict, L: int) -> np.ndarray:
    """Head h's weight of position l on position j, ``(H, L, L)`` (index k is position k+1), from
    the blocks of θ (numpy), as the model's member lays it out:

    - the paper's relative embedding (members ``paper``, ``value``, ``residual``,
      ``linear_query``, ``linear_output``, ``bilinear``): ``softmax(w_h)`` laid along the
      offsets ``l − j`` the head reads (``1..M``, or ``h..h+M−1`` with shifted windows); near the
      start a row sums to less than one, the share of the window's zero padding before position 1
      (``gflow.core._attention.window_attention``);
    - ``absolute``: ``softmax(A_h[l])`` over the offsets ``1..M`` of position l (same padding);
    - ``nichani``: ``softmax`` of the causal row ``A⁽¹⁾_h[l, j ≤ l]`` (rows sum to one);
    - ``edelman``, ``bietti``: ``softmax_{j≤l}(v_{l−j})`` (offset 0 included; rows sum to one).

    The members whose first layer reads the tokens (``token``, ``full``) have no attention
    without a sequence: ``ValueError``.
    """
    return member_of(model).sequence_attention(blocks, L)
