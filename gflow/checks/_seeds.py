"""A stochastic run's report: its rows judged on the seed mean with its standard error.

A run of ``solver.method = "sgd"`` or ``"sde"`` has R seeds (:attr:`Trajectory.per_seed`)
and its ordinary arrays are their means. :func:`check_seeds` builds the report of the
**seed-mean trajectory** (θ̄(t), the mean loss, the mean gradient) and of **every seed
alone**, and then judges every row the seed-mean report decides:

- a numeric row (rules ``abs``, ``le``, ``ge``, ``interval``): its measured value is the
  mean over the seeds of the seed's own measured value, ``m̄ = (1/R) Σ_r m_r``, and its
  tolerance is widened by ``k_se`` standard errors of that mean,
  ``SE = std_r(m_r)/√R`` (``ddof = 1``): ``|m̄ − pred| ≤ tol + k_se·SE`` (``abs``; the bound
  of ``le``/``ge``/``interval`` moved outwards by ``k_se·SE``). The tolerance column says
  so (``… + 4·SE(seeds)``). The seed noise is thus counted once, in the SE, and a row is
  decided only if its widened tolerance still rejects the row's plausible wrong answer
  (otherwise it is undecided, "vacuous", as any row). With one seed the SE is unknown and
  numeric rows are undecided;
- a row of sets or of true/false (``in``, ``true``: the winner, a finite trajectory): it
  must hold on the seed-mean trajectory and on every seed;
- a row the seed-mean report leaves undecided stays undecided; a row a seed's report
  does not measure (a number missing) becomes undecided, saying so.

The report's header and its first note say that the run was judged on the mean of R
seeds, and ``report.run["seeds"]`` is R. Cost: R + 1 reports on one theory and one sample
(the laws of every set a seed selected are added to the theory once, beforehand).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable

import numpy as np

from .._util import table_cell
from ..trajectory import Trajectory
from ._report import Report, Row, decided_row

__all__ = ["check_seeds"]


def _widen(rule: tuple, d) -> tuple:
    kind, *ref = rule
    if kind == "abs":
        return ("abs", ref[0], np.asarray(ref[1], np.float64) + d)
    if kind == "le":
        return ("le", np.asarray(ref[0], np.float64) + d)
    if kind == "ge":
        return ("ge", np.asarray(ref[0], np.float64) - d)
    if kind == "interval":
        return ("interval", np.asarray(ref[0], np.float64) - d, np.asarray(ref[1], np.float64) + d)
    raise ValueError(f"rule {kind!r} is not numeric")


def _plain(x):
    x = np.asarray(x, np.float64)
    return float(x) if x.ndim == 0 else [float(v) for v in x.ravel()]


def _undecided(row: Row, why: str) -> Row:
    return Row(row.name, row.predicted, row.measured, f"info: {why}", None, row.claim, row.rule, row.wrong)


def combine_row(row: Row, seed_rows: list[Row | None], k_se: float) -> Row:
    """The row `row` of the seed-mean report judged with the seeds' rows (module docstring)."""
    R = len(seed_rows)
    if row.passed is None or row.rule is None:
        return row
    missing = [r for r, sr in enumerate(seed_rows) if sr is None]
    if missing:
        return _undecided(row, f"not measured on seeds {missing} (judged on the mean of {R} seeds)")
    kind = row.rule[0]
    if kind in ("true", "in"):
        ok = [bool(row.decide(sr.measured)) for sr in seed_rows]
        tol = f"{table_cell(row.tolerance)}; on the seed mean and on each of the {R} seeds ({sum(ok)} pass)"
        return Row(row.name, row.predicted, row.measured, tol, bool(row.passed and all(ok)), row.claim, row.rule,
                   row.wrong)  # fmt: skip
    try:
        vals = np.array([np.asarray(sr.measured, np.float64) for sr in seed_rows])
    except (TypeError, ValueError):
        return _undecided(row, f"a seed's measured value is not a number (judged on the mean of {R} seeds)")
    if vals.shape[1:] != np.shape(np.asarray(row.measured, dtype=object)):
        return _undecided(row, f"the seeds measure {vals.shape[1:]} values, the seed mean {np.shape(row.measured)}")
    mean = vals.mean(axis=0)
    if R < 2:
        return decided_row(row.name, row.predicted, _plain(mean), row.tolerance, claim=row.claim, rule=row.rule,
                           wrong=row.wrong, why_not="one seed: no standard error over seeds to judge its mean by")  # fmt: skip
    se = vals.std(axis=0, ddof=1) / math.sqrt(R)
    d = k_se * se
    rule = _widen(row.rule, d)
    se_txt = table_cell(_plain(se)) if np.ndim(se) == 0 else f"max {float(np.max(se)):.3g}"
    if isinstance(row.tolerance, (int, float, np.integer, np.floating)) and kind == "abs" and np.ndim(d) == 0:
        tol = f"{table_cell(row.tolerance)} + {k_se:g}·SE(seeds) = {table_cell(float(row.tolerance) + float(d))} (SE {se_txt})"
    else:
        tol = f"{table_cell(row.tolerance)}; + {k_se:g}·SE(seeds) (SE {se_txt})"
    return decided_row(row.name, row.predicted, _plain(mean), tol, claim=row.claim, rule=rule, wrong=row.wrong)


def check_seeds(traj: Trajectory, check_one: Callable[[Trajectory], Report], k_se: float) -> Report:
    """The report of the stochastic run `traj` (R seeds), judged on the seed mean with its
    standard error (module docstring); `check_one` checks one deterministic trajectory on the
    run's theory and sample."""
    t0 = time.perf_counter()
    R = traj.n_seeds
    mean_rep = check_one(traj.seed_mean())
    seed_reps = [check_one(traj.seed_run(r)) for r in range(R)]
    by_name = [{row.name: row for row in rep.rows} for rep in seed_reps]
    rows = [combine_row(row, [b.get(row.name) for b in by_name], k_se) for row in mean_rep.rows]
    run = dict(mean_rep.run, seeds=R, judged_on=f"the mean of {R} seeds")
    sel = sorted({str(rep.theory.get("selected")) for rep in seed_reps})
    notes = [
        f"stochastic run ({traj.config.solver.method_for('I')}, R = {R} seeds): judged on the mean of {R} seeds — "
        f"each numeric row's measured value is the mean of its {R} per-seed values, its tolerance widened by "
        f"{k_se:g} standard errors of that mean; set and true/false rows must hold on the seed-mean trajectory "
        f"and on every seed",
    ]
    if len(sel) > 1:
        notes.append(f"the seeds selected different sets ({', '.join(sel)}): their mean mixes them")
    kept = [n for n in mean_rep.notes if not n.startswith("checks computed in")]
    notes += kept + [f"checks computed in {time.perf_counter() - t0:.1f} s ({R + 1} reports: the seed mean and every seed)"]
    return dataclasses.replace(mean_rep, rows=rows, run=run, notes=notes)
