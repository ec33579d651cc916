"""A run's Hessian spectrum, saved in its folder (``spectrum.npz``; docs/theory/mathematics.md §M9).

:func:`run_spectrum` computes :func:`gflow.dynamics.hessian_spectrum` of the run saved
in a folder at (at most) ``max_times`` saved times, on the run's own sample, and keeps
it in ``DIR/spectrum.npz`` with the key it was computed for (the run's configuration,
its number of saved rows, its last time and ``max_times``): a file of another run, or
of this run before it was extended, is recomputed.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np

from .._util import atomic_write_npz
from ..core import PopulationLoss
from ..dynamics import Spectrum, hessian_spectrum
from ..trajectory import Trajectory, load

SPECTRUM_FILE = "spectrum.npz"
#: saved times at which a run's spectrum is computed by default (evenly in index: in log t)
SPECTRUM_TIMES = 24


def _key(traj: Trajectory, max_times: int) -> str:
    return json.dumps({"config": traj.config.to_dict(), "rows": len(traj.ts), "t_end": float(traj.ts[-1]),
                       "max_times": int(max_times)}, sort_keys=True, default=str)  # fmt: skip


def saved_spectrum(run_dir: str | Path, traj: Trajectory | None = None, *, max_times: int | None = None
                   ) -> Spectrum | None:  # fmt: skip
    """The spectrum kept in ``run_dir/spectrum.npz`` if it belongs to the run as saved now
    (and, when given, was computed at `max_times`), else ``None``."""
    path = Path(run_dir) / SPECTRUM_FILE
    if not path.is_file():
        return None
    traj = load(run_dir) if traj is None else traj
    try:
        with np.load(path, allow_pickle=False) as z:
            d = {k: z[k] for k in z.files}
        key = json.loads(str(d.pop("key")))
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, json.JSONDecodeError):
        return None
    mt = key.get("max_times")
    if mt is None or (max_times is not None and mt != max_times) or json.dumps(key, sort_keys=True) != _key(traj, mt):
        return None
    return Spectrum.from_arrays(d)


def run_spectrum(run_dir: str | Path, traj: Trajectory | None = None, *, max_times: int = SPECTRUM_TIMES,
                 loss: PopulationLoss | None = None, reuse: bool = True, write: bool = True) -> Spectrum:  # fmt: skip
    """The Hessian spectrum of the run saved in `run_dir` (:func:`gflow.hessian_spectrum`
    at at most `max_times` saved times, evenly spaced in index, first and last kept), from
    ``spectrum.npz`` when it belongs to the run (`reuse`), else computed (on `loss`, default
    the run's sample) and, with `write`, saved there atomically."""
    traj = load(run_dir) if traj is None else traj
    if reuse:
        sp = saved_spectrum(run_dir, traj, max_times=max_times)
        if sp is not None:
            return sp
    sp = hessian_spectrum(traj.config, traj, loss=loss, max_times=max_times)
    if write:
        atomic_write_npz(Path(run_dir) / SPECTRUM_FILE, **sp.to_arrays(), key=np.array(_key(traj, max_times)))
    return sp
