"""Executors: the points of a grid on any engine with ``concurrent.futures.Executor.submit``
(docs/guides/running.md, "Grids on many cores and machines").

:func:`gflow.run_phase`, :func:`gflow.run_sweep`, :func:`gflow.run_replicates` and
:func:`gflow.evaluate` take ``executor=``: ``None`` (or ``"serial"``, the default: every point
in this process, as before), a spec string (the command line's ``--executor``) or any object
with ``submit(fn, *args)`` returning a future (``.done()``, ``.result()``): a
``concurrent.futures.ProcessPoolExecutor``, ``dask.distributed.Client(...).get_executor()``,
``submitit.AutoExecutor(...)``.

=================  ==============================================================================
spec               engine
=================  ==============================================================================
``serial``         this process, point after point (the default)
``processes:N``    N local worker processes (``ProcessPoolExecutor``, ``spawn`` start: JAX is not
                   fork-safe)
``dask-local:N``   a ``dask.distributed.LocalCluster`` of N worker processes, one thread each
                   (``pip install 'gflow[cluster]'``)
``dask:ADDRESS``   the Dask scheduler at ADDRESS (``tcp://host:8786``), e.g. one that
                   ``dask-jobqueue`` started on a SLURM cluster
=================  ==============================================================================

**What runs where.** A point's work is a top-level function of plain data (a configuration
dictionary, the point's values, the files of its run folder when it is resumed), run by
:func:`call` in the worker; it computes in a private scratch folder and returns plain values
(numbers, dictionaries, the bytes of the run folder's files). Only this process, the
coordinator, writes the grid's folder (one writer): each result is written as it arrives, the
point's record last, so a folder never holds half a point.

**The same numbers.** Every task carries the coordinator's environment
(:func:`worker_environment`): the worker refuses to run a point when its gflow, jax, jaxlib,
diffrax, equinox, optimistix, numpy or gflow's source differ from the coordinator's (the
fingerprint of the program cache) or its ``XLA_FLAGS`` differ, and runs it with the
coordinator's float64 flag, equinox's error mode and compilation caches. The points are the
functions the serial run calls, so a grid's files hold the serial run's numbers bit for bit
(``tests/test_executor.py``).

**Lost workers.** A worker process that dies mid-point (killed, out of memory, its machine
lost) loses only that point's unfinished work: the point is submitted again, up to
:data:`RETRIES` times (Dask also reschedules it itself; a ``processes:N`` pool that a dead
worker broke is replaced by a new one); a point still lost after that is recorded as lost and
the grid raises :class:`GridIncomplete` once every other point is written: running the same
command again (``--resume`` for sweeps and replicates) computes only what is missing. An
exception raised by a point's own computation is raised in the coordinator after the points
already running have been written (the ones not started are cancelled).

**Many programs in one process.** Each compiled program holds memory maps of its own, and
jaxlib dies of a segmentation fault when a process reaches the kernel's cap on them
(``vm.max_map_count``): after each point, the serial loop and every worker free the compiled
programs once the process holds half the cap (:func:`gflow._util.relieve_memory_maps`), which
changes no number, only the time of the next compilations.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib.util
import multiprocessing
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .._util import atomic_write_bytes, export_cache_folder, relieve_memory_maps, source_fingerprint

__all__ = [
    "EXECUTOR_FORMS",
    "RETRIES",
    "GridIncomplete",
    "call",
    "check_executor",
    "folder_files",
    "open_executor",
    "put_folder_files",
    "run_points",
    "scratch_folder",
    "worker_environment",
]

#: The spec strings ``--executor`` accepts (module docstring).
EXECUTOR_FORMS = ("serial", "processes:N", "dask-local:N", "dask:ADDRESS")
#: How many times a point whose worker was lost is submitted again.
RETRIES = 2

# Exceptions that mean "the worker was lost", not "the point's computation failed": a broken
# process pool, Dask's KilledWorker (a task whose workers died too often) and closed
# connections, submitit's job that ended without a result.
_LOST_NAMES = {"KilledWorker", "CommClosedError", "StreamClosedError", "UncompletedJobError", "FutureCancelledError"}


class GridIncomplete(RuntimeError):
    """A grid whose points were not all computed because their workers were lost.

    `lost`: ``{index: why}``; `result`: what the grid's function returns, for the points that
    were (a :class:`gflow.PhaseResult`, :class:`gflow.SweepResult`, … or ``None``). Everything finished is
    written; running the grid again computes the lost points."""

    def __init__(self, what: str, lost: dict[int, str], result: Any = None, hint: str = ""):
        self.lost, self.result = dict(lost), result
        ks = sorted(lost)
        why = lost[ks[0]] if ks else ""
        super().__init__(
            f"{what}: {len(ks)} point{'s' if len(ks) != 1 else ''} not computed, their workers lost "
            f"(indices {ks[:10]}{' …' if len(ks) > 10 else ''}; {why}); every other point is written"
            + (f"; {hint}" if hint else "")
        )


# ---------------------------------------------------------------------------
# Specs and engines
# ---------------------------------------------------------------------------


def _bad(spec, why: str = "") -> ValueError:
    return ValueError(
        f"--executor {spec!r}{': ' + why if why else ''}; allowed: {', '.join(EXECUTOR_FORMS)} "
        "(N a positive integer), or in Python any object with submit(fn, *args)"
    )


def check_executor(spec) -> tuple[str, Any]:
    """Validate an executor before any computation: ``(kind, arg)`` with kind ``"serial"``,
    ``"processes"``, ``"dask-local"``, ``"dask"`` or ``"object"`` (an object with ``submit``).
    **Raises** ``ValueError`` naming ``--executor`` and the allowed forms, or the missing package
    (``dask.distributed``: ``pip install 'gflow[cluster]'``)."""
    if spec is None:
        return "serial", None
    if not isinstance(spec, str):
        if callable(getattr(spec, "submit", None)):
            return "object", spec
        raise _bad(spec, "not a spec string and has no submit(fn, *args) method")
    kind, sep, arg = spec.strip().partition(":")
    if kind == "serial" and not sep:
        return "serial", None
    if kind in ("processes", "dask-local"):
        if not (sep and arg.isdigit() and int(arg) >= 1):
            raise _bad(spec, f"{kind}:N needs a positive integer N of worker processes")
        n = int(arg)
        if n > 4096:
            raise _bad(spec, f"at most 4096 worker processes, got {n}")
        out = kind, n
    elif kind == "dask":
        if not (sep and arg.strip()):
            raise _bad(spec, "dask:ADDRESS needs the scheduler's address, e.g. dask:tcp://10.0.0.1:8786")
        out = kind, arg.strip()
    else:
        raise _bad(spec, "unknown executor")
    if kind.startswith("dask") and importlib.util.find_spec("distributed") is None:
        raise ValueError(f"--executor {spec!r} needs dask.distributed, which is not installed: "
                         "pip install 'gflow[cluster]'")  # fmt: skip
    return out


class _Engine:
    """An executor and how to replace it (a process pool broken by a dead worker)."""

    def __init__(self, executor, *, remake: Callable[[], Any] | None = None, close=None):
        self.executor, self._remake, self._close = executor, remake, close
        self.generation = 0

    def replace(self) -> bool:
        """A new executor for a broken one (``False`` when this one cannot be replaced)."""
        if self._remake is None:
            return False
        with contextlib.suppress(Exception):
            self.executor.shutdown(wait=False, cancel_futures=True)
        self.executor = self._remake()
        self.generation += 1
        return True

    def close(self) -> None:
        if self._close is not None:
            self._close(self)


def _process_pool(n: int):
    return concurrent.futures.ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("spawn"))


@contextlib.contextmanager
def open_executor(spec) -> Iterator[_Engine | None]:
    """The engine of a validated `spec` (:func:`check_executor`) for the duration of a grid:
    ``None`` for serial; a pool or cluster gflow starts is shut down on exit, an object the
    caller gave is left running."""
    kind, arg = check_executor(spec)
    if kind == "serial":
        yield None
        return
    if kind == "object":
        yield _Engine(arg)
        return
    if kind == "processes":
        eng = _Engine(_process_pool(arg), remake=lambda: _process_pool(arg),
                      close=lambda e: e.executor.shutdown(wait=True, cancel_futures=True))  # fmt: skip
    else:
        from distributed import Client, LocalCluster

        if kind == "dask-local":
            cluster = LocalCluster(n_workers=arg, threads_per_worker=1, processes=True, dashboard_address=None)
            client = Client(cluster)
        else:
            cluster, client = None, Client(arg)

        def close(_e, client=client, cluster=cluster):
            client.close()
            if cluster is not None:
                cluster.close()

        eng = _Engine(client.get_executor(), close=close)
    try:
        yield eng
    finally:
        eng.close()


# ---------------------------------------------------------------------------
# The worker's side
# ---------------------------------------------------------------------------


def worker_environment() -> dict[str, Any]:
    """What a worker must share with this process for the same numbers (module docstring):
    gflow's fingerprint, ``XLA_FLAGS``, the float64 flag, equinox's error mode, the caches."""
    import jax
    from equinox import _errors

    exp = export_cache_folder()
    return {
        "fingerprint": source_fingerprint(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "x64": bool(jax.config.jax_enable_x64),
        "eqx_on_error": getattr(_errors, "EQX_ON_ERROR", None),
        "compilation_cache_dir": jax.config.jax_compilation_cache_dir,
        "min_compile_time": jax.config.jax_persistent_cache_min_compile_time_secs,
        "export_cache": None if exp is None else str(exp),
    }


@contextlib.contextmanager
def _environment(env: dict[str, Any]):
    """Run under the coordinator's environment `env` (restored afterwards); refuse a worker that
    would compute other numbers."""
    import socket

    import jax
    from equinox import _errors

    from .._util import disable_export_cache, enable_export_cache

    where = f"worker pid {os.getpid()} on {socket.gethostname()}"
    if source_fingerprint() != env["fingerprint"]:
        raise RuntimeError(f"{where} runs another gflow than the coordinator (the installed versions of gflow, "
                           "jax, jaxlib, diffrax, equinox, optimistix, numpy or gflow's source differ): every worker "
                           "must run the same installation")  # fmt: skip
    if os.environ.get("XLA_FLAGS", "") != env["xla_flags"]:
        raise RuntimeError(f"{where} has XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}, the coordinator "
                           f"{env['xla_flags']!r}: set the same XLA_FLAGS for every worker (they can change the "
                           "numbers)")  # fmt: skip
    before = (bool(jax.config.jax_enable_x64), getattr(_errors, "EQX_ON_ERROR", None),
              jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs,
              export_cache_folder())  # fmt: skip
    want = (env["x64"], env["eqx_on_error"], env["compilation_cache_dir"], env["min_compile_time"],
            None if env["export_cache"] is None else Path(env["export_cache"]))  # fmt: skip
    if want == before:  # the usual case (and an in-process executor's): nothing to change
        yield
        return
    cache_dir, exp = want[2], want[4]
    if cache_dir is not None and not _usable(cache_dir):
        cache_dir = None  # another machine without that folder: compiled here, same numbers
    if exp is not None and not _usable(exp):
        exp = None

    def apply(x64, eqx_mode, cdir, min_t, edir):
        jax.config.update("jax_enable_x64", x64)
        if eqx_mode is not None:
            _errors.EQX_ON_ERROR = eqx_mode
        jax.config.update("jax_compilation_cache_dir", cdir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", min_t)
        if edir is None:
            disable_export_cache()
        else:
            enable_export_cache(edir)

    apply(want[0], want[1], cache_dir, want[3], exp)
    try:
        yield
    finally:
        apply(*before)


def _usable(folder) -> bool:
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        return os.access(folder, os.W_OK | os.X_OK)
    except OSError:
        return False


def call(env: dict[str, Any], fn: Callable[[Any], Any], payload: Any) -> Any:
    """What a worker runs: ``fn(payload)`` under the coordinator's environment `env`."""
    with _environment(env):
        value = fn(payload)
    relieve_memory_maps()  # a worker that computes many points stays below the kernel's cap on maps
    return value


