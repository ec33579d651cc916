"""Replicates: R independent Monte Carlo samples of one configuration (docs/theory/mathematics.md §M5).

A run of gflow integrates the flow of ``L̂_N``, the loss on one sample of N
sequences drawn once from ``estimator.seed`` (common random numbers). Its
trajectory is a deterministic function of that sample; running the same
configuration on R independent samples measures how much of what a run shows
is Monte Carlo noise of size ``O(N^{-1/2})``. :func:`run_replicates` does
that and reports

- **trajectory bands** (:class:`StageBands`): for every stage and every
  saved time, the mean, standard deviation, standard error of the mean,
  minimum and maximum over the replicates of ``c(t)/Σc``, ``s(t)`` (the
  copier attention), ``a(t)`` and the loss;
- **stage statistics**: each stage's length, how it ended, the selected set;
- **the spread of every check-report row** (:class:`RowSpread`, when
  :mod:`gflow.checks` is run on each replicate): pass/fail counts and the
  mean and spread of the predicted and the measured values.

**Seeds.** Replicate ``r = 0, …, R−1`` is the configuration with
``estimator.seed = base_seed + r`` (``base_seed`` defaults to the
configuration's own seed), so replicate 0 is exactly ``gflow run`` of the
configuration, and the replicates of ``base_seed = 0`` and ``R = 10`` are the
single runs of seeds 0…9. Everything else (data, model, initialisation,
schedule, solver) is shared.

**How they run: in vmapped batches.** The replicates are integrated in
batches of ``batch`` (:func:`gflow.integrate_batch`): a batch's R
samples are stacked along a new leading axis and every solve, every stage
loss and every statistic runs under ``vmap`` over it, while each replicate
keeps what a literal ``vmap`` of whole runs could not give it: its own
clock, save grid, events and step-size control. Replicates whose stage has
ended by its event while others go on idle in zero-length solves, and
Stage II, whose event heads (the set selected by each replicate's Stage I)
are a static argument of the compiled solve, runs one batch per selected
set. Each replicate's trajectory is the one :func:`gflow.integrate` gives
for its seed, to rounding (the same saved times; values to ~1e-12
relative), and is written to its folder as that would write it. Its stage
records keep its own times, ends and step counts; ``nfev`` counts
evaluations of the batched vector field and ``wall`` is the batch's (see
:mod:`gflow.dynamics._vmapped`).

*Memory and chunking.* A batch holds its samples at once: one sample's
features take :func:`gflow.dynamics.sample_bytes` (counts layout
``N·d·(d+1)^M`` numbers plus ``N·(1 + d)`` more, positions layout
``N·L·M²`` plus the tokens), and by default (``batch=None``) the batch is
every replicate if their samples fit in :data:`SAMPLE_BUDGET` (2 GiB), else
the largest number that fits (at least one): the R replicates then run in
chunks of that many, one chunk after another. (Stacking the samples, and
building each stage's loss, briefly holds a second copy of a batch's
samples; the working memory of an evaluation, which also grows with the
batch, is not counted.) The default paper run (d = 3, M = 3, N = 10⁴)
takes 15.7 MB a sample, so R = 10 is one batch; at N = 10⁶ (1.6 GB a
sample) the replicates run one at a time. ``batch=1`` is the sequential
path: :func:`gflow.integrate` of each replicate in turn, every jitted
function compiled once and reused. A chunk of one replicate runs that way
too. A replicate that ``resume`` continues from its folder runs in its chunk
like the others, from its own saved state, time and step-size controller
(:func:`gflow.integrate_batch` with ``resume``; it idles through the
stages it has completed): it is what :func:`gflow.integrate` resuming it
gives, to rounding. The compiled solves depend on the batch
size: each distinct batch size compiles once (as long as a single run's).

*Speed.* On a CPU the gain is modest at best: one evaluation of the vector
field already vectorises over the N sequences (its cost per sequence is the
same at N = 10⁴ as at 10⁵, scripts/benchmarks/bench_scale.py), so batching only saves
the fixed per-step overhead, while a batch pays for its slowest replicate
(the batched loop runs until every replicate is done) and, under ``vmap``,
for both branches of the solver's data-dependent conditionals (measured on
two CPU cores, d = 3, L = 20, N = 500, R = 3, after compilation: 2.2 s as
one batch, 2.3 s one after another). On an accelerator, where one replicate
leaves most of the device idle, batching the R samples is the point.

Bands and the spread of check rows are computed by :mod:`gflow.runs._bands`.

Files (with ``out``): one ordinary run folder per replicate,
``out/rep000``, ``out/rep001``, … (``gflow check`` and ``gflow plot`` work on
each); ``out/replicates.json`` (seeds, stage statistics, band summaries, the
check-row spread), ``out/bands.npz`` (every band array, per-replicate values
included: ``"<stage>/<quantity>/<statistic>"``), and ``out/replicates.md``
(readable tables). :func:`load_replicates` rebuilds the result from the
folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from .._util import atomic_write_npz, atomic_write_text, jsonable
from ..checks import check
from ..config import Config, from_dict
from ..core import subset_label
from ..dynamics import sample_bytes
from ..trajectory import Trajectory, load
from ._bands import QUANTITIES, RowSpread, StageBands, bands, format_summary, row_spread, summarize
from ._executor import (
    GridIncomplete,
    check_executor,
    folder_files,
    open_executor,
    put_folder_files,
    run_points,
    scratch_folder,
)
from ._folder import STALE_FILES, check_run, integrate_batch_with_errors, lock

__all__ = [
    "QUANTITIES",
    "SAMPLE_BUDGET",
    "Replicates",
    "RowSpread",
    "StageBands",
    "bands",
    "default_batch",
    "load_replicates",
    "replicate_seeds",
    "replicates_task",
    "row_spread",
    "run_replicates",
]

RUN_DIR = "rep{:03d}"
"""Replicate r's folder in a replicates folder: ``RUN_DIR.format(r)``."""

