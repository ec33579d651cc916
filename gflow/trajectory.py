"""The trajectory of a run, and its files (docs/theory/mathematics.md §M7).

A run folder holds ``trajectory.npz`` (the arrays) and ``run.json`` (the
resolved configuration, stages, solver statistics, versions, seed, status).
:func:`load` reads both back into the same :class:`Trajectory`.

**One consistent snapshot.** ``trajectory.npz`` also holds the whole of
``run.json``'s content (its array ``meta``, a JSON string) and both carry the
same ``generation`` (a counter bumped by every :func:`save`). The npz is
written to a temporary name and renamed over the old one (one atomic
rename), so it is always one whole snapshot; :func:`load` takes the metadata
from it, never pairs arrays of one save with ``run.json`` of another. The
separate ``run.json`` (written second, also by an atomic rename) is for
people and tools; a process killed between the two renames leaves it one
generation behind, which :func:`load` detects and ignores (the next save
rewrites it).

**A seed axis.** A stochastic run (``solver.method = "sgd"`` or ``"sde"``: R seeds)
has :attr:`Trajectory.per_seed`, every array of :data:`SEED_ARRAYS` with a leading
seed axis ``(R, T, ...)``, stored in the npz as ``seed_<name>``; its ordinary arrays
are then the seed means of those (θ̄ = the mean parameters, the mean loss, …), so
every reader of a trajectory reads the seed mean. ``run.json`` says ``"seeds": R``.
Deterministic runs have ``per_seed = None`` and files without ``seed_*`` arrays.

**What a run's model predicts.** Once a run is integrated, its folder also holds
:attr:`Trajectory.kl`, the mean KL from each of Edelman et al.'s three in-context strategies
(uniform, unigram, bigram) to the model at every saved time, stored as ``kl_uniform``,
``kl_unigram``, ``kl_bigram`` (``gflow.strategies``; a run saved before them has none, and
``gflow.strategies`` computes them from θ). They describe the saved rows they were computed
from: appending rows (a resumed run) drops them until the run is integrated again.

**Complete means whole.** ``gflow run`` lists the files it writes after the integration (the
report, ``theory.json``, the figures) in the snapshot's ``files`` manifest: while it writes them
the status is :data:`WRITING` (the integration is complete, its outputs are not), and it becomes
``"complete"`` only when every listed file has been written whole (atomically) and recorded with
its size and SHA-256 (:func:`record_outputs`, written last). A run killed while drawing is
therefore never ``complete``; ``gflow plot`` / ``gflow check`` write the missing files and
complete it. :func:`run_status` also re-verifies the listed files.

**One writer.** The run layer's lock (``gflow.runs.lock``, an exclusive
``fcntl.flock`` on ``DIR/.lock``) keeps a second writer out; :func:`load` does
not need it.
"""

from __future__ import annotations

import dataclasses
import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ._util import STAGE_CODES, atomic_write_npz, atomic_write_text, rows_of_stage
from .config import Config, from_dict
from .core import member_of, subset_label

_ARRAYS = (
    "ts", "stage", "w", "C", "a", "loss", "loss_se", "unseen",
    "grad_w", "grad_C", "grad_a", "grad_se_w", "grad_se_C", "grad_se_a", "grad_norm",
)  # fmt: skip
# the kinds of a member's extra arrays, per extra block b: x_b (θ), grad_x_b, grad_se_x_b
_EXTRA_KINDS = ("x", "grad_x", "grad_se_x")


# The strategies' KL to the model at every saved time, stored once a run is integrated (Trajectory.kl).
KL_ARRAYS = ("kl_uniform", "kl_unigram", "kl_bigram")

# The arrays a stochastic run keeps per seed (every array but the shared times and stage codes).
SEED_ARRAYS = tuple(k for k in _ARRAYS if k not in ("ts", "stage"))

# The status of a run whose integration is complete while gflow run writes its report and figures.
WRITING = "integrated, writing outputs"


class RunFolderError(ValueError, FileNotFoundError):
    """A run folder (or output location) that cannot be used: names the file and what is wrong.
    A ``ValueError`` (the command line reports it as bad input, exit code 2), and a
    ``FileNotFoundError`` as the error for a folder without a run always was."""


