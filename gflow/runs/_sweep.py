"""Parameter sweeps: one run per point of a cross product of configuration values.

``gflow sweep CONFIG --param data.L=50,100,200 --param estimator.N=1000,10000
--out DIR`` runs every combination (here 3 × 2 = 6 points) of the base
configuration with those fields changed, each into its own ordinary run
folder ``DIR/<k>_<field=value>…`` (``gflow check`` and ``gflow plot`` work
on each), checks it, and writes a table of the headline numbers of every
point, ``DIR/sweep.csv`` (and ``DIR/sweep.json`` with the sweep's
definition).

**Fields and values.** A field is ``section.key`` of the TOML configuration
(any of them: ``data.L``, ``estimator.N``, ``schedule.durations``,
``solver.method``, …). Values are comma-separated TOML values:
``data.L=50,100``, ``data.parents=[1],[1,2]`` (commas inside brackets or
quotes do not split), ``schedule.events=true,false``; a value that is not
valid TOML is taken as a string (``solver.method=tsit5,kvaerno5``). Every
field name is checked, and every point's configuration is built, before any
run starts: a bad field or value is a ``ValueError`` naming it, and nothing
is run.

**Headline columns** (:data:`COLUMNS`): the point's values; the run's
status and wall time; the theory's predictions — ``S_star`` (argmax of the
modified χ²-MI, §6.1), ``C_star``, the validity window ``window_lo``,
``window_hi`` and ``a_star`` (§6.4), ``limit_loss`` (inf L_GIH, §6.5) — next
to what the run measured: ``S_measured`` (argmax c/Σc at the end of Stage I,
or of the run for the joint schedule), ``slope`` (least squares of a against
log τ in Stage III over the saved times with a in the window and past its
plateau, a ≥ a₀ + log 2, as the check report's slope row; the paper predicts 1), ``a_end``, ``loss_end`` and its standard error; and the check
report's verdict (``checks_passed``, ``checks_failed``). ``wall_s`` is the
run's own wall time: points run one after another in one process, so the
first point of a shape pays its compilation and the later ones reuse it
(the seed, ε, the initialisation or, with the counts layout, ``data.L``
leave the flow's shapes unchanged; ``estimator.N`` changes them). The theory columns
come from the check report (:func:`gflow.check_run`, which also writes
``report.json`` into each run folder); with ``check=False`` they are empty
and only the measured columns are filled.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re
import time
import tomllib
from pathlib import Path
from typing import Any

import numpy as np

from .._util import atomic_write_text, format_cell, log_slope, rows_of_stage, show_value, write_csv
from ..config import Config, did_you_mean, from_dict
from ..core import subset_label
from ..dynamics import FlowError
from ..trajectory import Trajectory
from ._executor import (
    GridIncomplete,
    check_executor,
    folder_files,
    open_executor,
    put_folder_files,
    run_points,
    scratch_folder,
)
from ._folder import STALE_FILES, check_run, integrate, lock
from ._samples import SampleBank, worker_bank

__all__ = ["COLUMNS", "SweepResult", "headline", "parse_param", "run_point", "run_sweep", "sweep_points", "sweep_task"]

COLUMNS = (
    "status", "wall_s", "S_star", "S_measured", "C_star", "window_lo", "window_hi", "a_star", "a_end", "slope",
    "slope_points", "limit_loss", "loss_end", "loss_end_se", "checks_passed", "checks_failed",
)  # fmt: skip


# ---------------------------------------------------------------------------
# Parsing and validation
# ---------------------------------------------------------------------------


def _split_top(s: str) -> list[str]:
    """Split at commas and semicolons outside brackets, braces and quotes."""
    parts, depth, quote, cur = [], 0, None, []
    for ch in s:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = None
            continue
        if ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch in ",;" and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    parts.append("".join(cur).strip())
    return parts


def _value(tok: str) -> Any:
    try:
        return tomllib.loads(f"v = {tok}")["v"]
    except tomllib.TOMLDecodeError:
        return tok


_RANGE = re.compile(r"\s*(lin|log):([^:]+):([^:]+):([^:]+)\s*")


def _range(spec: str, field: str, kind: str, a: str, b: str, n: str) -> list[float]:
    """``lin:a:b:n`` (``numpy.linspace``) or ``log:a:b:n`` (``numpy.geomspace``)."""
    try:
        lo, hi, num = float(a), float(b), int(n)
    except ValueError:
        raise ValueError(
            f"--param {spec!r}: {field} range {kind}:{a}:{b}:{n} needs two numbers and a point count "
            f"(e.g. {kind}:1:10:5)"
        ) from None
    if num < 1 or not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"--param {spec!r}: {field} range needs finite ends and n >= 1 points, got {a}, {b}, {n}")
    if kind == "log":
        if lo <= 0 or hi <= 0:
            raise ValueError(f"--param {spec!r}: {field} log range needs ends > 0, got {a}, {b}")
        return [float(x) for x in np.geomspace(lo, hi, num)]
    return [float(x) for x in np.linspace(lo, hi, num)]


def parse_param(spec: str) -> tuple[str, list[Any]]:
    """``"data.L=50,100,200"`` → ``("data.L", [50, 100, 200])`` (values parsed
    as TOML, strings otherwise; separated by commas or semicolons outside
    brackets, e.g. ``data.parents=[1,2];[1,3]``). A numeric range is
    ``lin:a:b:n`` (``n`` evenly spaced values from ``a`` to ``b``) or
    ``log:a:b:n`` (``n`` log-spaced values, ``a, b > 0``); on an integer
    field (``data.L``) every value of a range must be an integer (checked in
    :func:`sweep_points`). Only the syntax is checked here; see
    :func:`sweep_points` for the field itself."""
    if "=" not in spec:
        raise ValueError(f"--param {spec!r}: expected section.key=value[,value…], e.g. data.L=50,100")
    field, _, vals = spec.partition("=")
    field = field.strip()
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*", field):
        raise ValueError(f"--param {spec!r}: the field must be section.key (e.g. data.L), got {field!r}")
    m = _RANGE.fullmatch(vals)
    if m:
        return field, _range(spec, field, *m.groups())
    toks = _split_top(vals)
    if any(t == "" for t in toks):
        raise ValueError(f"--param {spec!r}: empty value (values are comma-separated, e.g. data.L=50,100)")
    return field, [_value(t) for t in toks]


def _check_field(config: Config, field: str) -> tuple[str, str]:
    d = config.to_dict()
    sec, _, key = field.partition(".")
    if sec not in d:
        raise ValueError(f"unknown config field {field!r}: no section [{sec}]{did_you_mean(sec, d)}; "
                         f"sections: {sorted(d)}")  # fmt: skip
    if key not in d[sec]:
        raise ValueError(f"unknown config field {field!r}: [{sec}] has no key {key!r}{did_you_mean(key, d[sec], sec)}; "
                         f"keys of [{sec}]: {list(d[sec])}")  # fmt: skip
    return sec, key


def _as_field_type(config: Config, field: str, vals: list) -> list:
    """Integral floats (``40.0`` from ``lin:20:200:10``) become ints on an
    integer field; a non-integral one is an error naming the field."""
    sec, key = field.split(".")
    default = config.to_dict()[sec][key]
    if not isinstance(default, int) or isinstance(default, bool):
        return vals
    out = []
    for v in vals:
        if isinstance(v, float):
            if not (math.isfinite(v) and abs(v - round(v)) <= 1e-9 * max(1.0, abs(v))):
                raise ValueError(
                    f"config field {field!r} takes integers; the value {v!r} is not one "
                    "(give a list, or a lin:a:b:n range with integer steps)"
                )
            v = round(v)
        out.append(v)
    return out


def sweep_points(config: Config, params) -> list[tuple[dict[str, Any], Config]]:
    """The cross product of `params` applied to `config`.

    `params`: a list of ``(field, values)`` pairs (or a dict, or ``--param``
    strings), ``field`` = ``"section.key"``. The last field varies fastest.

    **Returns:** ``[(point, config)]`` with ``point = {field: value}``.

    **Raises:** ``ValueError`` naming the field for an unknown field, a field
    given twice, no values, or a value the configuration rejects — all
    before anything runs.
    """
    if isinstance(params, dict):
        params = list(params.items())
    pairs = []
    for p in params:
        field, vals = parse_param(p) if isinstance(p, str) else (p[0], list(p[1]))
        _check_field(config, field)
        if any(field == f for f, _ in pairs):
            raise ValueError(f"config field {field!r} is swept twice; give all its values in one --param")
        if not vals:
            raise ValueError(f"config field {field!r}: no values to sweep")
        pairs.append((field, _as_field_type(config, field, vals)))
    if not pairs:
        raise ValueError("a sweep needs at least one --param section.key=value[,value…]")
    points = []
    for combo in itertools.product(*[v for _, v in pairs]):
        point = {f: v for (f, _), v in zip(pairs, combo)}
        sections: dict[str, dict] = {}
        for f, v in point.items():
            sec, key = f.split(".")
            sections.setdefault(sec, {})[key] = v
        try:
            cfg = config.replace(**sections)
        except ValueError as e:
            where = ", ".join(f"{f}={show_value(v)}" for f, v in point.items())
            raise ValueError(f"sweep point {where}: {e}") from None
        points.append((point, cfg))
    return points


def point_dirname(k: int, point: dict) -> str:
    body = "_".join(f"{f}={show_value(v)}" for f, v in point.items())
    body = re.sub(r"[^A-Za-z0-9._=+,\-\[\]]", "-", body)
    return f"{k:03d}_{body}"[:200]


# ---------------------------------------------------------------------------
# Headline numbers
# ---------------------------------------------------------------------------


def headline(traj: Trajectory, report: dict | None = None) -> dict[str, Any]:
    """The headline numbers of one run (the columns of :data:`COLUMNS`, without
    the point's values); `report` is its check report's JSON dict
    (``report.json``), which supplies the theory's predictions."""
    th = (report or {}).get("theory") or {}
    staged = any(st.name == "I" for st in traj.stages)
    rows = rows_of_stage(traj.stage, "I" if staged else "joint")
    S_meas = None
    if rows.size:
        S_meas = subset_label(traj.subsets[int(np.argmax(traj.c_frac[rows[-1]]))])
    win = th.get("window") or [None, None]
    slope, npts = math.nan, 0
    rec3 = next((st for st in traj.stages if st.name in ("III", "joint")), None)
    if rec3 is not None and win[0] is not None and win[1] is not None:
        r3 = rows_of_stage(traj.stage, rec3.name)
        a_start = float(traj.a[int(np.searchsorted(traj.ts, rec3.t0))])  # past the plateau only (log_slope)
        slope, npts = log_slope(traj.ts[r3] - rec3.t0, traj.a[r3], (win[0], win[1]), a_start=a_start)
    verdict = None if report is None else [r.get("passed") for r in report.get("rows", [])]
    return {
        "status": traj.status,
        "wall_s": traj.wall,
        "S_star": th.get("S_star"),
        "S_measured": S_meas,
        "C_star": th.get("C_star"),
        "window_lo": win[0],
        "window_hi": win[1],
        "a_star": th.get("a_star"),
        "a_end": float(traj.a[-1]) if len(traj.ts) else None,
        "slope": slope if npts >= 2 else None,
        "slope_points": npts,
        "limit_loss": th.get("limit_loss"),
        "loss_end": float(traj.loss[-1]) if len(traj.ts) else None,
        "loss_end_se": float(traj.loss_se[-1]) if len(traj.ts) else None,
        "checks_passed": None if verdict is None else sum(v is True for v in verdict),
        "checks_failed": None if verdict is None else sum(v is False for v in verdict),
    }


# ---------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class SweepResult:
    """A sweep: `fields` (the swept ``section.key``), `rows` (one dict per
    point: the point's values, ``dir``, and the :data:`COLUMNS`), `csv` (the
    table's path, or ``None``), `wall` (s)."""

    fields: list[str]
    rows: list[dict[str, Any]]
    csv: Path | None
    wall: float

    @property
    def failed(self) -> list[dict]:
        return [r for r in self.rows if r["status"] != "complete"]

    def table(self) -> str:
        cols = self.fields + ["status", "S_star", "S_measured", "a_star", "a_end", "slope", "window_lo",
                              "window_hi", "limit_loss", "loss_end", "wall_s"]  # fmt: skip
        body = [[format_cell(r.get(c)) for c in cols] for r in self.rows]
        w = [max(len(c), *(len(b[k]) for b in body)) if body else len(c) for k, c in enumerate(cols)]
        line = lambda cells: "  ".join(x.ljust(n) for x, n in zip(cells, w)).rstrip()
        return "\n".join([line(cols), line(["-" * n for n in w])] + [line(b) for b in body])


def run_sweep(
    config: Config,
    params,
    out: str | Path,
    *,
    check: bool = True,
    check_kwargs: dict[str, Any] | None = None,
    resume: bool = False,
    overwrite: bool = False,
    verbose: bool = False,
    executor=None,
) -> SweepResult:
    """Run every point of the sweep into ``out/<k>_<field=value>…`` and write
    ``out/sweep.csv`` (one row per point, the columns of :data:`COLUMNS`
    after the swept fields and the run folder) and ``out/sweep.json``.

    **Arguments:** `config` the base configuration; `params` as in
    :func:`sweep_points`; `out` the sweep's folder; `check` run the check
    report on every point (the theory columns come from it; `check_kwargs`
    go to :func:`gflow.check_run`); `resume` reuse or continue the
    points' run folders that already hold a run (otherwise an existing run
    folder is an error, raised before anything runs); `verbose` progress lines;
    `executor` where the points run (:mod:`gflow.runs._executor`; default this process):
    the same folders and numbers, written by this process only.

    A point whose integration fails is recorded with its status (and its
    partial trajectory's numbers) and the sweep goes on. Points lost with their workers
    raise :class:`~gflow.runs.GridIncomplete` after the others are written (``resume``
    computes them).

    **Returns:** :class:`SweepResult`.
    """
    points = sweep_points(config, params)
    check_executor(executor)
    fields = list(points[0][0])
    out = Path(out)
    dirs = [out / point_dirname(k, p) for k, (p, _) in enumerate(points)]
    if not resume and not overwrite:
        taken = [str(d) for d in dirs if (d / "run.json").exists()]
        if taken:
            raise ValueError(
                f"sweep folders already hold runs ({', '.join(taken[:3])}{', …' if len(taken) > 3 else ''}): "
                "resume them (resume=True, `gflow sweep --resume`) or choose another --out"
            )
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "sweep.json", json.dumps({
        "fields": fields,
        "base_config": config.to_dict(),
        "points": [{"dir": d.name, **{f: p[f] for f in fields}} for d, (p, _) in zip(dirs, points)],
    }, indent=1, default=str))  # fmt: skip
    t0 = time.perf_counter()
    found: dict[int, dict] = {}
    csv_path = out / "sweep.csv"

    def accept(k, res):
        point, d = points[k][0], dirs[k]
        if res.get("files") is not None:  # computed in a worker: this process writes its run folder
            with lock(d):
                put_folder_files(d, res["files"], replace=STALE_FILES if overwrite else ())
        found[k] = row = {**point, "dir": d.name, **res["headline"]}
        # after every point: an interrupted sweep keeps its table
        _write_csv(csv_path, fields, [found[j] for j in sorted(found)])
        if verbose:
            print(f"  {row['status']}: S* {format_cell(row['S_star'])}, measured {format_cell(row['S_measured'])}, "
                  f"a_end {format_cell(row['a_end'])}, loss_end {format_cell(row['loss_end'])}, {format_cell(row['wall_s'])} s",
                  flush=True)  # fmt: skip

    def here(k):
        (point, cfg), d = points[k], dirs[k]
        if verbose:
            print(f"point {k + 1}/{len(points)}: " + ", ".join(f"{f}={show_value(v)}" for f, v in point.items())
                  + f" -> {d}", flush=True)  # fmt: skip
        traj, report = run_point(cfg, d, check=check, check_kwargs=check_kwargs, resume=resume,
                                 overwrite=overwrite, verbose=verbose, loss=bank.loss(cfg))  # fmt: skip
        return {"headline": headline(traj, report)}

    bank = SampleBank([cfg for _, cfg in points])  # points differing in L or burn_in: one chain

    with open_executor(executor) as engine:
        if engine is None:
            lost = run_points(None, here, [(k, k) for k in range(len(points))], accept)
        else:
            tasks = [(k, {"config": cfg.to_dict(), "check": check, "check_kwargs": check_kwargs, "resume": resume,
                          "overwrite": overwrite, "steps": bank.steps_for(cfg),
                          "files": folder_files(d) if resume else {}})
                     for k, ((_, cfg), d) in enumerate(zip(points, dirs))]  # fmt: skip
            lost = run_points(engine, sweep_task, tasks, accept, verbose=verbose)
    rows = [found[k] for k in sorted(found)]
    res = SweepResult(fields=fields, rows=rows, csv=csv_path, wall=time.perf_counter() - t0)
    if lost:
        raise GridIncomplete(f"sweep {out}", lost, res, "run it again with resume (gflow sweep --resume)")
    return res


