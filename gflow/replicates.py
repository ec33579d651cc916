"""Replicates: R independent Monte Carlo samples of one configuration (SPEC §5).

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
batches of ``batch`` (:func:`gflow.vmapped.integrate_batch`): a batch's R
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
:mod:`gflow.vmapped`).

*Memory and chunking.* A batch holds its samples at once: one sample's
features take :func:`gflow.vmapped.sample_bytes` (counts layout
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
too, and so does every replicate that ``resume`` continues from its folder
(a batch always starts from t = 0). The compiled solves depend on the batch
size: each distinct batch size compiles once (as long as a single run's).

*Speed.* On a CPU the gain is modest at best: one evaluation of the vector
field already vectorises over the N sequences (its cost per sequence is the
same at N = 10⁴ as at 10⁵, scripts/bench_scale.py), so batching only saves
the fixed per-step overhead, while a batch pays for its slowest replicate
(the batched loop runs until every replicate is done) and, under ``vmap``,
for both branches of the solver's data-dependent conditionals (measured on
two CPU cores, d = 3, L = 20, N = 500, R = 3, after compilation: 2.2 s as
one batch, 2.3 s one after another). On an accelerator, where one replicate
leaves most of the device idle, batching the R samples is the point.

**Bands on the stages' own clocks.** Every stage runs on its own clock
``τ = t − t0`` (the stage starts at different absolute times in different
replicates), so bands are computed per stage as functions of τ. The common
grid of a stage is the union of the τ's saved by the replicates (merged
within a relative ``1e-6``, the rounding of ``(t0 + τ) − t0``), plus ``τ = 0``
(the stage's starting state, the previous stage's last saved row). gflow saves
every stage on one logarithmic τ grid, so that union is the grid itself plus
each replicate's event time. Each replicate's values are interpolated onto
it linearly in ``log τ`` (linearly in τ between 0 and the first saved τ),
which is exact, up to rounding, at the replicate's own saved times. A
replicate contributes to a τ only while its stage lasts: after its event it
is left out (``count`` says how many replicates make each point). The
replicates' values at the end of each stage are reported separately
(:attr:`StageBands.end`).

**Spread.** ``std`` is the sample standard deviation across replicates
(``ddof = 1``): the spread of a single run around the replicate mean, which
shrinks like ``N^{-1/2}``; ``sem = std/√count`` is the standard error of the
replicate mean.

Files (with ``out``): one ordinary run folder per replicate,
``out/rep000``, ``out/rep001``, … (``gflow check`` and ``gflow plot`` work on
each); ``out/replicates.json`` (seeds, stage statistics, band summaries, the
check-row spread), ``out/bands.npz`` (every band array, per-replicate values
included: ``"<stage>/<quantity>/<statistic>"``), and ``out/replicates.md``
(readable tables). :func:`load_replicates` rebuilds the result from the
folder.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from .checks import _jsonable as _checks_jsonable
from .config import Config
from .model import subset_label
from .trajectory import Trajectory, load

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
    "row_spread",
    "run_replicates",
]

#: The quantities whose bands are computed: name -> meaning (shape at one saved time).
QUANTITIES = {
    "c_frac": "selector weights c_S/Σc, (|𝒮|,)",
    "s": "copier attention softmax(w^(h)), (H, M)",
    "a": "classifier scale a",
    "loss": "the loss L̂",
}

_STAGE_INDEX = {"I": 1, "II": 2, "III": 3, "joint": 0}

# Two saved τ's of different replicates within this relative distance are one
# grid point: τ is recovered as (t0 + τ) − t0, whose rounding error is
# ~1e-16·t0, i.e. up to ~1e-7 of τ for a small τ late in a run; consecutive
# saved τ's differ by a factor 10^(1/save_per_decade), far more.
_MERGE_RTOL = 1e-6
_RUN_DIR = "rep{:03d}"

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
# Bands
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class StageBands:
    """Trajectory bands of one stage across replicates, on the stage's clock τ.

    - `name`: ``"I"``, ``"II"``, ``"III"`` or ``"joint"``.
    - `tau`: ``(T,)`` the common grid of τ = t − t0 (``tau[0] = 0``, the
      stage's starting state).
    - `count`: ``(T,)`` how many replicates are still in the stage at each τ.
    - `values`: per quantity, ``(R, T, …)`` each replicate's values on the
      grid, NaN where the replicate's stage has ended (or the replicate never
      reached the stage).
    - `length`: ``(R,)`` each replicate's stage length ``t1 − t0`` (NaN if absent).
    - `end`: per quantity, ``(R, …)`` each replicate's value at the end of the stage.
    - `ended_by`, `selected`: per replicate (``None`` if absent).

    The statistics (`mean`, `std`, `sem`, `min`, `max`) are dicts of arrays
    ``(T, …)`` over the replicates present at each τ; ``std`` has
    ``ddof = 1`` (NaN with fewer than two replicates).
    """

    name: str
    tau: np.ndarray
    count: np.ndarray
    values: dict[str, np.ndarray]
    length: np.ndarray
    end: dict[str, np.ndarray]
    ended_by: list[str | None]
    selected: list[list[int] | None]

    def _stat(self, stat: str) -> dict[str, np.ndarray]:
        return {q: _reduce(v, stat) for q, v in self.values.items()}

    @property
    def mean(self) -> dict[str, np.ndarray]:
        return self._stat("mean")

    @property
    def std(self) -> dict[str, np.ndarray]:
        return self._stat("std")

    @property
    def sem(self) -> dict[str, np.ndarray]:
        return self._stat("sem")

    @property
    def min(self) -> dict[str, np.ndarray]:
        return self._stat("min")

    @property
    def max(self) -> dict[str, np.ndarray]:
        return self._stat("max")

    def at(self, tau: float) -> int:
        """Index of the grid point nearest to `tau` (in log τ for τ > 0)."""
        if tau <= 0:
            return 0
        pos = np.flatnonzero(self.tau > 0)
        return int(pos[np.argmin(np.abs(np.log(self.tau[pos]) - math.log(tau)))])


def _reduce(v: np.ndarray, stat: str) -> np.ndarray:
    """A statistic over axis 0 of the finite entries (NaN marks an absent
    replicate): ``mean``, ``std`` (ddof = 1), ``sem`` (std/√n), ``min``, ``max``,
    or ``n``. NaN where too few entries are present."""
    v = np.asarray(v, np.float64)
    fin = np.isfinite(v)
    n = fin.sum(0)
    if stat == "n":
        return n
    x = np.where(fin, v, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(n > 0, x.sum(0) / np.maximum(n, 1), np.nan)
        if stat == "mean":
            return mean
        if stat in ("std", "sem"):
            ss = np.sum(np.where(fin, (x - mean) ** 2, 0.0), 0)
            std = np.where(n > 1, np.sqrt(ss / np.maximum(n - 1, 1)), np.nan)
            return std if stat == "std" else std / np.sqrt(np.maximum(n, 1))
        if stat == "min":
            return np.where(n > 0, np.where(fin, v, np.inf).min(0), np.nan)
        if stat == "max":
            return np.where(n > 0, np.where(fin, v, -np.inf).max(0), np.nan)
    raise ValueError(f"unknown statistic {stat!r}")


def _quantity(traj: Trajectory, q: str) -> np.ndarray:
    if q == "c_frac":
        return traj.c_frac
    if q == "s":
        return traj.s
    return np.asarray(getattr(traj, q), np.float64)


def _stage_rows(traj: Trajectory, name: str) -> tuple[np.ndarray, float] | None:
    """Rows of the stage prefixed by its starting row, and the stage's t0."""
    rec = next((s for s in traj.stages if s.name == name), None)
    if rec is None:
        return None
    idx = np.flatnonzero(traj.stage == _STAGE_INDEX[name])
    if name in ("I", "joint"):
        start = 0  # row 0 is t = 0, the initial state, saved with the first stage's index
    else:
        before = np.flatnonzero(traj.ts <= rec.t0 * (1 + 1e-15) + 1e-300)
        before = before[before < (idx[0] if idx.size else len(traj.ts))]
        if before.size == 0:
            return None
        start = int(before[-1])
    rows = np.concatenate([[start], idx[idx != start]]).astype(int)
    return rows, float(rec.t0)


