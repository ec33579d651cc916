"""Phase diagrams: where the paper's Stage I criterion and gflow's finite-size
laws pick the same set, over a grid of one or two configuration fields
(docs/theory/mathematics.md §M8.2).

``gflow phase [CONFIG] --param init.w_plus=log:1:10:10 --param data.L=lin:20:200:10
--out DIR`` evaluates, at every point of the grid (the cross product of the
fields' values, built and validated by :func:`gflow.runs.sweep_points`
before anything is computed — one code path with ``gflow sweep``):

- **the paper's criterion** (docs/theory/mathematics.md §M6.1): the Ĩ ranking over the prior
  (``n_pi`` kernels), ``S_star = argmax Ĩ``, its gap to the runner-up and the
  paired SE of the gap; ``Itilde_uncertain`` when the top two are within 3
  paired SE (or tie);
- **the finite-size Stage I law** (docs/theory/mathematics.md §M6.2): ``J(S)`` on the run's own
  sample at the run's initial ``w``, ``argmax_J``, its gap and paired SE,
  ``J_uncertain`` (within 3 paired SE); ``rankings_agree`` (``S_star ==
  argmax_J``); the predicted Stage I duration ``stage1_duration`` (the
  linearised Stage I solved exactly,
  :func:`gflow.theory.predicted_stage1_duration`; docs/theory/mathematics.md §M8.1);
- **the selected set's Stage III law** (docs/theory/mathematics.md §M6.4, §M6.5): theory-only, the
  selected set is predicted to be ``argmax_J`` (the flow's Stage I follows J,
  not Ĩ), and ``C_star``, the window, ``a_star`` and ``limit_loss`` are the
  GIH's of that set; when it differs from ``S_star`` the GIH of ``S_star``
  (``a_star_S_star``, ``limit_loss_S_star``) is given beside it, as "what
  the paper's S* would give".

These are exactly the numbers of ``gflow theory`` for the point's
configuration (the same functions on the same sample; the test compares them
with ``==``). Nothing is integrated unless ``--flow``; then every point is
also an ordinary run folder ``DIR/runs/<k>_<field=value>…`` (integrated and
checked by :func:`gflow.runs._sweep.run_point`, as in ``gflow sweep``) and the row
adds the selected set, the Stage I and II event times, ``a`` and the loss at
the end, the check report's verdicts and, for the joint schedule, the time at
which the loss has fallen halfway from its initial to its final value.

**Cost.** Points that share the data's prior and the model reuse one Ĩ
ranking; points that share the sample (data, model, estimator) reuse one
sample and one Stage III law per set; the initialisation (``w₊``, ``w₋``,
``c₀``, ``a₀``) enters as arrays, so such points reuse one compilation and
pay only ``J``. Points that differ only in ``L`` or ``burn_in`` take their
samples from one chain drawn for the longest of them (:mod:`gflow.runs._samples`:
the same samples bit for bit, one compilation); a new ``α`` compiles only the
sampler's kernels (a traced ``α`` would change them in their last bits); ``d``
and the parents change the shapes.

**Outputs** in DIR: ``points/<k>.json`` (one per finished point: what makes
a grid resumable — an interrupted grid recomputes only the missing points,
and its ``phase.csv`` is byte for byte the uninterrupted one's; wall times
are kept out of the CSV for that reason), ``phase.csv`` (one row per point in
grid order, the last field varying fastest), ``phase.json`` (the grid's
definition and every point's results) and, with ``plot``, ``figures/phase_map.png``
(the winning set under Ĩ, under J and, with flows, under the flow; uncertain
points hatched grey, not drawn as a phase; points where Ĩ and J disagree
marked ×, where the flow disagrees with J marked ○) and
``figures/phase_heat.png`` (a*, C*, the predicted Stage I duration and, with
flows, the measured Stage I and II durations).

**Shards.** ``shard=(k, n)`` computes the points ``k-1, k-1+n, k-1+2n, …``
(1-based k) into the same layout (``points/``), writes
``phase.shard<k>of<n>.csv`` instead of ``phase.csv``, and no figures;
:func:`merge_shards` (``gflow phase-merge DIR… --out DIR``) joins finished
shards — in one shared folder or several — into one ``phase.csv``,
``phase.json`` and the figures.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .._util import atomic_write_text, format_cell, write_csv
from ..config import Config, from_dict
from ..core import init_params, member_of, subset_label
from ..figures import phase_row, plot_phase
from ..theory import (
    TIE_RTOL,
    make_gih,
    modified_chi2_ranking,
    predicted_stage1_duration,
    ranking_of_sets,
    stage1_rates,
    stage3_law,
)
from ..trajectory import selected_set
from ._executor import (
    GridIncomplete,
    check_executor,
    folder_files,
    open_executor,
    put_folder_files,
    run_points,
    scratch_folder,
)
from ._folder import STALE_FILES, lock
from ._samples import SampleBank, worker_bank
from ._sweep import headline, point_dirname, run_point, show_value, sweep_points

__all__ = [
    "FLOW_COLUMNS",
    "THEORY_COLUMNS",
    "PhaseResult",
    "merge_shards",
    "phase_grid",
    "phase_task",
    "plot_phase",
    "point_theory",
    "run_phase",
]

THEORY_COLUMNS = (
    "S_star", "Itilde_gap", "Itilde_gap_se", "Itilde_uncertain",
    "argmax_J", "J_gap", "J_gap_se", "J_uncertain", "rankings_agree", "stage1_duration",
    "C_star", "window_lo", "window_hi", "a_star", "limit_loss", "a_star_S_star", "limit_loss_S_star",
    "S_chi2", "S_mi",
)  # fmt: skip
FLOW_COLUMNS = (
    "status", "selected", "t_event_I", "t_event_II", "a_end", "loss_end", "t_half_loss",
    "verdict_gflow", "verdict_paper", "checks_failed",
)  # fmt: skip

# Samples kept between points (a grid with L varying fastest revisits each
# sample once per value of the slow field); ~20 MB each at N = 10⁴, d = 3.
_SAMPLES_KEPT = 12
# Two rankings' top two within this many paired SEs: uncertain (docs/theory/mathematics.md §M6.1).
_UNCERTAIN_SE = 3.0


# ---------------------------------------------------------------------------
# The grid
# ---------------------------------------------------------------------------


def phase_grid(config: Config, params) -> tuple[list[str], list[tuple[dict[str, Any], Config]]]:
    """The grid of a phase diagram: one or two fields (``--param`` strings such
    as ``init.w_plus=log:1:10:10``, ``data.parents=[1,2];[1,3]``, or
    ``(field, values)`` pairs), validated and built by
    :func:`gflow.runs.sweep_points` (every point's configuration before any
    computation). **Returns** ``(fields, [(point, config)])``, the last field
    varying fastest. **Raises** ``ValueError`` naming the field or value."""
    if isinstance(params, (str, tuple)):
        params = [params]
    if isinstance(params, dict):
        params = list(params.items())
    if not 1 <= len(params) <= 2:
        raise ValueError(f"a phase diagram takes one or two --param fields, got {len(params)}")
    points = sweep_points(config, params)
    return list(points[0][0]), points


# ---------------------------------------------------------------------------
# Theory at one point
# ---------------------------------------------------------------------------


def _key(*parts) -> str:
    return json.dumps(parts, sort_keys=True, default=str)


def _sample_key(cfg: Config) -> str:
    dd = cfg.to_dict()
    return _key(dd["data"], dd["model"], dd["estimator"])


class _Cache:
    """What points share: Ĩ rankings (by prior and 𝒮), samples (by data,
    model and estimator; the last ``_SAMPLES_KEPT`` used) and Stage III laws
    (by sample and set)."""

    def __init__(self, bank: SampleBank | None = None):
        self.ranking: dict[str, Any] = {}
        self.loss: OrderedDict[str, Any] = OrderedDict()
        self.law: dict[str, Any] = {}
        self.bank = SampleBank() if bank is None else bank  # the samples, from chains shared over L and burn_in


def _f(x) -> float | None:
    """A JSON-safe float (``None`` for ``None`` and non-finite values), as in ``theory.json``."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _law_numbers(law) -> dict[str, Any]:
    return {
        "C_star": _f(law.C_star),
        "window_lo": _f(law.window[0]),
        "window_hi": _f(law.window[1]),
        "a_star": _f(law.a_star),
        "limit_loss": _f(law.limit_loss),
    }


