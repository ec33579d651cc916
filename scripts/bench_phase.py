"""The cost of a phase grid (gflow/phase.py), run once.

1. **Theory only**: a 10 × 10 grid, ``init.w_plus = log:1:10:10`` ×
   ``data.alpha = log:0.03:1:10``, at the paper's default otherwise
   (N = 10⁴, L = 100, n_pi = 2000), in a fresh process with the persistent
   compilation cache off: total wall time, the first point (compilations)
   and the median of the others. Target: ≤ 120 s in total.
2. **Flows**: ``--flow`` on ``init.w_plus = lin:2:4:K`` with a small flow
   configuration (scripts/small.toml's d = 3, L = 40, N = 2000, with Stage
   III capped at τ = 100): wall time per point (theory + integration + check
   report), the first (compilations) and the others. Target: ≤ 10 s per point
   after the first.

Prints the load average (``uptime``) with every number. Usage:
``python scripts/bench_phase.py [--flow-points 4] [--skip-theory] [--skip-flow]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
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
    args = ap.parse_args(argv)

    import gflow
    from gflow.phase import run_phase

    tmp = tempfile.mkdtemp(prefix="bench_phase_")
    if not args.skip_theory:
        print("load before:", _load(), flush=True)
        t0 = time.perf_counter()
        res = run_phase(gflow.Config(), ["init.w_plus=log:1:10:10", "data.alpha=log:0.03:1:10"],
                        f"{tmp}/theory", plot=False)  # fmt: skip
        total = time.perf_counter() - t0
        w = np.array(res.point_walls)
        print(f"theory-only 10x10 grid, N = 1e4: total {total:.1f} s (target <= 120 s); first point {w[0]:.2f} s, "
              f"others median {np.median(w[1:]):.3f} s, max {w[1:].max():.2f} s, sum {w.sum():.1f} s", flush=True)
        print("load after:", _load(), flush=True)
        t0 = time.perf_counter()
        from gflow.phase import plot_phase

        plot_phase(f"{tmp}/theory")
        print(f"figures: {time.perf_counter() - t0:.1f} s", flush=True)
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


if __name__ == "__main__":
    main()
