"""Where does the paper's Stage I criterion (argmax Ĩ) pick the set that the
finite-size law (argmax J) picks? Chooses the axes of the committed phase
diagram with the phase tool itself, then draws it.

1. **Search.** From the paper's default (d = 3, parents (1, 2), L = 100,
   w₊ = 3, α = 0.1, D = 2), a theory-only 1-d scan of each of w₊, L, the
   parent structure, d, α and D (:func:`gflow.runs._phase.run_phase`). Each axis
   is scored by the number of points where argmax J ≠ argmax Ĩ plus the
   number of changes of either winner along the axis.
2. **Diagram.** The two numeric axes with the highest scores (ties: the
   order above) span a 2-d theory-only grid, drawn into
   ``figures/phase_map.png`` and ``figures/phase_heat.png``; the scan's table
   goes to ``figures/phase_search.md``.

Usage: ``python scripts/studies/phase_diagram.py [--out DIR] [--N 5000] [--n 8]``
(about 5–10 minutes on 2 busy cores; every point is theory only).
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import time
from pathlib import Path

import gflow
from gflow.runs._phase import run_phase

ROOT = Path(__file__).resolve().parents[2]

SCANS = {
    "init.w_plus": "log:0.5:8:7",
    "data.L": "20,50,100,200",
    "data.parents": "[1];[2];[1,2];[1,3];[2,3];[1,2,3]",
    "data.d": "2,3,4",
    "data.alpha": "log:0.03:1:5",
    "model.D": "1,2,3",
}
NUMERIC_2D = {  # the 2-d grid's values for each numeric axis (n points)
    "init.w_plus": lambda n: f"log:0.5:8:{n}",
    "data.L": lambda n: ",".join(str(v) for v in [20, 30, 40, 60, 80, 100, 150, 200][:n]),
    "data.alpha": lambda n: f"log:0.03:1:{n}",
}


def _changes(seq) -> int:
    return sum(a != b for a, b in itertools.pairwise(seq))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="/tmp/gflow_phase_diagram", help="work folder for the grids")
    ap.add_argument("--N", type=int, default=5000, help="sequences per point (estimator.N)")
    ap.add_argument("--n", type=int, default=8, help="points per axis of the 2-d grid")
    ap.add_argument("--n-pi", type=int, default=2000)
    ap.add_argument("--figures", default=str(ROOT / "figures"))
    args = ap.parse_args(argv)
    base = gflow.Config().replace(estimator={"N": args.N})
    work = Path(args.out)
    t0 = time.perf_counter()
    lines = ["| axis | values | argmax Ĩ | argmax J | points J ≠ Ĩ | score |", "|---|---|---|---|---|---|"]
    scores = {}
    for field, vals in SCANS.items():
        ts = time.perf_counter()
        # a model must hold the parent offsets: H = M = 3 covers every scan value
        res = run_phase(base, [f"{field}={vals}"], work / field, n_pi=args.n_pi, plot=False)
        S = [r["S_star"] + ("?" if r["Itilde_uncertain"] else "") for r in res.rows]
        J = [r["argmax_J"] + ("?" if r["J_uncertain"] else "") for r in res.rows]
        dis = sum(r["S_star"] != r["argmax_J"] for r in res.rows)
        scores[field] = dis + _changes([r["S_star"] for r in res.rows]) + _changes([r["argmax_J"] for r in res.rows])
        shown = [gflow.runs._sweep.show_value(r[field]) if not isinstance(r[field], float) else f"{r[field]:.3g}"
                 for r in res.rows]  # fmt: skip
        lines.append(f"| {field} | {' '.join(shown)} | {' '.join(S)} | {' '.join(J)} | {dis} | {scores[field]} |")
        print(lines[-1], f"({time.perf_counter() - ts:.0f} s)", flush=True)
    axes = sorted(NUMERIC_2D, key=lambda f: -scores[f])[:2]
    axes.sort(key=list(NUMERIC_2D).index)
    print(f"2-d grid over {axes} (scores {[scores[a] for a in axes]})", flush=True)
    res = run_phase(base, [f"{a}={NUMERIC_2D[a](args.n)}" for a in axes], work / "grid", n_pi=args.n_pi,
                    plot=True)  # fmt: skip
    print(res.table())
    figs = Path(args.figures)
    figs.mkdir(parents=True, exist_ok=True)
    for name in ("phase_map.png", "phase_heat.png"):
        shutil.copy(work / "grid" / "figures" / name, figs / name)
    shutil.copy(work / "grid" / "phase.csv", figs / "phase_grid.csv")
    wall = time.perf_counter() - t0
    (figs / "phase_search.md").write_text(
        "Theory-only 1-d scans from the paper's default (N = "
        f"{args.N}, n_pi = {args.n_pi}); `?`: top two within 3 paired SE.\n\n" + "\n".join(lines)
        + f"\n\n2-d grid: {axes[0]} × {axes[1]}, {args.n}×{args.n} points; total wall {wall:.0f} s.\n"
    )
    print(f"figures in {figs}; {wall:.0f} s")


if __name__ == "__main__":
    main()
