"""Where a cold ``gflow run`` spends its compilation (issue 30, part 4).

Runs ``gflow run [CONFIG] --out TMP --quiet`` in this process with the compilation caches off
(``GFLOW_CACHE=none``: a cold start) and JAX's monitoring events recorded: for every
compiled program its tracing (``jaxpr_trace_duration``), lowering to MLIR
(``jaxpr_to_mlir_module_duration``) and XLA compilation (``backend_compile_duration``), with
how many times each happened. Prints the whole run's wall time, the sums, and the programs
by time (``--top``). What is left is arithmetic (``python scripts/bench_flow.py`` gives the
warm run's cost model).

Usage: ``python scripts/benchmarks/profile_compile.py [CONFIG.toml] [--top 25]``.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time

os.environ["GFLOW_CACHE"] = "none"

EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
    "/jax/core/compile/backend_compile_duration": "compile",
}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("config", nargs="?")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    import jax

    rec: dict[tuple[str, str], list[float]] = collections.defaultdict(list)

    def listen(event, duration, **kw):
        if event in EVENTS:
            name = kw.get("fun_name", "?")
            name = name[4:-1] if name.startswith("jit(") else name
            rec[(EVENTS[event], name)].append(duration)

    jax.monitoring.register_event_duration_secs_listener(listen)
    from gflow.cli import main as gflow_main

    out = tempfile.mkdtemp(prefix="profile_compile_")
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    code = gflow_main(["run", *([args.config] if args.config else []), "--out", out, "--quiet"])
    wall = time.perf_counter() - t0
    jax.monitoring.unregister_event_duration_listener(listen)
    tot = {k: sum(sum(v) for (kind, _), v in rec.items() if kind == k) for k in ("trace", "lower", "compile")}
    n = {k: sum(len(v) for (kind, _), v in rec.items() if kind == k) for k in ("trace", "lower", "compile")}
    print(f"gflow run {args.config or '(the paper default)'}: exit {code}, wall {wall:.1f} s; load "
          f"{load0[0]:.2f} before, {os.getloadavg()[0]:.2f} after")  # fmt: skip
    print(f"  XLA compilation {tot['compile']:.1f} s ({n['compile']} programs), tracing {tot['trace']:.1f} s "
          f"({n['trace']}), lowering {tot['lower']:.1f} s ({n['lower']}); together "
          f"{sum(tot.values()):.1f} s of {wall:.1f} s")  # fmt: skip
    by = collections.defaultdict(lambda: {"trace": 0.0, "lower": 0.0, "compile": 0.0, "n": 0})
    for (kind, name), v in rec.items():
        by[name][kind] += sum(v)
        if kind == "compile":
            by[name]["n"] += len(v)
    rows = sorted(by.items(), key=lambda kv: -(kv[1]["trace"] + kv[1]["lower"] + kv[1]["compile"]))
    print(f"  {'program':<48} {'compiles':>8} {'compile s':>10} {'trace s':>8} {'lower s':>8}")
    for name, r in rows[: args.top]:
        print(f"  {name[:48]:<48} {r['n']:>8} {r['compile']:>10.2f} {r['trace']:>8.2f} {r['lower']:>8.2f}")
    rest = rows[args.top:]
    if rest:
        print(f"  ... {len(rest)} more programs: compile {sum(r['compile'] for _, r in rest):.2f} s, "
              f"trace {sum(r['trace'] for _, r in rest):.2f} s, lower {sum(r['lower'] for _, r in rest):.2f} s")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
