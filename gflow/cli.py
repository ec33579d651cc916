"""The ``gflow`` command.

- ``gflow run [CONFIG] --out DIR``: integrate the flow of a TOML
  configuration (none: the paper's default staged run), write the trajectory,
  the check report and the figures into DIR.
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
integration failed (the partial trajectory is kept); :data:`EXIT_INTERRUPTED`
130 interrupted by SIGINT (the run is saved as "interrupted": ``--resume``
continues it).
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
EXIT_INTERRUPTED = 130


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gflow", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="integrate a flow, then check it and plot it")
    r.add_argument("config", nargs="?", help="TOML configuration (default: the paper's default run)")
    r.add_argument("--out", required=True, help="output folder")
    r.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    r.add_argument("--overwrite", action="store_true", help="replace a run already saved in --out")
    r.add_argument("--progress", action="store_true", help="diffrax's tqdm progress meter")
    r.add_argument("--no-check", action="store_true", help="skip the check report")
    r.add_argument("--no-plot", action="store_true", help="skip the figures")
    r.add_argument("--format", default="png", choices=("png", "svg", "pdf"), help="figure format")
    r.add_argument("--spectrum", action="store_true",
                   help="also compute the Hessian spectrum along the run (spectrum.npz) and draw sharpness.png")
    r.add_argument("--quiet", action="store_true")
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

    t = sub.add_parser("theory", help="the theory's predictions for a configuration")
    t.add_argument("config", nargs="?")
    t.add_argument("--json", action="store_true", help="print JSON instead of a table")
    t.add_argument("--n-pi", type=int, default=2000, help="kernels drawn for the Ĩ average (default 2000)")

    c = sub.add_parser("check", help="compare a saved run with the theory")
    c.add_argument("dir")

    sw = sub.add_parser("sweep", help="one run per point of a cross product of config values, and a CSV table")
    sw.add_argument("config", nargs="?", help="base TOML configuration (default: the paper's default run)")
    sw.add_argument(
        "--param", action="append", required=True, metavar="SECTION.KEY=V1,V2,...",
        help="a config field and its values (TOML values, comma-separated; e.g. data.L=50,100,200 or "
        "data.parents=[1],[1,2]); repeat for a cross product",
    )  # fmt: skip
    sw.add_argument("--out", required=True, help="sweep folder: one run folder per point and sweep.csv")
    sw.add_argument("--resume", action="store_true", help="reuse or continue the points' runs already in --out")
    sw.add_argument("--overwrite", action="store_true", help="replace the points' runs already in --out")
    sw.add_argument("--no-check", action="store_true", help="skip the check reports (no theory columns)")
    sw.add_argument("--progress", action="store_true", help="diffrax's tqdm progress meter")
    sw.add_argument("--quiet", action="store_true")

    _eval_parser(sub)
    _phase_parsers(sub)

    pl = sub.add_parser("plot", help="draw the figures of a saved run")
    pl.add_argument("dir")
    pl.add_argument("--out", help="figure folder (default DIR/figures)")
    pl.add_argument("--format", default="png", choices=("png", "svg", "pdf"))
    pl.add_argument("--spectrum", action="store_true",
                    help="compute the Hessian spectrum along the run if spectrum.npz is missing (sharpness.png)")
    return p


def _phase_parsers(sub) -> None:
    """``gflow phase`` and ``gflow phase-merge`` (:mod:`gflow.phase`)."""
    ph = sub.add_parser("phase", help="phase diagram: the theory (and with --flow the flow) over a 1-d or 2-d grid")
    ph.add_argument("config", nargs="?", help="base TOML configuration (default: the paper's default run)")
    ph.add_argument(
        "--param", action="append", required=True, metavar="SECTION.KEY=VALUES",
        help="a grid axis (one or two): comma/semicolon-separated TOML values (data.parents=[1,2];[1,3]), "
        "lin:a:b:n or log:a:b:n (init.w_plus=log:1:10:10)",
    )  # fmt: skip
    ph.add_argument("--out", required=True, help="output folder (phase.csv, phase.json, points/, figures/)")
    ph.add_argument("--flow", action="store_true", help="also integrate and check every point (runs/)")
    ph.add_argument("--shard", metavar="K/N", help="compute only the K-th of N disjoint subsets of the points")
    ph.add_argument("--n-pi", type=int, default=2000, help="kernels drawn for the Ĩ average (default 2000)")
    ph.add_argument("--overwrite", action="store_true", help="discard the points already in --out")
    ph.add_argument("--no-plot", action="store_true", help="skip the figures")
    ph.add_argument("--quiet", action="store_true")
    pm = sub.add_parser("phase-merge", help="join the finished shards of a phase grid into one phase.csv")
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
    from .runs import run_phase

    cfg = load_config(args.config)
    res = run_phase(cfg, args.param, args.out, flow=args.flow, shard=args.shard, n_pi=args.n_pi,
                    plot=not args.no_plot, overwrite=args.overwrite, verbose=not args.quiet)  # fmt: skip
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


def main(argv: list[str] | None = None) -> int:
    """Run a command; returns its exit code (module docstring). Usage errors exit 2 (argparse)."""
    args = _parser().parse_args(argv)
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
    finally:
        restore()


def _dispatch(args) -> int:
    """One function per command (``_cmd_<name>``): a new subcommand is a parser entry and a function."""
    return globals()["_cmd_" + args.cmd.replace("-", "_")](args)


def _cmd_run(args) -> int:
    from .config import load_config, refuse_sgd, warnings_for
    from .runs import check_output, lock

    cfg = load_config(args.config)
    if args.progress:
        cfg = cfg.replace(solver={"progress": True})
    out = Path(args.out)
    refuse_sgd(cfg, "gflow run")  # before any output folder is touched
    if args.replicates is not None:
        return _run_replicates(args, cfg, out)
    if args.replicates_batch is not None:
        raise ValueError("--replicates-batch needs --replicates R")
    if args.resume and args.overwrite:
        raise ValueError("--resume and --overwrite exclude each other")
    for w in warnings_for(cfg):
        print(f"gflow run: warning: {w}", file=sys.stderr)
    check_output(out)  # before any compute: a file, under a file, read-only
    with lock(out):  # held through the run, its report and its figures
        return _run(args, cfg, out)


def _run(args, cfg, out: Path) -> int:
    from .dynamics import FlowError
    from .runs import integrate

    if not args.quiet:
        print(f"gflow run: {args.config or 'the paper default'} -> {out}", flush=True)
    t0 = time.perf_counter()
    try:
        traj = integrate(cfg, out=out, resume=args.resume, overwrite=args.overwrite, verbose=not args.quiet)
    except FlowError as e:
        print(f"gflow run: error: {e}", file=sys.stderr)
        return EXIT_FAILED
    if not args.quiet:
        for st in traj.stages:
            print(f"  Stage {st.name}: t = {st.t0:.4g} -> {st.t1:.4g} ({st.ended_by}), steps {st.steps}, "
                  f"rejected {st.rejected}, vector-field evaluations {st.nfev}, {st.wall:.1f} s")  # fmt: skip
        print(f"  wall time {time.perf_counter() - t0:.1f} s; trajectory in {out}")
    ok = True
    if not args.no_check and not args.no_plot:
        ok = _check_and_plot(out, out / "figures", args.format, quiet=args.quiet, spectrum=args.spectrum or None)
    elif not args.no_check:
        ok = _check(out, quiet=args.quiet)
    elif not args.no_plot:
        _plot(out, out / "figures", args.format, quiet=args.quiet, spectrum=args.spectrum or None)
    if not ok:
        print(f"gflow run: the check report's verdict fails (see {out / 'report.md'})", file=sys.stderr)
    return EXIT_OK if ok else EXIT_VERDICT


def _cmd_theory(args) -> int:
    from .config import load_config
    from .theory import format_theory, theory_report

    cfg = load_config(args.config)
    sc = cfg.schedule
    rep = theory_report(cfg.data, cfg.model, cfg.estimator, cfg.init, n_pi=args.n_pi, eta_C=sc.eta_C, delta=sc.delta)
    print(json.dumps(rep.to_json(), indent=2) if args.json else format_theory(rep))
    return EXIT_OK


def _cmd_check(args) -> int:
    return EXIT_OK if _check(Path(args.dir), quiet=False) else EXIT_VERDICT


def _cmd_sweep(args) -> int:
    from .config import load_config
    from .runs import run_sweep

    cfg = load_config(args.config)
    if args.progress:
        cfg = cfg.replace(solver={"progress": True})
    out = Path(args.out)
    if not args.quiet:
        print(f"gflow sweep: {args.config or 'the paper default'} over {', '.join(args.param)} -> {out}",
              flush=True)  # fmt: skip
    res = run_sweep(cfg, args.param, out, check=not args.no_check, resume=args.resume,
                    overwrite=args.overwrite, verbose=not args.quiet)  # fmt: skip
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
    e = sub.add_parser("eval", help="evaluate a run's final parameters on other data configurations, with the loss ladder")
    e.add_argument("dir", help="a run folder")
    e.add_argument(
        "--param", action="append", required=True, metavar="SECTION.KEY=V1,V2,...",
        help="a data field (data.L, data.alpha, data.parents, data.start, data.burn_in, data.kernel) or "
        "estimator.N / estimator.seed / estimator.chunk, and its values; repeat for a cross product",
    )  # fmt: skip
    e.add_argument("--out", help="output folder for eval.csv, eval.json, eval.png (default DIR/eval)")
    e.add_argument("--no-plot", action="store_true", help="skip the figure")
    e.add_argument("--quiet", action="store_true")


def _cmd_eval(args) -> int:
    from .runs import evaluate

    res = evaluate(args.dir, args.param, out=args.out or Path(args.dir) / "eval", plot=not args.no_plot,
                   verbose=not args.quiet)  # fmt: skip
    if not args.quiet:
        print(res.table())
        print(f"  run's final loss {res.run_loss:.6f}; {len(res.rows)} configurations in {res.wall:.1f} s; "
              f"{', '.join(str(f) for f in res.files)}")  # fmt: skip
    return EXIT_OK


def _run_replicates(args, cfg, out: Path) -> int:
    from .runs import run_replicates

    if not args.quiet:
        print(f"gflow run: {args.config or 'the paper default'}, {args.replicates} replicates -> {out}", flush=True)
    res = run_replicates(cfg, args.replicates, out=out, batch=args.replicates_batch, resume=args.resume,
                         overwrite=args.overwrite, check=not args.no_check, verbose=not args.quiet)  # fmt: skip
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
    return _print_verdict(rep, quiet)


def _check_and_plot(out: Path, figdir: Path, fmt: str, *, quiet: bool, spectrum: bool | None = None) -> bool:
    """``gflow run``'s check report and figures, under one lock, overlapped: the run's theory
    first (both need it), then the figures are drawn in a second thread while the report's
    rows are computed. Drawing is Python (matplotlib holds the interpreter lock) and the
    rows are mostly XLA arithmetic (which releases it), so on two cores the figures cost
    little extra wall time (README "Performance"). The same files as :func:`_check` then
    :func:`_plot`; an error in either is raised after both have finished."""
    from concurrent.futures import ThreadPoolExecutor

    from .core import make_loss
    from .runs import check_output, check_run, load_or_compute, lock, plot_run
    from .trajectory import load

    traj = load(out)
    check_output(figdir)
    with lock(out):
        cfg = traj.config
        loss = make_loss(cfg.data, cfg.model, cfg.estimator)
        theory, how = load_or_compute(out, traj, loss=loss, write=True)
        with ThreadPoolExecutor(max_workers=1) as pool:
            figures = pool.submit(plot_run, out, figdir, fmt=fmt, theory=theory, spectrum=spectrum)
            rep = check_run(out, loss=loss, theory=(theory, how))
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
    print(f"gflow check: paper verdict {v['paper'].upper()}; gflow verdict {v['gflow'].upper()}"
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
    if not quiet:
        print(f"  figures: {', '.join(str(p) for p in paths)}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
