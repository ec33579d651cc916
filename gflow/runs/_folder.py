"""Run folders: the only place where gflow takes locks, writes runs and keeps caches.

- :func:`check_output` and :func:`lock`: an output location checked before any
  compute, and one writer per folder (an exclusive, non-blocking
  ``fcntl.flock`` on ``DIR/.lock`` recording the holder's pid; re-entrant within
  a process; it dies with its process, so a killed run leaves no stale lock).
- :class:`RunFolder`: the hook through which the solves of ``gflow.dynamics``
  save their snapshots, read a run to resume, and mark it interrupted. The
  solves themselves write nothing.
- :func:`integrate` and :func:`integrate_batch`: the solves with a run folder.
- :func:`load_or_compute`: a run's theory, cached in ``theory.json``.
- :func:`check_run` and :func:`plot_run`: the report and the figures of a saved run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import sys
import threading
from pathlib import Path

from .._util import atomic_write_json, atomic_write_text, jsonable, remove_temporaries
from ..checks import Report, check
from ..config import Config
from ..core import Params, PopulationLoss, make_loss
from ..dynamics import integrate as integrate_flow
from ..dynamics import integrate_batch_with_errors as integrate_batch_flows
from ..dynamics import integrate_stochastic
from ..figures import FORMATS, draw_run
from ..theory import Theory, config_key, strategy_arrays, theory_report
from ..trajectory import FIGURE_NAMES, Trajectory, folder_error, load, save, selected_set
from ._spectrum import run_spectrum, saved_spectrum

_HELD: dict[str, list] = {}  # resolved folder -> [open lock file, depth]: re-entrant within a process


def check_output(out: str | Path) -> Path:
    """Check, before any compute, that ``out`` can be a run folder: it is a folder or does not exist,
    no part of its path is a file, and it (or its first existing parent) is writable. Creates it.

    **Raises:** :class:`gflow.RunFolderError` naming the path and the problem."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise folder_error(out, "is a file, not a folder: --out must name a folder")
    p = out
    while not p.exists():
        if p.parent == p:
            break
        p = p.parent
    if p.exists() and not p.is_dir():
        raise folder_error(out, f"lies under {str(p)!r}, which is a file, not a folder")
    if not os.access(p, os.W_OK | os.X_OK):
        raise folder_error(p, "is not writable: cannot write the run there")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise folder_error(out, f"cannot be created: {e.strerror}") from None
    return out


@contextlib.contextmanager
def lock(out: str | Path):
    """Hold the exclusive lock of the run folder ``out`` (``fcntl.flock`` on ``out/.lock``,
    non-blocking; the lock file records the holder's pid). Re-entrant within one process.
    Creates the folder (:func:`check_output`).

    **Raises:** :class:`gflow.RunFolderError` at once if another process holds it."""
    out = check_output(out)
    key = os.path.realpath(out)
    if key in _HELD:
        _HELD[key][1] += 1
        try:
            yield out
        finally:
            _HELD[key][1] -= 1
        return
    path = out / ".lock"
    try:
        f = open(path, "a+")  # noqa: SIM115 (held open for as long as the lock)
    except OSError as e:
        raise folder_error(path, f"cannot be opened: {e.strerror}") from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "?"
        f.close()
        raise folder_error(
            out,
            f"is locked by another gflow process (pid {holder}) writing it; wait for it to end or use another folder",
        ) from None
    f.seek(0)
    f.truncate()
    f.write(str(os.getpid()))
    f.flush()
    # left by a writer killed mid-save (none is alive now)
    remove_temporaries(out, "trajectory.npz", "run.json", "theory.json", "report.json", "report.md",
                       *(f"figures/{n}.{x}" for n in (*FIGURE_NAMES, "seeds") for x in FORMATS))  # fmt: skip
    _HELD[key] = [f, 1]
    try:
        yield out
    finally:
        _HELD[key][1] -= 1
        if _HELD[key][1] == 0:
            del _HELD[key]
            fcntl.flock(f, fcntl.LOCK_UN)
            f.close()


# The files of a run that ``overwrite`` replaces (other files in the folder are left alone).
_STALE = ("trajectory.npz", "run.json", "report.json", "report.md", "theory.json", "spectrum.npz")
#: What an overwritten run discards: those files and the figures folder (:meth:`RunFolder.remove_stale`).
STALE_FILES = (*_STALE, "figures")


