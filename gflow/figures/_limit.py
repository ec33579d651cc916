"""The figure of one ``gflow limit`` claim: the quantity against its scaling variable, the fit, the
limit with its 95 % interval and the claim's value (:mod:`gflow.runs._limit`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .._util import L_TERMS, atomic_savefig
from ._base import new_figure


def plot_limit(claim: dict, axes, path: str | Path, *, contrast=None) -> Path:
    """q ± 2 SE at each size against the chosen model's scaling variable (1/L for the constant
    model; with w₊ alone, 1 − λ_w, the initial copier's contrast), the fitted line to the limit at 0 (one line per w₊ when w₊
    is a second axis), the limit's 95 % interval as a bar at 0, and the claim (its value, or 0
    for a claim q∞ > 0) as a dashed line, shaded over the band ± resolution its verdict tests."""
    lam = contrast or (lambda w: 1.0)  # λ_w(w₊), the runner's copier_contrast at S*'s size
    fig = new_figure((6.4, 4.6))
    ax = fig.subplots()
    fit = claim["fit"]
    model = fit["model"] if fit else "q∞"
    term = next((k for k in L_TERMS if k in model), None)
    if "data.L" in axes:
        xlab, xf = L_TERMS[term] if term else L_TERMS["b/L"]
        xof = lambda p: xf(p["data.L"])  # noqa: E731
    else:
        xlab, xof = "1 − λ_w (the initial copier's contrast)", lambda p: 1.0 - lam(p["init.w_plus"])  # noqa: E731
    groups: dict = {}
    for s in claim["sizes"]:
        g = s["point"].get("init.w_plus") if len(axes) == 2 else None
        groups.setdefault(g, []).append(s)
    for n, (g, rows) in enumerate(groups.items()):
        col = f"C{n}"
        x = np.array([xof(r["point"]) for r in rows], float)
        m = np.array([r["mean"] for r in rows], float)
        e = np.array([r["se"] for r in rows], float)
        lab = "measured (± 2 SE over replicates)" + ("" if g is None else f", w₊ = {g:g}")
        ax.errorbar(x, m, yerr=2 * np.nan_to_num(e), fmt="o", color=col, capsize=3, label=lab)
        if fit and rows:
            pts = [r["point"] for r in rows]
            xs = np.linspace(0.0, float(np.nanmax(x)) * 1.05, 60)
            ys = _line(fit, model, pts[0], xs, axes, lam)
            ax.plot(xs, ys, "-", color=col, lw=1, alpha=0.8, label=f"fit {model} (p = {fit['p']:.2g})" if n == 0 else None)
    if fit:
        lo, hi = fit["interval"]
        ax.errorbar([0.0], [fit["limit"]], yerr=[[fit["limit"] - lo], [hi - fit["limit"]]], fmt="s", color="k",
                    capsize=5, label=f"limit {fit['limit']:.4g} [{lo:.4g}, {hi:.4g}] (95 %)")  # fmt: skip
    want = claim["value"] if claim["kind"] == "eq" else 0.0
    ax.axhline(want, color="tab:red", ls="--", lw=1.2,
               label=f"paper: q∞ = {want:.4g}" if claim["kind"] == "eq" else "paper: q∞ > 0")  # fmt: skip
    if claim["kind"] == "eq":  # the band the verdict's equivalence test uses (not rescaling the axes)
        r = claim["resolution"] * (abs(want) if claim["relative"] else 1.0)
        lim = ax.get_ylim()
        ax.axhspan(want - r, want + r, color="tab:red", alpha=0.08, lw=0, label=f"the claim's band ± {r:.3g}")
        ax.set_ylim(lim)
    ax.set_xlabel(xlab + " (0: the limit)")
    ax.set_ylabel(claim["quantity"], fontsize=8)
    ax.set_title(f"{claim['statement']}\nverdict: {claim['verdict']}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return atomic_savefig(fig, path)


def _line(fit: dict, model: str, point: dict, xs: np.ndarray, axes, lam) -> np.ndarray:
    """The fitted model along the x axis at the fixed other coordinate of `point`."""
    coef = fit["coef"]
    y = np.full_like(xs, coef[0])
    k = 1
    if "data.L" in axes and any(t in model for t in L_TERMS):
        y = y + coef[1] * xs  # linear in its own scaling variable
        k = 2
    if "init.w_plus" in axes:
        wterm = xs if "data.L" not in axes else 1.0 - lam(point["init.w_plus"])
        y = y + coef[k] * wterm
    return y
