"""Means and Monte Carlo standard errors (numpy, float64): the one host-side helper.

The jitted estimator has its own reduction (``gflow.core.mean_se``, in ``jax.numpy``) so that
a ladder rung computed from its per-sequence values matches the loss to the last bit.
"""

from __future__ import annotations

import numpy as np


def mean_se(x, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The mean of `x` along `axis` and its standard error ``std(ddof=1)/√n``
    (0 with a single value)."""
    x = np.asarray(x, np.float64)
    n = x.shape[axis]
    se = np.std(x, axis=axis, ddof=1) / np.sqrt(n) if n > 1 else np.zeros_like(np.mean(x, axis=axis))
    return np.mean(x, axis=axis), se