def point_theory(cfg: Config, *, n_pi: int = 2000, pi_seed: int = 0, cache: _Cache | None = None) -> dict[str, Any]:
    """The theory columns (:data:`THEORY_COLUMNS`) of one configuration.

    The same computations as :func:`gflow.theory.theory_report` (so the same
    numbers as ``gflow theory``): the Ĩ ranking over `n_pi` kernels (key
    ``jax.random.key(pi_seed)``), ``J`` on ``make_loss(data, model,
    estimator)`` at the initial ``w``, the linearised Stage I's duration
    (:func:`gflow.theory.predicted_stage1_duration` with the schedule's
    ``eta_C`` and ``delta``), and the Stage III law
    (``stage3_law(make_gih(loss, S))``, default grid) of ``S = argmax J`` —
    the set the flow's Stage I is predicted to select at finite size — and,
    when different, of ``S_star``. Uncertain: the top two within 3 paired SE,
    or tied to relative 1e-9. `cache` shares rankings, samples and laws
    between points (results unchanged).
    """
    import jax

    cache = cache or _Cache()
    dd = cfg.to_dict()
    sets = cfg.model.subsets
    prior = {k: v for k, v in dd["data"].items() if k in ("d", "parents", "alpha", "kernel", "prior")}
    member = member_of(cfg.model)
    reads = tuple(member.set_offsets(S) or () for S in sets)  # a member's sets through the offsets they read
    rk = _key(prior, reads, n_pi, pi_seed)
    if rk not in cache.ranking:
        cache.ranking[rk] = modified_chi2_ranking(cfg.data, tuple(dict.fromkeys(reads)), n_pi=n_pi,
                                                  key=jax.random.key(pi_seed))  # fmt: skip
    rank = ranking_of_sets(cache.ranking[rk], sets, reads)

    lk = _sample_key(cfg)
    if lk not in cache.loss:
        while len(cache.loss) >= _SAMPLES_KEPT:
            cache.loss.popitem(last=False)
        cache.loss[lk] = cache.bank.loss(cfg)  # make_loss(cfg.data, cfg.model, cfg.estimator), bit for bit
    loss = cache.loss[lk]
    cache.loss.move_to_end(lk)

    params = init_params(cfg.model, cfg.init, d=cfg.data.d, L=cfg.data.L)
    rates = stage1_rates(loss, params.first_layer)
    J = np.asarray(rates.J)
    iJ, jJ, J_gap, J_gap_se = rates.top_two()
    if jJ is not None:
        tie = J_gap <= TIE_RTOL * max(abs(J[iJ]), abs(J[jJ]), 1e-300)
        J_unc = bool(tie or J_gap <= _UNCERTAIN_SE * J_gap_se)
    else:
        J_unc = False
    S_J = sets[iJ]

    def law_of(S):
        k = _key(lk, S)
        if k not in cache.law:
            cache.law[k] = _law_numbers(stage3_law(make_gih(loss, member.set_offsets(S) or ())))
        return cache.law[k]

    law = law_of(S_J)
    star = law if S_J == rank.S_star else law_of(rank.S_star)
    sch = cfg.schedule
    C0 = np.asarray(params.C, np.float64)
    dur = predicted_stage1_duration(J, C0**2, float(cfg.init.a0), sch.delta, eta_C=sch.eta_C, sets=sets).t
    return {
        "S_star": subset_label(rank.S_star),
        "Itilde_gap": _f(rank.gap),
        "Itilde_gap_se": _f(rank.gap_se),
        "Itilde_uncertain": bool(rank.close_call),
        "argmax_J": subset_label(S_J),
        "J_gap": _f(J_gap),
        "J_gap_se": _f(J_gap_se),
        "J_uncertain": J_unc,
        "rankings_agree": S_J == rank.S_star,
        "stage1_duration": _f(dur),
        **law,
        "a_star_S_star": star["a_star"],
        "limit_loss_S_star": star["limit_loss"],
        "S_chi2": subset_label(rank.S_chi2),
        "S_mi": None if rank.S_mi is None else subset_label(rank.S_mi),
    }


