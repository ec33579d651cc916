"""Measurement helpers shared by the benchmark scripts (``bench_*.py``).

The scripts run as ``python scripts/benchmarks/bench_x.py``, so this folder is on
``sys.path`` and ``import _bench`` finds this file (their subprocesses run the
same script file, so the same holds there).
"""

from __future__ import annotations

import builtins
import functools
import math
import os
import sys
import time

#: ``print`` with every line flushed: the scripts' output is often piped.
print = functools.partial(builtins.print, flush=True)


def progress(script: str, msg: str) -> None:
    """A time-stamped progress line on stderr."""
    sys.stderr.write(f"[{script} {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


def load_str() -> str:
    """The machine's load average, to print next to every timing."""
    a, b, c = os.getloadavg()
    return f"load avg {a:.2f} / {b:.2f} / {c:.2f} (1/5/15 min) on {os.cpu_count()} cores"


def print_versions(part: dict) -> None:
    """The versions line of a benchmark's child-process report (``part["versions"]``)."""
    v = part["versions"]
    print(f"   gflow {v['gflow']}, jax {v['jax']}, diffrax {v['diffrax']}, equinox {v['equinox']}, "
          f"backend {part['backend']}, float64")  # fmt: skip


def base_config(N: int, L: int):
    """The paper's default configuration with N sequences and context length L."""
    import gflow

    cfg = gflow.Config()
    if N != cfg.estimator.N:
        cfg = cfg.replace(estimator={"N": N})
    if L != cfg.data.L:
        cfg = cfg.replace(data={"L": L})
    return cfg


def json_default(x):
    """``json.dumps`` fallback for numpy scalars and arrays; non-finite floats become null."""
    import numpy as np

    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return str(x)


def rss_mb(field: str) -> float:
    """``VmRSS`` (current) or ``VmHWM`` (peak) of this process, in MB."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def timings(fn, reps: int) -> list[float]:
    """Wall seconds of ``reps`` calls of ``fn()``, each waited for (``jax.block_until_ready``)."""
    import jax

    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        out.append(time.perf_counter() - t0)
    return out


def median_s(fn, reps: int) -> float:
    """Median of :func:`timings` after one untimed call (compilation)."""
    import jax
    import numpy as np

    jax.block_until_ready(fn())
    return float(np.median(timings(fn, reps)))



def time_call(fn, *args, reps: int) -> tuple[float, float]:
    """``(first, median)``: the wall time of the first call of ``fn(*args)`` (compilation
    included) and the median of `reps` calls after it, each waited for
    (``jax.block_until_ready``)."""
    import statistics

    import jax

    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    first = time.perf_counter() - t0
    runs = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        runs.append(time.perf_counter() - t0)
    return first, statistics.median(runs)
