"""The check report: every law of docs/theory/mathematics.md §M6 and §M8.1 against a run (docs/theory/mathematics.md §M7).

:func:`check` compares a :class:`~gflow.trajectory.Trajectory` with its
:class:`~gflow.theory.Theory` and returns a :class:`Report`, one :class:`Row`
per prediction: ``name, claim, predicted, measured, tolerance, passed``.
:func:`gflow.check_run` does the same for a run folder and writes ``report.json``
and ``report.md`` (and ``theory.json`` through
:func:`~gflow.runs.load_or_compute`).

**Claims and verdicts** (docs/theory/mathematics.md §M8.1). Every row names its claim:

- ``"paper"``: the paper's asymptotic statements: Stage I selects
  ``S* = argmax Ĩ``; ``a`` grows like ``log t`` (slope 1); the Ĩ-based rates
  (informational: Ĩ is J's limit for a one-hot copier and ``L → ∞``).
- ``"finite"``: gflow's finite-size laws on the run's own sample and
  initialisation: ``argmax J``, the J log-ratio slopes, the predicted Stage I
  duration, the Stage II softmax law, and the GIH law of the set Stage I
  *selected* (the force ``F(a)``, ``a*``, the limit loss).
- ``"exact"``: identities of the flow: a finite trajectory, ``‖C‖`` conserved,
  the event conditions.

:attr:`Report.verdict` is ``{"gflow": …, "paper": …}``: ``gflow`` fails when a
decided finite or exact row fails (the flow disagrees with its own theory: a
bug or an unresolved numerical problem), ``paper`` folds the decided paper
rows (its failure is a scientific result, not a bug). ``gflow check`` exits 1
only on a gflow failure. Stage II and III rows use the selected set; when it
is not ``S*``, an informational row shows the GIH law of ``S*`` beside it.

**Undecided rows** (``passed`` None, tolerance ``"info: …"``): informational
rows; rows whose law does not cover the run's options (docs/theory/mathematics.md §M8.7:
:data:`~gflow.theory.LAW_COVERAGE`, e.g. the Stage I linearisation for
``norm="layer"``); rows the run cannot decide (a stage cut by its duration,
too few saved points); and **vacuous** rows: each row carries a plausible
wrong measurement (the other set, ``a + 1``, a slope × 1.5, …) and is decided
only if its tolerance rejects it.

**What is compared with what.** The theory is computed on the run's own
sample (same seed), so flow and predictions share their common random numbers;
SEs in tolerances are *paired* SEs over the sequences, at ``k_se`` (4). For
Stages II and III the frozen copier/selector is not exactly one-hot; the
*contrast* ``λ = (c_S/Σc) Π_{h∈S} (s^(h)_h)²`` (:func:`contrast`) is the
weight with which the model's kernel reads the GIH's match indicator, so to
first order the model is the GIH with ``a`` shrunk to ``λa``: its force
``λF(λa)``, its zero ``a*/λ``, its limit loss unchanged. ``|λF(λa) − F(a)|``
and ``a*|1/λ_w − 1|`` (λ_w the copier's part of λ) are the Stage III tolerances, with the
measured effect of the selector's residual mass on other sets added (it is not a dilution:
their kernels carry information). Staged Stage III itself settles at the zero a° of the
force at its frozen (w, C), checked exactly (``III: a at end vs a°``). The rows, their tolerances
and wrong answers are documented in the row functions (``gflow.checks._rows_stage1``,
``gflow.checks._rows_stage23``; their common context in ``gflow.checks._base``).
"""

from __future__ import annotations

import time

from .._util import linear_fit, log_slope, power_exponent
from ..core import PopulationLoss, make_loss
from ..theory import Theory, theory_report, unrepresented_parents
from ..trajectory import Trajectory, selected_set
from ._base import Ctx, contrast, set_label
from ._report import Report, Row
from ._rows_edge import check_beside, rows_beside, rows_edge, rows_gd_edge
from ._rows_ladder import rows_ladder, rows_probes, rows_strategies
from ._rows_laws import rows_laws
from ._rows_stage1 import (
    row_concentration,
    row_duration,
    row_finite,
    row_norm,
    rows_slopes,
    rows_winner,
    stage1_end,
)
from ._rows_stage23 import rows_stage2, rows_stage3
from ._seeds import check_seeds

__all__ = [
    "Report",
    "Row",
    "check",
    "contrast",
    "linear_fit",
    "log_slope",
    "power_exponent",
]



# ---------------------------------------------------------------------------
# check, check_run
# ---------------------------------------------------------------------------


def _theory_summary(ctx: Ctx) -> dict:
    th, S = ctx.th, ctx.selected
    law = th.laws.get(S) if S is not None else None
    rk = th.ranking
    return {
        "S_star": set_label(th.S_star),
        "close_call": rk.close_call,
        "Itilde_gap": rk.gap,
        "Itilde_gap_se": rk.gap_se,
        "argmax_J": set_label(th.argmax_J),
        "selected": set_label(S),
        "stage1_duration": th.duration.t,
        "C_star": None if law is None else law.C_star,
        "window": None if law is None else list(law.window),
        "a_star": None if law is None else law.a_star,
        "limit_loss": None if law is None else law.limit_loss,
        "limit_loss_se": None if law is None else law.limit_loss_se,
        "n_pi": rk.n_pi,
    }


