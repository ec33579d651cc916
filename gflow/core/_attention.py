"""The first layer's attention laid along the sequence, for every member whose first layer does
not read the tokens (:func:`sequence_attention`; ``gflow.attention`` reads it off a run)."""

from __future__ import annotations

import numpy as np

from ._member_edelman import offset_attention
from ._member_nichani import causal_attention
from ._model import ModelConfig
from ._ops import softmax_any


def sequence_attention(model: ModelConfig, blocks: dict, L: int) -> np.ndarray:
    """Head h's weight of position l on position j, ``(H, L, L)`` (index k is position k+1), from
    the blocks of θ (numpy).

    - the paper's relative embedding (members ``paper``, ``value``, ``residual``,
      ``linear_query``, ``linear_output``, ``bilinear``): ``softmax(w_h)`` laid along the
      offsets ``l − j`` the head reads (``1..M``, or ``h..h+M−1`` with shifted windows); near the
      start a row sums to less than one, the share of the window's zero padding before position 1;
    - ``absolute``: ``softmax(A_h[l])`` over the offsets ``1..M`` of position l (same padding);
    - ``nichani``: ``softmax`` of the causal row ``A⁽¹⁾_h[l, j ≤ l]`` (rows sum to one);
    - ``edelman``: ``softmax_{j≤l}(v_{l−j})`` (offset 0 included; rows sum to one).

    The members whose first layer reads the tokens (``token``, ``full``) have no attention
    without a sequence: ``ValueError``.
    """
    m = model.member
    if m in ("token", "full"):
        raise ValueError(f"model.member = {m!r}: its first layer reads the tokens, so its attention depends on the "
                         "sequence and has no (H, L, L) form from θ alone")  # fmt: skip
    if m == "nichani":
        return causal_attention(np.asarray(blocks["A1"], np.float64))
    if m == "edelman":
        return offset_attention(np.asarray(blocks["v"], np.float64), L)[None]
    out = np.zeros((model.H, L, L))
    if m == "absolute":
        s = softmax_any(np.asarray(blocks["pos"], np.float64))[:, :L]  # (H, L, M): position l's weights over offsets 1..M
        for k in range(model.M):
            rows = np.arange(k + 1, L)
            out[:, rows, rows - (k + 1)] = s[:, rows, k]
        return out
    s = softmax_any(np.asarray(blocks["w"], np.float64))  # (H, M)
    for h in range(model.H):
        first = h + 1 if model.windows == "shifted" else 1  # head h+1's window starts at this offset
        for k in range(model.M):
            off = first + k
            rows = np.arange(off, L)
            out[h, rows, rows - off] = s[h, k]
    return out
