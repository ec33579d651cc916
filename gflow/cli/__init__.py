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
  (:mod:`gflow.runs._replicates`); ``--replicates-batch B`` integrates B of them
  at a time, vmapped (default: as many as fit in memory).
- ``gflow sweep [CONFIG] --param data.L=50,100,200 [--param …] --out DIR``:
  one run per point of the cross product, and ``DIR/sweep.csv`` with the
  headline results (:mod:`gflow.runs._sweep`).
- ``gflow phase [CONFIG] --param F=VALUES [--param G=VALUES] --out DIR
  [--flow] [--shard k/n]``: a phase diagram of the theory (and the flow) over
  a grid; ``gflow phase-merge DIR… --out DIR`` joins shards (:mod:`gflow.runs._phase`).

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

The package: the parser (``_parser``), the subcommands (``_commands``), what they write into a
run folder after the integration (``_outputs``) and the process settings and unexpected errors
(``_session``); :func:`main` is the entry point (``gflow = "gflow.cli:main"``).
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from . import _commands
from ._parser import EXIT_FAILED as EXIT_FAILED
from ._parser import EXIT_INPUT as EXIT_INPUT
from ._parser import EXIT_INTERRUPTED as EXIT_INTERRUPTED
from ._parser import EXIT_OK as EXIT_OK
from ._parser import EXIT_UNEXPECTED as EXIT_UNEXPECTED
from ._parser import EXIT_VERDICT as EXIT_VERDICT
from ._parser import PARAM_HELP as PARAM_HELP
from ._parser import build_parser as build_parser
from ._session import enable_compilation_cache, unexpected

_PARSER: argparse.ArgumentParser | None = None


def main(argv: list[str] | None = None) -> int:
    """Run a command; returns its exit code (module docstring). Usage errors exit 2 (argparse)."""
    global _PARSER
    _PARSER = _PARSER or build_parser()  # built once per process (in-process callers run many commands)
    args = _PARSER.parse_args(argv)
    restore = enable_compilation_cache()
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
        return unexpected(args, e)
    finally:
        with contextlib.suppress(Exception):
            restore()


def _dispatch(args) -> int:
    """One function per command (``_commands.cmd_<name>``): a new subcommand is a parser entry and a function."""
    return getattr(_commands, "cmd_" + args.cmd.replace("-", "_"))(args)

