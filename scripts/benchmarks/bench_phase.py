"""The cost of a phase grid (gflow/phase.py), run once.

1. **Theory only**, two 10 × 10 grids at the paper's default otherwise
   (N = 10⁴, L = 100, n_pi = 2000), compilation cache off (``GFLOW_CACHE=none``):
   (a) ``init.w_plus = log:0.5:8:10`` × ``data.L = lin:20:200:10`` (the
   figure's axes: each L compiles the sampler once, 10 samples, one law per
   sample and set); (b) ``init.w_plus = log:0.5:8:10`` × ``init.w_minus =
   log:0.01:1:10`` (one sample: J per point). Total wall time, the first point
   and the median of the others. Target: ≤ 120 s in total.
2. **Flows**: ``--flow`` on ``init.w_plus = lin:2:4:K`` with a small flow
   configuration (d = 3, L = 40, N = 2000, Stage III capped at τ = 100):
   wall time per point (theory + integration + check report), the first
   (compilations) and the others. Target: ≤ 10 s per point after the first.

3. **Warm against cold** (``--warm K``): ``K`` pairs of ``python -m gflow run`` of the
   paper's default in new processes, each pair a *cold* run (an empty persistent
   compilation cache, ``GFLOW_CACHE`` a new folder) and then a *warm* one (the cache the
   cold run filled). Wall time of each, their medians and the median of the pairwise
   ratios warm/cold. Target: ≤ 0.5 (a second invocation should not pay the set-up again).

Prints the load average (``uptime``) with every number. Usage:
``python scripts/benchmarks/bench_phase.py [--flow-points 4] [--skip-theory] [--skip-flow] [--warm 3]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

os.environ.setdefault("GFLOW_CACHE", "none")


def _load() -> str:
    return subprocess.run(["uptime"], check=False, capture_output=True, text=True).stdout.strip()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--flow-points", type=int, default=4)
    ap.add_argument("--skip-theory", action="store_true")
    ap.add_argument("--skip-flow", action="store_true")
    ap.add_argument("--warm", type=int, default=0, metavar="K", help="K cold/warm pairs of `gflow run` (part 3)")
    args = ap.parse_args(argv)
    if args.warm:
        _warm_vs_cold(args.warm)
        return

    import gflow
    from gflow.runs._phase import run_phase

    tmp = tempfile.mkdtemp(prefix="bench_phase_")
    if not args.skip_theory:
        grids = {
            "w_plus x L": ["init.w_plus=log:0.5:8:10", "data.L=lin:20:200:10"],
            "w_plus x w_minus": ["init.w_plus=log:0.5:8:10", "init.w_minus=log:0.01:1:10"],
        }
        for name, params in grids.items():
            print("load before:", _load(), flush=True)
            t0 = time.perf_counter()
            res = run_phase(gflow.Config(), params, f"{tmp}/{name.replace(' ', '')}", plot=False)
            total = time.perf_counter() - t0
            w = np.array(res.point_walls)
            print(f"theory-only 10x10 grid {name}, N = 1e4: total {total:.1f} s (target <= 120 s); first point "
                  f"{w[0]:.2f} s, others median {np.median(w[1:]):.3f} s, max {w[1:].max():.2f} s", flush=True)
            print("load after:", _load(), flush=True)
    if not args.skip_flow:
        cfg = gflow.Config().replace(data={"L": 40}, estimator={"N": 2000}, schedule={"durations": [1e3, 1e10, 100.0]})
        print("load before:", _load(), flush=True)
        t0 = time.perf_counter()
        res = run_phase(cfg, [f"init.w_plus=lin:2:4:{args.flow_points}"], f"{tmp}/flow", flow=True, plot=False)
        total = time.perf_counter() - t0
        w = np.array(res.point_walls)
        print(f"flow grid ({len(w)} points; d=3, L=40, N=2000, Stage III to tau=100): total {total:.1f} s; "
              f"first point {w[0]:.1f} s; after the first: " + ", ".join(f"{x:.1f}" for x in w[1:])
              + f" s (median {np.median(w[1:]):.1f} s; target <= 10 s)", flush=True)  # fmt: skip
        print("load after:", _load(), flush=True)
        for r in res.rows:
            print(f"  w+={r['init.w_plus']:.3g}: argmax J {r['argmax_J']}, selected {r['selected']}, "
                  f"t_I {r['t_event_I']} vs predicted {r['stage1_duration']:.4g}, verdict {r['verdict_gflow']}")


def _timed_run(cache: str, out: str) -> float:
    env = dict(os.environ, GFLOW_CACHE=cache)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "gflow", "run", "--out", out], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    return time.perf_counter() - t0


def _warm_vs_cold(pairs: int) -> None:
    """Part 3 (module docstring)."""
    tmp = tempfile.mkdtemp(prefix="bench_warm_")
    cold, warm = [], []
    for k in range(pairs):
        print("load before:", _load(), flush=True)
        cache = f"{tmp}/cache{k}"
        cold.append(_timed_run(cache, f"{tmp}/cold{k}"))
        warm.append(_timed_run(cache, f"{tmp}/warm{k}"))
        print(f"pair {k + 1}: cold {cold[-1]:.1f} s, warm {warm[-1]:.1f} s, ratio {warm[-1] / cold[-1]:.2f}", flush=True)
    ratios = np.array(warm) / np.array(cold)
    print(f"gflow run (the paper's default), {pairs} pairs: cold median {np.median(cold):.1f} s "
          f"(min {min(cold):.1f}, max {max(cold):.1f}); warm median {np.median(warm):.1f} s (min {min(warm):.1f}, "
          f"max {max(warm):.1f}); warm/cold median {np.median(ratios):.2f} (target <= 0.5)", flush=True)  # fmt: skip
    print("load after:", _load(), flush=True)


if __name__ == "__main__":
    main()
