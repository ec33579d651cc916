"""Cold against warm ``gflow run`` of the paper's default (issue 30, part 4).

``--pairs K`` pairs of ``python -m gflow run --out DIR --quiet`` in new processes: a *cold* run
(``GFLOW_CACHE`` a new, empty folder: every program traced and compiled) and then a *warm* one
(the cache the cold run filled: programs deserialized, nothing compiled). Prints each run's
wall time and the load average, the medians, and the ratio cold/warm pair by pair (target of
issue 30: ≤ 1.6; 2.1 at commit 40f7db1). ``--compare PATH`` also times the same pairs with
``PYTHONPATH=PATH`` (e.g. a worktree of the commit before), alternating, and prints both.

Usage: ``python scripts/benchmarks/bench_cold.py [--pairs 5] [--compare /tmp/base]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _load() -> float:
    return os.getloadavg()[0]


def _run(cache: Path, out: Path, pythonpath: str | None) -> float:
    env = dict(os.environ, GFLOW_CACHE=str(cache))
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    t0 = time.perf_counter()
    # cwd: not a source tree (`python -m` would import the gflow of the current folder before PYTHONPATH's)
    subprocess.run([sys.executable, "-m", "gflow", "run", "--out", str(out), "--quiet"], check=True, env=env,
                   stdout=subprocess.DEVNULL, cwd=out.parent)  # fmt: skip
    return time.perf_counter() - t0


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--compare", metavar="PATH", help="also time gflow from PATH (PYTHONPATH), alternating")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench_cold_"))
    trees = {"this": os.environ.get("PYTHONPATH")}
    if args.compare:
        trees["compare"] = args.compare
    res = {t: {"cold": [], "warm": []} for t in trees}
    for k in range(args.pairs):
        for name, pp in trees.items():
            cache = tmp / f"cache-{name}-{k}"
            l0 = _load()
            c = _run(cache, tmp / f"cold-{name}-{k}", pp)
            w = _run(cache, tmp / f"warm-{name}-{k}", pp)
            res[name]["cold"].append(c)
            res[name]["warm"].append(w)
            print(f"{name} pair {k + 1}: cold {c:.1f} s, warm {w:.1f} s, cold/warm {c / w:.2f} "
                  f"(load {l0:.2f} -> {_load():.2f})", flush=True)  # fmt: skip
    for name in trees:
        c, w = res[name]["cold"], res[name]["warm"]
        r = [a / b for a, b in zip(c, w)]
        print(f"{name} ({trees[name] or 'installed gflow'}): cold median {statistics.median(c):.1f} s ({min(c):.1f}-"
              f"{max(c):.1f}), warm median {statistics.median(w):.1f} s ({min(w):.1f}-{max(w):.1f}); cold/warm pair by "
              f"pair median {statistics.median(r):.2f} ({min(r):.2f}-{max(r):.2f}); target <= 1.6", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