@contextlib.contextmanager
def scratch_folder(files: dict[str, bytes] | None, name: str = "run") -> Iterator[Path]:
    """A private folder for one point's run in a worker (a temporary folder, removed on exit),
    holding `files` (``{relative path: bytes}``, a run to resume) first."""
    with tempfile.TemporaryDirectory(prefix="gflow-point-") as tmp:
        d = Path(tmp) / name
        d.mkdir()
        for rel, data in (files or {}).items():
            p = d / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
        yield d


def _skipped(rel: Path) -> bool:
    """The lock and writers' temporaries are not part of a run folder's content."""
    return rel.name == ".lock" or (rel.name.startswith(".") and ".tmp" in rel.name)


def folder_files(d: str | Path) -> dict[str, bytes]:
    """Every file of the run folder `d` (``{relative path: bytes}``; not its lock or temporaries)."""
    d = Path(d)
    if not d.is_dir():
        return {}
    return {p.relative_to(d).as_posix(): p.read_bytes()
            for p in sorted(d.rglob("*")) if p.is_file() and not _skipped(p.relative_to(d))}  # fmt: skip


_FIRST = ("trajectory.npz", "run.json")  # the snapshot before the files derived from it


def put_folder_files(d: str | Path, files: dict[str, bytes], *, replace: tuple[str, ...] = ()) -> None:
    """Write a worker's run folder into `d` (the coordinator, holding `d`'s lock): first remove
    `replace` (the files and folders an overwritten run discards), then every file atomically,
    the snapshot first."""
    d = Path(d)
    for name in replace:
        p = d / name
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)
    for rel in sorted(files, key=lambda r: (r not in _FIRST, _FIRST.index(r) if r in _FIRST else 0, r)):
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(p, files[rel])


