"""What ``gflow run``, ``check`` and ``plot`` write into a run folder after the integration: the
check report and the figures, under the folder's lock, recorded in the run's manifest."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path


def output_names(args) -> list[str]:
    """The files ``gflow run`` writes after the integration (its manifest; docs/getting-started.md, "A run folder")."""
    from ..trajectory import FIGURE_NAMES

    names = [] if args.no_check else ["theory.json", "report.json", "report.md"]
    if not args.no_plot:
        names += [f"figures/{n}.{args.format}" for n in FIGURE_NAMES]
    return names


def record(out: Path, paths, cmd: str, quiet: bool) -> None:
    """Record files a command (re)wrote in the run's manifest (:func:`gflow.trajectory.record_outputs`);
    say whether that completed the run."""
    from ..trajectory import WRITING, load, record_outputs

    before = load(out).status
    rel = [os.path.relpath(os.path.realpath(p), os.path.realpath(out)) for p in paths]
    status, missing = record_outputs(out, rel)
    if status == "complete" and before == WRITING and not quiet:
        print(f"gflow {cmd}: the run in {str(out)!r} is complete (every file it lists is whole)")
    elif missing:
        print(f"gflow {cmd}: the run in {str(out)!r} is not complete yet: {', '.join(missing)} missing or damaged "
              f"(gflow check writes the report, gflow plot the figures)", file=sys.stderr)  # fmt: skip


def check_folder(out: Path, *, quiet: bool, beside=()) -> bool:
    """Check a saved run (writes its report into it, under its lock); the gflow verdict. `beside`:
    run folders compared with it (``check(..., beside=...)``), read and vetted before anything else."""
    from ..checks import check_beside
    from ..runs import check_run, lock
    from ..trajectory import load

    if not out.is_dir():
        load(out)  # not a folder: one clear error, nothing created
    others = [load(b) for b in beside]
    if others:
        check_beside(load(out), others)
    with lock(out):
        rep = check_run(out, beside=others) if others else check_run(out)  # a corrupt or foreign run: one clear error
        record(out, [out / "theory.json", out / "report.json", out / "report.md"], "check", quiet)
    return print_verdict(rep, quiet)


def check_and_plot(out: Path, figdir: Path, fmt: str, *, quiet: bool, spectrum: bool | None = None,
                   ahead=None) -> bool:  # fmt: skip
    """``gflow run``'s check report and figures, under one lock, overlapped: the run's theory
    first (both need it), then the figures are drawn in a second thread while the report's
    rows are computed. Drawing is Python (matplotlib holds the interpreter lock) and the
    rows are mostly XLA arithmetic (which releases it), so on two cores the figures cost
    little extra wall time (docs/performance.md). The same files as :func:`check_folder` then
    :func:`plot_folder`; an error in either is raised after both have finished."""
    from concurrent.futures import ThreadPoolExecutor

    from ..core import make_loss
    from ..runs import check_output, check_run, load_or_compute, lock, plot_run
    from ..trajectory import load, record_outputs

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
    ok = print_verdict(rep, quiet)
    if not quiet:
        print(f"  figures: {', '.join(str(p) for p in paths)}")
    return ok


def print_verdict(rep, quiet: bool) -> bool:
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


def plot_folder(out: Path, figdir: Path, fmt: str, *, quiet: bool, spectrum: bool | None = None) -> None:
    from ..runs import check_output, lock, plot_run
    from ..trajectory import load

    load(out)  # a missing, corrupt or foreign folder: one clear error
    check_output(figdir)  # a file, under a file, read-only: before drawing anything
    inside = Path(os.path.realpath(figdir)).is_relative_to(os.path.realpath(out))
    with lock(out) if inside else contextlib.nullcontext():
        paths = plot_run(out, figdir, fmt=fmt, spectrum=spectrum)
        if inside:  # repairs a run whose figures were missing or damaged, then completes it
            record(out, paths, "plot", quiet)
    if not quiet:
        print(f"  figures: {', '.join(str(p) for p in paths)}")