# ---------------------------------------------------------------------------
# The flow at one point
# ---------------------------------------------------------------------------


def _half_loss_time(ts, loss) -> float | None:
    """First time at which the loss has fallen to ``(L(t₀) + L(t_end))/2``,
    linearly interpolated between saved times (``None`` if it never has)."""
    ts, loss = np.asarray(ts, np.float64), np.asarray(loss, np.float64)
    if ts.size < 2 or not np.all(np.isfinite(loss[[0, -1]])):
        return None
    half = 0.5 * (loss[0] + loss[-1])
    idx = np.flatnonzero(loss <= half)
    if idx.size == 0:
        return None
    k = int(idx[0])
    if k == 0:
        return float(ts[0])
    t0, t1, l0, l1 = ts[k - 1], ts[k], loss[k - 1], loss[k]
    return float(t0 + (t1 - t0) * (l0 - half) / (l0 - l1)) if l0 != l1 else float(t1)


def point_flow(traj, report: dict | None) -> dict[str, Any]:
    """The flow columns (:data:`FLOW_COLUMNS`) of an integrated point: the set
    Stage I selected (:func:`gflow.trajectory.selected_set`), the Stage I and II
    durations when they ended at their events, ``a`` and the loss at the end
    (:func:`gflow.runs._sweep.headline`), the joint schedule's half-loss time, and
    the check report's ``verdict.gflow`` and ``verdict.paper``."""
    h = headline(traj, report)
    ev = {st.name: (st.t1 - st.t0 if st.ended_by == "event" else None) for st in traj.stages}
    joint = any(st.name == "joint" for st in traj.stages)
    v = (report or {}).get("verdict") or {}
    S = selected_set(traj)
    return {
        "status": traj.status,
        "selected": None if S is None else subset_label(S),
        "t_event_I": ev.get("I"),
        "t_event_II": ev.get("II"),
        "a_end": h["a_end"],
        "loss_end": h["loss_end"],
        "t_half_loss": _half_loss_time(traj.ts, traj.loss) if joint else None,
        "verdict_gflow": v.get("gflow"),
        "verdict_paper": v.get("paper"),
        "checks_failed": h["checks_failed"],
    }


