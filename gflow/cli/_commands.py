"""The subcommands of ``gflow``: one function ``cmd_<name>`` per command (``gflow phase-merge``:
:func:`cmd_phase_merge`), each returning its exit code."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from ._outputs import check_and_plot, check_folder, output_names, plot_folder
from ._parser import EXIT_FAILED, EXIT_OK, EXIT_VERDICT

# printed before the silent compilation of a run (a cold run compiles for ~20 s on 2 cores;
# a warm one, with the cache of GFLOW_CACHE filled by an earlier run of the same shapes, for a few)
_COMPILING = "  compiling (first run of these shapes: about 20 s; later runs reuse the compilation cache)..."


def cmd_phase_merge(args) -> int:
    from ..runs import merge_shards

    res = merge_shards(args.dirs, args.out, plot=not args.no_plot)
    print(f"gflow phase-merge: {len(res.rows)} points -> {res.csv}")
    return EXIT_OK


def cmd_phase(args) -> int:
    from ..config import load_config
    from ..runs import GridIncomplete, run_phase

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


def _saved_config(out: Path, replicates: bool):
    """``--resume`` without a configuration: the configuration saved in `out` (replicates: in
    ``out/rep000``, whose seed is the base seed), or ``None`` when `out` holds no run."""
    from ..trajectory import load

    d = out / "rep000" if replicates else out
    if (d / "trajectory.npz").is_file() or (d / "run.json").is_file():
        return load(d).config
    return None


def cmd_run(args) -> int:
    from ..config import LIMITS, load_config, refuse_sgd
    from ..runs import check_output, fmt_bytes, lock, preflight

    out = Path(args.out)
    cfg = None
    if args.resume and args.config is None:  # resume from the folder: its saved configuration
        cfg = _saved_config(out, args.replicates is not None)
    cfg = load_config(args.config) if cfg is None else cfg
    if args.param:
        cfg = with_params(cfg, args.param)
    if args.progress:
        cfg = cfg.replace(solver={"progress": True})
    if args.replicates is not None:
        refuse_sgd(cfg, "gflow run --replicates")  # before any output folder is touched
    if cfg.solver.is_stochastic:  # sgd / sde: R seeds (before any folder is touched)
        from ..dynamics import check_stochastic

        check_stochastic(cfg)
    if args.resume and args.overwrite:
        raise ValueError("--resume and --overwrite exclude each other")
    batch = 1
    if args.replicates is not None:
        R = args.replicates
        top = LIMITS["estimator.seed"][1]
        if not 1 <= R <= 10**5 or cfg.estimator.seed + R - 1 > top:
            raise ValueError(f"--replicates must be in [1, 100000] with estimator.seed + R - 1 <= {top}, got R = {R}")
        from ..runs import default_batch

        B = args.replicates_batch
        if B is not None and not 1 <= B <= R:
            raise ValueError(f"--replicates-batch must be in [1, R = {R}], got {B}")
        batch = B if B is not None else default_batch(cfg, R)
    elif args.replicates_batch is not None:
        raise ValueError("--replicates-batch needs --replicates R")
    if args.executor is not None:
        if args.replicates is None:
            raise ValueError("--executor needs --replicates R (one run has no points to share out)")
        from ..runs import check_executor

        check_executor(args.executor)
    need, avail, where = preflight(cfg, replicates=batch)  # before any compute or folder
    warnings = _warnings(cfg)
    if args.dry_run:
        for w in warnings:
            print(f"gflow run: warning: {w}", file=sys.stderr)
        check_output_dry(out)
        if args.replicates is None:
            refuse_foreign_folder(out, args)
        room = "no limit" if avail is None else f"{fmt_bytes(avail)} available ({where})"
        print(f"gflow run: dry run: configuration valid; memory estimate {fmt_bytes(need)}"
              f"{f' ({batch} replicates at once)' if batch > 1 else ''}, {room}; output {str(out)!r}")  # fmt: skip
        return EXIT_OK
    if args.replicates is not None:
        return _run_replicates(args, cfg, out)
    for w in warnings:
        print(f"gflow run: warning: {w}", file=sys.stderr)
    refuse_foreign_folder(out, args)
    check_output(out)  # before any compute: a file, under a file, read-only
    with lock(out):  # held through the run, its report and its figures
        return _run(args, cfg, out)


def with_params(cfg, params: list[str]):
    """`cfg` with ``gflow run --param SECTION.KEY=VALUE`` applied: the sweep's syntax and
    checks (:func:`gflow.runs.sweep_points`), one value per field (several are a sweep:
    a ``ValueError`` naming the field and ``gflow sweep``)."""
    from ..runs import parse_param, sweep_points

    pairs = [parse_param(spec) for spec in params]
    for spec, (field, vals) in zip(params, pairs):
        if len(vals) != 1:
            raise ValueError(f"--param {spec!r}: gflow run takes one value for {field!r}, got {len(vals)} "
                             "(several values are a grid: gflow sweep, gflow phase)")  # fmt: skip
    ((_, cfg),) = sweep_points(cfg, pairs)
    return cfg


def _warnings(cfg) -> list[str]:
    """What ``gflow run`` (and its dry run) warns about a valid configuration (exit status unchanged)."""
    from ..config import warnings_for
    from ..theory import unrepresented_parents

    unrep = unrepresented_parents(cfg.data, cfg.model)
    return warnings_for(cfg) + ([unrep] if unrep else [])


# what a folder may hold besides a run and still take a new one: gflow's own lock and log
_RUN_LEFTOVERS = ("gflow.log",)


def refuse_foreign_folder(out: Path, args) -> None:
    """Refuse (exit 2, before any compute) to write a run into an existing folder that holds other
    files and no run, unless ``--overwrite`` asks for it (the other files are then left alone);
    hidden files and ``gflow.log`` (an earlier attempt's) do not count."""
    from ..runs import RunFolder
    from ..trajectory import RunFolderError

    if args.overwrite or args.resume or not out.is_dir() or RunFolder(out).holds_run():
        return
    other = sorted(p.name for p in out.iterdir() if not p.name.startswith(".") and p.name not in _RUN_LEFTOVERS)
    if other:
        shown = ", ".join(other[:3]) + (f" and {len(other) - 3} more" if len(other) > 3 else "")
        raise RunFolderError(f"{str(out)!r}: holds other files ({shown}) and no run: give a new or empty folder, "
                             "or --overwrite to write the run beside them")  # fmt: skip


def check_output_dry(out: Path) -> None:
    """:func:`gflow.runs.check_output` without creating anything: `out` is a folder or can be
    one (no part of its path is a file; its first existing parent is writable)."""
    from ..trajectory import RunFolderError

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
    from ..dynamics import FlowError
    from ..runs import integrate

    if not args.quiet:
        print(f"gflow run: {args.config or 'the paper default'} -> {out}", flush=True)
        print(_COMPILING, flush=True)
    t0 = time.perf_counter()
    outputs = output_names(args) + ([f"figures/seeds.{args.format}"] if cfg.solver.is_stochastic and not args.no_plot else [])
    box, start = [], None
    if not (args.no_check or args.no_plot or args.resume):  # the report's theory, while the run integrates
        from ..runs import TheoryAhead

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
                  f"rejected {st.rejected}, vector-field evaluations {st.nfev}, {st.wall:.1f} s"
                  + (f"; stiff: {st.solver} from t = {st.solver_from:.6g} (solver.stiff_switch)" if st.solver else ""))  # fmt: skip
        if traj.n_seeds:
            print(f"  {traj.n_seeds} seeds ({cfg.solver.method}); report and figures on their mean and spread")
        print(f"  wall time {time.perf_counter() - t0:.1f} s; trajectory in {out}")
    ok = True
    if not args.no_check and not args.no_plot:
        ok = check_and_plot(out, out / "figures", args.format, quiet=args.quiet, spectrum=args.spectrum or None,
                            ahead=ahead)  # fmt: skip
    elif not args.no_check:
        ok = check_folder(out, quiet=args.quiet)
    elif not args.no_plot:
        plot_folder(out, out / "figures", args.format, quiet=args.quiet, spectrum=args.spectrum or None)
    if outputs:
        from ..runs import lock
        from ..trajectory import record_outputs

        with lock(out):
            status, missing = record_outputs(out, outputs)  # written last: the run is complete
        if missing:
            print(f"gflow run: the run is not complete: {', '.join(missing)} not written whole", file=sys.stderr)
    if not ok:
        print(f"gflow run: the check report's verdict fails (see {out / 'report.md'})", file=sys.stderr)
    return EXIT_OK if ok else EXIT_VERDICT


