"""The GIH law as a curve of τ (docs/theory/mathematics.md §M6.4): from the force ``F(a)`` the
law tabulates on its grid, the solution ``a(τ)`` of ``da/dτ = η_a λF(λa)``, ``a(0) = a₀``, at
any τ, and the time the law takes to reach a given ``a``; :class:`~gflow.StageIIILaw`'s
methods ``force``, ``a`` and ``tau_to`` call these.

**The force between the grid points** is the cubic through the four nearest grid values
(error O(h⁴ F⁗), h the grid's spacing: 0.05 at the default 601 points on [0, 30]); beyond the
grid ``F e^a`` is held at its value at the grid's end (the paper's tail ``F ≍ e^{−a}``).

**The solution** uses that the law is one autonomous equation: its time to go from a₀ to a is
``T(a) = ∫_{a₀}^{a} du / (η_a λF(λu))``, monotone in a as long as F keeps its sign, so a(τ) is
the inverse of T. T is computed by 8-point Gauss–Legendre quadrature on a mesh of a from a₀ to
the zero of λF(λ·) it moves towards (a mesh that clusters geometrically at that zero, where
T → ∞ logarithmically), a(τ) by Hermite interpolation of the inverse on that mesh (its slope is
the law's own right-hand side) refined by Newton's method on T itself. Where F has no zero
ahead (F > 0 up to the grid's end) the tail's closed form continues it:
``e^{λa} = e^{λa₁} + η_a λ² K (τ − τ₁)``, K the held ``F e^a``. An ODE solver would need
``O(η_a |F'(a*)| τ)`` steps near the zero (the approach is stiff for large τ); the inverse costs
the same at τ = 10⁹ as at τ = 1.
"""

from __future__ import annotations

import math

import numpy as np

# Gauss–Legendre nodes and weights on [0, 1], 8 points (exact for polynomials of degree 15)
_X, _W = np.polynomial.legendre.leggauss(8)
_X, _W = 0.5 * (_X + 1.0), 0.5 * _W


def grid_force(a_grid: np.ndarray, F: np.ndarray, Fexp: np.ndarray, a) -> np.ndarray:
    """F at `a` (any shape) from its grid values: the cubic through the four nearest grid
    points inside the grid, ``F e^a`` held at its end value outside (module docstring)."""
    a = np.asarray(a, np.float64)
    g = np.asarray(a_grid, np.float64)
    n = g.size
    i = np.clip(np.searchsorted(g, a) - 2, 0, n - 4)  # the four points i..i+3 around a
    xs = g[i[..., None] + np.arange(4)]
    ys = np.asarray(F, np.float64)[i[..., None] + np.arange(4)]
    out = np.zeros(a.shape)
    for j in range(4):  # Lagrange form
        lj = np.ones(a.shape)
        for m in range(4):
            if m != j:
                lj = lj * (a - xs[..., m]) / (xs[..., j] - xs[..., m])
        out = out + ys[..., j] * lj
    lo, hi = a < g[0], a > g[-1]
    with np.errstate(over="ignore"):
        out = np.where(lo, Fexp[0] * np.exp(-a), out)
        out = np.where(hi, Fexp[-1] * np.exp(-a), out)
    return out