@dataclasses.dataclass
class StageRecord:
    """One stage (or the single joint phase) of a run.

    - `name`: ``"I"``, ``"II"``, ``"III"`` or ``"joint"``; `moves`: the blocks it moves.
    - `t0`, `t1`: start and end time; `ended_by`: ``"event"``, ``"duration"``,
      ``"steady"`` (settled short of its event) or ``"failed"``; `complete`: whether the stage has finished.
    - `steps`, `rejected`, `nfev`: solver statistics (accepted steps, rejected
      steps, vector-field evaluations), summed over the stage's segments.
    - `wall`: wall time in seconds (including compilation).
    - `selected`: the set S Stage I selected (``argmax c/Σc`` at its end), as a tuple of
      heads like every set gflow names (the keys of ``Theory.laws``, ``Theory.S_star``; a list
      given is stored as a tuple): on Stage I (and a joint run) once it has ended, and on Stage II,
      whose heads' concentration ends it; ``None`` on Stage III and on a stage still running.
    - `solver`, `solver_from`: the solver the stage went on with, from the time `solver_from`,
      when its own met a stiff stretch (``solver.stiff_switch``: a tsit5 stage goes on with
      kvaerno5); ``None`` when it kept the configuration's.
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
    selected: tuple[int, ...] | None = None
    solver: str | None = None
    solver_from: float | None = None

    def __setattr__(self, name, value):
        if name == "selected" and value is not None:  # one type for a set everywhere: a tuple
            value = tuple(int(h) for h in value)
        super().__setattr__(name, value)


@dataclasses.dataclass
class Trajectory:
    """Everything a run produced.

    Arrays (``T`` saved times): `ts`; `stage` (1, 2, 3; 0 for joint); the
    parameters `w` ``(T, H, M)``, `C` ``(T, |𝒮|)``, `a` ``(T,)``; the loss
    `loss` and its standard error `loss_se`, the unseen mass `unseen`; the
    full gradient ``∇L̂`` (`grad_w`, `grad_C`, `grad_a`) and the Monte Carlo
    standard error of each component (`grad_se_*`); `grad_norm` ``‖∇L̂‖``.
    Plus `stages` (:class:`StageRecord`), the resolved `config`, `status`
    (``"complete"``, ``"running"``, ``"interrupted"`` or ``"failed: …"``),
    a member's extra blocks `x` (``{block: (T, ...)}``; empty for the paper's model) with
    their gradients `grad_x` and standard errors `grad_se_x` (stored as ``x_<block>``,
    ``grad_x_<block>``, ``grad_se_x_<block>``),
    `versions`, `seed`, `wall` (seconds); `generation`, the number of saves
    so far; `controller`, the step-size controller's state after the last
    saved solve (``{"stage", "t", "state"}``, so a resumed run continues with
    the very steps an uninterrupted one takes), or ``None``; `per_seed`, for a
    stochastic run (R seeds), ``{name: (R, T, ...) array}`` for every name of
    :data:`SEED_ARRAYS` (the ordinary arrays then hold their seed means), else
    ``None`` (:attr:`n_seeds`, :meth:`seed_se`, :meth:`seed_run`); `kl`, once the run is
    integrated, ``{"kl_uniform", "kl_unigram", "kl_bigram"}``, each ``(T,)``: the mean KL from each
    strategy to the model at every saved time (:data:`KL_ARRAYS`; ``gflow.strategies``), else empty.
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
    generation: int = 0
    controller: dict | None = None
    files: dict | None = None
    per_seed: dict[str, np.ndarray] | None = None
    # a member's extra blocks (docs/guides/models.md): {block: (T, ...)} for θ, ∇L̂ and its SE
    x: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    grad_x: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    grad_se_x: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    # the strategies' KL to the model at every saved time, once integrated ({} before; KL_ARRAYS)
    kl: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

    # -- every array, the extra blocks' included ---------------------------------------------
    @property
    def array_names(self) -> tuple[str, ...]:
        """The names of every array of the trajectory: :data:`_ARRAYS` and, per extra block b,
        ``x_b``, ``grad_x_b``, ``grad_se_x_b``."""
        return _ARRAYS + tuple(f"{k}_{b}" for b in sorted(self.x) for k in _EXTRA_KINDS)

    def array(self, name: str) -> np.ndarray:
        """The array `name` (:attr:`array_names`)."""
        for k in _EXTRA_KINDS[::-1]:  # the longest prefix first
            if name.startswith(k + "_") and name not in _ARRAYS:
                return getattr(self, k)[name[len(k) + 1 :]]
        return getattr(self, name)

    def set_array(self, name: str, value) -> None:
        for k in _EXTRA_KINDS[::-1]:
            if name.startswith(k + "_") and name not in _ARRAYS:
                getattr(self, k)[name[len(k) + 1 :]] = value
                return
        setattr(self, name, value)

    @property
    def member(self):
        """The model's member of the family (``gflow.core.member_of(config.model)``)."""
        return member_of(self.config.model)

    def blocks(self, i=slice(None)) -> dict[str, np.ndarray]:
        """θ's blocks by name at saved index (or slice) `i`: ``w``, ``C``, ``a`` and the extras."""
        return {"w": self.w[i], "C": self.C[i], "a": self.a[i], **{b: v[i] for b, v in self.x.items()}}

    def first_layer(self, i):
        """θ without C and a at saved index `i`: ``w[i]`` for the paper's model, else the dict of
        w and the member's extra blocks (``gflow.Params.assemble`` puts θ back together)."""
        if not self.x:
            return self.w[i]
        return {"w": self.w[i], **{b: v[i] for b, v in self.x.items()}}

    @property
    def integrated(self) -> bool:
        """Whether the integration is complete (status ``"complete"`` or :data:`WRITING`)."""
        return self.status in ("complete", WRITING)

    # -- the seed axis of a stochastic run -------------------------------------
    @property
    def n_seeds(self) -> int:
        """R, the number of seeds of a stochastic run; 0 for a deterministic one."""
        return 0 if self.per_seed is None else int(self.per_seed["a"].shape[0])

    def seed_se(self, name: str) -> np.ndarray:
        """The standard error over the seeds of the seed mean of array `name` (``std/√R``,
        ``ddof = 1``; ``inf`` for one seed), shape ``(T, ...)``; ``ValueError`` for a
        deterministic run."""
        if self.per_seed is None:
            raise ValueError("seed_se: a deterministic run has no seed axis")
        x = np.asarray(self.per_seed[name], np.float64)
        R = x.shape[0]
        if R < 2:
            return np.full(x.shape[1:], np.inf)
        return x.std(axis=0, ddof=1) / np.sqrt(R)

    def seed_run(self, r: int) -> Trajectory:
        """Seed r alone: a deterministic-shaped trajectory (``per_seed = None``) with seed r's
        arrays, the same times, stages, configuration and status."""
        if self.per_seed is None:
            raise ValueError("seed_run: a deterministic run has no seed axis")
        out = dataclasses.replace(self, per_seed=None, stages=[dataclasses.replace(s) for s in self.stages], kl={},
                                  x=dict(self.x), grad_x=dict(self.grad_x), grad_se_x=dict(self.grad_se_x))  # fmt: skip
        for k, v in self.per_seed.items():
            out.set_array(k, np.asarray(v[r]))
        return out

    def seed_mean(self) -> Trajectory:
        """The seed-mean trajectory alone (the ordinary arrays, ``per_seed = None``)."""
        return dataclasses.replace(self, per_seed=None, stages=[dataclasses.replace(s) for s in self.stages])

    @property
    def nonfinite(self) -> list[str]:
        """The arrays holding a NaN or an infinity (``[]`` for a sound trajectory). The standard errors
        are included: they are finite for every ``N >= 2``."""
        return [k for k in self.array_names if not np.all(np.isfinite(self.array(k)))]

    # -- derived ------------------------------------------------------------
    @property
    def seed(self) -> int:
        return self.config.estimator.seed

    @property
    def subsets(self) -> tuple[tuple[int, ...], ...]:
        return self.config.model.subsets

    @property
    def labels(self) -> list[str]:
        return [subset_label(S) for S in self.subsets]

    @property
    def c(self) -> np.ndarray:
        return self.C**2

    @property
    def c_frac(self) -> np.ndarray:
        """``c_S/Σc``, ``(T, |𝒮|)``: the selector's shares (the member's, e.g. the official Full
        model's over the sets that normalise κ; ``gflow.core.AbstractModel.shares``)."""
        return np.asarray(self.member.shares(self.blocks()))

    @property
    def s(self) -> np.ndarray:
        """Copier attention of the query ``softmax(w^(h))`` (the member's,
        ``gflow.core.AbstractModel.query_attention``), ``(T, H, M)``."""
        return np.asarray(self.member.query_attention(self.blocks()))

    def dadt(self) -> np.ndarray:
        """``∂ₜa`` at every saved time, ``(T,)``: the flow's own right-hand side for a,
        ``−η_a ∂L̂/∂a`` from the stored gradient (exact at the saved θ, no finite difference),
        on the rows of a stage that moves a (Stage III, the joint schedule); 0 on the rows of
        Stages I and II, where a is frozen. In Stage III, ``∂τa`` on its own clock
        ``τ = t − t₀`` is the same. For ``solver.method = "modified"`` it is the flow's part
        of the modified field (without ``−(η/2)(ΛHΛg)_a``); for GD and SGD the rate of the
        step, ``−η_a ∂L̂/∂a`` per unit time."""
        moves_a = np.isin(self.stage, [STAGE_CODES["III"], STAGE_CODES["joint"]])
        return np.where(moves_a, -float(self.config.schedule.eta_a) * np.asarray(self.grad_a, np.float64), 0.0)

    @property
    def boundaries(self) -> list[float]:
        """End times of the completed stages."""
        return [st.t1 for st in self.stages if st.complete]

    def __len__(self) -> int:
        return len(self.ts)

    # -- building ------------------------------------------------------------
    @classmethod
    def empty(cls, config: Config, H: int, M: int, nS: int, extra: dict | None = None) -> Trajectory:
        """No saved row yet; `extra`: the member's extra blocks' shapes ``{block: shape}``."""
        z = {
            "ts": (0,), "stage": (0,), "w": (0, H, M), "C": (0, nS), "a": (0,), "loss": (0,),
            "loss_se": (0,), "unseen": (0,), "grad_w": (0, H, M), "grad_C": (0, nS), "grad_a": (0,),
            "grad_se_w": (0, H, M), "grad_se_C": (0, nS), "grad_se_a": (0,), "grad_norm": (0,),
        }  # fmt: skip
        arrays = {k: np.zeros(s, dtype=np.int32 if k == "stage" else np.float64) for k, s in z.items()}
        ex = {k: {b: np.zeros((0,) + tuple(sh)) for b, sh in (extra or {}).items()} for k in _EXTRA_KINDS}
        return cls(**arrays, stages=[], config=config, **ex)

    def append(self, **arrays) -> None:
        """Append saved rows (every array of :attr:`array_names`, leading axis = rows); the
        strategies' KL (:attr:`kl`), computed for the rows before, is dropped."""
        self.kl = {}
        for k in self.array_names:
            old = self.array(k)
            self.set_array(k, np.concatenate([old, np.asarray(arrays[k], old.dtype)]))

    def state(self, i: int = -1) -> dict[str, np.ndarray]:
        """θ at saved index ``i``: every block by name."""
        return self.blocks(i)