class RunFolder:
    """A run folder as the solves see it: ``lock``, ``save``, ``load``, ``holds_run``,
    ``remove_stale`` and ``mark_interrupted``. ``str()`` is its path."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.loss: PopulationLoss | None = None  # the run's estimator, once drawn (integrate's on_loss)

    def __str__(self) -> str:
        return str(self.path)

    def __fspath__(self) -> str:
        return str(self.path)

    def lock(self):
        return lock(self.path)

    def save(self, traj: Trajectory) -> None:
        """Write `traj`; an integrated run (``traj.integrated``) with its strategies' KL
        (:func:`with_strategies`, on the folder's `loss`, the run's estimator once drawn)."""
        with_strategies(traj, self.loss)
        save(traj, self.path)

    def load(self) -> Trajectory:
        return load(self.path)

    def holds_run(self) -> bool:
        return (self.path / "run.json").exists() or (self.path / "trajectory.npz").exists()

    def remove_stale(self) -> None:
        """``overwrite``: remove the old run's files, its reports and its figures."""
        for name in _STALE:
            (self.path / name).unlink(missing_ok=True)
        if (self.path / "figures").is_dir():
            shutil.rmtree(self.path / "figures")

    def mark_interrupted(self) -> None:
        """Set the status of the last saved snapshot to "interrupted" (the in-memory state may be
        half-way through a segment; the snapshot is whole)."""
        if (self.path / "trajectory.npz").is_file():
            traj = load(self.path)
            if traj.status == "running":
                traj.status = "interrupted"
                save(traj, self.path)


def _folder(out) -> RunFolder | None:
    return None if out is None else out if isinstance(out, RunFolder) else RunFolder(out)


def with_strategies(traj: Trajectory, loss: PopulationLoss | None = None) -> Trajectory:
    """`traj` with :attr:`~gflow.Trajectory.kl` (the mean KL from Edelman et al.'s three
    strategies to the model at every saved time, ``gflow.theory.strategy_arrays``) once it is
    integrated, computed on `loss` (the run's estimator; default: drawn again from its
    configuration) unless already there; a run still integrating, or failed, is left as it is."""
    if traj.integrated and len(traj.ts) and not traj.kl:
        traj.kl = strategy_arrays(traj, loss)
    return traj


def integrate(
    config: Config = Config(),
    *,
    out: str | Path | None = None,
    resume: bool = False,
    overwrite: bool = False,
    loss: PopulationLoss | None = None,
    params0: Params | None = None,
    verbose: bool = False,
    throw: bool = True,
    outputs: list[str] | None = None,
    on_loss=None,
) -> Trajectory:
    """Run the training ``config.solver.method`` names and return its trajectory: a flow
    (adaptive solvers, GD, or any other flow method of the configuration) through the
    stage loop, or a stochastic method (``"sgd"``, ``"sde"``: ``sgd.seeds`` seeds) through
    :func:`gflow.dynamics.integrate_stochastic`, a trajectory with a seed axis
    (:attr:`~gflow.Trajectory.per_seed`; its ordinary arrays the seed means) whose seeds
    are those of :func:`gflow.sgd` / :func:`gflow.sde` of the configuration.

    **Arguments:**

    - `config`: the run (``Config()`` is the paper's default staged run).
    - `out`: a folder; if given, ``trajectory.npz`` and ``run.json`` are
      written there after every segment.
    - `resume`: continue the run saved in `out` from its last saved state
      (with the step-size controller's saved state: the same steps as an
      uninterrupted run), up to the (possibly later) end times of ``config``
      — e.g. a longer Stage III. Every setting that defines the trajectory so
      far must equal the saved run's. A stochastic run is not continued: `resume` returns
      its saved run when complete and made by the same configuration, else ``ValueError``.
    - `overwrite`: allow writing over a run already saved in `out` (without
      it, that is an error: a finished run is never replaced silently); the
      old run's files, reports and figures are removed first.
    - `loss`: an estimator to reuse (default: ``make_loss`` from the config's
      seed; passing the same one to several runs compares them on one sample).
    - `params0`: the initial θ (default: the paper's initialisation).
    - `verbose`: print a line per segment.
    - `throw`: raise :class:`~gflow.FlowError` when the integration fails (default,
      as diffrax's ``throw=True``); with ``throw=False`` the partial trajectory
      is returned instead, its ``status`` saying ``"failed: Stage … at t = …: why"``.
    - `outputs`: the files (relative to `out`) the caller writes after the integration (``gflow run``:
      the report and the figures): the run ends with the status ``gflow.trajectory.WRITING`` and
      these names in its ``files`` manifest, and becomes ``"complete"`` when they are recorded whole
      (``gflow.trajectory.record_outputs``).
    - `on_loss`: called with the run's estimator once the request has been checked and its sample
      drawn, before anything is integrated (``gflow run`` starts the report's theory then:
      :class:`TheoryAhead`).

    With `out`, the folder's lock (:func:`lock`) is held for the whole
    integration, and a ``KeyboardInterrupt`` (SIGINT) marks the saved run
    ``"interrupted"`` (its last saved snapshot, resumable) before it propagates.

    **Returns:** a :class:`~gflow.Trajectory`.

    **Raises:** :class:`~gflow.FlowError` (with the partial trajectory), unless
    ``throw=False``, when a stage's solve fails or its vector field is not finite;
    ``RunFolderError`` (a ``ValueError``) when `out` is locked by another
    process or cannot be written.
    """
    run = integrate_stochastic if config.solver.is_stochastic else integrate_flow
    folder, drawn = _folder(out), [loss]

    def start(est):  # the run's estimator, for the strategies' KL at its end (RunFolder.save)
        drawn[0] = est
        if folder is not None:
            folder.loss = est
        if on_loss is not None:
            on_loss(est)

    traj = run(config, out=folder, resume=resume, overwrite=overwrite, loss=loss, params0=params0,
               verbose=verbose, throw=throw, outputs=outputs, on_loss=start)  # fmt: skip
    return with_strategies(traj, drawn[0])


