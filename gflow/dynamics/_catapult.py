"""GD's catapults at the edge of stability, found in a run and predicted by the one-direction map
(docs/theory/central-flow.md, "Catapults").

L̂ depends on the selector C only through C/‖C‖, so GD's sharpness on C is ``Λ_C/‖C‖²`` with
``Λ_C`` the norm-free sharpness, and GD grows ‖C‖ by ``‖C_{k+1}‖² = ‖C_k‖² + η²‖∇_C L̂‖²``. When
``s = η λ_max`` passes 2, the component x of C along the top eigenvector grows like ``|1 − s|^k``
and pushes ‖C‖ up until s is back below 2: a catapult. In one direction, with y = x/‖C‖:

    s ← s / (1 + s² y²),     y ← (1 − s) y / √(1 + s² y²),

which from ``s_peak`` (where growth takes over) ends at ``s_after`` (``s_after ≈ 4 − s_peak``
near 2). Its small-angle form misses that a large oscillation flattens the loss; GD on the
scale-invariant ``½Λ sin²φ`` keeps it (:func:`catapult_map`, ``model = "angle"``, the default). :func:`find_catapults` reads the episodes past the edge from a
run's saved states and their spectrum.
"""

from __future__ import annotations

import dataclasses

import numpy as np


def catapult_map(s_peak: float, *, model: str = "angle", y0: float = 1e-6, max_steps: int = 100_000) -> float:
    """``s_after`` of a catapult that takes over at ``s = η λ_max = s_peak`` (``s_peak <= 2``
    returns ``s_peak``: no catapult).

    - ``model = "angle"`` (default): GD on the scale-invariant loss ``½Λ sin²φ`` of the angle φ
      between C and its rest direction (sharpness ``Λ/‖C‖²`` at φ = 0, curvature ``Λ cos 2φ/‖C‖²``
      at φ), from ``s_peak`` and ``tan φ = y0``, until φ is back below y0: the catapult whole;
    - ``model = "linear"``: its small-angle limit, the one-direction map of the module docstring
      (``s_after ≈ 4 − s_peak`` near 2): it ignores that the oscillation flattens the loss at
      large angles, and predicts too small an ``s_after`` past s_peak ≈ 2.5 (1.19 for 1.34 at 3.2).

    ``s_after`` depends on y0 only logarithmically weakly (the growth's start)."""
    if model not in ("angle", "linear"):
        raise ValueError(f"model must be 'angle' or 'linear', got {model!r}")
    s = float(s_peak)
    if not (np.isfinite(s) and s > 2):
        return s
    # Both in Λ = η = 1 units, the state (s, y) with y the tangent of the angle (linear) or
    # C = (c₁, c₂) with ‖C₀‖² = 1/s_peak (angle: GD on ½ c₂²/‖C‖² = ½ sin²φ); each step returns
    # the new state, its s and its |tan φ|.
    if model == "linear":
        def step(st):
            s_, y_ = st
            q = 1.0 + s_ * s_ * y_ * y_
            s_, y_ = s_ / q, (1.0 - s_) * y_ / np.sqrt(q)
            return (s_, y_), s_, abs(y_)

        state = (s, float(y0))
    else:
        def step(st):
            c1, c2 = st
            n4 = (c1 * c1 + c2 * c2) ** 2
            c1, c2 = c1 + c1 * c2 * c2 / n4, c2 - c2 * c1 * c1 / n4
            return (c1, c2), 1.0 / (c1 * c1 + c2 * c2), abs(c2 / c1)

        state = (np.sqrt(1.0 / s), y0 * np.sqrt(1.0 / s))
    grown = False
    for _ in range(max_steps):
        state, s, tan = step(state)
        grown = grown or tan > 10 * y0
        if grown and tan < y0:
            break
    return s


@dataclasses.dataclass
class Catapult:
    """One episode of a GD run past the edge, at the run's saved resolution.

    - `t_start`, `t_end`: the first saved time with ``η λ_max > 2`` and the first one after it
      back at or below 2 (``nan`` if the run ends past the edge);
    - `s_peak`: the largest saved ``η λ_max`` of the episode; `s_after`: ``η λ_max`` at `t_end`;
    - `norm_before`, `norm_after`: ‖C‖ at the saved time before `t_start` and at `t_end`;
    - `s_after_map`: :func:`catapult_map` of `s_peak` (the angle model's prediction of
      `s_after`); `s_after_linear`: the small-angle map's.
    """

    t_start: float
    t_end: float
    s_peak: float
    s_after: float
    norm_before: float
    norm_after: float
    s_after_map: float
    s_after_linear: float


def find_catapults(ts, eta: float, lam_max, C) -> list[Catapult]:
    """The episodes of ``η λ_max > 2`` along saved states (times `ts`, the top eigenvalue of ΛH
    `lam_max` at each, the selector `C` ``(T, |𝒮|)``), in order. Their timing and peaks are at the
    saved resolution: save every step (``solver.save_times``) to see each catapult whole."""
    ts, lam, C = np.asarray(ts, float), np.asarray(lam_max, float), np.asarray(C, float)
    if not (ts.shape == lam.shape == C.shape[:1]):
        raise ValueError(f"ts {ts.shape}, lam_max {lam.shape} and C {C.shape} must share their first axis")
    s = eta * lam
    norm = np.linalg.norm(C, axis=1)
    out, i, n = [], 0, len(ts)
    while i < n:
        if s[i] <= 2:
            i += 1
            continue
        j = i
        while j < n and s[j] > 2:
            j += 1
        peak = float(np.max(s[i:j]))
        before = float(norm[i - 1]) if i > 0 else float(norm[0])
        end = j < n
        out.append(Catapult(t_start=float(ts[i]), t_end=float(ts[j]) if end else float("nan"), s_peak=peak,
                            s_after=float(s[j]) if end else float("nan"), norm_before=before,
                            norm_after=float(norm[j]) if end else float(norm[-1]), s_after_map=catapult_map(peak),
                            s_after_linear=catapult_map(peak, model="linear")))  # fmt: skip
        i = j
    return out


def predicted_final_norm(norm0: float, eta: float, eta_c_min_flow: float, s_after: float) -> float:
    """The catapult law's final ‖C‖ from the flow's sharpness alone: the last catapult happens
    where the flow is sharpest, and leaves ``η Λ_C/‖C‖² = s_after``, so
    ``‖C_final‖ = ‖C₀‖ √(η / min_τ η_c^{flow}(τ)) · √(2 / s_after)``."""
    return float(norm0 * np.sqrt(eta / eta_c_min_flow) * np.sqrt(2.0 / s_after))
