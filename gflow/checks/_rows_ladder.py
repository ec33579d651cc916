"""Check-report rows of the loss ladder (docs/theory/mathematics.md §M8.3): the flow's loss at the
end on the ladder of the run's own sample (:mod:`gflow.theory._ladder`)."""

from __future__ import annotations

import jax.numpy as jnp

from ..core import Params, kernel_conditional
from ..theory import RUNGS, loss_ladder
from ._base import Ctx
from ._report import decided_row


def rows_ladder(ctx: Ctx) -> None:
    """The ladder of the run's sample: oracle, Bayes, the GIH of the selected
    set at the theory's ``argmin_a L_GIH``, the context unigram, the flow at
    the run's last saved time.

    - ``Bayes − oracle ≥ 0`` (finite: on the run's sample, ``loss="log"``): ``π(·|z_q)`` has the
      least expected log loss of any predictor of ``x_{L+1}`` from ``X`` (a
      proper scoring rule), up to ``2dε`` for the ε inside the log; tolerance
      ``k_se`` paired SE + ``2dε``. Wrong answer: Bayes below the oracle by
      twice the tolerance. Undecided for ``ce_on_probs`` (not a proper
      scoring rule).
    - informational (finite): the five rungs; flow − Bayes and GIH − Bayes
      with paired SEs; the captured share (unigram − flow)/(unigram − Bayes).
    """
    tr, dt = ctx.traj, ctx.loss.eps.dtype
    if len(tr.ts) == 0:
        ctx.skip("loss ladder", "the run has no saved time")
        return
    S = ctx.selected if ctx.selected is not None else ctx.S_star
    law = ctx.th.laws.get(S)
    theta = Params.from_blocks({b: jnp.asarray(v, dt) for b, v in tr.state(-1).items()})
    try:
        lad = loss_ladder(ctx.loss, ctx.cfg.data, S=S, params=theta, a_gih=None if law is None else law.a_limit,
                          pi_cond=kernel_conditional(ctx.cfg.data, ctx.cfg.estimator), estimator=ctx.cfg.estimator)  # fmt: skip
    except ValueError as e:  # parents beyond the counts layout's window
        ctx.skip("loss ladder", str(e))
        return
    g, se = lad.gap("bayes", "oracle")
    tol = ctx.k_se * se + 2 * ctx.cfg.data.d * lad.eps
    why = None if lad.kind == "log" else "ce_on_probs is not a proper scoring rule: the oracle need not be the floor"
    ctx.add(
        decided_row(
            "ladder: Bayes − oracle ≥ 0 (the oracle is the floor)", 0.0, g, tol,
            claim="finite", rule=("ge", -tol), wrong=-(abs(g) + 2 * tol), why_not=why,
        )
    )  # fmt: skip
    names = [k for k in RUNGS if k in lad.values]
    ctx.info(
        "ladder: oracle, Bayes, GIH (selected set, best a), unigram, flow at the end",
        None, [lad.mean(k) for k in names],
        f"losses on the run's sample, SEs {[round(lad.se(k), 5) for k in names]}; Bayes "
        + ("is exactly Bayes-optimal here" if lad.bayes_optimal else "drops the start's likelihood (stationary start)"),
        "finite",
    )  # fmt: skip
    for a, label in (("flow", "flow − Bayes"), ("gih", "GIH − Bayes")):
        m, s = lad.gap(a, "bayes")
        ctx.info(f"ladder: {label}", None, m, f"paired SE {s:.2g}", "finite")
    cap = lad.captured()
    if cap is not None:
        ctx.info("ladder: captured (unigram − flow)/(unigram − Bayes)", None, cap[0],
                 f"delta-method SE {cap[1]:.2g}", "finite")  # fmt: skip
