"""The figure of ``gflow eval``: a trained θ off its training distribution, with the loss
ladder of each evaluated configuration."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .._util import atomic_savefig, show_value
from ..core import subset_label

_STYLE = {
    "oracle": ("oracle E H(π)", "0.4", ":"),
    "bayes": ("Bayes (Dirichlet predictive)", "tab:green", "--"),
    "gih": ("GIH at its own a*", "tab:orange", "-."),
    "unigram": ("context unigram", "tab:purple", (0, (1, 1))),
}


def plot_eval(res, path: str | Path) -> Path:
    """Loss of θ against the first swept field (± SE), with the ladder's
    curves (± SE bands); one panel per combination of the other fields."""
    f0, rest = res.fields[0], res.fields[1:]
    groups: dict[tuple, list[dict]] = {}
    for r in res.rows:
        groups.setdefault(tuple(show_value(r[f]) for f in rest), []).append(r)
    n = len(groups)
    from matplotlib.figure import Figure  # built without pyplot: no backend is chosen or changed

    fig = Figure(figsize=(6.4 * n, 4.6))
    axes = fig.subplots(1, n, squeeze=False)
    for ax, (g, rows) in zip(axes[0], groups.items()):
        xs = [r[f0] for r in rows]
        numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs)
        x = np.array(xs, float) if numeric else np.arange(len(xs), dtype=float)
        for k, (lab, col, ls) in _STYLE.items():
            m = np.array([r[k] for r in rows])
            s = np.array([r[f"{k}_se"] for r in rows])
            ax.plot(x, m, ls=ls, color=col, label=lab)
            ax.fill_between(x, m - 2 * s, m + 2 * s, color=col, alpha=0.15, lw=0)
        m = np.array([r["loss"] for r in rows])
        s = np.array([r["loss_se"] for r in rows])
        ax.errorbar(x, m, yerr=2 * s, fmt="o-", color="tab:blue", ms=4, capsize=2, label="trained TF(θ) (± 2 SE)")
        if numeric and np.all(x > 0) and x.max() / x.min() >= 8:
            ax.set_xscale("log")
            ax.set_xticks(x)
            ax.set_xticklabels([show_value(v) for v in xs])
            ax.minorticks_off()
        elif not numeric:
            ax.set_xticks(x)
            ax.set_xticklabels([show_value(v) for v in xs])
        ax.set_xlabel(f0)
        ax.set_ylabel("loss (run's definition)")
        title = f"θ of the run evaluated off-distribution; GIH on S = {subset_label(res.S)}"
        if rest:
            title += "\n" + ", ".join(f"{f}={v}" for f, v in zip(rest, g))
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    atomic_savefig(fig, path, dpi=120)
    return path
