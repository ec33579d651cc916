"""What a theorist reads off a saved run beyond its arrays."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..core import sequence_attention
from ..trajectory import Trajectory, load

__all__ = ["attention"]


def attention(run: Trajectory | str | Path, i: int = -1) -> np.ndarray:
    """The first layer's attention at saved index `i` of `run` (a trajectory or a run folder),
    ``(H, L, L)``: head h's weight of position l on position j, index k being position k+1,
    computed from the saved θ (``gflow.core.sequence_attention``: the paper's relative embedding
    laid along the sequence, the absolute bands, Nichani's causal scores, Edelman's offset
    weights). ``ValueError`` for the members whose first layer reads the tokens, and for an index
    outside the saved times."""
    traj = run if isinstance(run, Trajectory) else load(run)
    n = len(traj.ts)
    if not -n <= int(i) < n:
        raise ValueError(f"attention: i = {i} is outside the run's {n} saved times (allowed: {-n}..{n - 1})")
    return sequence_attention(traj.config.model, traj.state(int(i)), traj.config.data.L)