def point_record(k: int, point: dict, cfg: Config, *, flow: bool, n_pi: int, pi_seed: int, overwrite: bool,
                 cache: _Cache, run_dir: Path) -> dict[str, Any]:  # fmt: skip
    """The record of grid point `k` (``points/<k>.json``): its theory columns and, with `flow`,
    its run integrated and checked in `run_dir` (resumed there unless `overwrite`) and its flow
    columns; ``wall_s``."""
    tp = time.perf_counter()
    theory = point_theory(cfg, n_pi=n_pi, pi_seed=pi_seed, cache=cache)
    rec = {"index": k, "point": point, "theory": theory}
    if flow:
        traj, report = run_point(cfg, run_dir, check=True, check_kwargs={"n_pi": n_pi, "pi_seed": pi_seed},
                                 resume=not overwrite, overwrite=overwrite, loss=cache.loss[_sample_key(cfg)])  # fmt: skip
        rec["flow"] = point_flow(traj, report)
    rec["wall_s"] = time.perf_counter() - tp
    return rec


# What the points computed by one worker process share (as one serial run's points do); a
# worker running several tasks at once in threads runs them one at a time here.
_WORKER_CACHE = _Cache()
_WORKER_LOCK = threading.Lock()


def phase_task(payload: dict[str, Any]) -> dict[str, Any]:
    """One grid point in a worker (:mod:`gflow.runs._executor`): `payload` holds the point's
    ``index``, ``point``, ``config`` (``Config.to_dict()``), ``flow``, ``n_pi``, ``pi_seed``,
    ``overwrite`` and ``files`` (its run folder's, to resume). The run is computed in a scratch
    folder; **returns** ``{"rec": …, "files": …}`` (the record and, with ``flow``, the run
    folder's files) for the coordinator to write."""
    cfg = from_dict(payload["config"])
    with _WORKER_LOCK, scratch_folder(payload["files"]) as d:
        _WORKER_CACHE.bank = worker_bank(cfg, payload["steps"])
        rec = point_record(payload["index"], payload["point"], cfg, flow=payload["flow"], n_pi=payload["n_pi"],
                           pi_seed=payload["pi_seed"], overwrite=payload["overwrite"], cache=_WORKER_CACHE,
                           run_dir=d)  # fmt: skip
        return {"rec": rec, "files": folder_files(d) if payload["flow"] else None}


