"""Trajectory bands across replicates, and the spread of check-report rows.

The replicates of one configuration (:mod:`gflow.runs._replicates`) are R runs on
independent Monte Carlo samples; this module summarises them.

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
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

import numpy as np

from .._util import STAGE_CODES, jsonable, table_cell
from ..trajectory import Trajectory

__all__ = ["QUANTITIES", "RowSpread", "StageBands", "bands", "row_spread", "summarize"]

#: The quantities whose bands are computed: name -> meaning (shape at one saved time).
QUANTITIES = {
    "c_frac": "selector weights c_S/Σc, (|𝒮|,)",
    "s": "copier attention softmax(w^(h)), (H, M)",
    "a": "classifier scale a",
    "loss": "the loss L̂",
}

_STAGE_INDEX = STAGE_CODES

# Two saved τ's of different replicates within this relative distance are one
# grid point: τ is recovered as (t0 + τ) − t0, whose rounding error is
# ~1e-16·t0, i.e. up to ~1e-7 of τ for a small τ late in a run; consecutive
# saved τ's differ by a factor 10^(1/save_per_decade), far more.
_MERGE_RTOL = 1e-6


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
    selected: list[tuple[int, ...] | None]

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
        return jsonable(dataclasses.asdict(self), inf_as_str=False)  # non-finite numbers as null


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
        return {"values": dict(Counter(table_cell(v) for v in values))}
    if x.ndim == 1:
        return {k: float(_reduce(x, k)) for k in ("mean", "std", "min", "max")} | {"n": int(_reduce(x, "n"))}
    return {k: [float(u) for u in _reduce(x, k)] for k in ("mean", "std", "min", "max")} | {
        "n": [int(u) for u in _reduce(x, "n")]
    }


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


def format_summary(s: dict) -> str:
    if "values" in s:
        return ", ".join(f"{k} ×{n}" for k, n in s["values"].items())

    def one(m, sd):
        if m is None or (isinstance(m, float) and math.isnan(m)):
            return "—"
        return f"{m:.4g} ± {sd:.2g}" if sd is not None and not math.isnan(sd) else f"{m:.4g}"

    if isinstance(s["mean"], list):
        return "[" + ", ".join(one(m, sd) for m, sd in zip(s["mean"], s["std"])) + "]"
    return one(s["mean"], s["std"])