#: Bytes the samples of one vmapped batch may take (module docstring).
SAMPLE_BUDGET = 2 * 2**30


def replicate_seeds(config: Config, R: int, base_seed: int | None = None) -> list[int]:
    """The estimator seeds of the R replicates: ``base_seed + r``, ``r = 0…R−1``
    (``base_seed`` defaults to ``config.estimator.seed``)."""
    if not isinstance(R, (int, np.integer)) or isinstance(R, bool) or R < 1:
        raise ValueError(f"the number of replicates R must be an integer >= 1, got {R!r}")
    base = config.estimator.seed if base_seed is None else base_seed
    if not isinstance(base, (int, np.integer)) or isinstance(base, bool):
        raise ValueError(f"base_seed must be an integer, got {base!r}")
    return [int(base) + r for r in range(int(R))]


# ---------------------------------------------------------------------------
# The result
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class Replicates:
    """R replicates of one configuration.

    - `config`: the shared configuration (replicate 0's, i.e. with
      ``estimator.seed = seeds[0]``); `seeds`: each replicate's estimator seed.
    - `trajectories`: the replicates' trajectories; `dirs`: their run
      folders (``None`` without `out`).
    - `bands`: :func:`bands` of the trajectories, per stage.
    - `reports`: each replicate's check report (JSON dict) or ``None``;
      `spread`: :func:`row_spread` of them.
    - `wall`: each replicate's wall time (s), compilation included: that
      of its batch (every replicate of a batch has the batch's wall time; the
      first batch, or with ``batch=1`` the first replicate, compiles, the
      others reuse it); `total_wall`.
    - `batches`: the replicate indices integrated together, batch by batch
      (``[[0], [1], …]`` for the sequential path).
    - `notes`.
    """

    config: Config
    seeds: list[int]
    trajectories: list[Trajectory]
    dirs: list[Path | None]
    bands: dict[str, StageBands]
    reports: list[dict | None]
    spread: list[RowSpread]
    wall: list[float]
    total_wall: float = 0.0
    notes: list[str] = dataclasses.field(default_factory=list)
    batches: list[list[int]] = dataclasses.field(default_factory=list)

    @property
    def R(self) -> int:
        return len(self.seeds)

    @property
    def failed(self) -> list[int]:
        """Indices of the replicates whose run did not complete."""
        return [r for r, tr in enumerate(self.trajectories) if tr.status != "complete"]

    def stage_summary(self) -> dict[str, dict]:
        """Per stage: the spread of its length, how it ended and the selected set."""
        out = {}
        for name, b in self.bands.items():
            out[name] = {
                "length": summarize([None if math.isnan(x) else float(x) for x in b.length]),
                "ended_by": dict(Counter(str(e) for e in b.ended_by)),
                "selected": dict(Counter(subset_label(tuple(s)) if s is not None else "—" for s in b.selected))
                if name == "II" else None,  # fmt: skip
            }
        return out

    def summary(self) -> dict:
        """A JSON-serialisable summary (``replicates.json``): seeds, wall
        times, stage statistics, per stage the band statistics on the τ grid,
        and the spread of every check row."""
        st = {}
        for name, b in self.bands.items():
            st[name] = {
                "tau": b.tau,
                "count": b.count,
                "mean": b.mean,
                "std": b.std,
                "sem": b.sem,
                "min": b.min,
                "max": b.max,
            }
        return jsonable(
            {
                "R": self.R,
                "seeds": self.seeds,
                "seed_rule": "replicate r uses estimator.seed = seeds[0] + r",
                "config": self.config.to_dict(),
                "dirs": [None if d is None else str(d) for d in self.dirs],
                "status": [tr.status for tr in self.trajectories],
                "wall": self.wall,
                "total_wall": self.total_wall,
                "batches": self.batches,
                "stages": self.stage_summary(),
                "bands": st,
                "checks": [r.to_json() for r in self.spread],
                "notes": self.notes,
            }
        , inf_as_str=False)

    def table(self) -> str:
        """Readable text: stage statistics, the bands at the end of each
        stage's common grid and at a few τ, and the check-row spread."""
        out = [f"{self.R} replicates, seeds {self.seeds[0]}…{self.seeds[-1]} (estimator.seed = {self.seeds[0]} + r)"]
        if self.wall and any(len(b) > 1 for b in self.batches):
            walls = ", ".join(f"{len(b)} in {self.wall[b[0]]:.1f} s" for b in self.batches)
            out.append(f"wall time: batches of replicates (vmapped) {walls} (the first with compilation); "
                       f"total {self.total_wall:.1f} s")  # fmt: skip
        elif self.wall:
            rest = self.wall[1:]
            out.append(
                f"wall time: first {self.wall[0]:.1f} s (with compilation)"
                + (f", then {np.mean(rest):.1f} s per replicate" if rest else "")
                + f"; total {self.total_wall:.1f} s"
            )
        out.append("")
        out.append("stages (length t1 − t0, mean ± std over replicates):")
        for name, s in self.stage_summary().items():
            ln = s["length"]
            line = f"  {name:<5} length {format_summary(ln)}; ended by {', '.join(f'{k} ×{n}' for k, n in s['ended_by'].items())}"
            if s["selected"]:
                line += f"; selected {', '.join(f'{k} ×{n}' for k, n in s['selected'].items())}"
            out.append(line)
        out.append("")
        out.append("bands (mean ± std over replicates; n = replicates present):")
        for name, b in self.bands.items():
            mean, std = b.mean, b.std
            picks = sorted(set(np.linspace(0, len(b.tau) - 1, min(len(b.tau), 6)).round().astype(int).tolist()))
            out.append(f"  Stage {name}:")
            labels = _labels(self.config)
            for k in picks:
                lead = int(np.nanargmax(mean["c_frac"][k])) if np.any(np.isfinite(mean["c_frac"][k])) else 0
                out.append(
                    f"    τ = {b.tau[k]:<10.4g} n = {int(b.count[k]):<3} loss {_ms(mean['loss'][k], std['loss'][k], '.6g')}"
                    f"  a {_ms(mean['a'][k], std['a'][k])}"
                    f"  c/Σc[{labels[lead]}] {_ms(mean['c_frac'][k][lead], std['c_frac'][k][lead])}"
                )
        if self.spread:
            out.append("")
            out.append("check rows across replicates (passed/failed/info; measured mean ± std):")
            w = min(max(len(r.name) for r in self.spread), 70)
            for r in self.spread:
                nm = r.name if len(r.name) <= w else r.name[: w - 1] + "…"
                out.append(f"  {nm:<{w}}  {r.passed}/{r.failed}/{r.info}  {format_summary(r.measured)}"
                           f"   (predicted {format_summary(r.predicted)})")  # fmt: skip
        if self.notes:
            out.append("")
            out += [f"note: {n}" for n in self.notes]
        return "\n".join(out)

    def to_markdown(self) -> str:
        out = ["# gflow replicates", "", "```", self.table(), "```", ""]
        if self.spread:
            out += ["| check | n | passed | failed | info | predicted | measured |", "|---|---|---|---|---|---|---|"]
            for r in self.spread:
                cells = [r.name, str(r.n), str(r.passed), str(r.failed), str(r.info),
                         format_summary(r.predicted), format_summary(r.measured)]  # fmt: skip
                out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        return "\n".join(out) + "\n"

    def save(self, out: str | Path) -> None:
        """Write ``replicates.json``, ``bands.npz`` and ``replicates.md`` into `out`."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "replicates.json", json.dumps(self.summary(), indent=1, ensure_ascii=False))
        arrays = {}
        for name, b in self.bands.items():
            arrays[f"{name}/tau"] = b.tau
            arrays[f"{name}/count"] = b.count
            arrays[f"{name}/length"] = b.length
            for stat in ("mean", "std", "sem", "min", "max"):
                for q, v in getattr(b, stat).items():
                    arrays[f"{name}/{q}/{stat}"] = v
            for q, v in b.values.items():
                arrays[f"{name}/{q}/values"] = v
                arrays[f"{name}/{q}/end"] = b.end[q]
        atomic_write_npz(out / "bands.npz", **arrays)
        atomic_write_text(out / "replicates.md", self.to_markdown())


def _labels(cfg: Config) -> list[str]:
    return [subset_label(S) for S in cfg.model.subsets]


def _ms(m, s, spec=".4g") -> str:
    if m is None or not np.isfinite(m):
        return "—"
    return f"{m:{spec}} ± {s:.2g}" if np.isfinite(s) else f"{m:{spec}}"


# ---------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------


def default_batch(config: Config, R: int, budget: int = SAMPLE_BUDGET) -> int:
    """How many replicates of `config` are vmapped together by default: all
    R if their samples fit in `budget` bytes
    (:func:`gflow.dynamics.sample_bytes` each), else as many as fit, at least one."""
    return int(max(1, min(int(R), budget // max(1, sample_bytes(config)))))


def run_replicates(
    config: Config = Config(),
    R: int = 10,
    *,
    out: str | Path | None = None,
    base_seed: int | None = None,
    batch: int | None = None,
    resume: bool = False,
    overwrite: bool = False,
    check: bool = False,
    check_kwargs: dict[str, Any] | None = None,
    verbose: bool = False,
    executor=None,
) -> Replicates:
    """Integrate R independent replicates of `config` and compute their bands.

    **Arguments:**

    - `config`: the configuration; `R`: the number of replicates (≥ 1).
    - `out`: a folder; replicate r is written to ``out/rep{r:03d}`` (an
      ordinary run folder) and the summaries next to them (see the module
      docstring).
    - `base_seed`: replicate r uses ``estimator.seed = base_seed + r``
      (default: ``config.estimator.seed``).
    - `batch`: how many replicates are vmapped together
      (:func:`gflow.integrate_batch`; the R replicates run in chunks
      of `batch`, in order). Default: :func:`default_batch`, all R when their
      samples fit in :data:`SAMPLE_BUDGET`, else the largest batch that fits.
      ``1``: one after another with :func:`gflow.integrate` (as does a
      chunk of one).
    - `overwrite`: replace runs already in the replicate folders.
    - `resume`: replicate folders that already hold a run are resumed
      instead of refused, in their chunks like the others
      (:func:`gflow.integrate_batch` with ``resume``: what
      :func:`gflow.integrate` with ``resume=True`` gives; a complete run is
      reused as it is, an interrupted one continued), and the replicates
      without a run are integrated from the start.
    - `check`: run the check report (:mod:`gflow.checks`) on every replicate
      (with `out`, ``check_run`` writes ``report.json`` into each folder)
      and report the spread of its rows; `check_kwargs` go to it (e.g.
      ``n_pi``).
    - `verbose`: a line per replicate or batch (and per solve).
    - `executor`: where the chunks run (:mod:`gflow.runs._executor`; default this process):
      each chunk of `batch` replicates is one task, integrated and checked in a worker; only
      this process writes the folders. The same trajectories, bit for bit, as in this process.

    **Returns:** :class:`Replicates`.

    A replicate whose integration fails (its stage cannot start, its solve
    fails, or its state becomes non-finite: what :func:`gflow.integrate`
    raises :class:`gflow.FlowError` for) is kept with its partial trajectory
    (its status says why; :attr:`Replicates.failed` lists it), contributes
    to the bands as far as it got, gets no check report, and the other
    replicates (of its batch too) go on.

    **Raises:** ``ValueError`` for a bad `R`, `base_seed` or `batch`, or
    (before any replicate runs) an existing replicate folder without
    `resume` or `overwrite`; :class:`~gflow.runs.GridIncomplete` when chunks were lost with
    their workers (the others are written; `resume` computes the rest).
    """
    seeds = replicate_seeds(config, R, base_seed)
    check_executor(executor)
    if batch is not None and (not isinstance(batch, (int, np.integer)) or isinstance(batch, bool) or batch < 1):
        raise ValueError(f"batch must be an integer >= 1 (or None: by memory), got {batch!r}")
    B = default_batch(config, len(seeds)) if batch is None else min(int(batch), len(seeds))
    cfgs = [config.replace(estimator={"seed": s}) for s in seeds]
    out = None if out is None else Path(out)
    dirs, again = _folders(out, len(seeds), resume=resume, overwrite=overwrite)
    # in chunks of B, in order; a replicate whose folder holds a run is resumed in its chunk
    batches = [list(range(i, min(i + B, len(seeds)))) for i in range(0, len(seeds), B)]
    t_all = time.perf_counter()
    checker = _checker() if check else None
    notes = ["gflow.checks is not available: no check reports"] if check and checker is None else []
    with open_executor(executor) as engine:
        if engine is None:
            trajs, walls, reports = _run_chunks(batches, cfgs, dirs, again, notes, overwrite=overwrite,
                                                verbose=verbose, checker=checker, check_kwargs=check_kwargs)  # fmt: skip
        else:
            trajs, walls, reports = _run_chunks_on(engine, batches, cfgs, dirs, again, notes, overwrite=overwrite,
                                                   check=check, check_kwargs=check_kwargs, verbose=verbose)  # fmt: skip
    res = Replicates(
        config=cfgs[0],
        seeds=seeds,
        trajectories=trajs,
        dirs=dirs,
        bands=bands(trajs),
        reports=reports,
        spread=row_spread(reports),
        wall=walls,
        total_wall=time.perf_counter() - t_all,
        notes=notes,
        batches=batches,
    )
    if out is not None:
        res.save(out)
    return res


def _run_chunks(batches, cfgs, dirs, again, notes: list[str], *, overwrite, verbose, checker, check_kwargs):
    """Integrate the replicates chunk by chunk (:func:`gflow.integrate_batch`; a chunk of one is
    :func:`gflow.integrate` itself) and check each complete one; failures are added to `notes`.
    Returns each replicate's trajectory, wall time (its chunk's) and check report (or ``None``)."""
    seeds = [c.estimator.seed for c in cfgs]
    n = len(cfgs)
    trajs: list[Trajectory | None] = [None] * n
    walls, reports = [0.0] * n, [None] * n
    for chunk in batches:
        t0 = time.perf_counter()
        if verbose:
            _announce(chunk, seeds, dirs)
        got, errs = integrate_batch_with_errors([cfgs[r] for r in chunk], outs=[dirs[r] for r in chunk],
                                     resume=[again[r] for r in chunk], overwrite=overwrite, verbose=verbose)  # fmt: skip
        wall = time.perf_counter() - t0
        for r, tr, e in zip(chunk, got, errs):
            trajs[r], walls[r] = tr, wall
            if e is not None:
                notes.append(f"replicate {r} (seed {seeds[r]}) failed: {e}")
                if verbose:
                    print(f"  {notes[-1]}", flush=True)
            if checker is not None and tr.status == "complete":
                reports[r] = checker(tr, dirs[r], dict(check_kwargs or {}))
        if verbose:
            print(f"  done in {wall:.1f} s", flush=True)
    return trajs, walls, reports


def _run_chunks_on(engine, batches, cfgs, dirs, again, notes: list[str], *, overwrite, check, check_kwargs, verbose):
    """:func:`_run_chunks` with each chunk a task of `engine` (:func:`replicates_task`); this
    process writes the replicates' folders as the chunks arrive, and the notes in chunk order."""
    n = len(cfgs)
    trajs: list[Trajectory | None] = [None] * n
    walls, reports = [0.0] * n, [None] * n
    chunk_notes: dict[int, list[str]] = {}

    def accept(i, res):
        chunk_notes[i] = []
        for j, r in enumerate(batches[i]):
            if dirs[r] is not None:
                with lock(dirs[r]):
                    put_folder_files(dirs[r], res["files"][j], replace=STALE_FILES if overwrite and not again[r] else ())
            trajs[r], walls[r], reports[r] = res["trajs"][j], res["wall"], res["reports"][j]
            if res["errors"][j] is not None:
                chunk_notes[i].append(f"replicate {r} (seed {cfgs[r].estimator.seed}) failed: {res['errors'][j]}")
        if verbose:
            print(f"  replicates {batches[i][0] + 1}…{batches[i][-1] + 1} done in {res['wall']:.1f} s", flush=True)

    tasks = [(i, {"configs": [cfgs[r].to_dict() for r in chunk], "out": dirs[0] is not None,
                  "again": [again[r] for r in chunk], "overwrite": overwrite, "check": check,
                  "check_kwargs": check_kwargs, "files": [folder_files(dirs[r]) if again[r] else {} for r in chunk]})
             for i, chunk in enumerate(batches)]  # fmt: skip
    lost = run_points(engine, replicates_task, tasks, accept, verbose=verbose)
    for i in sorted(chunk_notes):
        notes += chunk_notes[i]
    if lost:
        gone = {r: lost[i] for i in lost for r in batches[i]}
        raise GridIncomplete("replicates", gone, None, "run them again with resume (gflow run --replicates R --resume)")
    return trajs, walls, reports


