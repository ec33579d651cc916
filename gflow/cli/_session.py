"""The ``gflow`` command's process settings (the compilation caches, equinox's error mode) and
what it does with an error gflow does not handle (exit :data:`EXIT_UNEXPECTED`: one line, the
traceback in a log, the runs left ``running`` marked ``failed``)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ._parser import EXIT_UNEXPECTED


def enable_compilation_cache() -> Callable[[], None]:
    """JAX's persistent compilation cache for the command line: a second
    ``gflow run`` of the same shapes skips XLA compilation. ``GFLOW_CACHE``
    names the folder (default ``~/.cache/gflow/xla``); ``GFLOW_CACHE=none``
    turns it off.

    JAX never writes a program that calls back into Python (a host callback) to
    that cache. Two kinds of callback would keep the stage solves out of it:
    gflow's evaluation counter (now counted inside the program for explicit
    solvers, ``gflow.dynamics._solve``) and equinox's runtime checks (``eqx.error_if``),
    which diffrax uses to check its inputs (``dt0``'s sign, ``saveat.ts``
    increasing and inside ``[t0, t1]``) and which lower to a callback that
    raises. So, in this command-line process only and unless ``EQX_ON_ERROR``
    is set, those checks are traced in equinox's ``"nan"`` mode: a failed check
    returns NaN instead of raising, which gflow's drivers report as a
    non-finite state (a failed stage, the partial trajectory kept). gflow builds
    these inputs itself (increasing save grids inside each solve), so the checks
    cannot fail. Importing gflow changes nothing of this, and :func:`gflow.cli.main` undoes
    it when it returns (the returned function restores every setting; programs
    traced meanwhile stay in JAX's in-memory caches).
    """
    import jax
    from equinox import _errors

    from .._util import disable_export_cache, enable_export_cache

    keys = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
    before = {k: getattr(jax.config, k) for k in keys}
    eqx_before = getattr(_errors, "EQX_ON_ERROR", None)

    def restore() -> None:
        for k, v in before.items():
            jax.config.update(k, v)
        disable_export_cache()
        if eqx_before is not None:
            _errors.EQX_ON_ERROR = eqx_before

    where = os.environ.get("GFLOW_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "gflow", "xla"))
    if where.lower() == "none":
        return restore
    jax.config.update("jax_compilation_cache_dir", where)
    # JAX caches only compilations that took ≥ 1 s by default; a run compiles ~120 small
    # programs of 20–200 ms each (the theory, the checks, the loss at saved states), which
    # together cost ~10 s of a warm start. Cache them all.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    enable_export_cache(os.path.join(where, "export"))  # traced solves too (gflow._export_cache)
    if "EQX_ON_ERROR" not in os.environ and eqx_before == "raise":
        _errors.EQX_ON_ERROR = "nan"
    return restore


def _folder_of(args) -> Path | None:
    """The folder a command writes (its log's home), if it names one."""
    where = getattr(args, "out", None) if args.cmd in ("run", "sweep", "phase", "phase-merge") else None
    where = where or getattr(args, "dir", None)
    return None if where is None else Path(where)


def unexpected(args, e: BaseException) -> int:
    """Exit :data:`EXIT_UNEXPECTED`: one line on stderr, the traceback appended to the folder's
    ``gflow.log`` (a temporary file when there is no folder), and every run of the folder left
    ``running`` marked ``failed`` (resumable)."""
    import tempfile
    import traceback

    text = "".join(traceback.format_exception(e))
    folder = _folder_of(args)
    log = None
    try:
        if folder is not None and folder.is_dir():
            log = folder / "gflow.log"
            with open(log, "a", encoding="utf-8") as f:
                f.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} gflow {args.cmd} (pid {os.getpid()})\n{text}")
        else:
            fd, name = tempfile.mkstemp(prefix="gflow-", suffix=".log")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            log = Path(name)
    except OSError:
        log = None
    marked = _mark_failed(folder, e) if folder is not None else []
    what = " ".join(f"{type(e).__name__}: {e}".split())
    if len(what) > 300:
        what = what[:297] + "..."
    tail = f"; the traceback is in {str(log)!r}" if log else ""
    if marked:
        tail += f"; {', '.join(repr(str(m)) for m in marked)} marked 'failed': continue with --resume"
    print(f"gflow {args.cmd}: unexpected error (exit {EXIT_UNEXPECTED}): {what}{tail}", file=sys.stderr)
    return EXIT_UNEXPECTED


def _mark_failed(folder: Path, e: BaseException) -> list[Path]:
    """Mark every run under `folder` (itself, ``rep*``) whose snapshot says ``running`` as
    ``failed: unexpected …`` (under its lock; a folder another process holds is left alone)."""
    from ..runs import lock
    from ..trajectory import load, save

    done = []
    cands = [folder, *sorted(folder.glob("rep[0-9]*"))] if folder.is_dir() else []
    for d in cands:
        try:
            if not (d / "trajectory.npz").is_file():
                continue
            with lock(d):
                traj = load(d)
                if traj.status == "running":
                    traj.status = f"failed: unexpected {type(e).__name__}: {' '.join(str(e).split())[:200]}"
                    save(traj, d)
                    done.append(d)
        except Exception:  # a folder that cannot be marked stays as it is  # noqa: BLE001
            continue
    return done

