"""Finite-size scaling: a quantity measured at several sizes, extrapolated to the limit.

``q(x) ≈ q∞ + b·f(x)`` (or more terms) fitted by weighted least squares, weights
``1/SE²``, for each candidate scaling model (:func:`fit_scaling`); the models are compared by
Akaike's criterion ``AIC = χ² + 2p`` (p the number of fitted coefficients) among those that
fit, a fit being one whose χ² has a p-value of at least :data:`P_FIT` for its degrees of
freedom (:func:`chi2_sf`). The limit's standard error is the fit's, scaled by
``√(χ²/dof)`` when that exceeds 1 (the Birge ratio: scatter beyond the stated errors widens
the interval rather than being ignored), or, when the points share their samples, the spread of
the limits of the replicates (``fit_scaling(..., replicates=)``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["L_TERMS", "P_FIT", "Z95", "ScalingFit", "chi2_sf", "fit_scaling", "t95", "wls"]

L_TERMS = {"b/L": ("1/L", lambda L: 1.0 / L), "b/√L": ("1/√L", lambda L: L**-0.5),
           "b/ln L": ("1/ln L", lambda L: 1.0 / np.log(L))}
"""The one-term corrections in the context length L: ``{term: (its variable's name, the variable
as a function of L)}``; a model ``q∞ + b·x(L)`` is a straight line in x, with the limit at x = 0."""

P_FIT = 0.01
"""A scaling model fits when its χ² p-value is at least this."""

Z95 = 1.959963984540054
"""The two-sided 95 % normal quantile: a limit's interval is ``q∞ ± Z95·SE``."""


# Student's t 97.5 % quantiles for 1..10 degrees of freedom, then 15, 20, 30, 60 (standard tables)
_T975 = {1: 12.706204736, 2: 4.302652730, 3: 3.182446305, 4: 2.776445105, 5: 2.570581836, 6: 2.446911851,
         7: 2.364624252, 8: 2.306004135, 9: 2.262157163, 10: 2.228138852, 15: 2.131449546, 20: 2.085963447,
         30: 2.042272456, 60: 2.000297822}  # fmt: skip


def t95(dof: int) -> float:
    """The two-sided 95 % quantile of Student's t with `dof` ≥ 1 degrees of freedom: tabulated
    to 10 and at 15, 20, 30, 60, linear in 1/dof between and towards the normal's :data:`Z95`
    beyond 60 (within 10⁻³ of the exact quantile)."""
    if dof < 1 or int(dof) != dof:
        raise ValueError(f"degrees of freedom must be an integer >= 1, got {dof!r}")
    if dof in _T975:
        return _T975[dof]
    if dof > 60:
        return Z95 + (_T975[60] - Z95) * 60.0 / dof
    lo = max(k for k in _T975 if k < dof)
    hi = min(k for k in _T975 if k > dof)
    u = (1.0 / dof - 1.0 / hi) / (1.0 / lo - 1.0 / hi)
    return _T975[hi] + u * (_T975[lo] - _T975[hi])


