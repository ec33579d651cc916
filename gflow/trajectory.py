"""The trajectory of a run, and its files (SPEC §7).

A run folder holds ``trajectory.npz`` (the arrays) and ``run.json`` (the
resolved configuration, stages, solver statistics, versions, seed, status).
:func:`load` reads both back into the same :class:`Trajectory`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from .config import Config, from_dict
from .model import subset_label, subsets

_ARRAYS = (
    "ts", "stage", "w", "C", "a", "loss", "loss_se", "unseen",
    "grad_w", "grad_C", "grad_a", "grad_se_w", "grad_se_C", "grad_se_a", "grad_norm",
)  # fmt: skip


@dataclasses.dataclass
class StageRecord:
    """One stage (or the single joint phase) of a run.

    - `name`: ``"I"``, ``"II"``, ``"III"`` or ``"joint"``; `moves`: the blocks it moves.
    - `t0`, `t1`: start and end time; `ended_by`: ``"event"``, ``"duration"``,
      ``"steady"`` (settled short of its event) or ``"failed"``; `complete`: whether the stage has finished.
    - `steps`, `rejected`, `nfev`: solver statistics (accepted steps, rejected
      steps, vector-field evaluations), summed over the stage's segments.
    - `wall`: wall time in seconds (including compilation).
    - `selected`: Stage II only: the heads (the set S selected by Stage I) whose
      concentration ends the stage.
    """

    name: str
    moves: list[str]
    t0: float
    t1: float
    ended_by: str = "duration"
    complete: bool = False
    steps: int = 0
    rejected: int = 0
    nfev: int = 0
    wall: float = 0.0
    selected: list[int] | None = None


@dataclasses.dataclass
class Trajectory:
    """Everything a run produced.

    Arrays (``T`` saved times): `ts`; `stage` (1, 2, 3; 0 for joint); the
    parameters `w` ``(T, H, M)``, `C` ``(T, |𝒮|)``, `a` ``(T,)``; the loss
    `loss` and its standard error `loss_se`, the unseen mass `unseen`; the
    full gradient ``∇L̂`` (`grad_w`, `grad_C`, `grad_a`) and the Monte Carlo
    standard error of each component (`grad_se_*`); `grad_norm` ``‖∇L̂‖``.
    Plus `stages` (:class:`StageRecord`), the resolved `config`, `status`
    (``"complete"``, ``"running"`` or ``"failed: …"``), `versions`, `seed`,
    `wall` (seconds).
    """

    ts: np.ndarray
    stage: np.ndarray
    w: np.ndarray
    C: np.ndarray
    a: np.ndarray
    loss: np.ndarray
    loss_se: np.ndarray
    unseen: np.ndarray
    grad_w: np.ndarray
    grad_C: np.ndarray
    grad_a: np.ndarray
    grad_se_w: np.ndarray
    grad_se_C: np.ndarray
    grad_se_a: np.ndarray
    grad_norm: np.ndarray
    stages: list[StageRecord]
    config: Config
    status: str = "running"
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    wall: float = 0.0

    # -- derived ------------------------------------------------------------
    @property
    def seed(self) -> int:
        return self.config.estimator.seed

    @property
    def subsets(self) -> tuple[tuple[int, ...], ...]:
        return subsets(self.config.model.H, self.config.model.D)

    @property
    def labels(self) -> list[str]:
        return [subset_label(S) for S in self.subsets]

    @property
    def c(self) -> np.ndarray:
        return self.C**2

    @property
    def c_frac(self) -> np.ndarray:
        """``c_S/Σc``, ``(T, |𝒮|)``."""
        c = self.C**2
        return c / c.sum(-1, keepdims=True)

    @property
    def s(self) -> np.ndarray:
        """Copier attention ``softmax(w^(h))``, ``(T, H, M)``."""
        z = self.w - self.w.max(-1, keepdims=True)
        e = np.exp(z)
        return e / e.sum(-1, keepdims=True)

    @property
    def boundaries(self) -> list[float]:
        """End times of the completed stages."""
        return [st.t1 for st in self.stages if st.complete]

    def __len__(self) -> int:
        return len(self.ts)

    # -- building ------------------------------------------------------------
    @classmethod
    def empty(cls, config: Config, H: int, M: int, nS: int) -> "Trajectory":
        z = {
            "ts": (0,), "stage": (0,), "w": (0, H, M), "C": (0, nS), "a": (0,), "loss": (0,),
            "loss_se": (0,), "unseen": (0,), "grad_w": (0, H, M), "grad_C": (0, nS), "grad_a": (0,),
            "grad_se_w": (0, H, M), "grad_se_C": (0, nS), "grad_se_a": (0,), "grad_norm": (0,),
        }  # fmt: skip
        arrays = {k: np.zeros(s, dtype=np.int32 if k == "stage" else np.float64) for k, s in z.items()}
        return cls(**arrays, stages=[], config=config)

    def append(self, **arrays) -> None:
        """Append saved rows (every array of :data:`_ARRAYS`, leading axis = rows)."""
        for k in _ARRAYS:
            setattr(self, k, np.concatenate([getattr(self, k), np.asarray(arrays[k], getattr(self, k).dtype)]))

    def state(self, i: int = -1) -> dict[str, np.ndarray]:
        """θ at saved index ``i``."""
        return {"w": self.w[i], "C": self.C[i], "a": self.a[i]}


def save(traj: Trajectory, out: str | Path) -> Path:
    """Write ``trajectory.npz`` and ``run.json`` into ``out`` (atomically: a
    crash mid-write leaves the previous files intact)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "trajectory.tmp.npz"
    np.savez(tmp, **{k: getattr(traj, k) for k in _ARRAYS})
    os.replace(tmp, out / "trajectory.npz")
    meta = {
        "status": traj.status,
        "config": traj.config.to_dict(),
        "stages": [dataclasses.asdict(s) for s in traj.stages],
        "versions": traj.versions,
        "seed": traj.seed,
        "wall": traj.wall,
        "n_saved": len(traj.ts),
    }
    tmpj = out / "run.tmp.json"
    tmpj.write_text(json.dumps(meta, indent=2, default=_json_default))
    os.replace(tmpj, out / "run.json")
    return out


def _json_default(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON-serialisable: {type(x)}")


def load(out: str | Path) -> Trajectory:
    """Read a run folder written by :func:`save`."""
    out = Path(out)
    if not (out / "trajectory.npz").is_file() or not (out / "run.json").is_file():
        raise FileNotFoundError(
            f"{str(out)!r} holds no gflow run: expected trajectory.npz and run.json (written by `gflow run`)"
        )
    meta: dict[str, Any] = json.loads((out / "run.json").read_text())
    with np.load(out / "trajectory.npz") as z:
        arrays = {k: z[k] for k in _ARRAYS}
    return Trajectory(
        **arrays,
        stages=[StageRecord(**s) for s in meta["stages"]],
        config=from_dict(meta["config"]),
        status=meta["status"],
        versions=meta["versions"],
        wall=meta["wall"],
    )
