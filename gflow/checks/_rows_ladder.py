"""Check-report rows of the loss ladder (docs/theory/mathematics.md §M8.3): the flow's loss at the
end on the ladder of the run's own sample (:mod:`gflow.theory._ladder`)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ..core import Params, kernel_conditional
from ..theory import RUNGS, STRATEGIES, STRATEGY_RUNGS, loss_ladder, probes_of, strategies_of
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
        + ("is exactly Bayes-optimal here" if lad.bayes_optimal else "is not exactly Bayes-optimal here (docs/guides/data.md: "
           "the stationary start's likelihood dropped, or the random triggers known)"),
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


#: how close to the global bigram's entropy rate the loss at the non-trigger tokens must come for the
#: bigram to count as learned (nats; the flow's excess there is a KL divergence, >= 0)
BIGRAM_TOL = 0.05
#: Bietti et al.'s probes in the order their top-down claim names them
PROBE_NAMES = {"probe_wo2": "W_O2", "probe_wk2": "W_K2", "probe_wk1": "layer 1"}


def first_time(t, x, below=None, above=None) -> float:
    """The first saved time where `x` is ``<= below`` (or ``>= above``), else ``nan``."""
    x = np.asarray(x, np.float64)
    hit = x <= below if below is not None else x >= above
    return float(np.asarray(t)[np.argmax(hit)]) if hit.any() else float("nan")


def rows_probes(ctx: Ctx) -> None:
    """Informational (finite): Bietti et al.'s probes of a ``bietti`` run (``gflow.probes``: the
    first saved time each of W_O², W_K², layer 1 reaches 0.5, their order, their values at the end)
    and, on the triggers data, the loss split: the first time the loss at the tokens that are not
    triggers comes within :data:`BIGRAM_TOL` of the global bigram's entropy rate (the bigram
    learned) against the first time the loss at the trigger outputs has fallen half way from its
    start to its end (the induction head), and both losses at the end."""
    cfg, n = ctx.cfg, len(ctx.traj.ts)
    if cfg.model.member != "bietti" and cfg.data.kind != "triggers":
        return
    if n == 0:
        ctx.skip("probes", "the run has no saved time")
        return
    p = probes_of(ctx.traj, every=-(-n // STRATEGY_TIMES), loss=ctx.loss)
    t = p["t"]
    if "probe_wo2" in p:
        cross = {k: first_time(t, p[k], above=0.5) for k in PROBE_NAMES}
        ctx.info("probes: first time W_O2, W_K2, layer 1 reach 0.5", None, list(cross.values()),
                 f"at {len(t)} saved times; W_O2, W_K2: the fraction of rows with the diagonal largest (W_K2 over "
                 f"the fixed triggers), layer 1: its attention on offset 1; nan: not reached", "finite")  # fmt: skip
        order = sorted((v, PROBE_NAMES[k]) for k, v in cross.items() if np.isfinite(v))
        ctx.info("probes: order of the 0.5 crossings", "W_O2 → W_K2 → layer 1",
                 " → ".join(name for _, name in order) or "none", "Bietti et al.'s top-down order", "finite")  # fmt: skip
        ctx.info("probes: W_O2, W_K2, layer 1 at the end", None, [float(p[k][-1]) for k in PROBE_NAMES],
                 "1 for the induction head", "finite")  # fmt: skip
    if "loss_rest" in p:
        lo, lr, H = p["loss_outputs"], p["loss_rest"], p["entropy_rest"]
        t_big = first_time(t, lr, below=H + BIGRAM_TOL)
        t_head = first_time(t, lo, below=(lo[0] + lo[-1]) / 2) if lo[0] - lo[-1] > BIGRAM_TOL else float("nan")
        ctx.info("probes: the bigram learned, then the induction head (first times)", "bigram first", [t_big, t_head],
                 f"the non-trigger loss within {BIGRAM_TOL} of the bigram's entropy rate, then the trigger-output "
                 f"loss half way from its start to its end; nan: not reached", "finite")  # fmt: skip
        ctx.info("probes: loss at the trigger outputs, elsewhere, the bigram's entropy rate (end)", None,
                 [float(lo[-1]), float(lr[-1]), float(H)],
                 "outputs: trigger tokens seen before (their outs >= 2); elsewhere: the tokens that are not "
                 "triggers", "finite")  # fmt: skip