def replicates_task(payload: dict[str, Any]) -> dict[str, Any]:
    """One chunk of replicates in a worker (:mod:`gflow.runs._executor`): integrated together
    (:func:`gflow.integrate_batch`, as :func:`run_replicates` does in this process) in
    scratch folders (holding ``files``, those resumed), each complete one checked. **Returns**
    the trajectories, the errors (text), the reports, each folder's files and the chunk's wall time."""
    cfgs = [from_dict(c) for c in payload["configs"]]
    with contextlib.ExitStack() as stack:
        dirs = [stack.enter_context(scratch_folder(f)) if payload["out"] else None for f in payload["files"]]
        t0 = time.perf_counter()
        got, errs = integrate_batch_with_errors(cfgs, outs=dirs, resume=payload["again"],
                                                overwrite=payload["overwrite"])  # fmt: skip
        wall = time.perf_counter() - t0
        checker = _checker() if payload["check"] else None
        reports = [checker(tr, d, dict(payload["check_kwargs"] or {})) if checker and tr.status == "complete" else None
                   for tr, d in zip(got, dirs)]  # fmt: skip
        return {"trajs": got, "errors": [None if e is None else str(e) for e in errs], "reports": reports,
                "files": [folder_files(d) if d is not None else {} for d in dirs], "wall": wall}  # fmt: skip


