"""The theory's 10-value scans: a new L (or burn-in, or α) against a new w₊ (issue 30).

Each scan is ``gflow phase --param FIELD=… --out DIR`` over 10 values at the paper's default
otherwise (N = 10⁴, L = 100, n_pi = 2000), in a new process with the compilation caches off
(``GFLOW_CACHE=none``: every scan pays its compilations, as the first grid of a session
does). Printed per scan: the whole command's wall time, the first point's and the median of
the others (from ``phase.json``), and the load average before and after; then the ratio of
each scan to the w₊ scan. Target (issue 30): the L scan ≤ 2× the w₊ scan. ``--pairs K``
repeats the w₊ and L scans K times alternating and gives the ratio pair by pair.

Usage: ``python scripts/benchmarks/bench_scan.py [--pairs 3] [--also burn_in alpha]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCANS = {
    "w_plus": "init.w_plus=log:0.5:8:10",
    "L": "data.L=lin:20:200:10",
    "burn_in": "data.burn_in=0,5,10,20,30,40,60,80,100,150",
    "alpha": "data.alpha=log:0.05:1:10",
}


def _load() -> str:
    a, b, c = os.getloadavg()
    return f"load {a:.2f}/{b:.2f}/{c:.2f}"


def _scan(name: str, out: Path) -> tuple[float, float, float]:
    env = dict(os.environ, GFLOW_CACHE="none")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "gflow", "phase", "--param", SCANS[name], "--no-plot", "--quiet",
                    "--out", str(out)], check=True, env=env, stdout=subprocess.DEVNULL, cwd=out.parent)  # fmt: skip
    wall = time.perf_counter() - t0
    w = json.loads((out / "phase.json").read_text())["wall_s"]
    return wall, w[0], statistics.median(w[1:])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=1)
    ap.add_argument("--also", nargs="*", default=[], choices=["burn_in", "alpha"])
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench_scan_"))
    walls: dict[str, list[float]] = {}
    order = ["w_plus", "L"] * args.pairs + list(args.also)
    for i, name in enumerate(order):
        before = _load()
        wall, first, rest = _scan(name, tmp / f"{name}{i}")
        walls.setdefault(name, []).append(wall)
        print(f"{name} scan (10 values, N = 1e4): {wall:.1f} s in all; first point {first:.2f} s, the others median "
              f"{rest:.3f} s ({before} before, {_load()} after)", flush=True)  # fmt: skip
    w = walls["w_plus"]
    for name, v in walls.items():
        if name == "w_plus":
            continue
        r = [a / b for a, b in zip(v, w)] if name == "L" else [statistics.median(v) / statistics.median(w)]
        print(f"{name} scan / w_plus scan: median {statistics.median(r):.2f} (min {min(r):.2f}, max {max(r):.2f})"
              + (" pair by pair (target <= 2)" if name == "L" else ""), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
