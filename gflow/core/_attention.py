"""The first layer's attention laid along the sequence: the pieces members share. Each member
computes its own (``AbstractModel.sequence_attention``; ``gflow.core.sequence_attention`` asks the
member, ``gflow.attention`` reads it off a run); the relative embedding's layout, shared by every
member whose first layer is the paper's softmax(w) on windows of offsets, is
:func:`window_attention`."""

from __future__ import annotations

import numpy as np

from ._model import ModelConfig
from ._ops import softmax_any


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
