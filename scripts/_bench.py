"""Measurement helpers shared by the benchmark scripts (``bench_*.py``).

The scripts run as ``python scripts/bench_x.py``, so this folder is on
``sys.path`` and ``import _bench`` finds this file (their subprocesses run the
same script file, so the same holds there).
"""

from __future__ import annotations

import time


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