def chi2_sf(x: float, k: int) -> float:
    """``P(χ²_k ≥ x)``, the survival function of the χ² law with `k` ≥ 1 degrees of freedom,
    in closed form (the regularised upper incomplete gamma function at half-integer order):
    for even k, ``e^{−x/2} Σ_{i<k/2} (x/2)^i / i!``; for odd k, ``erfc(√(x/2))`` plus
    ``e^{−x/2} Σ_{i<(k−1)/2} (x/2)^{i+1/2} / Γ(i + 3/2)``."""
    if k < 1 or int(k) != k:
        raise ValueError(f"degrees of freedom must be an integer >= 1, got {k!r}")
    if x <= 0:
        return 1.0
    h = 0.5 * x
    if k % 2 == 0:
        return float(math.exp(-h) * sum(h**i / math.factorial(i) for i in range(k // 2)))
    s = math.erfc(math.sqrt(h))
    s += math.exp(-h) * sum(h ** (i + 0.5) / math.gamma(i + 1.5) for i in range((k - 1) // 2))
    return float(s)


def wls(A, y, se) -> tuple[np.ndarray, np.ndarray, float]:
    """Weighted least squares ``y ≈ A·β`` with weights ``1/se²``: ``(β, cov β, χ²)``,
    ``cov β = (AᵀWA)⁻¹`` (the errors taken as known)."""
    A = np.asarray(A, np.float64)
    y = np.asarray(y, np.float64)
    w = 1.0 / np.asarray(se, np.float64) ** 2
    cov = np.linalg.inv(A.T @ (w[:, None] * A))
    beta = cov @ (A.T @ (w * y))
    r = y - A @ beta
    return beta, cov, float(np.sum(w * r**2))


@dataclasses.dataclass(frozen=True)
class ScalingFit:
    """One scaling model fitted to ``(x, q ± se)``.

    - `model`: its formula, e.g. ``"q∞ + b/L"``; `coef`: ``[q∞, b, …]``.
    - `limit`, `limit_se`: ``q∞`` and its standard error (Birge-scaled, module docstring);
      `interval`: ``q∞ ± Z95·limit_se``.
    - `chi2`, `dof`, `p`: the fit's χ², its degrees of freedom and p-value; `fits`: ``p ≥ P_FIT``.
    - `aic`: ``χ² + 2·(number of coefficients)``.
    """

    model: str
    coef: tuple[float, ...]
    limit: float
    limit_se: float
    chi2: float
    dof: int
    p: float
    aic: float

    @property
    def fits(self) -> bool:
        return self.p >= P_FIT

    @property
    def interval(self) -> tuple[float, float]:
        return (self.limit - Z95 * self.limit_se, self.limit + Z95 * self.limit_se)

    def predict(self, features: np.ndarray) -> np.ndarray:
        """``q∞ + Σ b_i f_i`` at rows of features (without the constant column)."""
        f = np.atleast_2d(np.asarray(features, np.float64))
        return self.coef[0] + (f @ np.asarray(self.coef[1:]) if len(self.coef) > 1 else 0.0)

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["coef"] = list(self.coef)
        d["fits"] = self.fits
        d["interval"] = list(self.interval)
        return d


def _fit_one(name: str, F: np.ndarray, y, se, reps=None) -> ScalingFit | None:
    A = np.column_stack([np.ones(len(y)), F]) if F.size else np.ones((len(y), 1))
    dof = len(y) - A.shape[1]
    if dof < 1 or np.linalg.matrix_rank(A) < A.shape[1]:
        return None
    beta, cov, chi2 = wls(A, y, se)
    if reps is None:
        limit_se = math.sqrt(cov[0, 0] * max(1.0, chi2 / dof))
    else:  # the same linear estimator on each replicate's curve; the SE is their spread (Student-t)
        w = 1.0 / np.asarray(se, np.float64) ** 2
        a = (cov @ (A.T * w))[0]  # q∞ = a·y
        lim = reps @ a
        R = lim.size
        limit_se = float(lim.std(ddof=1) / math.sqrt(R) * t95(R - 1) / Z95)
    return ScalingFit(
        model=name, coef=tuple(float(b) for b in beta), limit=float(beta[0]),
        limit_se=float(limit_se), chi2=chi2, dof=dof, p=chi2_sf(chi2, dof), aic=chi2 + 2.0 * A.shape[1],
    )  # fmt: skip


def fit_scaling(
    points: Sequence, q, se, models: Sequence[tuple[str, Sequence[Callable]]], *, replicates=None,
    se_floor: float = 1e-12,
) -> tuple[ScalingFit | None, list[ScalingFit]]:  # fmt: skip
    """Fit every candidate model to ``q ± se`` measured at `points` and choose one.

    - `points`: the sizes (anything the feature functions take, e.g. a dict per point).
    - `models`: ``(formula, [f₁, f₂, …])``: the model ``q∞ + Σ b_i f_i(point)`` (no feature:
      the constant model). A model with fewer points than coefficients + 1 is skipped.
    - `replicates`: ``(R, n)``, each replicate's value at every point, when the points share
      their samples (replicate r is the same draw at every size, so the sizes' errors are
      correlated and a WLS standard error that treats them as independent is wrong). Then
      ``q`` is their mean, the limit is the same, and its standard error is the spread of the
      R limits the fit's linear estimator gives on each replicate's curve, times ``t_{R−1}/1.96``
      (the Birge ratio is not applied: the spread measures the scatter directly). Replicates
      with a NaN at some point are left out (at least 2 must remain).
    - `se_floor`: a standard error below it (a quantity exactly equal over replicates) is
      raised to it times ``max(1, |q|)``.

    **Returns:** ``(chosen, every fit)``: the least AIC among the models that fit (p ≥ P_FIT);
    when none fits, the least AIC of all with ``fits`` False (the caller says so); ``None``
    when no model could be fitted.
    """
    y = np.asarray(q, np.float64)
    s = np.maximum(np.asarray(se, np.float64), se_floor * np.maximum(1.0, np.abs(y)))
    reps = None
    if replicates is not None:
        reps = np.asarray(replicates, np.float64).reshape(-1, len(y))
        reps = reps[np.all(np.isfinite(reps), axis=1)]
        if reps.shape[0] < 2:
            raise ValueError(f"replicates: at least 2 with a value at every point, got {reps.shape[0]}")
    fits = []
    for name, feats in models:
        F = np.array([[f(p) for f in feats] for p in points], np.float64).reshape(len(y), len(feats))
        r = _fit_one(name, F, y, s, reps)
        if r is not None:
            fits.append(r)
    if not fits:
        return None, []
    good = [f for f in fits if f.fits]
    return min(good or fits, key=lambda f: f.aic), fits
