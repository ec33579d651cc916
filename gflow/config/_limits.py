"""The bounds of every integer key of a configuration (:data:`LIMITS`) and the checks that
use them, before any size is computed from a value."""

from __future__ import annotations

import math

import numpy as np

# Bounds of every integer key, ``key: (lowest, highest)``, checked before a section is built (so
# that no size is ever computed from, say, M = 10**30). The upper bounds are far above any run
# that fits in memory; they exist so that every later expression (``d**k``, ``(d+1)**M``, a
# sample of ``N·(burn_in+L)`` tokens, ``max_steps`` in a compiled loop) stays a small, fast
# integer computation and within int32/int64. Whether a configuration inside them fits in the
# memory of the machine is the resource preflight's question (:func:`gflow.runs.preflight`).
LIMITS: dict[str, tuple[int, int]] = {
    "data.d": (2, 4096),
    "data.parents": (1, 4096),  # each offset
    "data.L": (1, 10**7),
    "data.burn_in": (0, 10**7),
    "model.M": (1, 1024),
    "model.H": (1, 1024),
    "model.D": (0, 1024),
    "solver.max_steps": (1, 10**9),
    "solver.save_per_decade": (1, 10**4),
    "solver.edge_eigs": (1, 64),
    "estimator.N": (1, 10**9),
    "estimator.seed": (0, 2**32 - 1),  # jax.random.key's 32-bit seed range (replicates add r to it)
    "estimator.chunk": (0, 10**9),
    "sgd.batch": (1, 10**9),
    "sgd.seeds": (1, 10**6),
    "sgd.seed": (0, 2**32 - 1),  # jax.random.key's 32-bit seed range
    "sde.sigma_sample": (0, 10**9),
}
MAX_PARENTS = 32  # len(data.parents): the kernel has d**k rows
MAX_SETS = 2**16  # |𝒮| = Σ_{r <= D} C(H, r): the selector's size, enumerated as tuples
MAX_KERNEL_DEPTH = MAX_PARENTS + 1  # data.kernel: (d**k, d) or (d,)*k + (d,)


def n_sets(H: int, D: int, limit: int = MAX_SETS) -> int:
    """``|𝒮| = Σ_{r <= D} C(H, r)`` without enumerating it, stopping as soon as it exceeds `limit`
    (then ``limit + 1``)."""
    total, term = 0, 1
    for r in range(0, min(D, H) + 1):
        if r:
            term = term * (H - r + 1) // r
        total += term
        if total > limit:
            return limit + 1
    return total


def init_bounds(dtype: str) -> tuple[float, float]:
    """``(big, gap)`` for the initialisation in `dtype`: ``|a0|, |w_plus|, |w_minus| <= big = ln(max)``
    (``e^a`` and ``e^w`` are finite: the classifier reads ``e^{a·κ}`` with ``κ <= 1``, the theory
    ``F(a)·e^a``) and ``|w_plus − w_minus| <= gap = −ln(tiny)`` (the smallest attention weight
    ``≈ e^{−|w_plus − w_minus|}`` is a normal number, so every weight and its gradient is
    non-zero). float64: 709.78 and 708.40; float32: 88.72 and 87.34."""
    fi = np.finfo(dtype)
    return math.log(float(fi.max)), -math.log(float(fi.tiny))


def is_int(v) -> bool:
    # bool is an int in Python, and 2.0 is not an integer: neither is accepted
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def is_float(v) -> bool:
    return (is_int(v) or isinstance(v, (float, np.floating))) and math.isfinite(v)


def short_repr(v, n: int = 80) -> str:
    """``repr(v)``, cut to `n` characters (a message never prints a whole table or a deep list)."""
    try:
        r = repr(v)
    except RecursionError:
        r = f"<a {type(v).__name__} nested too deeply to print>"
    return r if len(r) <= n else r[: n - 5] + " …" + r[-3:]


def check_int(name: str, v) -> None:
    lo, hi = LIMITS[name]
    if v < lo and name == "estimator.seed":  # every other key's section states its own lower bound
        raise ValueError(f"{name} must be an integer >= {lo}, got {short_repr(v)}")
    if v > hi:
        raise ValueError(f"{name} must be an integer <= {hi} (gflow's bound on it, gflow.config.LIMITS), got {short_repr(v)}")


def check_limits(d: dict) -> None:
    """:data:`LIMITS` (and the number of parents) of a configuration dictionary: ``ValueError``
    naming the key."""
    for name in LIMITS:
        sec, key = name.split(".")
        v = d.get(sec, {}).get(key)
        if v is None:
            continue
        vals = list(v) if isinstance(v, (list, tuple)) else [v]
        if name == "data.parents" and len(vals) > MAX_PARENTS:
            raise ValueError(f"data.parents must have at most {MAX_PARENTS} offsets, got {len(vals)}")
        for x in vals:
            if is_int(x):
                check_int(name, x)
