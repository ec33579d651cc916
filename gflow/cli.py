"""The ``gflow`` command.

- ``gflow run [CONFIG] --out DIR``: integrate the flow of a TOML
  configuration (none: the paper's default staged run), write the trajectory,
  the check report and the figures into DIR. Every ``solver.method`` runs: the
  flows and GD, and ``"sgd"``/``"sde"`` (R seeds: a trajectory with a seed axis,
  its report judged on the seed mean, a ``seeds`` figure).
- ``gflow theory [CONFIG] [--json]``: the paper's predictions for a
  configuration, without integrating anything.
- ``gflow check DIR``: compare a saved run with the theory; writes
  ``report.json`` and ``report.md`` into DIR and prints the table.
- ``gflow plot DIR [--out FIGDIR] [--spectrum]``: draw the figures of a saved run
  (``--spectrum``, also for ``run``: the Hessian spectrum along it, ``sharpness.png``).
- ``gflow eval DIR --param data.L=25,50,100 [--param …]``: the run's final
  parameters on other data configurations, with the loss ladder of each
  (:func:`gflow.evaluate`); writes ``eval.csv``, ``eval.json``, ``eval.png``.
- ``gflow run [CONFIG] --out DIR --replicates R``: R independent Monte Carlo
  replicates (``estimator.seed = seed + r``) into ``DIR/rep000``, …, with
  their trajectory bands and the spread of the check rows
  (:mod:`gflow.replicates`); ``--replicates-batch B`` integrates B of them
  at a time, vmapped (default: as many as fit in memory).
- ``gflow sweep [CONFIG] --param data.L=50,100,200 [--param …] --out DIR``:
  one run per point of the cross product, and ``DIR/sweep.csv`` with the
  headline results (:mod:`gflow.sweep`).
- ``gflow phase [CONFIG] --param F=VALUES [--param G=VALUES] --out DIR
  [--flow] [--shard k/n]``: a phase diagram of the theory (and the flow) over
  a grid; ``gflow phase-merge DIR… --out DIR`` joins shards (:mod:`gflow.phase`).

Exit codes (every command): :data:`EXIT_OK` 0 done (for ``run``/``check``:
the report's gflow verdict passes; the paper's may fail, that is a result);
:data:`EXIT_VERDICT` 1 the gflow verdict fails (a row of gflow's own
finite/exact theory, e.g. a non-finite trajectory); :data:`EXIT_INPUT` 2 bad
input (configuration, usage, output location, a corrupt, foreign or locked
run folder), reported before any compute; :data:`EXIT_FAILED` 3 the
integration failed (the partial trajectory is kept); :data:`EXIT_UNEXPECTED` 4
an unexpected error (an exception gflow does not handle: a bug, or a resource
the preflight did not foresee): one line on stderr, the traceback appended to
the run folder's ``gflow.log`` (or a temporary file, named), and a run that
was ``running`` marked ``failed`` (``--resume`` continues it);
:data:`EXIT_INTERRUPTED` 130 interrupted by SIGINT (the run is saved as
"interrupted": ``--resume`` continues it).

Before any compute, ``run`` and ``theory`` estimate the memory the
configuration needs and refuse it (exit 2, naming the keys and the estimate)
when it exceeds the memory available (:func:`gflow.runs.preflight`;
``GFLOW_MAX_MEMORY=64G`` sets the budget, ``GFLOW_MAX_MEMORY=none`` turns the
check off). ``gflow run --dry-run`` stops after these checks.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

EXIT_OK = 0
EXIT_VERDICT = 1
EXIT_INPUT = 2
EXIT_FAILED = 3
EXIT_UNEXPECTED = 4
EXIT_INTERRUPTED = 130

# printed before the silent compilation of a run (a cold run compiles for ~20 s on 2 cores;
# a warm one, with the cache of GFLOW_CACHE filled by an earlier run of the same shapes, for a few)
_COMPILING = "  compiling (first run of these shapes: about 20 s; later runs reuse the compilation cache)..."


_DESCRIPTION = """\
gflow integrates the limiting gradient-flow dynamics of the two-attention-layer
transformer of Chen, Sheen, Wang, Yang, "Unveiling Induction Heads" (NeurIPS 2024)
on n-gram Markov mixtures, and checks each trajectory against the paper's
predictions (the selector picks argmax of the modified chi2-MI, the copier learns
the parents, the classifier scale a grows like log t)."""

_EPILOG = """\
examples:
  gflow run --out runs/default              the paper's default run (about 50 s on 2 cores)
  gflow run small.toml --out runs/small     a TOML configuration (see the docs' configuration guide)
  gflow theory small.toml                   the predictions alone, no integration
  gflow check runs/small                    compare a saved run with its theory again
  gflow sweep --param data.L=50,100,200 --out runs/L
  gflow phase --param init.w_plus=log:0.5:8:8 --param data.L=20,40 --out runs/phase

--param syntax (sweep, phase, eval):
  SECTION.KEY=V1,V2,...   the values are TOML values separated by commas, e.g.
                          data.L=50,100,200 or data.start=uniform,stationary;
                          a list value keeps its brackets: data.parents=[1],[1,2]
                          (semicolons separate values too: data.parents=[1];[1,2])
  SECTION.KEY=lin:A:B:N   N evenly spaced values from A to B
  SECTION.KEY=log:A:B:N   N log-spaced values from A to B (A, B > 0)
  Repeat --param for a cross product (the last one varies fastest). Quote a
  value with brackets or semicolons in the shell: --param 'data.parents=[1],[1,2]'.

exit codes (every command):
  0    done; for run and check: the report's gflow verdict passes (the paper's
       verdict may fail: that is a result, not an error)
  1    the gflow verdict fails (a row of gflow's own finite/exact theory)
  2    bad input (configuration, usage, output location; a corrupt, foreign or
       locked run folder), reported before any compute
  3    the integration failed (the partial trajectory is kept)
  130  interrupted (Ctrl-C); the run is saved as "interrupted": --resume continues it

environment: GFLOW_CACHE names the compilation cache folder (default
~/.cache/gflow/xla; GFLOW_CACHE=none turns it off)."""

_PARAM_HELP = (
    "a config field and its values: SECTION.KEY=V1,V2,... (TOML values separated by commas; "
    "a list keeps its brackets, data.parents=[1],[1,2]), or SECTION.KEY=lin:A:B:N / log:A:B:N; "
    "repeat for a cross product (see 'gflow --help')"
)
_QUIET_HELP = "print nothing but errors and warnings"
_EXECUTOR_HELP = (
    "where the points run: serial (default: this process), processes:N (N local worker processes), "
    "dask-local:N (a local Dask cluster of N worker processes), dask:ADDRESS (a Dask scheduler; "
    "dask needs pip install 'gflow[cluster]'); the same numbers, only this process writes --out"
)
_FORMAT_HELP = "figure file format (default png)"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gflow")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree without installing
        return "unknown (not installed)"


def _sub(sub, name: str, help: str, description: str):
    return sub.add_parser(name, help=help, description=description, formatter_class=argparse.RawDescriptionHelpFormatter)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gflow", description=_DESCRIPTION, epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--version", action="version", version=f"gflow {_version()}")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    r = _sub(sub, "run", "integrate a flow, then check it and plot it",
             "Integrate the gradient flow of a configuration (none: the paper's default staged run), then write "
             "the check report (report.md, report.json, theory.json) and the figures (figures/) into the output "
             "folder. The trajectory (trajectory.npz, run.json) is saved after every decade of each stage's clock, "
             "so an interrupted run can be resumed.")  # fmt: skip
    r.add_argument("config", nargs="?", help="TOML configuration (default: the paper's default run)")
    r.add_argument("--out", required=True, help="output folder (the run folder)")
    r.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    r.add_argument("--overwrite", action="store_true", help="replace a run already saved in --out")
    r.add_argument("--progress", action="store_true", help="diffrax's tqdm progress meter")
    r.add_argument("--no-check", action="store_true", help="skip the check report")
    r.add_argument("--no-plot", action="store_true", help="skip the figures")
    r.add_argument("--format", default="png", choices=("png", "svg", "pdf"), help=_FORMAT_HELP)
    r.add_argument("--spectrum", action="store_true",
                   help="also compute the Hessian spectrum along the run (spectrum.npz) and draw sharpness.png")
    r.add_argument("--quiet", action="store_true", help=_QUIET_HELP)
    r.add_argument(
        "--replicates", type=int, metavar="R",
        help="run R independent Monte Carlo replicates (estimator.seed = seed + r, r = 0..R-1) into "
        "OUT/rep000, OUT/rep001, ...; write their trajectory bands and the spread of the check rows "
        "(OUT/replicates.json, bands.npz, replicates.md); figures for replicate 0 only",
    )  # fmt: skip
    r.add_argument(
        "--replicates-batch", type=int, metavar="B",
        help="with --replicates: integrate B replicates at a time, vmapped (default: all R if their samples "
        "fit in 2 GiB, else as many as fit; 1: one after another)",
    )  # fmt: skip
    r.add_argument("--executor", metavar="SPEC", help="with --replicates: " + _EXECUTOR_HELP + " (a chunk a task)")
    r.add_argument(
        "--dry-run", action="store_true",
        help="check the configuration, the output folder and the memory estimate, print them, and stop",
    )  # fmt: skip

    t = _sub(sub, "theory", "the theory's predictions for a configuration",
             "Print the predictions for a configuration without integrating anything: the modified chi2-MI "
             "ranking with standard errors and S*, the Stage I rates J(S), the predicted Stage I duration, and "
             "the Stage III law (C*, the validity window, a*, the limit loss) of the generalized induction head.")  # fmt: skip
    t.add_argument("config", nargs="?", help="TOML configuration (default: the paper's default run)")
    t.add_argument("--json", action="store_true", help="print JSON instead of a table")
    t.add_argument("--n-pi", type=int, default=2000, help="kernels drawn for the Ĩ average (default 2000)")

    c = _sub(sub, "check", "compare a saved run with the theory",
             "Compare a saved run with its theory (computed on the run's own sample and initialisation); write "
             "report.json and report.md into the run folder and print the table and both verdicts. Exit code 1 "
             "only when the gflow verdict fails; a failing paper verdict is a result.")  # fmt: skip
    c.add_argument("dir", help="a run folder (written by gflow run)")

    sw = _sub(sub, "sweep", "one run per point of a cross product of config values, and a CSV table",
              "Run one ordinary run folder per point of the cross product of the --param values, and write "
              "OUT/sweep.csv with the headline numbers of every point (S*, C*, window, a*, limit loss, measured "
              "set, slope, a and loss at the end, check verdict, wall time). Every point is validated first.")  # fmt: skip
    sw.add_argument("config", nargs="?", help="base TOML configuration (default: the paper's default run)")
    sw.add_argument("--param", action="append", required=True, metavar="SECTION.KEY=VALUES", help=_PARAM_HELP)
    sw.add_argument("--out", required=True, help="sweep folder: one run folder per point and sweep.csv")
    sw.add_argument("--resume", action="store_true", help="reuse or continue the points' runs already in --out")
    sw.add_argument("--overwrite", action="store_true", help="replace the points' runs already in --out")
    sw.add_argument("--no-check", action="store_true", help="skip the check reports (no theory columns)")
    sw.add_argument("--progress", action="store_true", help="diffrax's tqdm progress meter")
    sw.add_argument("--executor", metavar="SPEC", help=_EXECUTOR_HELP)
    sw.add_argument("--quiet", action="store_true", help=_QUIET_HELP)

    _eval_parser(sub)
    _phase_parsers(sub)

    pl = _sub(sub, "plot", "draw the figures of a saved run",
              "Draw the figures of a saved run (c_frac, copier, a_vs_logt, rate, loss and summary) into "
              "DIR/figures or --out.")  # fmt: skip
    pl.add_argument("dir", help="a run folder (written by gflow run)")
    pl.add_argument("--out", help="figure folder (default DIR/figures)")
    pl.add_argument("--format", default="png", choices=("png", "svg", "pdf"), help=_FORMAT_HELP)
    pl.add_argument("--spectrum", action="store_true",
                    help="compute the Hessian spectrum along the run if spectrum.npz is missing (sharpness.png)")
    return p


def _phase_parsers(sub) -> None:
    """``gflow phase`` and ``gflow phase-merge`` (:mod:`gflow.phase`)."""
    ph = _sub(sub, "phase", "phase diagram: the theory (and with --flow the flow) over a 1-d or 2-d grid",
              "Compute, at every point of a grid over one or two configuration fields, the paper's Stage I winner "
              "(argmax of the modified chi2-MI), gflow's finite-size winner (argmax J), the predicted Stage I "
              "duration and the Stage III law of the predicted set; with --flow also integrate and check every "
              "point. Writes OUT/phase.csv, phase.json, points/ and figures/. Running the same command again "
              "computes only the missing points.")  # fmt: skip
    ph.add_argument("config", nargs="?", help="base TOML configuration (default: the paper's default run)")
    ph.add_argument("--param", action="append", required=True, metavar="SECTION.KEY=VALUES",
                    help=_PARAM_HELP + "; one or two axes")  # fmt: skip
    ph.add_argument("--out", required=True, help="output folder (phase.csv, phase.json, points/, figures/)")
    ph.add_argument("--flow", action="store_true", help="also integrate and check every point (runs/)")
    ph.add_argument("--shard", metavar="K/N", help="compute only the K-th of N disjoint subsets of the points")
    ph.add_argument("--n-pi", type=int, default=2000, help="kernels drawn for the Ĩ average (default 2000)")
    ph.add_argument("--executor", metavar="SPEC", help=_EXECUTOR_HELP)
    ph.add_argument("--overwrite", action="store_true", help="discard the points already in --out")
    ph.add_argument("--no-plot", action="store_true", help="skip the figures")
    ph.add_argument("--quiet", action="store_true", help=_QUIET_HELP)
    pm = _sub(sub, "phase-merge", "join the finished shards of a phase grid into one phase.csv",
              "Join the finished shards of a phase grid (gflow phase --shard K/N) into one phase.csv, phase.json "
              "and the figures; names the points still missing.")  # fmt: skip
    pm.add_argument("dirs", nargs="+", help="the shards' folders (or one shared folder)")
    pm.add_argument("--out", required=True, help="output folder")
    pm.add_argument("--no-plot", action="store_true", help="skip the figures")


def _cmd_phase_merge(args) -> int:
    from .runs import merge_shards

    res = merge_shards(args.dirs, args.out, plot=not args.no_plot)
    print(f"gflow phase-merge: {len(res.rows)} points -> {res.csv}")
    return EXIT_OK


def _cmd_phase(args) -> int:
    from .config import load_config
    from .runs import GridIncomplete, run_phase

    cfg = load_config(args.config)
    try:
        res = run_phase(cfg, args.param, args.out, flow=args.flow, shard=args.shard, n_pi=args.n_pi,
                        plot=not args.no_plot, overwrite=args.overwrite, verbose=not args.quiet,
                        executor=args.executor)  # fmt: skip
    except GridIncomplete as e:
        print(f"gflow phase: error: {e}", file=sys.stderr)
        return EXIT_FAILED
    if not args.quiet:
        print(res.table())
        n = len(res.point_walls)
        per = f", {res.wall / n:.2f} s per point" if n else ""
        print(f"  {n} points computed in {res.wall:.1f} s{per}; table in {res.csv}")
    return EXIT_OK


def _enable_compilation_cache() -> Callable[[], None]:
    """JAX's persistent compilation cache for the command line: a second
    ``gflow run`` of the same shapes skips XLA compilation. ``GFLOW_CACHE``
    names the folder (default ``~/.cache/gflow/xla``); ``GFLOW_CACHE=none``
    turns it off.

    JAX never writes a program that calls back into Python (a host callback) to
    that cache. Two kinds of callback would keep the stage solves out of it:
    gflow's evaluation counter (now counted inside the program for explicit
    solvers, ``gflow._solve``) and equinox's runtime checks (``eqx.error_if``),
    which diffrax uses to check its inputs (``dt0``'s sign, ``saveat.ts``
    increasing and inside ``[t0, t1]``) and which lower to a callback that
    raises. So, in this command-line process only and unless ``EQX_ON_ERROR``
    is set, those checks are traced in equinox's ``"nan"`` mode: a failed check
    returns NaN instead of raising, which gflow's drivers report as a
    non-finite state (a failed stage, the partial trajectory kept). gflow builds
    these inputs itself (increasing save grids inside each solve), so the checks
    cannot fail. Importing gflow changes nothing of this, and :func:`main` undoes
    it when it returns (the returned function restores every setting; programs
    traced meanwhile stay in JAX's in-memory caches).
    """
    import jax
    from equinox import _errors

    from ._util import disable_export_cache, enable_export_cache

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


_PARSER: argparse.ArgumentParser | None = None


def main(argv: list[str] | None = None) -> int:
    """Run a command; returns its exit code (module docstring). Usage errors exit 2 (argparse)."""
    global _PARSER
    _PARSER = _PARSER or _parser()  # built once per process (in-process callers run many commands)
    args = _PARSER.parse_args(argv)
    restore = _enable_compilation_cache()
    try:
        return _dispatch(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"gflow {args.cmd}: error: {e}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        where = getattr(args, "out", None) if args.cmd in ("run", "sweep") else None
        tail = f"; the run saved in {where!r} is marked 'interrupted': continue it with --resume" if where else ""
        print(f"gflow {args.cmd}: interrupted{tail}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # anything gflow's own handling did not catch: exit 4, never a traceback
        return _unexpected(args, e)
    finally:
        with contextlib.suppress(Exception):
            restore()


def _folder_of(args) -> Path | None:
    """The folder a command writes (its log's home), if it names one."""
    where = getattr(args, "out", None) if args.cmd in ("run", "sweep", "phase", "phase-merge") else None
    where = where or getattr(args, "dir", None)
    return None if where is None else Path(where)


def _unexpected(args, e: BaseException) -> int:
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
    from .runs import lock
    from .trajectory import load, save

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


def _dispatch(args) -> int:
    """One function per command (``_cmd_<name>``): a new subcommand is a parser entry and a function."""
    return globals()["_cmd_" + args.cmd.replace("-", "_")](args)


def _saved_config(out: Path, replicates: bool):
    """``--resume`` without a configuration: the configuration saved in `out` (replicates: in
    ``out/rep000``, whose seed is the base seed), or ``None`` when `out` holds no run."""
    from .trajectory import load

    d = out / "rep000" if replicates else out
    if (d / "trajectory.npz").is_file() or (d / "run.json").is_file():
        return load(d).config
    return None


def _cmd_run(args) -> int:
    from .config import LIMITS, load_config, refuse_sgd, warnings_for
    from .runs import check_output, fmt_bytes, lock, preflight

    out = Path(args.out)
    cfg = None
    if args.resume and args.config is None:  # resume from the folder: its saved configuration
        cfg = _saved_config(out, args.replicates is not None)
    cfg = load_config(args.config) if cfg is None else cfg
    if args.progress:
        cfg = cfg.replace(solver={"progress": True})
    if args.replicates is not None:
        refuse_sgd(cfg, "gflow run --replicates")  # before any output folder is touched
    if cfg.solver.is_stochastic:  # sgd / sde: R seeds (before any folder is touched)
        from .dynamics import check_stochastic

        check_stochastic(cfg)
    if args.resume and args.overwrite:
        raise ValueError("--resume and --overwrite exclude each other")
    batch = 1
    if args.replicates is not None:
        R = args.replicates
        top = LIMITS["estimator.seed"][1]
        if not 1 <= R <= 10**5 or cfg.estimator.seed + R - 1 > top:
            raise ValueError(f"--replicates must be in [1, 100000] with estimator.seed + R - 1 <= {top}, got R = {R}")
        from .runs import default_batch

        B = args.replicates_batch
        if B is not None and not 1 <= B <= R:
            raise ValueError(f"--replicates-batch must be in [1, R = {R}], got {B}")
        batch = B if B is not None else default_batch(cfg, R)
    elif args.replicates_batch is not None:
        raise ValueError("--replicates-batch needs --replicates R")
    if args.executor is not None:
        if args.replicates is None:
            raise ValueError("--executor needs --replicates R (one run has no points to share out)")
        from .runs import check_executor

        check_executor(args.executor)
    need, avail, where = preflight(cfg, replicates=batch)  # before any compute or folder
    if args.dry_run:
        check_output_dry(out)
        room = "no limit" if avail is None else f"{fmt_bytes(avail)} available ({where})"
        print(f"gflow run: dry run: configuration valid; memory estimate {fmt_bytes(need)}"
              f"{f' ({batch} replicates at once)' if batch > 1 else ''}, {room}; output {str(out)!r}")  # fmt: skip
        return EXIT_OK
    if args.replicates is not None:
        return _run_replicates(args, cfg, out)
    for w in warnings_for(cfg):
        print(f"gflow run: warning: {w}", file=sys.stderr)
    check_output(out)  # before any compute: a file, under a file, read-only
    with lock(out):  # held through the run, its report and its figures
        return _run(args, cfg, out)


def check_output_dry(out: Path) -> None:
    """:func:`gflow.trajectory.check_output` without creating anything: `out` is a folder or can be
    one (no part of its path is a file; its first existing parent is writable)."""
    from .trajectory import RunFolderError

    if out.exists() and not out.is_dir():
        raise RunFolderError(f"{str(out)!r}: is a file, not a folder: --out must name a folder")
    p = out
    while not p.exists() and p.parent != p:
        p = p.parent
    if p.exists() and not p.is_dir():
        raise RunFolderError(f"{str(out)!r}: lies under {str(p)!r}, which is a file, not a folder")
    if not os.access(p, os.W_OK | os.X_OK):
        raise RunFolderError(f"{str(p)!r}: is not writable: cannot write the run there")


def _run(args, cfg, out: Path) -> int:
    from .dynamics import FlowError
    from .runs import integrate

    if not args.quiet:
        print(f"gflow run: {args.config or 'the paper default'} -> {out}", flush=True)
        print(_COMPILING, flush=True)
    t0 = time.perf_counter()
    outputs = _outputs(args) + ([f"figures/seeds.{args.format}"] if cfg.solver.is_stochastic and not args.no_plot else [])
    box, start = [], None
    if not (args.no_check or args.no_plot or args.resume):  # the report's theory, while the run integrates
        from .runs import TheoryAhead

        start = lambda loss: box.append(TheoryAhead(cfg, loss))  # noqa: E731
    try:
        traj = integrate(cfg, out=out, resume=args.resume, overwrite=args.overwrite, verbose=not args.quiet,
                         outputs=outputs, on_loss=start)  # fmt: skip
    except BaseException as e:
        for a in box:
            a.join()  # nothing of the run outlives the command (its settings are restored when it ends)
        if not isinstance(e, FlowError):
            raise
        print(f"gflow run: error: {e}", file=sys.stderr)
        return EXIT_FAILED
    ahead = box[0] if box else None
    if not args.quiet:
        for st in traj.stages:
            print(f"  Stage {st.name}: t = {st.t0:.4g} -> {st.t1:.4g} ({st.ended_by}), steps {st.steps}, "
                  f"rejected {st.rejected}, vector-field evaluations {st.nfev}, {st.wall:.1f} s")  # fmt: skip
        if traj.n_seeds:
            print(f"  {traj.n_seeds} seeds ({cfg.solver.method}); report and figures on their mean and spread")
        print(f"  wall time {time.perf_counter() - t0:.1f} s; trajectory in {out}")
    ok = True
    if not args.no_check and not args.no_plot:
        ok = _check_and_plot(out, out / "figures", args.format, quiet=args.quiet, spectrum=args.spectrum or None,
                             ahead=ahead)  # fmt: skip
    elif not args.no_check:
        ok = _check(out, quiet=args.quiet)
    elif not args.no_plot:
        _plot(out, out / "figures", args.format, quiet=args.quiet, spectrum=args.spectrum or None)
    if outputs:
        from .runs import lock
        from .trajectory import record_outputs

        with lock(out):
            status, missing = record_outputs(out, outputs)  # written last: the run is complete
        if missing:
            print(f"gflow run: the run is not complete: {', '.join(missing)} not written whole", file=sys.stderr)
    if not ok:
        print(f"gflow run: the check report's verdict fails (see {out / 'report.md'})", file=sys.stderr)
    return EXIT_OK if ok else EXIT_VERDICT


def _outputs(args) -> list[str]:
    """The files ``gflow run`` writes after the integration (its manifest, README "Run folders")."""
    from .trajectory import FIGURE_NAMES

    names = [] if args.no_check else ["theory.json", "report.json", "report.md"]
    if not args.no_plot:
        names += [f"figures/{n}.{args.format}" for n in FIGURE_NAMES]
    return names


def _record(out: Path, paths, cmd: str, quiet: bool) -> None:
    """Record files a command (re)wrote in the run's manifest (:func:`gflow.trajectory.record_outputs`);
    say whether that completed the run."""
    from .trajectory import WRITING, load, record_outputs

    before = load(out).status
    rel = [os.path.relpath(os.path.realpath(p), os.path.realpath(out)) for p in paths]
    status, missing = record_outputs(out, rel)
    if status == "complete" and before == WRITING and not quiet:
        print(f"gflow {cmd}: the run in {str(out)!r} is complete (every file it lists is whole)")
    elif missing:
        print(f"gflow {cmd}: the run in {str(out)!r} is not complete yet: {', '.join(missing)} missing or damaged "
              f"(gflow check writes the report, gflow plot the figures)", file=sys.stderr)  # fmt: skip


def _cmd_theory(args) -> int:
    from .config import load_config
    from .runs import preflight
    from .theory import format_theory, theory_report

    if not 1 <= args.n_pi <= 10**7:
        raise ValueError(f"--n-pi must be an integer in [1, 10000000], got {args.n_pi}")
    cfg = load_config(args.config)
    preflight(cfg, n_pi=args.n_pi)  # before any compute
    sc = cfg.schedule
    rep = theory_report(cfg.data, cfg.model, cfg.estimator, cfg.init, n_pi=args.n_pi, eta_C=sc.eta_C, delta=sc.delta)
    print(json.dumps(rep.to_json(), indent=2) if args.json else format_theory(rep))
    return EXIT_OK


def _cmd_check(args) -> int:
    return EXIT_OK if _check(Path(args.dir), quiet=False) else EXIT_VERDICT


def _cmd_sweep(args) -> int:
    from .config import load_config
    from .runs import GridIncomplete, check_executor, preflight, run_sweep, sweep_points

    cfg = load_config(args.config)
    if args.progress:
        cfg = cfg.replace(solver={"progress": True})
    for _, point in sweep_points(cfg, args.param):  # every point's memory, before any compute
        preflight(point)
    check_executor(args.executor)
    out = Path(args.out)
    if not args.quiet:
        print(f"gflow sweep: {args.config or 'the paper default'} over {', '.join(args.param)} -> {out}",
              flush=True)  # fmt: skip
    try:
        res = run_sweep(cfg, args.param, out, check=not args.no_check, resume=args.resume,
                        overwrite=args.overwrite, verbose=not args.quiet, executor=args.executor)  # fmt: skip
    except GridIncomplete as e:
        print(f"gflow sweep: error: {e}", file=sys.stderr)
        return EXIT_FAILED
    if not args.quiet:
        print(res.table())
        print(f"  {len(res.rows)} runs in {res.wall:.1f} s; table in {res.csv}")
    for r in res.failed:
        print(f"gflow sweep: point {r['dir']}: {r['status']}", file=sys.stderr)
    return EXIT_FAILED if res.failed else EXIT_OK


def _cmd_plot(args) -> int:
    d = Path(args.dir)
    _plot(d, Path(args.out) if args.out else d / "figures", args.format, quiet=False, spectrum=args.spectrum or None)
    return EXIT_OK


def _eval_parser(sub) -> None:
    """``gflow eval RUN --param data.L=25,50,100 [--param …] [--out DIR]``."""
    e = _sub(sub, "eval", "evaluate a run's final parameters on other data configurations, with the loss ladder",
             "Evaluate a run's final parameters on every point of the cross product of the --param values, each "
             "on its own sample, with that sample's loss ladder (oracle, Bayes, GIH, unigram). It may change "
             "data.L, data.alpha, data.parents, data.start, data.burn_in, data.kernel, estimator.N, "
             "estimator.seed and estimator.chunk. Writes eval.csv, eval.json and eval.png.")  # fmt: skip
    e.add_argument("dir", help="a run folder")
    e.add_argument("--param", action="append", required=True, metavar="SECTION.KEY=VALUES", help=_PARAM_HELP)
    e.add_argument("--out", help="output folder for eval.csv, eval.json, eval.png (default DIR/eval)")
    e.add_argument("--no-plot", action="store_true", help="skip the figure")
    e.add_argument("--executor", metavar="SPEC", help=_EXECUTOR_HELP)
    e.add_argument("--quiet", action="store_true", help=_QUIET_HELP)


def _cmd_eval(args) -> int:
    from .runs import GridIncomplete, evaluate, preflight, sweep_points
    from .trajectory import load

    try:  # every evaluated configuration's memory, before any compute (bad fields: evaluate names them)
        points = sweep_points(load(args.dir).config, args.param)
    except ValueError:
        points = []
    for _, point in points:
        preflight(point)

    try:
        res = evaluate(args.dir, args.param, out=args.out or Path(args.dir) / "eval", plot=not args.no_plot,
                       verbose=not args.quiet, executor=args.executor)  # fmt: skip
    except GridIncomplete as e:
        print(f"gflow eval: error: {e}", file=sys.stderr)
        return EXIT_FAILED
    if not args.quiet:
        print(res.table())
        print(f"  run's final loss {res.run_loss:.6f}; {len(res.rows)} configurations in {res.wall:.1f} s; "
              f"{', '.join(str(f) for f in res.files)}")  # fmt: skip
    return EXIT_OK


def _run_replicates(args, cfg, out: Path) -> int:
    from .runs import GridIncomplete, run_replicates

    if not args.quiet:
        print(f"gflow run: {args.config or 'the paper default'}, {args.replicates} replicates -> {out}", flush=True)
    try:
        res = run_replicates(cfg, args.replicates, out=out, batch=args.replicates_batch, resume=args.resume,
                             overwrite=args.overwrite, check=not args.no_check, verbose=not args.quiet,
                             executor=args.executor)  # fmt: skip
    except GridIncomplete as e:
        print(f"gflow run: error: {e}", file=sys.stderr)
        return EXIT_FAILED
    if not args.quiet:
        print(res.table())
        print(f"  bands and check spread in {out / 'replicates.json'}, {out / 'bands.npz'}, {out / 'replicates.md'}")
    if not args.no_plot and res.trajectories[0].status == "complete":
        _plot(res.dirs[0], res.dirs[0] / "figures", args.format, quiet=args.quiet)
    for r in res.failed:
        print(f"gflow run: replicate {r}: {res.trajectories[r].status}", file=sys.stderr)
    return EXIT_FAILED if res.failed else EXIT_OK


def _check(out: Path, *, quiet: bool) -> bool:
    """Check a saved run (writes its report into it, under its lock); the gflow verdict."""
    from .runs import check_run, lock
    from .trajectory import load

    if not out.is_dir():
        load(out)  # not a folder: one clear error, nothing created
    with lock(out):
        rep = check_run(out)  # reads the run first: a corrupt or foreign folder is one clear error
        _record(out, [out / "theory.json", out / "report.json", out / "report.md"], "check", quiet)
    return _print_verdict(rep, quiet)


def _check_and_plot(out: Path, figdir: Path, fmt: str, *, quiet: bool, spectrum: bool | None = None,
                    ahead=None) -> bool:  # fmt: skip
    """``gflow run``'s check report and figures, under one lock, overlapped: the run's theory
    first (both need it), then the figures are drawn in a second thread while the report's
    rows are computed. Drawing is Python (matplotlib holds the interpreter lock) and the
    rows are mostly XLA arithmetic (which releases it), so on two cores the figures cost
    little extra wall time (docs/performance.md). The same files as :func:`_check` then
    :func:`_plot`; an error in either is raised after both have finished."""
    from concurrent.futures import ThreadPoolExecutor

    from .core import make_loss
    from .runs import check_output, check_run, load_or_compute, lock, plot_run
    from .trajectory import load, record_outputs

    traj = load(out)
    check_output(figdir)
    with lock(out):
        cfg = traj.config
        # `ahead` (gflow.runs.TheoryAhead): the theory computed while the run integrated, on its sample
        loss = make_loss(cfg.data, cfg.model, cfg.estimator) if ahead is None else ahead.loss
        theory, how = load_or_compute(out, traj, loss=loss, write=True, ahead=ahead)
        with ThreadPoolExecutor(max_workers=1) as pool:
            figures = pool.submit(plot_run, out, figdir, fmt=fmt, theory=theory, spectrum=spectrum)
            rep = check_run(out, loss=loss, theory=(theory, how))
            # recorded as soon as written: a kill while drawing leaves only the figures to repair
            record_outputs(out, ["theory.json", "report.json", "report.md"])
            paths = figures.result()
    ok = _print_verdict(rep, quiet)
    if not quiet:
        print(f"  figures: {', '.join(str(p) for p in paths)}")
    return ok


def _print_verdict(rep, quiet: bool) -> bool:
    if not quiet:
        print(rep.table())
    v = rep.verdict
    if quiet:
        return rep.passed
    # the paper verdict is the scientific result; only a gflow failure is an error (exit 1)
    seeds = rep.run.get("seeds")
    judged = f" (judged on the mean of {seeds} seeds)" if seeds else ""
    print(f"gflow check{judged}: paper verdict {v['paper'].upper()}; gflow verdict {v['gflow'].upper()}"
          f" (selected {rep.theory.get('selected')}, S* = {rep.theory.get('S_star')}, "
          f"argmax J = {rep.theory.get('argmax_J')})")  # fmt: skip
    return rep.passed


def _plot(out: Path, figdir: Path, fmt: str, *, quiet: bool, spectrum: bool | None = None) -> None:
    from .runs import check_output, lock, plot_run
    from .trajectory import load

    load(out)  # a missing, corrupt or foreign folder: one clear error
    check_output(figdir)  # a file, under a file, read-only: before drawing anything
    inside = Path(os.path.realpath(figdir)).is_relative_to(os.path.realpath(out))
    with lock(out) if inside else contextlib.nullcontext():
        paths = plot_run(out, figdir, fmt=fmt, spectrum=spectrum)
        if inside:  # repairs a run whose figures were missing or damaged, then completes it
            _record(out, paths, "plot", quiet)
    if not quiet:
        print(f"  figures: {', '.join(str(p) for p in paths)}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
