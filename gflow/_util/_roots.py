"""Scalar root finding and maximisation on the host, for the theory's one-dimensional laws
(the zero a* of the GIH force, the half-maximum window, the maximum C*, the zero a° of the
frozen model's force).

**Why hand-written and not optimistix.** Each call solves for a new closure over arrays that
are already computed (a law's grid, one run's per-sequence values); optimistix traces and
compiles every new closure. Measured for ``tanh(x) − 0.3`` on ``[−5, 5]`` at tolerance 1e-12:
``optimistix.root_find`` with ``Bisection`` took 792 ms the first time and 188 ms for a second
closure (0.4 ms when the same closure is reused), against 0.025 ms for :func:`bracketed_root`,
which also lands on ``atanh(0.3)`` to the last bit where the bisection stopped 2.9e-13 short.
A check report solves a few dozen such problems, so the compiled solvers would add seconds
to every report for nothing. The tolerances are the ones the solvers had before.
"""

from __future__ import annotations

import math


def bracketed_root(f, df, lo: float, hi: float, flo: float, *, tol: float = 1e-12, maxiter: int = 100) -> float:
    """Root of ``f`` in ``[lo, hi]`` given ``sign f(lo) = sign flo ≠ sign f(hi)``: Newton
    steps from the bracket's midpoint, each kept only if it lands strictly inside the
    current bracket and otherwise replaced by bisection; the bracket shrinks at every
    step, so it converges whatever ``df`` says, and quadratically near a simple root
    (a handful of evaluations where bisection needs ~40). Stops when the step or the
    bracket is below ``tol·max(1, |x|)``, or ``f = 0``."""
    x = 0.5 * (lo + hi)
    for _ in range(maxiter):
        fx = f(x)
        if fx == 0.0:
            return x
        if (fx > 0) == (flo > 0):
            lo, flo = x, fx
        else:
            hi = x
        d = df(x)
        step_ok = d != 0.0 and math.isfinite(d)
        x_new = x - fx / d if step_ok else math.nan
        if not (min(lo, hi) < x_new < max(lo, hi)):
            x_new = 0.5 * (lo + hi)
        small = tol * max(1.0, abs(x_new))
        if abs(x_new - x) <= small or abs(hi - lo) <= small:
            return x_new
        x = x_new
    return x


def bisect_root(f, lo: float, hi: float, flo: float, *, tol: float = 1e-12, maxiter: int = 200) -> float:
    """Root of ``f`` in ``[lo, hi]`` given ``sign f(lo) = sign flo ≠ sign f(hi)``."""
    for _ in range(maxiter):
        mid = 0.5 * (lo + hi)
        fm = f(mid)
        if fm == 0.0:
            return mid
        if (fm > 0) == (flo > 0):
            lo, flo = mid, fm
        else:
            hi = mid
        if hi - lo <= tol * max(1.0, abs(mid)):
            break
    return 0.5 * (lo + hi)


def golden_max(f, lo: float, hi: float, *, tol: float = 1e-10, maxiter: int = 200) -> float:
    """Argmax of a unimodal ``f`` on ``[lo, hi]`` by golden-section search."""
    g = (math.sqrt(5.0) - 1.0) / 2.0
    x1, x2 = hi - g * (hi - lo), lo + g * (hi - lo)
    f1, f2 = f(x1), f(x2)
    for _ in range(maxiter):
        if hi - lo <= tol * max(1.0, abs(hi)):
            break
        if f1 >= f2:
            hi, x2, f2 = x2, x1, f1
            x1 = hi - g * (hi - lo)
            f1 = f(x1)
        else:
            lo, x1, f1 = x1, x2, f2
            x2 = lo + g * (hi - lo)
            f2 = f(x2)
    return 0.5 * (lo + hi)
