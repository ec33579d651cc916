"""Small shared plumbing: the stage codes of a trajectory, JSON-safe values and
atomic file writes (one home for each, used by the trajectory snapshot, checks,
theory, plot, replicates and phase)."""

from __future__ import annotations

import csv
import importlib.metadata
import io
import json
import math
import os
from pathlib import Path

import numpy as np

# The integer code of each stage in ``Trajectory.stage`` (the joint schedule is 0).
STAGE_CODES: dict[str, int] = {"joint": 0, "I": 1, "II": 2, "III": 3}


def rows_of_stage(stage_codes, name: str) -> np.ndarray:
    """Indices of the saved times that belong to stage `name` ("I", "II", "III", "joint")."""
    if name not in STAGE_CODES:
        raise ValueError(f"unknown stage {name!r}; allowed: {sorted(STAGE_CODES)}")
    return np.flatnonzero(np.asarray(stage_codes) == STAGE_CODES[name])


def jsonable(x, *, inf_as_str: bool = True):
    """Plain JSON values: numpy scalars and arrays to Python ones, paths to
    strings, NaN to ``None``, ±∞ to ``"inf"``/``"-inf"`` (or ``None`` with
    ``inf_as_str=False``)."""
    rec = lambda v: jsonable(v, inf_as_str=inf_as_str)
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        x = float(x)
        if math.isfinite(x):
            return x
        return None if math.isnan(x) or not inf_as_str else ("inf" if x > 0 else "-inf")
    if isinstance(x, np.ndarray):
        return [rec(v) for v in x.tolist()]
    if isinstance(x, (list, tuple)):
        return [rec(v) for v in x]
    if isinstance(x, dict):
        return {str(k): rec(v) for k, v in x.items()}
    if isinstance(x, Path):
        return str(x)
    return x


def _temporary(path: Path) -> Path:
    """Where `path` is written before its rename: hidden, in the same folder, with the writer's
    pid (no two processes share one) and the same suffix (``.run.<pid>.tmp.json``)."""
    return path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder and
    ``os.replace``: a reader never sees a half-written file."""
    path = Path(path)
    tmp = _temporary(path)
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same folder and ``os.replace``, as
    :func:`atomic_write_text`."""
    path = Path(path)
    tmp = _temporary(path)
    tmp.write_bytes(data)
    os.replace(tmp, path)


def atomic_write_npz(path: str | Path, **arrays) -> None:
    """``np.savez`` of `arrays` to `path` (a name ending in ``.npz``) through a temporary
    file in the same folder and ``os.replace``, as :func:`atomic_write_text`."""
    path = Path(path)
    tmp = _temporary(path)
    np.savez(tmp, **arrays)
    os.replace(tmp, path)


def atomic_savefig(fig, path: str | Path, **kw) -> Path:
    """``fig.savefig`` to `path` through a temporary file in the same folder and ``os.replace``, as
    :func:`atomic_write_text`: a process killed while drawing leaves the previous file or none, never
    a truncated one. The format is `path`'s suffix (given explicitly: the temporary name ends in
    ``.tmp.png``, which matplotlib would read as well)."""
    path = Path(path)
    tmp = _temporary(path)  # a writer that dies leaves it; removed under the folder's lock
    fig.savefig(tmp, format=kw.pop("format", path.suffix.lstrip(".") or None), **kw)
    os.replace(tmp, path)
    return path


def remove_temporaries(folder: str | Path, *names: str) -> None:
    """Remove the temporary files of `names` in `folder` that a writer killed mid-write left
    (call it only when no writer can be alive, e.g. holding the folder's lock)."""
    folder = Path(folder)
    for name in names:
        p = folder / name
        for stale in p.parent.glob(f".{p.stem}.*.tmp{p.suffix}"):
            stale.unlink(missing_ok=True)


def atomic_write_json(path: str | Path, obj, *, indent: int = 1) -> None:
    """:func:`atomic_write_text` of ``json.dumps(jsonable(obj))`` (UTF-8, not ASCII-escaped)."""
    atomic_write_text(path, json.dumps(jsonable(obj), indent=indent, ensure_ascii=False))


def versions() -> dict[str, str]:
    """The installed versions of gflow and of the packages its results depend on."""
    out = {}
    for pkg in ("gflow", "jax", "jaxlib", "diffrax", "equinox", "optimistix", "numpy"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def write_csv(path: str | Path, header: list[str], rows, *, lineterminator: str = "\r\n") -> Path:
    """Write a CSV table atomically (:func:`atomic_write_text`): `header`, then one line per
    row of already formatted cells. `lineterminator` is the ``csv`` module's (its default,
    ``"\r\n"``, or ``"\n"``)."""
    buf = io.StringIO(newline="")
    w = csv.writer(buf, lineterminator=lineterminator)
    w.writerow(header)
    w.writerows(rows)
    atomic_write_text(path, buf.getvalue())
    return Path(path)
