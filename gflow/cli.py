"""The ``gflow`` command.

- ``gflow run [CONFIG] --out DIR``: integrate the flow of a TOML
  configuration (none: the paper's default staged run), write the trajectory,
  the check report and the figures into DIR.
- ``gflow theory [CONFIG] [--json]``: the paper's predictions for a
  configuration, without integrating anything.
- ``gflow check DIR``: compare a saved run with the theory; writes
  ``report.json`` and ``report.md`` into DIR and prints the table.
- ``gflow plot DIR [--out FIGDIR]``: draw the figures of a saved run.
- ``gflow run [CONFIG] --out DIR --replicates R``: R independent Monte Carlo
  replicates (``estimator.seed = seed + r``) into ``DIR/rep000``, …, with
  their trajectory bands and the spread of the check rows
  (:mod:`gflow.replicates`); ``--replicates-batch B`` integrates B of them
  at a time, vmapped (default: as many as fit in memory).
- ``gflow sweep [CONFIG] --param data.L=50,100,200 [--param …] --out DIR``:
  one run per point of the cross product, and ``DIR/sweep.csv`` with the
  headline results (:mod:`gflow.sweep`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


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

    pl = sub.add_parser("plot", help="draw the figures of a saved run")
    pl.add_argument("dir")
    pl.add_argument("--out", help="figure folder (default DIR/figures)")
    pl.add_argument("--format", default="png", choices=("png", "svg", "pdf"))
    return p


def _enable_compilation_cache() -> None:
    """JAX's persistent compilation cache for the command line: a second
    ``gflow run`` of the same shapes skips XLA compilation. ``GFLOW_CACHE``
    names the folder (default ``~/.cache/gflow/xla``); ``GFLOW_CACHE=none``
    turns it off."""
    import os

    import jax

    where = os.environ.get("GFLOW_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "gflow", "xla"))
    if where.lower() != "none":
        jax.config.update("jax_compilation_cache_dir", where)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _enable_compilation_cache()
    try:
        return _dispatch(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"gflow {args.cmd}: error: {e}", file=sys.stderr)
        return 2


def _dispatch(args) -> int:
    from .config import load_config

    if args.cmd == "run":
        from .flow import FlowError, integrate

        cfg = load_config(args.config)
        if args.progress:
            cfg = cfg.replace(solver={"progress": True})
        out = Path(args.out)
        if args.replicates is not None:
            return _run_replicates(args, cfg, out)
        if args.replicates_batch is not None:
            raise ValueError("--replicates-batch needs --replicates R")
        if not args.quiet:
            print(f"gflow run: {args.config or 'the paper default'} -> {out}", flush=True)
        t0 = time.perf_counter()
        try:
            traj = integrate(cfg, out=out, resume=args.resume, overwrite=args.overwrite, verbose=not args.quiet)
        except FlowError as e:
            print(f"gflow run: {e}", file=sys.stderr)
            return 1
        if not args.quiet:
            for st in traj.stages:
                print(f"  Stage {st.name}: t = {st.t0:.4g} -> {st.t1:.4g} ({st.ended_by}), steps {st.steps}, "
                      f"rejected {st.rejected}, vector-field evaluations {st.nfev}, {st.wall:.1f} s")  # fmt: skip
            print(f"  wall time {time.perf_counter() - t0:.1f} s; trajectory in {out}")
        if not args.no_check:
            _check(out, quiet=args.quiet)
        if not args.no_plot:
            _plot(out, out / "figures", args.format, quiet=args.quiet)
        return 0

    if args.cmd == "theory":
        from .theory import format_theory, theory_report

        cfg = load_config(args.config)
        sc = cfg.schedule
        rep = theory_report(cfg.data, cfg.model, cfg.estimator, cfg.init, n_pi=args.n_pi, eta_C=sc.eta_C, delta=sc.delta)
        print(json.dumps(rep.to_json(), indent=2) if args.json else format_theory(rep))
        return 0

    if args.cmd == "check":
        ok = _check(Path(args.dir), quiet=False)
        return 0 if ok else 1

    if args.cmd == "sweep":
        from .sweep import run_sweep

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
        return 1 if res.failed else 0

    if args.cmd == "plot":
        d = Path(args.dir)
        _plot(d, Path(args.out) if args.out else d / "figures", args.format, quiet=False)
        return 0
    raise AssertionError(args.cmd)


def _run_replicates(args, cfg, out: Path) -> int:
    from .replicates import run_replicates

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
    return 1 if res.failed else 0


def _check(out: Path, *, quiet: bool) -> bool:
    from .checks import check_run

    rep = check_run(out)
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


def _plot(out: Path, figdir: Path, fmt: str, *, quiet: bool) -> None:
    from .plot import plot_run

    paths = plot_run(out, figdir, fmt=fmt)
    if not quiet:
        print(f"  figures: {', '.join(str(p) for p in paths)}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