# ---------------------------------------------------------------------------
# The grid run
# ---------------------------------------------------------------------------


class PhaseResult:
    """A phase grid: `fields`, `rows` (one dict per finished point in grid
    order: ``index``, the fields' values, the theory and flow columns), `out`,
    `csv` (its path), `complete` (every point of the grid — of this shard —
    is done), `wall` (s) and `point_walls` (s per point computed in this call)."""

    def __init__(self, fields, rows, out, csv_path, complete, wall, point_walls):
        self.fields, self.rows, self.out, self.csv = fields, rows, out, csv_path
        self.complete, self.wall, self.point_walls = complete, wall, point_walls

    def table(self) -> str:
        cols = ["index", *self.fields, "S_star", "argmax_J", "stage1_duration", "C_star", "a_star", "limit_loss"]
        if self.rows and "selected" in self.rows[0]:
            cols += ["selected", "t_event_I", "a_end", "verdict_gflow", "verdict_paper"]
        body = [[format_cell(r.get(c)) for c in cols] for r in self.rows]
        for b, r in zip(body, self.rows):
            b[cols.index("S_star")] += "?" if r.get("Itilde_uncertain") else ""
            b[cols.index("argmax_J")] += "?" if r.get("J_uncertain") else ""
        w = [max(len(c), *(len(b[k]) for b in body)) if body else len(c) for k, c in enumerate(cols)]
        line = lambda cells: "  ".join(x.ljust(n) for x, n in zip(cells, w)).rstrip()
        return "\n".join([line(cols), line(["-" * n for n in w])] + [line(b) for b in body])


def _definition(config: Config, fields, points, *, flow: bool, n_pi: int, pi_seed: int) -> dict:
    return {
        "fields": fields,
        "values": [list(dict.fromkeys(show_value(p[f]) for p, _ in points)) for f in fields],
        "base_config": config.to_dict(),
        "flow": bool(flow),
        "n_pi": int(n_pi),
        "pi_seed": int(pi_seed),
        "points": [{"index": k, **p} for k, (p, _) in enumerate(points)],
    }


def _columns(fields, flow: bool) -> list[str]:
    return ["index", *fields, *THEORY_COLUMNS, *(FLOW_COLUMNS if flow else ())]


def _write_csv(path: Path, fields, rows, flow: bool) -> None:
    cols = _columns(fields, flow)
    write_csv(path, cols, ([format_cell(r.get(c), full=True) for c in cols] for r in rows), lineterminator="\n")


def _parse_shard(shard) -> tuple[int, int] | None:
    if shard is None:
        return None
    if isinstance(shard, str):
        try:
            k, n = (int(x) for x in shard.split("/"))
        except ValueError:
            raise ValueError(f"--shard must be k/n with integers 1 <= k <= n, got {shard!r}") from None
    else:
        k, n = shard
    if not (isinstance(k, int) and isinstance(n, int) and 1 <= k <= n):
        raise ValueError(f"--shard must be k/n with integers 1 <= k <= n, got {k}/{n}")
    return k, n


def _load_points(dirs) -> dict[int, dict]:
    done: dict[int, dict] = {}
    for d in dirs:
        pdir = Path(d) / "points"
        if not pdir.is_dir():
            continue
        for f in sorted(pdir.glob("*.json")):
            try:
                rec = json.loads(f.read_text())
            except (json.JSONDecodeError, OSError):
                continue  # a point interrupted while being written: computed again
            done.setdefault(int(rec["index"]), rec)
    return done