def _folders(out: Path | None, n: int, *, resume: bool, overwrite: bool) -> tuple[list[Path | None], list[bool]]:
    """The replicates' run folders and whether each is resumed (`resume` and it holds a run);
    ``ValueError`` when some already hold runs and neither `resume` nor `overwrite` is given."""
    dirs = [None if out is None else out / RUN_DIR.format(r) for r in range(n)]
    if out is not None and not resume and not overwrite:
        taken = [str(d) for d in dirs if (d / "run.json").exists()]
        if taken:
            raise ValueError(
                f"replicate folders already hold runs ({', '.join(taken[:3])}{', …' if len(taken) > 3 else ''}): "
                "resume them (resume=True, `gflow run --replicates R --resume`) or choose another --out"
            )
    return dirs, [d is not None and resume and (d / "run.json").exists() for d in dirs]


def _announce(chunk: list[int], seeds: list[int], dirs: list[Path | None]) -> None:
    """The verbose line of a chunk: which replicates, their seeds and folders."""
    which = ", ".join(str(seeds[r]) for r in chunk)
    where = "" if dirs[0] is None else f" -> {dirs[chunk[0]]}" + (f"…{dirs[chunk[-1]].name}" if len(chunk) > 1 else "")
    print(f"replicate{'s' if len(chunk) > 1 else ''} {', '.join(str(r + 1) for r in chunk)}/{len(seeds)}: "
          f"estimator.seed = {which}{where}" + (" (vmapped)" if len(chunk) > 1 else ""), flush=True)  # fmt: skip


