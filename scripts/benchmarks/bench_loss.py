"""Benchmark the Monte Carlo loss and its gradient (docs/theory/mathematics.md §M5).

At the paper's default (d=3, trigram, L=100, H=M=3, D=2, N=10,000, float64)
and around it (N and L swept), for both layouts of the sample ("counts", the
default, and "positions"), this times after compilation

- one evaluation of loss + gradient (``PopulationLoss.value_and_grad``,
  jitted): median, min and max of ``--reps`` runs;
- one evaluation of ``PopulationLoss.stats`` (loss, gradient and their Monte
  Carlo standard errors);

and reports memory. XLA allocates outside Python's allocator, so tracemalloc
sees nothing: every configuration runs in a fresh subprocess, which reports
its resident set size after importing JAX and initialising the backend
(baseline) and its peak (``VmHWM``, the same as ``ru_maxrss``) at the end;
the difference is what the configuration costs, compilation included.

Usage::

    python scripts/benchmarks/bench_loss.py            # the full table
    python scripts/benchmarks/bench_loss.py --quick    # the default configuration only

Timings on a shared machine are noisy: the load average is printed with the
table, and min/max are given next to the median.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from _bench import rss_mb, timings

# One loss + gradient at the default must cost ≤ 30 ms so that a ~1,000-evaluation
# staged run stays well under a minute on a 2-core laptop.
TARGET_MS = 30.0


def child(layout: str, N: int, L: int, reps: int, stats_reps: int) -> dict:
    """Run one configuration in this process and return its measurements."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    import gflow
    from gflow.core._loss import resolve_layout

    jax.block_until_ready(jnp.ones(3) + 1)  # initialise the backend
    rss0 = rss_mb("VmRSS")

    data = gflow.DataConfig(d=3, parents=(1, 2), alpha=0.1, L=L)
    model = gflow.ModelConfig(M=3, H=3, D=2)
    est = gflow.EstimatorConfig(N=N, seed=0, layout=layout, dtype="float64")
    t0 = time.perf_counter()
    f = gflow.make_loss(data, model, est)
    jax.block_until_ready(f)
    t_build = time.perf_counter() - t0
    p = gflow.init_params(model)

    vg = eqx.filter_jit(lambda f, p: f.value_and_grad(p))
    t0 = time.perf_counter()
    jax.block_until_ready(vg(f, p))
    t_compile = time.perf_counter() - t0
    t_vg = timings(lambda: vg(f, p), reps)

    st = eqx.filter_jit(lambda f, p: f.stats(p))
    t0 = time.perf_counter()
    s = st(f, p)
    jax.block_until_ready(s)
    t_compile_stats = time.perf_counter() - t0
    t_st = timings(lambda: st(f, p), stats_reps)

    return dict(
        layout=resolve_layout(layout, data.d, model.M),
        N=N,
        L=L,
        build_s=t_build,
        compile_s=t_compile,
        vg_ms=[1e3 * t for t in t_vg],
        compile_stats_s=t_compile_stats,
        stats_ms=[1e3 * t for t in t_st],
        rss_base_mb=rss0,
        rss_peak_mb=rss_mb("VmHWM"),
        loss=float(s.loss),
        loss_se=float(s.loss_se),
    )


def run_child(layout: str, N: int, L: int, reps: int, stats_reps: int) -> dict:
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        f"--layout={layout}",
        f"--N={N}",
        f"--L={L}",
        f"--reps={reps}",
        f"--stats-reps={stats_reps}",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        return dict(layout=layout, N=N, L=L, error=out.stderr.strip().splitlines()[-1:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def _fmt_times(ts: list[float]) -> str:
    import statistics

    return f"{statistics.median(ts):8.2f} ({min(ts):7.2f}-{max(ts):7.2f})"


def _median(ts):
    import statistics

    return statistics.median(ts)


def print_table(rows: list[dict]) -> None:
    head = (
        f"{'layout':<10}{'N':>7}{'L':>5} | {'build s':>8}{'compile s':>10} | "
        f"{'loss+grad ms: median (min-max)':>31} | {'stats ms: median (min-max)':>28} | "
        f"{'RSS base':>9}{'peak':>8}{'Δ MB':>8}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        if "error" in r:
            print(f"{r['layout']:<10}{r['N']:>7}{r['L']:>5} | failed: {r['error']}")
            continue
        print(
            f"{r['layout']:<10}{r['N']:>7}{r['L']:>5} | {r['build_s']:8.2f}{r['compile_s']:10.2f} | "
            f"{_fmt_times(r['vg_ms']):>31} | {_fmt_times(r['stats_ms']):>28} | "
            f"{r['rss_base_mb']:9.0f}{r['rss_peak_mb']:8.0f}{r['rss_peak_mb'] - r['rss_base_mb']:8.0f}"
        )


def print_scaling(rows: list[dict], N0: int, L0: int) -> None:
    """Fitted exponents: time ∝ N^β (at L0) and ∝ L^β (at N0)."""
    import numpy as np

    ok = [r for r in rows if "error" not in r]
    print("\nScaling of the median loss+grad time (log-log slope):")
    for layout in sorted({r["layout"] for r in ok}):
        for var, fixed, fval in (("N", "L", L0), ("L", "N", N0)):
            sel = [r for r in ok if r["layout"] == layout and r[fixed] == fval]
            pts = sorted((r[var], _median(r["vg_ms"])) for r in sel)
            if len(pts) >= 2:
                x, y = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
                slope = np.polyfit(x, y, 1)[0]
                desc = ", ".join(f"{v}: {t:.2f} ms" for v, t in pts)
                print(f"  {layout:<10} vs {var} ({fixed}={fval}): slope {slope:5.2f}   [{desc}]")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--layout", default="counts")
    ap.add_argument("--N", type=int, default=10_000)
    ap.add_argument("--L", type=int, default=100)
    ap.add_argument("--reps", type=int, default=20, help="timed loss+grad evaluations (default 20)")
    ap.add_argument("--stats-reps", type=int, default=10, help="timed .stats evaluations (default 10)")
    ap.add_argument("--quick", action="store_true", help="only the default configuration, both layouts")
    ap.add_argument("--json", help="also write the measurements to this file")
    args = ap.parse_args(argv)

    if args.child:
        print(json.dumps(child(args.layout, args.N, args.L, args.reps, args.stats_reps)))
        return

    import jax

    import gflow

    N0, L0 = 10_000, 100
    configs = [(N0, L0)]
    if not args.quick:
        configs += [(2_500, L0), (40_000, L0), (N0, 50), (N0, 200)]
    print(
        f"gflow {gflow.__version__}, jax {jax.__version__}, {jax.devices()[0].platform} "
        f"({os.cpu_count()} cores), float64; d=3, parents (1, 2), alpha=0.1, H=M=3, D=2; "
        f"params at the paper's initialisation"
    )
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    rows = []
    for N, L in configs:
        for layout in ("counts", "positions"):
            rows.append(run_child(layout, N, L, args.reps, args.stats_reps))
    print_table(rows)
    print_scaling(rows, N0, L0)
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    default = [
        r for r in rows if "error" not in r and (r["N"], r["L"], r["layout"]) == (N0, L0, "counts")
    ]
    if default:
        med = _median(default[0]["vg_ms"])
        verdict = "meets" if med <= TARGET_MS else "MISSES"
        print(
            f"default (counts, N={N0}, L={L0}): median {med:.2f} ms, "
            f"{verdict} the {TARGET_MS:.0f} ms target"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
