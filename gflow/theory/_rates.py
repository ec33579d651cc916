"""The Stage I rate law of the linearised loss (README §M6.2): with
``L ≈ L₀ − a Σ_S (c_S/Σc) J(S)`` and ``c = C²``, the selector's log-weights move
at constant pairwise rates while ``‖C‖`` is conserved. Pure numpy, no gflow imports.
"""

from __future__ import annotations

import numpy as np


def first_order_slope(c, J) -> float:
    """``Σ_S (c_S/Σc) J(S)``: the exact first-order rate ``−∂L̂/∂a`` at ``a = 0``
    for selector weights ``c`` (``norm="sum"``; README §M6.2)."""
    c = np.asarray(c, np.float64)
    return float(np.dot(c / c.sum(), np.asarray(J, np.float64)))


def dlogc_dt(J, C, a, *, rate: float = 1.0) -> np.ndarray:
    """Predicted ``d/dt log c_S = 4 a rate (J(S) − Σ_S' (c_S'/Σc) J(S'))/‖C‖²`` for
    every S (README §M6.2), with ``c = C²``.

    Derivation (gflow's own, from ``L ≈ L₀ − a Σ_S (C_S²/‖C‖²) J(S)`` and
    ``dC/dt = −rate ∂L/∂C``): ``dC_S/dt = 2 a rate C_S (J(S) − J̄)/‖C‖²``, so
    ``‖C‖`` is conserved and ``d log c_S/dt = 2 d log|C_S|/dt``. `rate` is
    the selector block's time scale ``η_C`` (1 for the paper's flow). `J` may
    be ``J`` or ``Ĩ`` in its place.
    """
    C = np.asarray(C, np.float64)
    J = np.asarray(J, np.float64)
    c = C**2
    return 4.0 * float(a) * float(rate) * (J - np.dot(c / c.sum(), J)) / c.sum()


def log_ratio_slope(J, i: int, j: int, C, a, *, rate: float = 1.0) -> float:
    """Predicted ``d/dt log(c_{S_i}/c_{S_j}) = 4 a rate (J(S_i) − J(S_j))/‖C‖²``
    (README §M6.2); constant in Stage I since ``‖C‖`` is conserved."""
    C = np.asarray(C, np.float64)
    J = np.asarray(J, np.float64)
    return 4.0 * float(a) * float(rate) * float(J[i] - J[j]) / float(np.sum(C**2))