def _checker():
    def run(traj, d, kw):
        rep = check_run(d, **kw) if d is not None else check(traj, **kw)
        return rep.to_json()

    return run


def load_replicates(out: str | Path) -> Replicates:
    """Rebuild :class:`Replicates` from a folder written by :func:`run_replicates`
    (its ``rep*`` run folders and their ``report.json``; the wall times from
    ``replicates.json`` if present)."""
    out = Path(out)
    dirs = sorted(p for p in out.glob("rep[0-9][0-9][0-9]") if (p / "run.json").is_file())
    if not dirs:
        raise FileNotFoundError(f"{str(out)!r} holds no replicates (expected rep000/, rep001/, … with run.json)")
    trajs = [load(d) for d in dirs]
    reports = []
    for d in dirs:
        p = d / "report.json"
        reports.append(json.loads(p.read_text()) if p.is_file() else None)
    meta = {}
    if (out / "replicates.json").is_file():
        meta = json.loads((out / "replicates.json").read_text())
    cfg0 = trajs[0].config
    return Replicates(
        config=cfg0,
        seeds=[tr.seed for tr in trajs],
        trajectories=trajs,
        dirs=list(dirs),
        bands=bands(trajs),
        reports=reports,
        spread=row_spread(reports),
        wall=[tr.wall for tr in trajs],
        total_wall=float(meta.get("total_wall") or sum(tr.wall for tr in trajs)),
        notes=list(meta.get("notes", [])),
        batches=meta.get("batches") or [[r] for r in range(len(trajs))],
    )
