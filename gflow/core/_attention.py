"""The first layer's attention laid along the sequence (:func:`sequence_attention`;
``gflow.attention`` reads it off a run). Each member of the family computes its own
(``AbstractModel.sequence_attention``); the relative embedding's layout, shared by every member
whose first layer is the paper's softmax(w) on windows of offsets, is :func:`window_attention`."""

from __future__ import annotations

import numpy as np

from ._model import ModelConfig
from ._ops import softmax_any


def sequence_attention(model: ModelConfig, blocks: dict, L: int) -> np.ndarray:
    """Head h's weight of position l on position j, ``(H, L, L)`` (index k is position k+1), from
    the blocks of θ (numpy), as the model's member lays it out:

    - the paper's relative embedding (members ``paper``, ``value``, ``residual``,
      ``linear_query``, ``linear_output``, ``bilinear``): ``softmax(w_h)`` laid along the
      offsets ``l − j`` the head reads (``1..M``, or ``h..h+M−1`` with shifted windows); near the
      start a row sums to less than one, the share of the window's zero padding before position 1
      (:func:`window_attention`);
    - ``absolute``: ``softmax(A_h[l])`` over the offsets ``1..M`` of position l (same padding);
    - ``nichani``: ``softmax`` of the causal row ``A⁽¹⁾_h[l, j ≤ l]`` (rows sum to one);
    - ``edelman``: ``softmax_{j≤l}(v_{l−j})`` (offset 0 included; rows sum to one).

    The members whose first layer reads the tokens (``token``, ``full``) have no attention
    without a sequence: ``ValueError``.
    """
    from ._members import member_of

    return member_of(model).sequence_attention(blocks, L)


def window_attention(model: ModelConfig, blocks: dict, L: int) -> np.ndarray:
    """The relative embedding ``softmax(w)`` (block ``"w"``, ``(H, M)``) laid along the sequence:
    head h's offsets ``1..M`` (aligned windows) or ``h..h+M−1`` (shifted)."""
    out = np.zeros((model.H, L, L))
    s = softmax_any(np.asarray(blocks["w"], np.float64))  # (H, M)
    for h in range(model.H):
        first = h + 1 if model.windows == "shifted" else 1  # head h+1's window starts at this offset
        for k in range(model.M):
            off = first + k
            rows = np.arange(off, L)
            out[h, rows, rows - off] = s[h, k]
    return out


def no_sequence_attention(name: str):
    """The refusal of a member whose first layer reads the tokens."""
    raise ValueError(f"model.member = {name!r}: its first layer reads the tokens, so its attention depends on the "
                     "sequence and has no (H, L, L) form from θ alone")  # fmt: skip