def _interp_log(tau_grid: np.ndarray, tau: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Values of ``y`` (saved at increasing ``tau``, ``tau[0] = 0``) on
    ``tau_grid``: linear in log τ between saved τ > 0, linear in τ on
    ``[0, tau[1]]``; NaN outside ``[0, tau[-1]]``."""
    T = len(tau_grid)
    flat = y.reshape(len(tau), -1)
    out = np.full((T, flat.shape[1]), np.nan)
    t_end = tau[-1] * (1 + _MERGE_RTOL) if tau[-1] > 0 else 0.0
    for k, tg in enumerate(tau_grid):
        if tg > t_end:
            continue
        if tg <= 0:
            out[k] = flat[0]
            continue
        j = int(np.searchsorted(tau, tg, side="left"))
        j = min(max(j, 1), len(tau) - 1)
        near = [i for i in (j - 1, j) if abs(tau[i] - tg) <= _MERGE_RTOL * tg]
        if near:
            out[k] = flat[near[-1]]
            continue
        t_lo, t_hi = tau[j - 1], tau[j]
        if tg > t_hi:  # past the last saved τ but within the merge tolerance
            out[k] = flat[j]
            continue
        if t_lo <= 0:
            w = (tg - t_lo) / (t_hi - t_lo)
        else:
            w = (math.log(tg) - math.log(t_lo)) / (math.log(t_hi) - math.log(t_lo))
        out[k] = (1 - w) * flat[j - 1] + w * flat[j]
    return out.reshape((T,) + y.shape[1:])


def _merge(taus: list[np.ndarray]) -> np.ndarray:
    allt = np.sort(np.concatenate([np.zeros(1)] + [t[t > 0] for t in taus]))
    keep = [0.0]
    for t in allt:
        if t > 0 and t > keep[-1] * (1 + _MERGE_RTOL):
            keep.append(float(t))
    return np.asarray(keep)


def bands(trajs: list[Trajectory], *, tau: dict[str, np.ndarray] | None = None) -> dict[str, StageBands]:
    """Per-stage bands of ``c/Σc``, ``s``, ``a`` and the loss across replicates
    (see the module docstring for the grid and the interpolation).

    **Arguments:** `trajs`, the replicates' trajectories (one configuration,
    different seeds); `tau`, optionally, a τ grid per stage name to use
    instead of the union of the saved τ's.

    **Returns:** ``{stage name: StageBands}`` in the order the stages ran.
    """
    if not trajs:
        raise ValueError("bands: no trajectories")
    names: list[str] = []
    for tr in trajs:
        for st in tr.stages:
            if st.name not in names:
                names.append(st.name)
    out = {}
    R = len(trajs)
    for name in names:
        per = [_stage_rows(tr, name) for tr in trajs]
        taus = [None if p is None else traj.ts[p[0]] - p[1] for p, traj in zip(per, trajs)]
        taus = [None if t is None else np.maximum(t, 0.0) for t in taus]
        for t in taus:
            if t is not None:
                t[0] = 0.0
        grid = np.asarray(tau[name], np.float64) if tau is not None and name in tau else _merge(
            [t for t in taus if t is not None])  # fmt: skip
        values, end = {}, {}
        for q in QUANTITIES:
            shape = _quantity(trajs[0], q).shape[1:]
            v = np.full((R, len(grid)) + shape, np.nan)
            e = np.full((R,) + shape, np.nan)
            for r, (p, tr) in enumerate(zip(per, trajs)):
                if p is None:
                    continue
                y = _quantity(tr, q)[p[0]]
                v[r] = _interp_log(grid, taus[r], y)
                e[r] = y[-1]
            values[q], end[q] = v, e
        recs = [next((s for s in tr.stages if s.name == name), None) for tr in trajs]
        count = np.sum(np.isfinite(values["a"]), 0)
        out[name] = StageBands(
            name=name,
            tau=grid,
            count=count,
            values=values,
            length=np.array([np.nan if s is None else s.t1 - s.t0 for s in recs]),
            end=end,
            ended_by=[None if s is None else s.ended_by for s in recs],
            selected=[None if s is None else s.selected for s in recs],
        )
    return out


# ---------------------------------------------------------------------------
# Spread of check-report rows
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class RowSpread:
    """One check-report row across replicates.

    - `name`: the row's name; `n`: how many replicates' reports have it.
    - `passed`, `failed`, `info`: how many replicates passed, failed, or had
      it as an informational row.
    - `predicted`, `measured`: summaries (:func:`summarize`): for numbers
      ``{"mean", "std", "min", "max", "n"}`` (elementwise lists for lists of
      numbers of one length); otherwise ``{"values": {value: count}}``.
    """

    name: str
    n: int
    passed: int
    failed: int
    info: int
    predicted: dict
    measured: dict

    def to_json(self) -> dict:
        return _jsonable(dataclasses.asdict(self))


def _is_num(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


def summarize(values: list) -> dict:
    """Mean, sample standard deviation, min and max of numbers (``None`` and
    non-finite values left out; ``n`` counts the finite ones), elementwise
    for lists of numbers of equal length; otherwise counts of the distinct
    values (as strings)."""
    present = [v for v in values if v is not None]
    if present and all(_is_num(v) for v in present):
        x = np.asarray(present, np.float64)
    elif present and all(isinstance(v, (list, tuple)) and all(_is_num(u) or u is None for u in v) for v in present) \
            and len({len(v) for v in present}) == 1:  # fmt: skip
        x = np.asarray([[np.nan if u is None else u for u in v] for v in present], np.float64)
    else:
        return {"values": dict(Counter(_label(v) for v in values))}
    if x.ndim == 1:
        return {k: float(_reduce(x, k)) for k in ("mean", "std", "min", "max")} | {"n": int(_reduce(x, "n"))}
    return {k: [float(u) for u in _reduce(x, k)] for k in ("mean", "std", "min", "max")} | {
        "n": [int(u) for u in _reduce(x, "n")]
    }


def _label(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_label(u) for u in v) + "]"
    if _is_num(v):
        return format(float(v), ".4g")
    return str(v)


def row_spread(reports: list) -> list[RowSpread]:
    """The spread of every check-report row across replicates.

    `reports` are :class:`gflow.checks.Report` objects or their JSON dicts
    (``report.json``), one per replicate (``None`` for a replicate without a
    report). Rows are matched by name, in the order of first appearance.
    """
    rows: dict[str, list[dict]] = {}
    for rep in reports:
        if rep is None:
            continue
        rs = rep["rows"] if isinstance(rep, dict) else [dataclasses.asdict(r) for r in rep.rows]
        for r in rs:
            rows.setdefault(r["name"], []).append(r)
    out = []
    for name, rs in rows.items():
        out.append(
            RowSpread(
                name=name,
                n=len(rs),
                passed=sum(r["passed"] is True for r in rs),
                failed=sum(r["passed"] is False for r in rs),
                info=sum(r["passed"] is None for r in rs),
                predicted=summarize([r["predicted"] for r in rs]),
                measured=summarize([r["measured"] for r in rs]),
            )
        )
    return out


def _fmt_summary(s: dict) -> str:
    if "values" in s:
        return ", ".join(f"{k} ×{n}" for k, n in s["values"].items())

    def one(m, sd):
        if m is None or (isinstance(m, float) and math.isnan(m)):
            return "—"
        return f"{m:.4g} ± {sd:.2g}" if sd is not None and not math.isnan(sd) else f"{m:.4g}"

    if isinstance(s["mean"], list):
        return "[" + ", ".join(one(m, sd) for m, sd in zip(s["mean"], s["std"])) + "]"
    return one(s["mean"], s["std"])


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
        return _jsonable(
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
        )

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
            line = f"  {name:<5} length {_fmt_summary(ln)}; ended by {', '.join(f'{k} ×{n}' for k, n in s['ended_by'].items())}"
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
                out.append(f"  {nm:<{w}}  {r.passed}/{r.failed}/{r.info}  {_fmt_summary(r.measured)}"
                           f"   (predicted {_fmt_summary(r.predicted)})")  # fmt: skip
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
                         _fmt_summary(r.predicted), _fmt_summary(r.measured)]  # fmt: skip
                out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        return "\n".join(out) + "\n"

    def save(self, out: str | Path) -> None:
        """Write ``replicates.json``, ``bands.npz`` and ``replicates.md`` into `out`."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        _write(out / "replicates.json", json.dumps(self.summary(), indent=1, ensure_ascii=False))
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
        tmp = out / "bands.tmp.npz"
        np.savez(tmp, **arrays)
        tmp.replace(out / "bands.npz")
        _write(out / "replicates.md", self.to_markdown())