class LawCurve:
    """The solution of ``da/dτ = η_a λF(λa)``, ``a(0) = a0``, of one law (module docstring)."""

    def __init__(self, a_grid, F, Fexp, a0: float, eta_a: float, lam: float = 1.0):
        a0, eta_a, lam = float(a0), float(eta_a), float(lam)
        for name, v in (("a0", a0), ("eta_a", eta_a), ("lam", lam)):
            if not math.isfinite(v):
                raise ValueError(f"{name} must be finite, got {v!r}")
        if eta_a <= 0 or lam <= 0:
            raise ValueError(f"eta_a and lam must be > 0, got eta_a = {eta_a!r}, lam = {lam!r}")
        self.g, self.F, self.Fexp = np.asarray(a_grid, np.float64), np.asarray(F, np.float64), np.asarray(Fexp)
        self.a0, self.rate, self.lam = a0, eta_a * lam, lam
        f0 = float(self.rhs(a0))
        self.sign = 0.0 if f0 == 0 else math.copysign(1.0, f0)
        self.zero = self._zero_ahead() if self.sign else a0
        self._mesh()

    def rhs(self, a) -> np.ndarray:
        """``da/dτ = η_a λF(λa)``."""
        return self.rate * grid_force(self.g, self.F, self.Fexp, self.lam * np.asarray(a, np.float64))

    def _zero_ahead(self) -> float | None:
        """The zero of λF(λ·) the flow from a0 moves to (refined by bisection), ``None`` if none
        on the grid ahead (F keeps its sign to the grid's end: the tail continues it)."""
        u = self.g / self.lam  # the grid in a-units
        f = self.sign * self.rhs(u)
        ahead = u > self.a0 if self.sign > 0 else u < self.a0
        idx = np.flatnonzero(ahead)
        if self.sign < 0:
            idx = idx[::-1]
        prev = self.a0
        for k in idx:
            if f[k] <= 0:
                lo, hi = prev, float(u[k])  # sign·F > 0 at lo, <= 0 at hi
                for _ in range(200):
                    mid = 0.5 * (lo + hi)
                    if mid in (lo, hi):
                        break
                    if self.sign * float(self.rhs(mid)) > 0:
                        lo = mid
                    else:
                        hi = mid
                return lo
            prev = float(u[k])
        if self.sign < 0:
            raise ValueError("the law's force is negative down to the grid's start: a decreases without a zero")
        return None

    def _segment_time(self, lo, hi) -> np.ndarray:
        """``∫_lo^hi du / rhs(u)`` (Gauss–Legendre, vectorised over the pairs)."""
        lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
        u = lo[..., None] + (hi - lo)[..., None] * _X
        return (hi - lo) * np.sum(_W / self.rhs(u), axis=-1)

    def _mesh(self) -> None:
        a0 = self.a0
        if self.sign == 0:
            self.u = np.array([a0])
            self.T = np.array([0.0])
            return
        h = float(self.g[1] - self.g[0]) / self.lam / 4.0  # a quarter of the grid's spacing in a
        if self.zero is not None:
            d = abs(self.zero - a0)
            # uniform far from the zero, geometric (ratio 1/2 down to 1e-13 of d) close to it
            n = max(int(math.ceil(d / h)), 1)
            steps = np.linspace(0.0, 1.0, n + 1)[:-1]
            close = 1.0 - 0.5 ** np.arange(1, 44)
            frac = np.unique(np.concatenate([steps, close[close > steps[-1]]]))
            u = a0 + self.sign * d * frac
        else:
            end = float(self.g[-1]) / self.lam
            n = max(int(math.ceil((end - a0) / h)), 1)
            u = np.linspace(a0, end, n + 1) if end > a0 else np.array([a0])
        T = np.concatenate([[0.0], np.cumsum(self._segment_time(u[:-1], u[1:]))])
        self.u, self.T = u, T

    def tau_to(self, a) -> np.ndarray:
        """The law's time to reach `a` from a0 (``inf`` at or beyond the zero it moves to, or
        behind a0)."""
        a = np.asarray(a, np.float64)
        out = np.full(a.shape, np.inf)
        if self.sign == 0:
            return np.where(a == self.a0, 0.0, out)
        s = self.sign
        ok = s * (a - self.a0) >= 0
        if self.zero is not None:
            ok &= s * (self.zero - a) > 0
        k = np.clip(np.searchsorted(s * self.u, s * a, side="right") - 1, 0, self.u.size - 1)
        base = self.T[k] + self._segment_time(self.u[k], np.where(ok, a, self.u[k]))
        if self.zero is None:  # past the grid: the tail's closed form
            end, K, lam = self.u[-1], float(self.Fexp[-1]), self.lam
            past = a > end
            with np.errstate(over="ignore", invalid="ignore"):
                tail = self.T[-1] + (np.exp(lam * a) - np.exp(lam * end)) / (self.rate * lam * K)
            base = np.where(past, tail, base)
        return np.where(ok, base, out)

    def a(self, tau) -> np.ndarray:
        """a at the times `tau` (any shape, τ ≥ 0)."""
        tau = np.asarray(tau, np.float64)
        if np.any(~np.isfinite(tau)) or np.any(tau < 0):
            raise ValueError("tau must be finite and >= 0")
        if self.sign == 0:
            return np.full(tau.shape, self.a0)
        u, T, r = self.u, self.T, self.rhs(self.u)
        k = np.clip(np.searchsorted(T, tau, side="right") - 1, 0, u.size - 2) if u.size > 1 else np.zeros(tau.shape, int)
        if u.size > 1:
            # Hermite in τ on the mesh segment (the slope is the law's rhs), then Newton on T itself
            t0, t1, u0, u1, r0, r1 = T[k], T[k + 1], u[k], u[k + 1], r[k], r[k + 1]
            h = t1 - t0
            s = np.clip((tau - t0) / np.where(h > 0, h, 1.0), 0.0, 1.0)
            h00, h10, h01, h11 = 2 * s**3 - 3 * s**2 + 1, s**3 - 2 * s**2 + s, -2 * s**3 + 3 * s**2, s**3 - s**2
            x = h00 * u0 + h10 * h * r0 + h01 * u1 + h11 * h * r1
            lo, hi = np.minimum(u0, u1), np.maximum(u0, u1)
            for _ in range(4):
                x = np.clip(x - (t0 + self._segment_time(u0, x) - tau) * self.rhs(x), lo, hi)
        else:
            x = np.full(tau.shape, self.a0)
        beyond = tau > T[-1]
        if np.any(beyond):
            if self.zero is not None:  # the last mesh point is within 1e-13 of the zero
                x = np.where(beyond, self.zero, x)
            else:  # the tail's closed form past the grid
                end, K, lam = u[-1], float(self.Fexp[-1]), self.lam
                with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
                    xt = np.log(np.exp(lam * end) + self.rate * lam * K * (tau - T[-1])) / lam
                x = np.where(beyond, xt, x)
        return x
