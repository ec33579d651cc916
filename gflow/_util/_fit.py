"""Least-squares fits shared by check, plot and sweep: one straight line
(:func:`linear_fit`), the slope of ``a`` against ``log τ`` (:func:`log_slope`,
the paper's Stage III law ``a = log t + O(1)`` has slope 1; docs/theory/mathematics.md §M6.4) and
a power-law exponent (:func:`power_exponent`, docs/theory/mathematics.md §M6.3)."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["PLATEAU_EXIT", "linear_fit", "log_slope", "power_exponent"]


def linear_fit(x, y) -> tuple[float, float, float]:
    """Ordinary least squares ``y ≈ slope·x + intercept``.

    **Returns:** ``(slope, intercept, se)``, `se` the usual OLS standard error
    of the slope (0 with two points, NaN with fewer).
    """
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    n = x.size
    if n < 2:
        return math.nan, math.nan, math.nan
    xm, ym = x.mean(), y.mean()
    sxx = float(np.sum((x - xm) ** 2))
    if sxx == 0:
        return math.nan, math.nan, math.nan
    slope = float(np.sum((x - xm) * (y - ym)) / sxx)
    icpt = float(ym - slope * xm)
    if n == 2:
        return slope, icpt, 0.0
    resid = y - (slope * x + icpt)
    se = math.sqrt(float(np.sum(resid**2)) / (n - 2) / sxx)
    return slope, icpt, se


# Where a has left its plateau: the paper's law a = log(e^{a₀} + C*η_a τ) has the local slope
# da/dlog τ = 1 − e^{a₀ − a}, below 1/2 (a plateau on a log axis) until a = a₀ + log 2.
PLATEAU_EXIT = math.log(2.0)


def log_slope(tau, a, window=None, *, a_start: float | None = None) -> tuple[float, int]:
    """The slope of ``a`` against ``log τ`` (least squares) over the points
    with ``τ > 0`` and, if `window` ``(lo, hi)`` is given, ``lo ≤ a ≤ hi``
    (docs/theory/mathematics.md §M6.4: the paper's ``a(t) = log t + O(1)`` gives slope 1).
    With `a_start` (a at τ = 0) only the points past the plateau count,
    ``a ≥ a_start + log 2`` (:data:`PLATEAU_EXIT`): before it the law
    ``log(e^{a₀} + C*η_a τ)`` is flat on a log axis whatever its slope later.

    **Returns:** ``(slope, number of points used)``; the slope is NaN with
    fewer than 2 points.
    """
    tau = np.asarray(tau, np.float64)
    a = np.asarray(a, np.float64)
    m = (tau > 0) & np.isfinite(a) & np.isfinite(tau)
    if window is not None:
        lo, hi = window
        m &= (a >= lo) & (a <= hi)
    if a_start is not None:
        m &= a >= float(a_start) + PLATEAU_EXIT
    n = int(m.sum())
    if n < 2:
        return math.nan, n
    return linear_fit(np.log(tau[m]), a[m])[0], n


def power_exponent(tau, y) -> tuple[float, int]:
    """The exponent β of ``y ~ τ^(−β)``: minus the least-squares slope of
    ``log y`` against ``log τ`` over the points with ``τ > 0`` and ``y > 0``
    (docs/theory/mathematics.md §M6.3).

    **Returns:** ``(β, number of points used)``; NaN with fewer than 2 points.
    """
    tau = np.asarray(tau, np.float64)
    y = np.asarray(y, np.float64)
    m = (tau > 0) & (y > 0) & np.isfinite(tau) & np.isfinite(y)
    n = int(m.sum())
    if n < 2:
        return math.nan, n
    return -linear_fit(np.log(tau[m]), np.log(y[m]))[0], n