def _labels(cfg: Config) -> list[str]:
    return [subset_label(S) for S in cfg.model.subsets]


def _ms(m, s, spec=".4g") -> str:
    if m is None or not np.isfinite(m):
        return "—"
    return f"{m:{spec}} ± {s:.2g}" if np.isfinite(s) else f"{m:{spec}}"


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.stem + ".tmp" + path.suffix)
    tmp.write_text(text)
    tmp.replace(path)


def _jsonable(x):
    # replicates.json writes every non-finite number as null
    return _checks_jsonable(x, inf_as_str=False)


# ---------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------


def default_batch(config: Config, R: int, budget: int = SAMPLE_BUDGET) -> int:
    """How many replicates of `config` are vmapped together by default: all
    R if their samples fit in `budget` bytes
    (:func:`gflow.vmapped.sample_bytes` each), else as many as fit, at least one."""
    from .vmapped import sample_bytes

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
      (:func:`gflow.vmapped.integrate_batch`; the R replicates run in chunks
      of `batch`, in order). Default: :func:`default_batch`, all R when their
      samples fit in :data:`SAMPLE_BUDGET`, else the largest batch that fits.
      ``1``: one after another with :func:`gflow.integrate` (as does a
      chunk of one).
    - `overwrite`: replace runs already in the replicate folders.
    - `resume`: replicate folders that already hold a run are resumed
      (:func:`gflow.integrate` with ``resume=True``, one after another: a
      complete run is reused as it is, an interrupted one continued) instead
      of refused; the replicates without a run are integrated in batches.
    - `check`: run the check report (:mod:`gflow.checks`) on every replicate
      (with `out`, ``check_run`` writes ``report.json`` into each folder)
      and report the spread of its rows; `check_kwargs` go to it (e.g.
      ``n_pi``).
    - `verbose`: a line per replicate or batch (and per solve).

    **Returns:** :class:`Replicates`.

    A replicate whose integration fails (its stage cannot start, its solve
    fails, or its state becomes non-finite: what :func:`gflow.integrate`
    raises :class:`gflow.FlowError` for) is kept with its partial trajectory
    (its status says why; :attr:`Replicates.failed` lists it), contributes
    to the bands as far as it got, gets no check report, and the other
    replicates (of its batch too) go on.

    **Raises:** ``ValueError`` for a bad `R`, `base_seed` or `batch`, or
    (before any replicate runs) an existing replicate folder without
    `resume` or `overwrite`.
    """
    from .flow import FlowError, integrate
    from .vmapped import _integrate_batch

    seeds = replicate_seeds(config, R, base_seed)
    if batch is not None and (not isinstance(batch, (int, np.integer)) or isinstance(batch, bool) or batch < 1):
        raise ValueError(f"batch must be an integer >= 1 (or None: by memory), got {batch!r}")
    B = default_batch(config, len(seeds)) if batch is None else min(int(batch), len(seeds))
    cfgs = [config.replace(estimator={"seed": s}) for s in seeds]
    out = None if out is None else Path(out)
    dirs = [None if out is None else out / _RUN_DIR.format(r) for r in range(len(seeds))]
    if out is not None and not resume and not overwrite:
        taken = [str(d) for d in dirs if (d / "run.json").exists()]
        if taken:
            raise ValueError(
                f"replicate folders already hold runs ({', '.join(taken[:3])}{', …' if len(taken) > 3 else ''}): "
                "resume them (resume=True, `gflow run --replicates R --resume`) or choose another --out"
            )
    # replicates resumed from their folders run one by one; the others in chunks of B
    again = [d is not None and resume and (d / "run.json").exists() for d in dirs]
    fresh = [r for r in range(len(seeds)) if not again[r]]
    batches = [[r] for r in range(len(seeds)) if again[r]] + [fresh[i : i + B] for i in range(0, len(fresh), B)]
    t_all = time.perf_counter()
    n = len(seeds)
    trajs: list[Trajectory | None] = [None] * n
    walls, reports = [0.0] * n, [None] * n
    errors: list[Exception | None] = [None] * n
    notes = []
    checker = _checker() if check else None
    if check and checker is None:
        notes.append("gflow.checks is not available: no check reports")
    for chunk in batches:
        t0 = time.perf_counter()
        if verbose:
            which = ", ".join(str(seeds[r]) for r in chunk)
            where = "" if out is None else f" -> {dirs[chunk[0]]}" + (f"…{dirs[chunk[-1]].name}" if len(chunk) > 1 else "")
            print(f"replicate{'s' if len(chunk) > 1 else ''} {', '.join(str(r + 1) for r in chunk)}/{n}: "
                  f"estimator.seed = {which}{where}" + (" (vmapped)" if len(chunk) > 1 else ""), flush=True)  # fmt: skip
        if len(chunk) == 1:
            r = chunk[0]
            d = dirs[r]
            try:
                trajs[r] = integrate(cfgs[r], out=d, resume=again[r], overwrite=overwrite and not again[r],
                                     verbose=verbose)  # fmt: skip
            except FlowError as e:
                trajs[r], errors[r] = e.trajectory, e
        else:
            got, errs = _integrate_batch([cfgs[r] for r in chunk], outs=[dirs[r] for r in chunk],
                                         overwrite=overwrite, verbose=verbose)  # fmt: skip
            for r, tr, e in zip(chunk, got, errs):
                trajs[r], errors[r] = tr, e
        wall = time.perf_counter() - t0
        for r in chunk:
            walls[r] = wall
            if errors[r] is not None:
                notes.append(f"replicate {r} (seed {seeds[r]}) failed: {errors[r]}")
                if verbose:
                    print(f"  {notes[-1]}", flush=True)
            if checker is not None and trajs[r].status == "complete":
                reports[r] = checker(trajs[r], dirs[r], dict(check_kwargs or {}))
        if verbose:
            print(f"  done in {wall:.1f} s", flush=True)
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


def _checker():
    try:
        from . import checks
    except ImportError:  # pragma: no cover - gflow.checks is written concurrently
        return None

    def run(traj, d, kw):
        rep = checks.check_run(d, **kw) if d is not None else checks.check(traj, **kw)
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