def _run_summary(traj: Trajectory) -> dict:
    cfg = traj.config
    keys = ("name", "t0", "t1", "ended_by", "complete", "steps", "rejected", "nfev", "selected")
    return {
        "status": "complete" if traj.integrated else traj.status,  # of the integration
        "schedule": cfg.schedule.kind,
        "method": cfg.solver.method if isinstance(cfg.solver.method, str) else list(cfg.solver.method),
        "n_saved": len(traj.ts),
        "wall_s": traj.wall,
        "stages": [{**{k: getattr(s, k) for k in keys},
                    **({"solver": s.solver, "solver_from": s.solver_from} if s.solver else {})} for s in traj.stages],
        "final_loss": float(traj.loss[-1]) if len(traj.ts) else None,
        "final_loss_se": float(traj.loss_se[-1]) if len(traj.ts) else None,
    }


def check(
    traj: Trajectory,
    *,
    theory: Theory | dict | None = None,
    loss: PopulationLoss | None = None,
    n_pi: int = 2000,
    pi_seed: int = 0,
    claimed_S_star=None,
    k_se: float = 4.0,
    beside=(),
) -> Report:
    """Compare a run with every law of docs/theory/mathematics.md §M6 and §M8.1 (see the module
    docstring and the row functions for the rows, their claims and tolerances).

    **Arguments:**

    - `traj`: the run (staged, joint or gd; complete or not).
    - `theory`: the run's :class:`~gflow.theory.Theory` (or its JSON dict);
      computed if ``None`` (with `n_pi`, `pi_seed`). The GIH law of the set Stage I
      selected is added if missing.
    - `loss`: the run's estimator (default: ``make_loss`` of the run's configuration).
    - `claimed_S_star`: replace ``S*`` in the paper's winner row by this set (a
      deliberately different prediction: that row then fails unless the run selected it).
    - `beside`: other runs (:class:`Trajectory`) of the same data, model, estimator and init — a
      GD run's flow and central flow — whose distance to this run the report gives
      (informational rows ``beside the … run``; :func:`gflow.checks._rows_edge.rows_beside`).
    - `k_se`: how many paired standard errors the Monte Carlo parts of the tolerances allow
      (and, for a stochastic run, standard errors of the seed mean).

    A stochastic run (R seeds, ``traj.per_seed``) is judged on its seed mean with its
    standard error (:func:`gflow.checks._seeds.check_seeds`: R + 1 reports on one theory;
    the report says "judged on the mean of R seeds").

    **Returns:** a :class:`Report`.
    """
    t0 = time.perf_counter()
    cfg = traj.config
    if len(traj.ts) == 0:
        raise ValueError("check: the trajectory has no saved time")
    beside = tuple(beside)
    check_beside(traj, beside)  # before the theory: nothing is computed for runs that cannot be compared
    if loss is None:
        loss = make_loss(cfg.data, cfg.model, cfg.estimator)
    if isinstance(theory, dict):
        theory = Theory.from_json(theory)
    if theory is None:
        sc = cfg.schedule
        theory = theory_report(cfg.data, cfg.model, cfg.estimator, cfg.init, n_pi=n_pi, pi_seed=pi_seed,
                               loss=loss, eta_C=sc.eta_C, delta=sc.delta)  # fmt: skip
    if list(theory.sets) != list(traj.subsets):
        raise ValueError(f"check: the theory's sets {list(theory.sets)} are not the run's 𝒮 {list(traj.subsets)}")
    if claimed_S_star is not None and tuple(int(h) for h in claimed_S_star) not in traj.subsets:
        raise ValueError(f"claimed_S_star {tuple(claimed_S_star)} is not in the model's 𝒮 = {traj.subsets}")
    if traj.n_seeds:
        for one in [traj.seed_mean()] + [traj.seed_run(r) for r in range(traj.n_seeds)]:
            sel = selected_set(one)
            if sel is not None and sel not in theory.laws:
                theory = theory.with_law(loss, sel)  # once, for every report below
        return check_seeds(traj, lambda one: check(one, theory=theory, loss=loss, claimed_S_star=claimed_S_star,
                                                   k_se=k_se), k_se)  # fmt: skip
    sel = selected_set(traj)
    if sel is not None:
        theory = theory.with_law(loss, sel)
    ctx = Ctx(traj, theory, loss, k_se)
    unrep = unrepresented_parents(cfg.data, cfg.model)
    if unrep is not None:
        ctx.notes.append(f"warning: {unrep}")
    if not traj.integrated:
        ctx.notes.append(f"run status {traj.status!r}: rows of unfinished stages are undecided or skipped")
    row_finite(ctx)
    if stage1_end(ctx) is None:
        ctx.skip("Stage I rows", "the run has no saved Stage I")
    else:
        rows_winner(ctx, claimed_S_star)
        row_concentration(ctx)
        rows_slopes(ctx)
        row_norm(ctx)
        row_duration(ctx)
    rows_stage2(ctx)
    rows_stage3(ctx)
    rows_ladder(ctx)
    rows_strategies(ctx)
    rows_probes(ctx)
    rows_laws(ctx)
    rows_edge(ctx)
    rows_gd_edge(ctx)
    rows_beside(ctx, beside)
    ctx.notes.extend(f"theory: {n}" for n in theory.notes if n != unrep)
    ctx.notes.append(f"checks computed in {time.perf_counter() - t0:.1f} s")
    return Report(
        rows=ctx.rows,
        run=_run_summary(traj),
        theory=_theory_summary(ctx),
        skipped=ctx.skipped,
        notes=ctx.notes,
        selected=ctx.selected,
        S_star=theory.S_star,
        argmax_J=theory.argmax_J,
    )