def run_phase(
    config: Config,
    params,
    out: str | Path,
    *,
    flow: bool = False,
    shard=None,
    n_pi: int = 2000,
    pi_seed: int = 0,
    plot: bool = True,
    overwrite: bool = False,
    verbose: bool = False,
    on_point: Callable[[int], None] | None = None,
    executor=None,
) -> PhaseResult:
    """Compute a phase grid into `out` (see the module docstring for the
    columns and files).

    **Arguments:** `config` the base configuration; `params` one or two fields
    (:func:`phase_grid`); `flow` also integrate and check every point; `shard`
    ``"k/n"`` or ``(k, n)``: only the k-th of n disjoint subsets of the points
    (:func:`merge_shards` joins them); `n_pi`, `pi_seed` the Ĩ average's kernels
    (as ``gflow theory --n-pi``); `plot` draw the figures when the grid is
    complete (never for a shard); `overwrite` discard the points already in
    `out` (otherwise they are kept and only the missing ones computed — an
    interrupted grid resumes; a folder holding a different grid is an error);
    `on_point(k)` is called after point k is saved (progress hooks; tests use
    it to interrupt a grid); `executor` where the points run (:mod:`gflow.runs._executor`:
    ``None``/``"serial"`` this process, ``"processes:N"``, ``"dask-local:N"``,
    ``"dask:ADDRESS"``, or any object with ``submit``): the same files and numbers, only this
    process writes `out`.

    Everything is validated before anything is computed. **Raises**
    :class:`~gflow.runs.GridIncomplete` (everything else written) when points were lost with
    their workers.
    """
    fields, points = phase_grid(config, params)
    sh = _parse_shard(shard)
    check_executor(executor)
    if int(n_pi) < 1:
        raise ValueError(f"n_pi must be a positive integer, got {n_pi!r}")
    out = Path(out)
    defn = _definition(config, fields, points, flow=flow, n_pi=n_pi, pi_seed=pi_seed)
    jpath = out / "phase.json"
    if jpath.is_file() and not overwrite:
        try:
            old = json.loads(jpath.read_text())
        except json.JSONDecodeError:
            old = None
        if old is not None and {k: old.get(k) for k in defn} != json.loads(json.dumps(defn, default=str)):
            raise ValueError(
                f"{out} holds a different phase grid (phase.json): choose another --out, or --overwrite to discard it"
            )
    mine = [k for k in range(len(points)) if sh is None or k % sh[1] == sh[0] - 1]
    out.mkdir(parents=True, exist_ok=True)
    (out / "points").mkdir(exist_ok=True)
    if overwrite:
        for f in (out / "points").glob("*.json"):
            f.unlink()
    atomic_write_text(jpath, json.dumps(defn, indent=1, default=str))
    done = _load_points([out])
    csv_path = out / ("phase.csv" if sh is None else f"phase.shard{sh[0]}of{sh[1]}.csv")
    t0 = time.perf_counter()
    walls = []
    todo = [k for k in mine if k not in done]
    cache = _Cache(SampleBank([points[k][1] for k in todo]))
    if verbose:
        print(f"{len(points)} points ({len(mine)} in this shard), {len(mine) - len(todo)} already done",
              flush=True)  # fmt: skip
    run_dirs = {k: out / "runs" / point_dirname(k, points[k][0]) for k in todo}

    def accept(k, res):
        point = points[k][0]
        rec, files = res["rec"], res.get("files")
        if files is not None:  # computed in a worker: this process writes its run folder
            with lock(run_dirs[k]):
                put_folder_files(run_dirs[k], files, replace=STALE_FILES if overwrite else ())
        walls.append(rec["wall_s"])
        atomic_write_text(out / "points" / f"{k:05d}.json", json.dumps(rec, indent=1, default=str))
        done[k] = rec
        rows = [phase_row(done[j]) for j in mine if j in done]
        _write_csv(csv_path, fields, rows, flow)
        if verbose:
            where = ", ".join(f"{f}={show_value(v)}" for f, v in point.items())
            fl = f", flow selected {rec['flow']['selected']}" if flow else ""
            print(f"point {k + 1}/{len(points)} ({where}): S* {rec['theory']['S_star']}, argmax J "
                  f"{rec['theory']['argmax_J']}{fl}, {rec['wall_s']:.2f} s", flush=True)  # fmt: skip
        if on_point is not None:
            on_point(k)

    with open_executor(executor) as engine:
        if engine is None:  # this process: the points share one cache, the runs are written in place
            def task(k):
                rec = point_record(k, *points[k], flow=flow, n_pi=n_pi, pi_seed=pi_seed, overwrite=overwrite,
                                   cache=cache, run_dir=run_dirs[k])  # fmt: skip
                return {"rec": rec}
            lost = run_points(None, task, [(k, k) for k in todo], accept)
        else:
            tasks = [(k, {"index": k, "point": points[k][0], "config": points[k][1].to_dict(), "flow": flow,
                          "n_pi": n_pi, "pi_seed": pi_seed, "overwrite": overwrite,
                          "steps": cache.bank.steps_for(points[k][1]),
                          "files": folder_files(run_dirs[k]) if flow and not overwrite else {}})
                     for k in todo]  # fmt: skip
            lost = run_points(engine, phase_task, tasks, accept, verbose=verbose)
    if lost:
        rows = [phase_row(done[j]) for j in mine if j in done]
        _write_csv(csv_path, fields, rows, flow)
        res = PhaseResult(fields, rows, out, csv_path, False, time.perf_counter() - t0, walls)
        raise GridIncomplete(f"phase grid {out}", lost, res, "run the same command again to compute them")
    rows = [phase_row(done[j]) for j in mine]
    _write_csv(csv_path, fields, rows, flow)
    if sh is None:
        _write_results(out, defn, [done[j] for j in mine])
        if plot:
            plot_phase(out)
    return PhaseResult(fields, rows, out, csv_path, True, time.perf_counter() - t0, walls)