def integrate_batch_with_errors(configs, *, outs=None, resume=False, overwrite=False, verbose=False):
    """:func:`integrate_batch`, also returning each replicate's :class:`~gflow.FlowError` (or ``None``)."""
    folders = None if outs is None else [_folder(o) for o in outs]
    trajs, errors = integrate_batch_flows(configs, outs=folders, resume=resume, overwrite=overwrite, verbose=verbose)
    return [with_strategies(t) for t in trajs], errors


def integrate_batch(
    configs: list[Config],
    *,
    outs: list[str | Path | None] | None = None,
    resume: bool | list[bool] = False,
    overwrite: bool = False,
    verbose: bool = False,
    throw: bool = True,
) -> list[Trajectory]:
    """Integrate the gradient flows of `configs` as one vmapped batch.

    **Arguments:**

    - `configs`: the runs; they must differ only in ``estimator.seed``.
    - `outs`: one folder (or ``None``) per configuration: each trajectory is
      written there as :func:`integrate` writes it (after every solve,
      at the end of every stage, at the end).
    - `resume`: continue the runs saved in `outs` (one flag for all, or one
      per configuration), each as :func:`integrate` with ``resume=True``
      continues it: from its own last saved state and time, with its saved
      step-size controller state, up to the (possibly later) end times of its
      configuration. Resumed and new runs may share a batch: a replicate idles
      through the stages it has already completed.
    - `overwrite`: allow writing over runs already saved in `outs` (those not resumed).
    - `verbose`: a line per batched solve.
    - `throw`: after the whole batch has run, raise the first failed
      replicate's :class:`~gflow.FlowError` (default, like
      :func:`integrate`); with ``throw=False`` every trajectory is
      returned, a failed one with the status ``"failed: …"``.

    **Returns:** one :class:`~gflow.Trajectory` per configuration, equal to
    :func:`integrate` of it (resuming it, if resumed) to rounding. A failed
    replicate's trajectory has the status ``"failed: …"`` that :func:`integrate`
    would have raised with; it is kept (and written to its folder) whatever `throw` is.

    **Raises:** ``ValueError`` for an empty list, configurations that differ
    in more than the seed, `outs` or `resume` of another length, a folder that
    already holds a run (without `overwrite` or `resume`), or a saved run that
    cannot be resumed with its configuration; what :func:`gflow.load`
    raises for a resumed folder without a readable run.
    """
    trajs, errors = integrate_batch_with_errors(configs, outs=outs, resume=resume, overwrite=overwrite, verbose=verbose)
    first = next((e for e in errors if e is not None), None)
    if throw and first is not None:
        raise first
    return trajs


