"""What a theorist reads off a saved run beyond its arrays."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..core import sequence_attention
from ..trajectory import Trajectory, load

__all__ = ["attention", "probes", "strategies"]


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


def strategies(run: Trajectory | str | Path, *, every: int = 1) -> dict:
    """The mean KL from Edelman et al.'s three strategies (uniform, unigram, bigram, add-one
    counts; ``gflow.theory.strategy_kl``) to the model's prediction at the run's saved times, over
    the run's own sample and the positions where its loss is taken: ``{"t", "kl_uniform",
    "kl_unigram", "kl_bigram"}`` (arrays over every `every`-th saved time and the last), and
    ``"phases"``, ``gflow.theory.strategy_phases`` of them (stretches of time where one strategy
    is closest by a factor 2). Computed from the saved θ (one gradient of the loss in its targets
    per time), for every member, layout and data kind."""
    from ..theory import strategies_of

    return strategies_of(_saved(run, every, "strategies"), every=every)


def probes(run: Trajectory | str | Path, *, every: int = 1) -> dict:
    """Bietti et al.'s probes at the run's saved times (``gflow.theory.probes_of``): for the member
    ``bietti``, ``probe_wo2`` and ``probe_wk2`` (the fraction of rows of W_O² and W_K² whose largest
    entry is on the diagonal; W_K²'s over the fixed triggers, else every token) and ``probe_wk1``
    (layer 1's attention on offset 1, averaged over the positions); for the triggers data,
    ``loss_outputs`` (the loss at the trigger outputs from their second occurrence), ``loss_rest``
    (at the tokens that are not triggers) and ``entropy_rest`` (the global bigram's entropy rate
    there, the least ``loss_rest`` can be); with ``"t"``, at every `every`-th saved time and the
    last. Computed from the saved θ, like :func:`strategies` (one gradient of the loss in its targets
    per saved time for the loss split); the report's probe rows give their crossing times."""
    from ..theory import probes_of

    return probes_of(_saved(run, every, "probes"), every=every)


def _saved(run, every, who: str) -> Trajectory:
    """The trajectory of `run` (loaded from its folder if need be), refusing a stride `every` that is
    not an integer >= 1 and a run with no saved time, the errors named after the function `who`."""
    traj = run if isinstance(run, Trajectory) else load(run)
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        raise ValueError(f"{who}: every must be an integer >= 1, got {every!r}")
    if len(traj.ts) == 0:
        raise ValueError(f"{who}: the run has no saved time")
    return traj
