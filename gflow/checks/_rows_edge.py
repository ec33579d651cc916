"""Check-report rows of GD's central flow (``solver.method = "central"``, docs/theory/central-flow.md):
the edge held, no eigenvalue past it left unheld, and the central flow's predictions of GD's time
averages at the run's end."""

from __future__ import annotations

import numpy as np

from ..dynamics import EDGE_RATE, EDGE_WINDOW, central_predictions
from ._base import Ctx
from ._report import decided_row

#: Saved states at which the central flow's terms are recomputed for the report (evenly spaced).
EDGE_ROWS = 60


def rows_edge(ctx: Ctx) -> None:
    """The rows of a central-flow run (none for any other method).

    - ``central: held eigenvalues at the edge`` (exact): ``max |η λ_i / 2 − 1|`` over the saved
      states where an eigenvalue is held, after its first entry. The field holds an eigenvalue
      from ``(1 − EDGE_WINDOW)·2/η`` on and pulls it onto ``2/η`` at the rate ``EDGE_RATE/η``, so
      the measured gap is at most about EDGE_WINDOW, plus a run's start above the edge (pulled down
      at that rate): tolerance ``2·EDGE_WINDOW`` from one time unit ``η/EDGE_RATE`` after the entry
      on. Wrong answer: the eigenvalue 10 % off the edge.
    - ``central: eigenvalues past the edge all held`` (exact): the count at or past the edge's
      window minus the count held, at every recomputed state: 0 unless more eigenvalues reached
      the edge than ``solver.edge_eigs`` holds (raise it). Wrong answer: one unheld.
    - informational: the first saved time at the edge; GD's predicted time-averaged loss
      ``L̂ + ½ Σ X_ii λ_i`` and ``‖∇L̂‖²`` beside the central flow's own at the end; ``tr X``.
    """
    sc = ctx.cfg.solver
    if sc.method_for("I") != "central":
        return
    tr = ctx.traj
    if len(tr.ts) == 0:
        ctx.skip("central flow rows", "the run has no saved time")
        return
    es = central_predictions(tr, loss=ctx.loss, max_times=EDGE_ROWS)
    eta = float(sc.eta)
    held = np.flatnonzero(es.held > 0)
    if held.size == 0:
        ctx.info("central: first time at the edge 2/η", None, None,
                 f"never reached: max η λ_max/2 = {float(np.max(es.lam[:, 0]) / es.edge):.4g} on the recomputed "
                 f"states (the central flow is the flow here)", "exact")  # fmt: skip
        return
    t_in = float(es.ts[held[0]])
    ctx.info("central: first time at the edge 2/η", None, t_in, f"of {len(es.ts)} recomputed saved states", "exact")
    settled = held[es.ts[held] >= t_in + eta / EDGE_RATE]
    if settled.size:
        gap = max(float(np.max(np.abs(es.lam[i, : es.held[i]] / es.edge - 1.0))) for i in settled)
        tol = 2 * EDGE_WINDOW
        ctx.add(decided_row("central: held eigenvalues at the edge (max |η λ_i/2 − 1|)", 0.0, gap, tol, claim="exact",
                            rule=("le", tol), wrong=0.1))  # fmt: skip
    else:
        ctx.skip("central: held eigenvalues at the edge", "no recomputed state a time unit η/EDGE_RATE after the entry")
    unheld = int(np.max(es.past - es.held))
    ctx.add(decided_row("central: eigenvalues past the edge all held (max past − held)", 0, unheld, 0, claim="exact",
                        rule=("le", 0), wrong=1))  # fmt: skip
    if unheld:
        ctx.notes.append(f"warning: {unheld} eigenvalue(s) of ΛH passed the edge 2/η unheld: raise solver.edge_eigs "
                         f"(now {sc.edge_eigs})")  # fmt: skip
    ctx.info("central: GD's time-averaged loss at the end (L̂, L̂ + ½ Σ X_ii λ_i)", float(es.loss[-1]),
             float(es.loss_gd[-1]), "the central flow's prediction of GD's average loss beside its own L̂", "finite")
    ctx.info("central: GD's time-averaged ‖∇L̂‖² at the end (flow's, predicted)", float(es.grad2[-1]),
             float(es.grad2_gd[-1]), "of the moving blocks; the oscillation adds ⟨X, UᵀH²U⟩", "finite")
    ctx.info("central: oscillation size tr X at the end", None, float(np.trace(es.X[-1])),
             "X_ii: GD's mean squared distance from the central flow along edge direction i (Λ^{-1/2} units)",
             "finite")  # fmt: skip