def _write_results(out: Path, defn: dict, recs: list[dict]) -> None:
    body = {**defn, "results": [{k: v for k, v in r.items() if k != "wall_s"} for r in recs],
            "wall_s": [r.get("wall_s") for r in recs]}  # fmt: skip
    atomic_write_text(out / "phase.json", json.dumps(body, indent=1, default=str))


def merge_shards(dirs, out: str | Path, *, plot: bool = True) -> PhaseResult:
    """Join the finished shards of one grid (folders written by
    :func:`run_phase` with ``shard``; one shared folder or several) into
    ``out/phase.csv``, ``out/phase.json`` and the figures. **Raises**
    ``ValueError`` when the folders hold different grids or points are
    missing (naming them)."""
    dirs = [Path(d) for d in dirs]
    if not dirs:
        raise ValueError("phase-merge needs at least one shard folder")
    defn = None
    for d in dirs:
        j = d / "phase.json"
        if not j.is_file():
            raise FileNotFoundError(f"{d} holds no phase grid (no phase.json)")
        dj = json.loads(j.read_text())
        dj = {k: v for k, v in dj.items() if k not in ("results", "wall_s")}
        if defn is None:
            defn = dj
        elif dj != defn:
            raise ValueError(f"{d} holds a different phase grid from {dirs[0]}: shards of one grid only")
    done = _load_points(dirs)
    n = len(defn["points"])
    missing = [k for k in range(n) if k not in done]
    if missing:
        raise ValueError(
            f"{len(missing)} of {n} points are not done yet (indices {missing[:10]}{' …' if len(missing) > 10 else ''}): "
            "run (or resume) their shards first"
        )
    out = Path(out)
    (out / "points").mkdir(parents=True, exist_ok=True)
    recs = [done[k] for k in range(n)]
    for r in recs:
        p = out / "points" / f"{r['index']:05d}.json"
        if not p.is_file():
            atomic_write_text(p, json.dumps(r, indent=1, default=str))
    fields, flow = defn["fields"], defn["flow"]
    rows = [phase_row(r) for r in recs]
    _write_csv(out / "phase.csv", fields, rows, flow)
    _write_results(out, defn, recs)
    if plot:
        plot_phase(out)
    return PhaseResult(fields, rows, out, out / "phase.csv", True, 0.0, [])


# ---------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------
