"""The central flow's predictions at the saved states of any run (docs/theory/central-flow.md):
:func:`central_predictions`, on the terms of :mod:`gflow.dynamics._central`."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from .._util import STAGE_CODES
from ..core import Params, make_loss, member_of
from ._central import EdgeStates, edge_states
from ._solve import block_scales
from ._spectrum import select_rows


def central_predictions(traj, *, eta: float | None = None, edge_eigs: int | None = None, loss=None,
                        max_times: int | None = None) -> EdgeStates:
    """The central flow's terms at the saved states of a run (:class:`EdgeStates`): the top
    eigenvalues of ``ΛH`` against the edge ``2/η``, how many are held, the oscillation's
    covariance X and GD's predicted time averages (the loss, ``‖∇L̂‖²``). At a state below the
    edge X is 0 and the predictions are the flow's own values.

    - `traj`: any flow's, GD's or the central flow's :class:`~gflow.Trajectory` (Λ at each state
      is its stage's, as in :func:`gflow.hessian_spectrum`);
    - `eta`: GD's step (default the run's ``solver.eta``); `edge_eigs`: the most eigenvalues held
      (default the run's ``solver.edge_eigs``);
    - `loss`: the run's estimator if already built; `max_times`: at most this many saved states,
      evenly spaced in index (first and last kept).

    **Raises:** ``ValueError`` for ``eta <= 0`` or a run with a seed axis (SGD, the SDE).
    """
    cfg = traj.config
    eta = float(cfg.solver.eta if eta is None else eta)
    K = int(cfg.solver.edge_eigs if edge_eigs is None else edge_eigs)
    if not (np.isfinite(eta) and eta > 0):
        raise ValueError(f"central_predictions: eta must be a finite number > 0 (GD's step), got {eta!r}")
    if K < 1:
        raise ValueError(f"central_predictions: edge_eigs must be an integer >= 1, got {K!r}")
    if getattr(traj, "n_seeds", 0):
        raise ValueError("central_predictions: a run with a seed axis (SGD, the SDE) has no single state per time")
    if loss is None:
        loss = make_loss(cfg.data, cfg.model, cfg.estimator)
    dtype = cfg.estimator.jdtype
    rows = select_rows(len(traj.ts), max_times)
    stage_names = {v: k for k, v in STAGE_CODES.items()}
    member = member_of(cfg.model)
    ps, ms, ss = [], [], []
    for i in rows:
        name = "joint" if cfg.schedule.kind == "joint" else stage_names.get(int(traj.stage[i]), "I")
        moves = tuple(member.stage_moves[name])
        scale = block_scales(cfg, moves, dtype)
        moving = tuple(b for b in moves if float(scale[b]) > 0)
        ps.append(Params.from_blocks({b: jnp.asarray(v, dtype) for b, v in traj.state(int(i)).items()}))
        ms.append(moving)
        ss.append({b: scale[b] for b in moving})
    return edge_states(loss, ps, ms, ss, np.asarray(traj.ts)[rows], eta, K)