def sweep_task(payload: dict[str, Any]) -> dict[str, Any]:
    """One sweep point in a worker (:mod:`gflow.runs._executor`): its run integrated and checked
    in a scratch folder (from ``files``, its folder's, when resumed). **Returns** ``{"headline":
    …, "files": …}`` for the coordinator to write."""
    cfg = from_dict(payload["config"])
    with scratch_folder(payload["files"]) as d:
        loss = worker_bank(cfg, payload["steps"]).loss(cfg)
        traj, report = run_point(cfg, d, check=payload["check"], check_kwargs=payload["check_kwargs"],
                                 resume=payload["resume"], overwrite=payload["overwrite"], loss=loss)  # fmt: skip
        return {"headline": headline(traj, report), "files": folder_files(d)}


def run_point(
    cfg: Config,
    d: Path,
    *,
    check: bool = True,
    check_kwargs: dict[str, Any] | None = None,
    resume: bool = False,
    overwrite: bool = False,
    verbose: bool = False,
    loss=None,
) -> tuple[Trajectory, dict | None]:
    """Integrate one point into the run folder `d` (continuing the run saved
    there with `resume`) and, when it completed and `check`, write and return
    its check report's JSON dict. A failed integration returns its partial
    trajectory (status not ``"complete"``) and no report. `loss`: the
    point's estimator, if already built (the same sample the configuration's
    seed gives; integration and check report reuse it). Shared by
    :func:`run_sweep` and :func:`gflow.run_phase`."""
    again = resume and (d / "run.json").exists()
    try:
        traj = integrate(cfg, out=d, resume=again, overwrite=overwrite and not again, verbose=verbose, loss=loss)
    except FlowError as e:
        traj = e.trajectory
        if verbose:
            print(f"  failed: {e}", flush=True)
    report = None
    if check and traj.status == "complete":
        report = check_run(d, loss=loss, **(check_kwargs or {})).to_json()
    return traj, report


def _write_csv(path: Path, fields: list[str], rows: list[dict]) -> None:
    cols = fields + ["dir", *COLUMNS]
    write_csv(path, cols, ([format_cell(r.get(c), full=True) for c in cols] for r in rows))