class TheoryAhead:
    """A run's theory (:func:`gflow.theory_report` of its configuration, as :func:`load_or_compute`
    computes it) computed in a background thread while the run integrates: the theory needs the
    run's configuration and sample only, not its trajectory. `loss`: the run's estimator (start it
    from :func:`integrate`'s `on_loss`, once the request is checked and the sample drawn).
    :meth:`theory` waits for it and raises what the computation raised; :func:`load_or_compute`
    takes it as `ahead` (the same numbers as computing it then: the same function on the same
    sample)."""

    def __init__(self, cfg: Config, loss: PopulationLoss, *, n_pi: int = 2000, pi_seed: int = 0):
        self.cfg, self.n_pi, self.pi_seed = cfg, int(n_pi), int(pi_seed)
        self.loss = loss
        self._done = threading.Event()
        self._result: Theory | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name="gflow-theory-ahead")
        self._thread.start()

    def _work(self) -> None:
        cfg, sc = self.cfg, self.cfg.schedule
        try:
            self._result = theory_report(cfg.data, cfg.model, cfg.estimator, cfg.init, n_pi=self.n_pi,
                                         pi_seed=self.pi_seed, loss=self.loss, eta_C=sc.eta_C, delta=sc.delta)  # fmt: skip
        except BaseException as e:  # noqa: BLE001 (raised in the caller's thread by theory())
            self._error = e
        finally:
            self._done.set()

    def join(self) -> None:
        """Wait for the computation (its outcome is kept for :meth:`theory`)."""
        self._thread.join()

    def theory(self) -> Theory:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._result


def load_or_compute(
    run_dir,
    traj=None,
    *,
    n_pi: int = 2000,
    pi_seed: int = 0,
    loss: PopulationLoss | None = None,
    reuse: bool = True,
    write: bool = True,
    ahead: TheoryAhead | None = None,
) -> tuple[Theory, str]:
    """The theory of the run saved in `run_dir`, with the GIH law of the set its
    Stage I selected: ``run_dir/theory.json`` when it belongs to the run, else computed.

    A cached theory belongs to the run when its :attr:`gflow.Theory.config` equals
    ``config_key`` of the run's data, model, estimator and initialisation
    sections (every field, so options added later count), `n_pi`, `pi_seed` and
    the schedule's ``η_C`` and ``δ``. An unreadable file, one of another
    configuration, or one written by an older gflow is recomputed
    (:func:`gflow.theory_report` with the run's sample: ``make_loss`` of its
    configuration, or `loss`). The selected set's law is added when missing.
    With `write` the file is (re)written atomically when anything changed.

    The file carries the SHA-256 of its content (:func:`theory_digest`; its key is part of it): a
    file whose checksum does not match (edited, damaged, or from before checksums) is recomputed,
    never trusted, with a one-line note on stderr.

    `ahead`: the theory computed while the run integrated (:class:`TheoryAhead`, of the run's
    configuration and the same `n_pi` and `pi_seed`), used instead of computing it here.

    **Returns:** ``(theory, how)``, `how` ``"reused"``, ``"reused, law added"`` or ``"computed"``.
    """
    run_dir = Path(run_dir)
    traj = load(run_dir) if traj is None else traj
    cfg = traj.config
    sc = cfg.schedule
    key = config_key(cfg.data, cfg.model, cfg.estimator, cfg.init, n_pi=1 if cfg.data.kernel is not None else n_pi,
                     pi_seed=pi_seed, eta_C=sc.eta_C, delta=sc.delta)  # fmt: skip
    key["n_pi_asked"] = int(n_pi)
    path = run_dir / "theory.json"
    theory, how = None, "computed"
    if reuse and path.is_file():
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(d, dict) or d.pop("sha256", None) != theory_digest(d):
                # edited, damaged or written before checksums: never trusted
                print(f"gflow: note: {str(path)!r} does not match its checksum: the theory is recomputed",
                      file=sys.stderr)  # fmt: skip
            else:
                th = Theory.from_json(d)
                if jsonable(th.config) == key:
                    theory, how = th, "reused"
        except Exception:  # any unreadable or malformed file: recomputed, never trusted  # noqa: BLE001
            theory = None
    needs_loss = theory is None or selected_set(traj) not in (None, *theory.laws)
    if needs_loss and loss is None:
        loss = make_loss(cfg.data, cfg.model, cfg.estimator)
    if theory is None:
        if ahead is not None and (ahead.cfg, ahead.n_pi, ahead.pi_seed) == (cfg, int(n_pi), int(pi_seed)):
            theory = ahead.theory()
        else:
            theory = theory_report(cfg.data, cfg.model, cfg.estimator, cfg.init, n_pi=n_pi, pi_seed=pi_seed,
                                   loss=loss, eta_C=sc.eta_C, delta=sc.delta)  # fmt: skip
        theory = dataclasses.replace(theory, config=key)  # the one identity rule: the run's key
    sel = selected_set(traj)
    if sel is not None and sel not in theory.laws:
        theory = theory.with_law(loss, sel)
        how = "reused, law added" if how == "reused" else how
    if write and how != "reused":
        save_theory(path, theory)
    return theory, how