def _stage_dict(rec: StageRecord) -> dict:
    """A stage record as stored (the stiff switch's fields only where a stage switched)."""
    d = dataclasses.asdict(rec)
    if rec.solver is None:
        d.pop("solver"), d.pop("solver_from")
    return d


def _meta(traj: Trajectory) -> dict:
    return {
        "status": traj.status,
        "generation": traj.generation,
        "config": traj.config.to_dict(),
        "stages": [_stage_dict(s) for s in traj.stages],
        "versions": traj.versions,
        "seed": traj.seed,
        "wall": traj.wall,
        "n_saved": len(traj.ts),
        "controller": traj.controller,
        "seeds": traj.n_seeds,
        "files": traj.files,
    }


def save(traj: Trajectory, out: str | Path) -> Path:
    """Write ``trajectory.npz`` (arrays + metadata) and then ``run.json``
    (metadata) into ``out``, each by an atomic rename, with ``traj.generation``
    bumped: a crash mid-write leaves the previous snapshot intact (see the
    module docstring). Temporary names carry the pid, so no two processes share one."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    traj.generation += 1
    text = json.dumps(_meta(traj), indent=2, default=_json_default)
    seeds = {f"seed_{k}": v for k, v in (traj.per_seed or {}).items()}
    T = len(traj.ts)  # the KL of other rows (arrays cut or extended by hand) is not written: it is recomputed
    kl = {k: traj.kl[k] for k in KL_ARRAYS if k in traj.kl} if all(np.shape(v) == (T,) for v in traj.kl.values()) else {}
    atomic_write_npz(out / "trajectory.npz", **{k: traj.array(k) for k in traj.array_names}, **seeds, **kl,
                     meta=np.array(text))  # fmt: skip
    atomic_write_text(out / "run.json", text)
    return out


def _json_default(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON-serialisable: {type(x)}")


def _extra_kind(name: str) -> str | None:
    """Which kind of extra array an npz entry is (``"x"``, ``"grad_x"``, ``"grad_se_x"``), or ``None``."""
    for k in _EXTRA_KINDS[::-1]:
        if name.startswith(k + "_") and name not in _ARRAYS:
            return k
    return None


def folder_error(path: Path, what: str) -> RunFolderError:
    return RunFolderError(f"{str(path)!r}: {what}")


def load(out: str | Path) -> Trajectory:
    """Read a run folder written by :func:`save`: one snapshot, from ``trajectory.npz``
    (its embedded metadata; ``run.json`` only for folders written before it had them).

    **Raises:** :class:`RunFolderError` naming the file and what is wrong: not a
    folder, not a run (neither file), a missing file, a truncated or foreign
    npz, an invalid ``run.json``, arrays of inconsistent lengths."""
    out = Path(out)
    npz, js = out / "trajectory.npz", out / "run.json"
    if not out.is_dir():
        raise folder_error(out, f"{'is a file' if out.exists() else 'does not exist'}: it holds no gflow run")
    if not npz.is_file() and not js.is_file():
        raise folder_error(out, "holds no gflow run: expected trajectory.npz and run.json (written by `gflow run`)")
    if not npz.is_file():
        raise folder_error(npz, "is missing (run.json is there): the run folder is incomplete")
    try:
        with np.load(npz, allow_pickle=False) as z:
            missing = [k for k in _ARRAYS if k not in z.files]
            if missing:
                raise folder_error(npz, f"is not a gflow trajectory: arrays {missing} are missing")
            arrays = {k: np.asarray(z[k]) for k in _ARRAYS}
            extra = {k: {n[len(k) + 1 :]: np.asarray(z[n]) for n in z.files if _extra_kind(n) == k} for k in _EXTRA_KINDS}
            per_seed = {n[5:]: np.asarray(z[n]) for n in z.files if n.startswith("seed_")}
            kl = {n: np.asarray(z[n]) for n in KL_ARRAYS if n in z.files}
            text = str(z["meta"][()]) if "meta" in z.files else None
    except RunFolderError:
        raise
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError) as e:
        raise folder_error(npz, f"is unreadable (truncated or not an npz file): {type(e).__name__}: {e}") from None
    if text is None:  # written before the metadata was embedded
        if not js.is_file():
            raise folder_error(js, "is missing (trajectory.npz is there): the run folder is incomplete")
        try:
            text = js.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise folder_error(js, f"is unreadable: {e}") from None
        where = js
    else:
        where = npz
    try:
        meta: dict[str, Any] = json.loads(text)
    except json.JSONDecodeError as e:
        raise folder_error(where, f"holds invalid JSON metadata: {e}") from None
    if not isinstance(meta, dict) or not {"status", "config", "stages"} <= set(meta):
        raise folder_error(where, "holds no gflow run metadata (keys status, config, stages)")
    try:
        config = from_dict(meta["config"])
        stages = [StageRecord(**s) for s in meta["stages"]]
    except (ValueError, TypeError) as e:
        raise folder_error(where, f"holds an invalid run configuration or stage list: {e}") from None
    T = len(arrays["ts"])
    bad = [k for k in _ARRAYS if arrays[k].ndim == 0 or len(arrays[k]) != T]
    bad += [f"{k}_{b}" for k in _EXTRA_KINDS for b, v in extra[k].items() if v.ndim == 0 or len(v) != T]
    bad += [k for k, v in kl.items() if v.shape != (T,)]
    if kl and set(kl) != set(KL_ARRAYS):
        bad.append(f"{', '.join(KL_ARRAYS)} (some missing)")
    if not (set(extra["x"]) == set(extra["grad_x"]) == set(extra["grad_se_x"])):
        bad.append("x_* / grad_x_* / grad_se_x_* (not the same blocks)")
    if bad or meta.get("n_saved", T) != T:
        raise folder_error(
            npz, f"is inconsistent: {T} saved times, but arrays {bad} and n_saved = {meta.get('n_saved')}"
        )
    seed_names = set(SEED_ARRAYS) | {f"{k}_{b}" for k in _EXTRA_KINDS for b in extra[k]}
    full = {**arrays, **{f"{k}_{b}": v for k in _EXTRA_KINDS for b, v in extra[k].items()}}
    if per_seed and (set(per_seed) != seed_names or any(
            v.shape[1:] != full[k].shape or v.shape[0] != per_seed["a"].shape[0] or v.shape[0] < 1
            for k, v in per_seed.items())):  # fmt: skip
        raise folder_error(npz, f"is inconsistent: its seed arrays {sorted(per_seed)} do not have the shapes (R, T, ...) "
                                "of the trajectory's arrays")  # fmt: skip
    n_meta = meta.get("seeds", 0)
    if isinstance(n_meta, bool) or not isinstance(n_meta, int) or n_meta != (per_seed["a"].shape[0] if per_seed else 0):
        raise folder_error(npz, f"is inconsistent: the metadata says {meta.get('seeds')} seeds, the arrays "
                                f"{per_seed['a'].shape[0] if per_seed else 0}")  # fmt: skip
    return Trajectory(
        per_seed=per_seed or None,
        **arrays,
        stages=stages,
        config=config,
        status=meta["status"],
        versions=meta.get("versions", {}),
        wall=meta.get("wall", 0.0),
        generation=int(meta.get("generation", 0)),
        controller=meta.get("controller"),
        files=meta.get("files") if isinstance(meta.get("files"), dict) else None,
        kl=kl,
        **extra,
    )


# ---------------------------------------------------------------------------
# The files a run lists (its outputs), and its status
# ---------------------------------------------------------------------------


def file_record(path: Path) -> dict:
    """``{"bytes": size, "sha256": hex}`` of a file."""
    import hashlib

    data = Path(path).read_bytes()
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _whole(path: Path, rec) -> bool:
    if not isinstance(rec, dict) or not path.is_file():
        return False
    try:
        return rec.get("bytes", 0) > 0 and file_record(path) == {"bytes": rec["bytes"], "sha256": rec.get("sha256")}
    except OSError:
        return False


def missing_outputs(out: str | Path, traj: Trajectory) -> list[str]:
    """The files `traj`'s manifest lists that are not (or no longer) whole in `out`."""
    out = Path(out)
    return [n for n, rec in (traj.files or {}).items() if not _whole(out / n, rec)]


