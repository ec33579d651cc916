"""A flow grid on two local worker processes against the serial run (issue 30).

The 6-point flow grid of ``scripts/bench_phase.py`` (``init.w_plus = lin:2:4:6``, d = 3,
L = 40, N = 2000, Stage III capped at τ = 100; theory, integration and check report per
point) as ``gflow phase … --flow`` in a new process, once serially and once per executor
(default ``processes:2``; ``--executors processes:2 dask-local:2``), alternating, ``--pairs``
times. Every run starts cold (``GFLOW_CACHE=none``: each process compiles, as a worker on
another machine would). Prints each run's wall time, the medians, the ratio executor/serial
pair by pair, whether every run's ``phase.csv`` is the serial one byte for byte, and the load
average with every figure.

On 2 cores the two workers share the cores the serial run already uses (XLA uses both), and
each worker pays the grid's compilation: expect little or no gain there; the gain is on
machines with more cores than one point uses.

Usage: ``python scripts/benchmarks/bench_executor.py [--pairs 3] [--executors processes:2 dask-local:2]``.
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

TOML = "[data]\nL = 40\n[estimator]\nN = 2000\n[schedule]\ndurations = [1e3, 1e10, 100.0]\n"
PARAM = "init.w_plus=lin:2:4:6"


def _load() -> str:
    a, b, c = os.getloadavg()
    return f"load {a:.2f} / {b:.2f} / {c:.2f} (1/5/15 min) on {os.cpu_count()} cores"


def _run(toml: Path, out: Path, executor: str | None) -> float:
    cmd = [sys.executable, "-m", "gflow", "phase", str(toml), "--param", PARAM, "--flow", "--no-plot", "--quiet",
           "--out", str(out)]  # fmt: skip
    if executor:
        cmd += ["--executor", executor]
    env = dict(os.environ, GFLOW_CACHE="none")
    t0 = time.perf_counter()
    # cwd: not a source tree (`python -m` would import the gflow of the current folder before PYTHONPATH's)
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, cwd=out.parent)
    return time.perf_counter() - t0


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--executors", nargs="+", default=["processes:2"])
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench_executor_"))
    toml = tmp / "grid.toml"
    toml.write_text(TOML)
    walls: dict[str, list[float]] = {"serial": [], **{e: [] for e in args.executors}}
    same: dict[str, bool] = {e: True for e in args.executors}
    ref = None
    for k in range(args.pairs):
        for name in walls:
            out = tmp / f"{name.replace(':', '-')}-{k}"
            print(f"{name}, run {k + 1}: {_load()} before", flush=True)
            walls[name].append(_run(toml, out, None if name == "serial" else name))
            csv = (out / "phase.csv").read_bytes()
            if name == "serial":
                ref = ref or csv
                same_serial = csv == ref
                print(f"  {walls[name][-1]:.1f} s (phase.csv as the first serial run's: {same_serial}); {_load()} after",
                      flush=True)  # fmt: skip
            else:
                same[name] &= csv == ref
                print(f"  {walls[name][-1]:.1f} s (phase.csv the serial one byte for byte: {csv == ref}); {_load()} after",
                      flush=True)  # fmt: skip
    s = walls["serial"]
    print(f"6-point flow grid (d=3, L=40, N=2000, Stage III to tau=100), cold processes, {args.pairs} runs each:")
    print(f"  serial: median {statistics.median(s):.1f} s (min {min(s):.1f}, max {max(s):.1f})")
    for e in args.executors:
        w = walls[e]
        r = [a / b for a, b in zip(w, s)]
        print(f"  {e}: median {statistics.median(w):.1f} s (min {min(w):.1f}, max {max(w):.1f}); {e}/serial pair by "
              f"pair: median {statistics.median(r):.2f} (min {min(r):.2f}, max {max(r):.2f}); phase.csv the serial "
              f"one in every run: {same[e]}")  # fmt: skip
    print(f"  {_load()} at the end")


if __name__ == "__main__":
    main()