def theory_digest(d: dict) -> str:
    """The checksum ``theory.json`` carries: SHA-256 of its content (every key but ``"sha256"``,
    the run's key in ``"config"`` included), serialized canonically (sorted keys)."""
    body = {k: v for k, v in d.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(jsonable(body), sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def save_theory(path, theory: Theory | dict) -> None:
    """Write ``theory.json`` (a :class:`gflow.Theory` or its JSON dict) atomically, with its checksum
    (:func:`theory_digest`), as :func:`load_or_compute` reads it."""
    d = jsonable(theory.to_json() if isinstance(theory, Theory) else dict(theory))
    d.pop("sha256", None)
    d["sha256"] = theory_digest(d)
    atomic_write_json(path, d)


def check_run(
    out_dir: str | Path,
    *,
    n_pi: int = 2000,
    pi_seed: int = 0,
    reuse_theory: bool = True,
    write: bool = True,
    loss: PopulationLoss | None = None,
    theory: tuple | None = None,
    **kw,
) -> Report:
    """Check the run saved in `out_dir` and write its report (docs/theory/mathematics.md §M7).

    Loads the run (:func:`gflow.trajectory.load`; ``FileNotFoundError`` for a
    folder without a run), takes its theory from
    :func:`~gflow.runs.load_or_compute` (``theory.json`` when it belongs to
    the run, else computed on the run's sample; `reuse_theory=False` forces a
    recomputation; or `theory`, the ``(Theory, how)`` that
    :func:`~gflow.runs.load_or_compute` already returned for this run), then
    :func:`check` (further keywords go to it). With
    `write`, writes ``theory.json``, ``report.json`` (:meth:`Report.to_json`)
    and ``report.md`` into `out_dir`, each atomically.
    """
    out = Path(out_dir)
    traj = load(out)
    cfg = traj.config
    if loss is None:
        loss = make_loss(cfg.data, cfg.model, cfg.estimator)
    if theory is None:
        theory = load_or_compute(out, traj, n_pi=n_pi, pi_seed=pi_seed, loss=loss, reuse=reuse_theory, write=write)
    theory, how = theory
    report = check(traj, theory=theory, loss=loss, n_pi=n_pi, pi_seed=pi_seed, **kw)
    report.notes.insert(0, f"theory {'computed' if how == 'computed' else 'reused from theory.json'}")
    if write:
        atomic_write_json(out / "report.json", report.to_json())
        atomic_write_text(out / "report.md", report.to_markdown())
    return report


def plot_run(run_dir: str | Path, figdir: str | Path | None = None, *, fmt: str = "png", theory=None,
             spectrum: bool | None = None) -> list[Path]:  # fmt: skip
    """Draw every figure of the run saved in `run_dir` into `figdir` (default ``run_dir/figures``),
    with the run's theory from :func:`load_or_compute` unless `theory` (a :class:`~gflow.Theory`)
    is given. The sharpness figure (``sharpness.png``: λ_max(ΛH) along the run, docs/theory/mathematics.md §M9) is
    drawn from the run's Hessian spectrum: with ``spectrum=True`` computed if needed
    (:func:`run_spectrum`, kept in ``spectrum.npz``), with ``None`` (default) only when
    ``spectrum.npz`` already belongs to the run, with ``False`` never. **Returns:** the paths written."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    run_dir = Path(run_dir)
    traj = load(run_dir)
    if theory is None:
        theory = load_or_compute(run_dir, traj)[0]
    spec = None
    if spectrum:
        spec = run_spectrum(run_dir, traj)
    elif spectrum is None:
        spec = saved_spectrum(run_dir, traj)
    return draw_run(run_dir, figdir, fmt=fmt, theory=theory, traj=traj, spectrum=spec)