def record_outputs(out: str | Path, names) -> tuple[str, list[str]]:
    """Record the files `names` (relative to `out`) that a command has just written whole in the
    run's manifest; the status becomes ``"complete"`` when every listed file is whole, else
    :data:`WRITING`. Call it under the folder's lock. A run without a manifest (``gflow.integrate``
    without ``outputs``, or written before manifests) or not integrated is left as it is.
    Returns ``(status, missing files)``."""
    out = Path(out)
    traj = load(out)
    if traj.files is None or not traj.integrated:
        return traj.status, []
    files = dict(traj.files)
    for n in names:
        n = str(n)
        if n in files and (out / n).is_file() and (out / n).stat().st_size > 0:
            files[n] = file_record(out / n)
    missing = [n for n, rec in files.items() if not _whole(out / n, rec)]
    status = "complete" if not missing else WRITING
    if files != traj.files or status != traj.status:
        traj.files, traj.status = files, status
        save(traj, out)
    return status, missing


def run_status(out: str | Path) -> str:
    """The run's status, with its listed files re-verified: ``"complete"`` only when the
    integration is complete and every file of its manifest is whole; else the saved status, or
    ``"incomplete: <files> missing or damaged"``."""
    traj = load(out)
    if traj.status != "complete":
        return traj.status
    bad = missing_outputs(out, traj)
    return f"incomplete: {', '.join(bad)} missing or damaged" if bad else "complete"


# The figures of a run (gflow.figures draws them; the run layer cleans their temporaries)
FIGURE_NAMES = ("c_frac", "copier", "a_vs_logt", "rate", "loss", "summary", "strategies")


# ---------------------------------------------------------------------------
# The set Stage I selected
# ---------------------------------------------------------------------------


def selected_set(traj) -> tuple[int, ...] | None:
    """The set Stage I selected: Stage II's heads (recorded by the flow), else
    ``argmax c/Σc`` at the end of Stage I (or of a joint run); ``None`` if the run
    has no saved Stage I."""
    rec = next((r for r in traj.stages if r.name == "II"), None)
    if rec is not None and rec.selected is not None:
        return tuple(int(h) for h in rec.selected)
    for name in ("I", "joint"):
        idx = rows_of_stage(traj.stage, name)
        if idx.size:
            return tuple(traj.subsets[int(np.argmax(traj.c_frac[int(idx[-1])]))])
    return None