# ---------------------------------------------------------------------------
# The coordinator's loop
# ---------------------------------------------------------------------------


def _lost(e: BaseException) -> bool:
    return isinstance(e, concurrent.futures.BrokenExecutor) or type(e).__name__ in _LOST_NAMES


def _wait_any(futures: list) -> list:
    if all(isinstance(f, concurrent.futures.Future) for f in futures):
        done, _ = concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_COMPLETED)
        return list(done)
    while True:  # futures of another kind (submitit's jobs): poll
        done = [f for f in futures if f.done()]
        if done:
            return done
        time.sleep(0.2)


def run_points(
    engine: _Engine | None,
    fn: Callable[[Any], Any],
    tasks: list[tuple[int, Any]],
    on_result: Callable[[int, Any], None],
    *,
    retries: int = RETRIES,
    verbose: bool = False,
) -> dict[int, str]:
    """Compute ``fn(payload)`` for every ``(index, payload)`` of `tasks` and hand each result to
    ``on_result(index, result)`` in this process, as it arrives (serially: in order, here).

    **Returns** ``{index: why}`` of the points whose workers were lost more than `retries` times
    (module docstring). An exception of a point's computation is raised after the points already
    running have been handed over; an exception of `on_result` at once (the rest cancelled)."""
    if engine is None:
        for k, payload in tasks:
            value = fn(payload)
            relieve_memory_maps()  # a long grid in one process stays below the kernel's cap on maps
            on_result(k, value)
        return {}
    env = worker_environment()
    payloads = dict(tasks)
    attempts = dict.fromkeys(payloads, 0)
    pending: dict[Any, tuple[int, int]] = {}  # future -> (index, the engine's generation)

    def submit(k):
        pending[engine.executor.submit(call, env, fn, payloads[k])] = (k, engine.generation)

    for k, _ in tasks:
        submit(k)
    lost: dict[int, str] = {}
    error: BaseException | None = None
    try:
        while pending:
            for f in _wait_any(list(pending)):
                k, gen = pending.pop(f)
                if getattr(f, "cancelled", lambda: False)():
                    continue
                try:
                    value = f.result()
                except BaseException as e:  # noqa: BLE001 (a worker's exception, sorted below)
                    if not _lost(e):
                        if error is None:
                            error = e
                            for g in pending:
                                g.cancel()
                        continue
                    attempts[k] += 1
                    why = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
                    if error is not None or attempts[k] > retries:
                        lost[k] = why
                        continue
                    if isinstance(e, concurrent.futures.BrokenExecutor) and gen == engine.generation:
                        if not engine.replace():  # the caller's pool, broken for good
                            lost[k] = why
                            continue
                    elif isinstance(e, concurrent.futures.BrokenExecutor) and engine._remake is None:
                        lost[k] = why
                        continue
                    if verbose:
                        print(f"point {k}: its worker was lost ({why}); submitted again", flush=True)
                    submit(k)
                    continue
                on_result(k, value)
    except BaseException:
        for g in pending:
            g.cancel()
        raise
    if error is not None:
        raise error
    return lost