def cmd_theory(args) -> int:
    from ..config import load_config
    from ..runs import preflight
    from ..theory import format_theory, theory_report, unrepresented_parents

    if not 1 <= args.n_pi <= 10**7:
        raise ValueError(f"--n-pi must be an integer in [1, 10000000], got {args.n_pi}")
    cfg = load_config(args.config)
    preflight(cfg, n_pi=args.n_pi)  # before any compute
    unrep = unrepresented_parents(cfg.data, cfg.model)
    if unrep:
        print(f"gflow theory: warning: {unrep}", file=sys.stderr)
    rep = theory_report(cfg, n_pi=args.n_pi)
    print(json.dumps(rep.to_json(), indent=2) if args.json else format_theory(rep))
    return EXIT_OK


def cmd_check(args) -> int:
    return EXIT_OK if check_folder(Path(args.dir), quiet=False, beside=[Path(b) for b in args.beside]) else EXIT_VERDICT


def cmd_sweep(args) -> int:
    from ..config import load_config
    from ..runs import GridIncomplete, check_executor, preflight, run_sweep, sweep_points

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


def cmd_limit(args) -> int:
    from ..config import load_config
    from ..runs import check_executor, limit_grid, preflight, run_limit

    cfg = load_config(args.config)
    _, points = limit_grid(cfg, args.param)  # the grid's problems, before any compute
    for _, point in points:
        preflight(point)
    check_executor(args.executor)
    out = Path(args.out)
    if not args.quiet:
        print(f"gflow limit: {args.config or 'the paper default'} over {', '.join(args.param)}, "
              f"{args.replicates} replicates a size -> {out}", flush=True)  # fmt: skip
    res = run_limit(cfg, args.param, out=out, R=args.replicates, flows=not args.theory_only, n_pi=args.n_pi,
                    resume=args.resume, overwrite=args.overwrite, executor=args.executor,
                    verbose=not args.quiet, plot=not args.no_plot)  # fmt: skip
    if not args.quiet:
        print(res.table())
        print(f"  {len(res.points)} sizes in {res.wall:.1f} s; {', '.join(str(f) for f in res.files[:2])}")
    return EXIT_OK


def cmd_plot(args) -> int:
    d = Path(args.dir)
    plot_folder(d, Path(args.out) if args.out else d / "figures", args.format, quiet=False, spectrum=args.spectrum or None)
    return EXIT_OK


def cmd_eval(args) -> int:
    from ..runs import GridIncomplete, evaluate, preflight, sweep_points
    from ..trajectory import load

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
    from ..runs import GridIncomplete, run_replicates

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
        plot_folder(res.dirs[0], res.dirs[0] / "figures", args.format, quiet=args.quiet)
    for r in res.failed:
        print(f"gflow run: replicate {r}: {res.trajectories[r].status}", file=sys.stderr)
    return EXIT_FAILED if res.failed else EXIT_OK

