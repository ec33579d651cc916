"""Check-report rows of the loss ladder (docs/theory/mathematics.md §M8.3): the flow's loss at the
end on the ladder of the run's own sample (:mod:`gflow.theory._ladder`)."""

from __future__ import annotations

import jax.numpy as jnp

from ..core import Params, kernel_conditional
from ..theory import RUNGS, STRATEGIES, STRATEGY_RUNGS, loss_ladder, strategies_of
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
        "ladder: oracle, Bayes, GIH (selected set, best a), unigram, run at the end",
        None, [lad.mean(k) for k in names],
        f"losses on the run's sample{'' if 'gih' in names else ' (no GIH: the loss is at every position)'}, SEs "
        f"{[round(lad.se(k), 5) for k in names]}; Bayes "
        + ("is exactly Bayes-optimal here" if lad.bayes_optimal else "drops the start's likelihood (stationary start)"),
        "finite",
    )  # fmt: skip
    strat = [k for k in STRATEGY_RUNGS if k in lad.values]
    if strat:
        ctx.info("ladder: Edelman et al.'s strategies uniform, unigram+1, bigram+1", None, [lad.mean(k) for k in strat],
                 f"add-one counts, scored as the run's loss; SEs {[round(lad.se(k), 5) for k in strat]}", "finite")  # fmt: skip
    for a, label in (("flow", "flow − Bayes"), ("gih", "GIH − Bayes")):
        if a not in lad.values:  # no GIH rung with the loss at every position
            continue
        m, s = lad.gap(a, "bayes")
        ctx.info(f"ladder: {label}", None, m, f"paired SE {s:.2g}", "finite")
    cap = lad.captured()
    if cap is not None:
        ctx.info("ladder: captured (unigram − flow)/(unigram − Bayes)", None, cap[0],
                 f"delta-method SE {cap[1]:.2g}", "finite")  # fmt: skip


#: the most saved times the strategies' rows evaluate the model at (evenly spaced, and the last)
STRATEGY_TIMES = 100


def rows_strategies(ctx: Ctx) -> None:
    """Informational (finite): the run's phases (Edelman et al.'s strategies: the stretches of
    saved time where one strategy's mean KL to the model is the smallest by a factor 2) and each
    strategy's KL at the end (``gflow.strategies``; at most :data:`STRATEGY_TIMES` saved times)."""
    n = len(ctx.traj.ts)
    if n == 0:
        ctx.skip("strategies", "the run has no saved time")
        return
    s = strategies_of(ctx.traj, every=-(-n // STRATEGY_TIMES), loss=ctx.loss)
    phases = " → ".join(f"{k} [{a:.3g}, {b:.3g}]" for k, a, b in s["phases"]) or "none"
    ctx.info("strategies: phases (the strategy closest to the model by a factor 2, over t)", None, phases,
             f"mean KL(strategy ‖ model) at {len(s['t'])} saved times; add-one uniform, unigram, bigram", "finite")  # fmt: skip
    ctx.info("strategies: KL(uniform, unigram, bigram ‖ model) at the end", None,
             [float(s[f"kl_{k}"][-1]) for k in STRATEGIES], "over the positions where the loss is taken", "finite")  # fmt: skip
