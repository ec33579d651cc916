"""The parser of the ``gflow`` command: its description, examples, ``--param`` syntax, exit
codes (:data:`EXIT_OK` …) and every subcommand's arguments (:func:`build_parser`)."""

from __future__ import annotations

import argparse

EXIT_OK = 0
EXIT_VERDICT = 1
EXIT_INPUT = 2
EXIT_FAILED = 3
EXIT_UNEXPECTED = 4
EXIT_INTERRUPTED = 130

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
  gflow limit --param data.L=50,100,200,400 --out runs/limit

--param syntax (run: one value a field; sweep, phase, eval: several):
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
  4    an unexpected error (a bug, or a resource the preflight did not foresee):
       one line here, the traceback in DIR/gflow.log (or a named temporary file)
  130  interrupted (Ctrl-C); the run is saved as "interrupted": --resume continues it

environment: GFLOW_CACHE names the compilation cache folder (default
~/.cache/gflow/xla; GFLOW_CACHE=none turns it off)."""

PARAM_HELP = (
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


def build_parser() -> argparse.ArgumentParser:
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
    r.add_argument("--param", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="set one config field on top of the configuration (one value each, the sweep's "
                   "syntax: data.L=40, 'data.parents=[1,2]'); repeat for several fields; "
                   "several values are a sweep: gflow sweep")  # fmt: skip
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
    c.add_argument("--beside", action="append", default=[], metavar="DIR",
                   help="another run folder of the same data, model, estimator and init (a GD run's flow or "
                        "central flow): the report gives the distance between the two runs; repeat for several")  # fmt: skip

    sw = _sub(sub, "sweep", "one run per point of a cross product of config values, and a CSV table",
              "Run one ordinary run folder per point of the cross product of the --param values, and write "
              "OUT/sweep.csv with the headline numbers of every point (S*, C*, window, a*, limit loss, measured "
              "set, slope, a and loss at the end, check verdict, wall time). Every point is validated first.")  # fmt: skip
    sw.add_argument("config", nargs="?", help="base TOML configuration (default: the paper's default run)")
    sw.add_argument("--param", action="append", required=True, metavar="SECTION.KEY=VALUES", help=PARAM_HELP)
    sw.add_argument("--out", required=True, help="sweep folder: one run folder per point and sweep.csv")
    sw.add_argument("--resume", action="store_true", help="reuse or continue the points' runs already in --out")
    sw.add_argument("--overwrite", action="store_true", help="replace the points' runs already in --out")
    sw.add_argument("--no-check", action="store_true", help="skip the check reports (no theory columns)")
    sw.add_argument("--progress", action="store_true", help="diffrax's tqdm progress meter")
    sw.add_argument("--executor", metavar="SPEC", help=_EXECUTOR_HELP)
    sw.add_argument("--quiet", action="store_true", help=_QUIET_HELP)

    _eval_parser(sub)
    _phase_parsers(sub)
    _limit_parser(sub)

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
    """``gflow phase`` and ``gflow phase-merge`` (:mod:`gflow.runs._phase`)."""
    ph = _sub(sub, "phase", "phase diagram: the theory (and with --flow the flow) over a 1-d or 2-d grid",
              "Compute, at every point of a grid over one or two configuration fields, the paper's Stage I winner "
              "(argmax of the modified chi2-MI), gflow's finite-size winner (argmax J), the predicted Stage I "
              "duration and the Stage III law of the predicted set; with --flow also integrate and check every "
              "point. Writes OUT/phase.csv, phase.json, points/ and figures/. Running the same command again "
              "computes only the missing points.")  # fmt: skip
    ph.add_argument("config", nargs="?", help="base TOML configuration (default: the paper's default run)")
    ph.add_argument("--param", action="append", required=True, metavar="SECTION.KEY=VALUES",
                    help=PARAM_HELP + "; one or two axes")  # fmt: skip
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


def _limit_parser(sub) -> None:
    """``gflow limit [CONFIG] --param data.L=50,100,200,400 [--param init.w_plus=…] --out DIR``."""
    li = _sub(sub, "limit", "the paper's asymptotic claims decided by finite-size scaling in L (and w_plus)",
              "Measure every asymptotic claim of the paper at three or more sizes (data.L, and/or init.w_plus), "
              "with its standard error over R replicates per size, fit scaling models by weighted least squares "
              "(q_inf, q_inf + b/L, q_inf + b/sqrt(L), q_inf + b/ln L; with a w_plus axis + c (1 - lambda_w), "
              "lambda_w the initial copier's contrast; chosen by AIC among those with a chi2 p-value >= 0.01; the "
              "limit's SE over the replicates, which share their chains across sizes), extrapolate to the limit with a 95% interval and "
              "decide each claim: consistent, inconsistent or undecided. Writes OUT/limit.json, limit.md, "
              "figures/limit_<claim>.png and the replicate runs under OUT/points/.")  # fmt: skip
    li.add_argument("config", nargs="?", help="base TOML configuration (default: the paper's default run)")
    li.add_argument("--param", action="append", required=True, metavar="SECTION.KEY=VALUES",
                    help=PARAM_HELP + "; the scaling axes: data.L and/or init.w_plus, three values or more each "
                    "(data.L=50,100,200,400, init.w_plus=lin:2:6:3)")  # fmt: skip
    li.add_argument("--out", required=True, help="output folder (limit.json, limit.md, figures/, points/)")
    li.add_argument("--replicates", type=int, default=4, metavar="R",
                    help="independent replicates per size (estimator.seed = seed + r; default 4, at least 2)")
    li.add_argument("--theory-only", action="store_true",
                    help="only the claims computed on the samples (the Stage I rates); no flows")
    li.add_argument("--n-pi", type=int, default=2000, help="kernels drawn for the Ĩ average (default 2000)")
    li.add_argument("--executor", metavar="SPEC", help=_EXECUTOR_HELP + " (a size's replicates a task)")
    li.add_argument("--resume", action="store_true", help="reuse the complete replicate runs in --out, compute the rest")
    li.add_argument("--overwrite", action="store_true", help="replace the replicate runs already in --out")
    li.add_argument("--no-plot", action="store_true", help="skip the figures")
    li.add_argument("--quiet", action="store_true", help=_QUIET_HELP)


def _eval_parser(sub) -> None:
    """``gflow eval RUN --param data.L=25,50,100 [--param …] [--out DIR]``."""
    e = _sub(sub, "eval", "evaluate a run's final parameters on other data configurations, with the loss ladder",
             "Evaluate a run's final parameters on every point of the cross product of the --param values, each "
             "on its own sample, with that sample's loss ladder (oracle, Bayes, GIH, unigram). It may change "
             "data.L, data.alpha, data.parents, data.start, data.burn_in, data.kernel, data.prior, estimator.N, "
             "estimator.seed and estimator.chunk. Writes eval.csv, eval.json and eval.png.")  # fmt: skip
    e.add_argument("dir", help="a run folder")
    e.add_argument("--param", action="append", required=True, metavar="SECTION.KEY=VALUES", help=PARAM_HELP)
    e.add_argument("--out", help="output folder for eval.csv, eval.json, eval.png (default DIR/eval)")
    e.add_argument("--no-plot", action="store_true", help="skip the figure")
    e.add_argument("--executor", metavar="SPEC", help=_EXECUTOR_HELP)
    e.add_argument("--quiet", action="store_true", help=_QUIET_HELP)

