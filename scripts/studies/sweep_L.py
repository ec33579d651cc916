"""How the Stage III law of the generalized induction head changes with the context length L.

What it shows
-------------
In Stage III the classifier scale follows ∂ₜa = F(a), F(a) = −dL_GIH/da the
one-dimensional law of the generalized induction head (GIH) on S* (docs/theory/mathematics.md §M6.4).
The paper's rate is F(a) ≍ e^{−a}, hence a(t) = log t + O(1); at finite L,
F changes sign at a finite a* (shrinkage towards the context's unigram beats
the raw conditional counts) and the log-t law only holds on the validity
window {a : F(a)·e^a ≥ C*/2}, C* = max_a F(a)·e^a. This script measures, as L
grows (default L = 50, 100, 200, 400):

- a*, the zero of F (where a(t) stops);
- the window's ends a_lo, a_hi and its width a_hi − a_lo, the range of a
  over which a(t) = log t + O(1) holds within a factor 2 of the rate;
- C*;
- the limit loss inf_a L_GIH;

each with its standard error over R independent samples of N sequences
(default R = 5, N = 4000). These are theory-only quantities, computed without
integrating any flow: one draw of R·N sequences per L (``gflow.sample``) split
into R blocks of N, the GIH's match counts on S* for each block
(:func:`gflow.theory.make_gih`, the paper's model's limit with a one-hot
copier and c = e_{S*}) and its law (:func:`gflow.theory.stage3_law`). S* does
not depend on L (the modified χ²-MI is a property of the stationary law): it
is computed once, from the Ĩ ranking over ``--n-pi`` prior kernels, and
checked to be the paper's parents.

It fits a* ≈ α + β·ln L and the window's ends the same way by weighted least
squares (weights 1/SE²) and draws those lines: these are EMPIRICAL fits over
the L's of the sweep, not a law derived anywhere.

Output: ``figures/sweep_L.png`` (a*, window ends and the fits; window width;
C*; F(a)·e^a for one sample per L) and a table.

Runtime: about a minute on 2 quiet CPU cores at the default (up to 3 on a
loaded machine), mostly sampling and compilation; ``--R``, ``--N``, ``--Ls``
scale it.

Usage::

    python scripts/studies/sweep_L.py
    python scripts/studies/sweep_L.py --Ls 25 50 100 200 400 800 --R 10 --N 10000
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import numpy as np
from _study import save_figure

import gflow
from gflow.core._model import subset_label
from gflow.theory._theory import make_gih, modified_chi2_ranking, stage3_law

ROOT = Path(__file__).resolve().parents[2]


def mean_se(x) -> tuple[float, float]:
    x = np.asarray(x, float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return np.nan, np.nan
    return float(x.mean()), float(x.std(ddof=1) / np.sqrt(x.size)) if x.size > 1 else np.nan


def wfit(x, y, se) -> tuple[float, float, float, float]:
    """Weighted least squares ``y = α + β x`` (weights 1/se²): ``(α, β, SE α, SE β)``."""
    x, y, se = (np.asarray(v, float) for v in (x, y, se))
    w = 1.0 / np.maximum(se, 1e-12) ** 2
    A = np.stack([np.ones_like(x), x], 1)
    cov = np.linalg.inv(A.T @ (w[:, None] * A))
    coef = cov @ (A.T @ (w * y))
    return float(coef[0]), float(coef[1]), float(np.sqrt(cov[0, 0])), float(np.sqrt(cov[1, 1]))


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--Ls",
        type=int,
        nargs="+",
        default=[50, 100, 200, 400],
        help="context lengths (default 50 100 200 400)",
    )
    p.add_argument("--R", type=int, default=5, help="independent samples per L (default 5)")
    p.add_argument("--N", type=int, default=4000, help="sequences per sample (default 4000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the draws (default 0)")
    p.add_argument(
        "--n-pi", type=int, default=500, help="prior kernels for the Ĩ ranking that gives S* (default 500)"
    )
    p.add_argument("--a-max", type=float, default=30.0, help="largest a of the F(a) grid (default 30)")
    p.add_argument("--out", default=str(ROOT / "figures" / "sweep_L.png"), help="figure path")
    args = p.parse_args(argv)
    if args.R < 2:
        raise SystemExit("--R must be at least 2 for a standard error over samples")
    return args


def _measure(args, data0, est, S, L, key) -> tuple[dict, tuple]:
    """The Stage III law of R samples at context length L: the row of means ± SE, and one sample's curve."""
    t0 = time.perf_counter()
    data = gflow.DataConfig(d=data0.d, parents=data0.parents, alpha=data0.alpha, L=L)
    smp = gflow.sample(data, args.N * args.R, key=key)
    laws = []
    for r in range(args.R):
        blk = jax.tree.map(lambda x, r=r: x[r * args.N : (r + 1) * args.N], smp)
        gih = make_gih(blk, S, eps=float(est.eps), kind=est.loss)
        laws.append(stage3_law(gih, a_max=args.a_max))
    curve = (laws[0].a_grid, laws[0].Fexp, laws[0].a_star)
    nan = lambda v: np.nan if v is None else v
    vals = {
        "a_star": [nan(w.a_star) for w in laws],
        "lo": [w.window[0] for w in laws],
        "hi": [w.window[1] for w in laws],
        "width": [w.window[1] - w.window[0] for w in laws],
        "C_star": [w.C_star for w in laws],
        "limit": [w.limit_loss for w in laws],
    }
    row = {"L": L, "wall": time.perf_counter() - t0}
    for k, v in vals.items():
        row[k], row[k + "_se"] = mean_se(v)
    row["a_star_se_within"] = float(np.nanmean([nan(w.a_star_se) for w in laws]))
    row["n_inf"] = sum(w.a_star is None for w in laws)
    row["clipped"] = any(w.window_clipped[0] or w.window_clipped[1] for w in laws)
    row["not_interval"] = sum(not w.window_is_interval for w in laws)
    print(f"  L = {L:4d}: a* = {row['a_star']:.3f} ± {row['a_star_se']:.3f}, window "
          f"[{row['lo']:.3f}, {row['hi']:.3f}], C* = {row['C_star']:.3f}  ({row['wall']:.1f} s)", flush=True)  # fmt: skip
    return row, curve


def _print_table(args, rows, fits, lnL) -> None:
    print(f"\n{'L':>5} {'a*':>16} {'sd | within SE':>15} {'window lo':>16} {'window hi':>16} {'width':>16} "
          f"{'C*':>16} {'inf L_GIH':>17}")  # fmt: skip
    for r in rows:
        pm = lambda k, f=".3f", r=r: f"{r[k]:{f}} ± {r[k + '_se']:.3f}"
        sd = f"{r['a_star_se'] * np.sqrt(args.R):.3f} | {r['a_star_se_within']:.3f}"
        print(f"{r['L']:>5d} {pm('a_star'):>16} {sd:>15} {pm('lo'):>16} {pm('hi'):>16} "
              f"{pm('width'):>16} {pm('C_star'):>16} {pm('limit', '.4f'):>17}")  # fmt: skip
    print(f"(mean ± SE over R = {args.R} samples of N = {args.N}; 'sd | within SE': the standard deviation of a* "
          f"over the samples, next to the delta-method SE of a* that stage3_law gives from one sample, averaged "
          f"over the samples: the two should agree)")  # fmt: skip
    for r in rows:
        if r["n_inf"] or r["clipped"] or r["not_interval"]:
            print(
                f"  note L = {r['L']}: {r['n_inf']} samples with F > 0 on the whole grid (a* = ∞); "
                f"window clipped by the grid: {r['clipped']}; windows not an interval: {r['not_interval']}"
            )
    names = {"a_star": "a*", "lo": "window lo", "hi": "window hi", "width": "width", "C_star": "C*"}
    for k, (al, be, sa, sb) in fits.items():
        resid = np.array([r[k] for r in rows]) - (al + be * lnL)
        chi2 = float(np.sum((resid / np.array([r[k + "_se"] for r in rows])) ** 2))
        print(f"empirical fit {names[k]:>9} ≈ {al:.3f} + {be:.3f}·ln L   (±{sa:.3f}, ±{sb:.3f}; "
              f"χ² = {chi2:.1f} on {len(rows) - 2} dof)")  # fmt: skip


def main(argv=None) -> int:
    args = _args(argv)
    t_start = time.perf_counter()
    cfg = gflow.Config()
    data0, est = cfg.data, cfg.estimator
    rank = modified_chi2_ranking(data0, cfg.model.subsets, n_pi=args.n_pi, key=jax.random.key(args.seed))
    S = rank.S_star
    print(f"sweep_L: d={data0.d}, parents {data0.parents}, α={data0.alpha:g}; GIH on S* = {subset_label(S)} "
          f"(argmax Ĩ over {args.n_pi} kernels; gap to the runner-up {rank.gap / rank.gap_se:.1f} paired SE); "
          f"R = {args.R} samples of N = {args.N} per L", flush=True)  # fmt: skip

    keys = jax.random.split(jax.random.key(args.seed), len(args.Ls))
    rows, curves = [], {}
    for L, key in zip(args.Ls, keys):
        row, curves[L] = _measure(args, data0, est, S, L, key)
        rows.append(row)

    Ls = np.array([r["L"] for r in rows], float)
    lnL = np.log(Ls)
    fits = {}
    for k in ("a_star", "lo", "hi", "width", "C_star"):
        y = np.array([r[k] for r in rows])
        se = np.array([r[k + "_se"] for r in rows])
        if len(rows) >= 2 and np.all(np.isfinite(y)) and np.all(np.isfinite(se)):
            fits[k] = wfit(lnL, y, se)
    _print_table(args, rows, fits, lnL)
    out = _figure(args, rows, fits, curves, Ls, S, data0)
    print(f"\nfigure: {out}\ntime: total {time.perf_counter() - t_start:.1f} s")
    return 0


def _log_L_axis(ax, Ls):
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

    ax.set_xscale("log")
    ax.xaxis.set_major_locator(FixedLocator(Ls))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xticklabels([f"{int(x)}" for x in Ls])
    ax.set_xlabel("context length $L$ (log scale)")
    ax.grid(alpha=0.3)


def _panel_fit(ax, Ls, rows, fits, k, fmt, color, label, ylabel, title):
    """One quantity against L (mean ± SE) with its least-squares fit in ln L."""
    LL = np.geomspace(Ls.min() / 1.15, Ls.max() * 1.15, 50)
    y = np.array([r[k] for r in rows])
    se = np.array([r[k + "_se"] for r in rows])
    ax.errorbar(Ls, y, yerr=se, fmt=fmt, ms=6, color=color, capsize=3, label=label)
    if k in fits:
        al, be = fits[k][:2]
        ax.plot(LL, al + be * np.log(LL), "--", color=color, lw=1.2, label=f"fit {al:.2f} + {be:.2f} ln L")
    _log_L_axis(ax, Ls)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=11)
    ax.legend(fontsize=9, loc="upper left")


def _panel_window(ax, Ls, rows, fits) -> None:
    """a* and the validity window's ends against L, with their fits."""
    LL = np.geomspace(Ls.min() / 1.15, Ls.max() * 1.15, 50)
    series = (("a_star", r"$a^*$ (zero of $F$)", "tab:red", "o"),
              ("hi", r"window end $a_{\rm hi}$", "tab:green", "^"),
              ("lo", r"window start $a_{\rm lo}$", "tab:blue", "v"))  # fmt: skip
    pts, lines = [], []
    for k, lab, c, mk in series:
        y = np.array([r[k] for r in rows])
        se = np.array([r[k + "_se"] for r in rows])
        pts.append(ax.errorbar(Ls, y, yerr=se, fmt=mk, ms=6, color=c, capsize=3, label=f"{lab} ± SE"))
        if k in fits:
            al, be = fits[k][:2]
            lines += ax.plot(LL, al + be * np.log(LL), "--", color=c, lw=1.2,
                             label=f"fit {al:.2f} + {be:.2f} ln L")  # fmt: skip
    _log_L_axis(ax, Ls)
    ax.set_ylabel("$a$")
    ax.set_title(r"$a^*$ and the validity window $\{F e^a \geq C^*/2\}$", fontsize=11)
    ax.legend(handles=pts + lines, fontsize=8.5, loc="upper left", ncol=2)
    top = max(np.nanmax([r["a_star"] + r["a_star_se"] for r in rows]), 1.0)
    ax.set_ylim(0, 1.35 * top)


def _panel_curves(ax, Ls, rows, curves) -> None:
    """The GIH law F(a) e^a of one sample per L, with its zero a*."""
    import matplotlib as mpl

    cmap = mpl.colormaps["viridis"]
    a_hi = 1.15 * max(np.nanmax([q["a_star"] for q in rows]), 1.0)
    top = 0.0
    for k, L in enumerate(Ls.astype(int)):
        a, Fe, a0_star = curves[L]
        col = cmap(0.85 * k / max(len(Ls) - 1, 1))
        m = a <= a_hi
        ax.plot(a[m], Fe[m], color=col, lw=1.8, label=f"L = {L}")
        top = max(top, float(np.nanmax(Fe[m])))
        if a0_star is not None:
            ax.plot([a0_star], [0.0], "o", ms=6, mfc="white", color=col)
    ax.plot([], [], "o", ms=6, mfc="white", color="0.3", label="$a^*$, the zero of $F$")
    ax.set_ylim(-0.45 * top, 1.2 * top)
    ax.set_xlim(0, a_hi)
    ax.axhline(0, color="black", lw=0.6)
    ax.set_xlabel("$a$")
    ax.set_ylabel(r"$F(a)\,e^{a}$")
    ax.set_title(r"the GIH law $F(a)\,e^a$ (one sample per L)", fontsize=11)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9, loc="lower left")


def _figure(args, rows, fits, curves, Ls, S, data0) -> Path:
    import matplotlib as mpl
    from matplotlib.figure import Figure

    with mpl.rc_context({"font.size": 11}):
        fig = Figure(figsize=(11.5, 8.4), dpi=120, layout="constrained")
        (ax1, ax2), (ax3, ax4) = fig.subplots(2, 2)
        _panel_window(ax1, Ls, rows, fits)
        _panel_fit(ax2, Ls, rows, fits, "width", "s", "tab:purple", r"width $a_{\rm hi} - a_{\rm lo}$ ± SE",
                   r"width $a_{\rm hi} - a_{\rm lo}$",
                   r"width of the validity window (it spans width/ln 10 decades of $t$)")  # fmt: skip
        _panel_fit(ax3, Ls, rows, fits, "C_star", "D", "tab:orange", r"$C^* = \max_a F(a)\,e^a$ ± SE", r"$C^*$",
                   r"$C^*$: the constant of $\partial_t a \approx C^* e^{-a}$")  # fmt: skip
        _panel_curves(ax4, Ls, rows, curves)
        fig.suptitle(
            rf"Stage III law of the GIH on S* = {subset_label(S)} against L: d = {data0.d}, parents "
            rf"{tuple(data0.parents)}, $\alpha$ = {data0.alpha:g}; mean ± SE over R = {args.R} samples of N = {args.N}"
            "\n(dashed: empirical least-squares fits in ln L over these L, not a derived law)",
            fontsize=11.5,
        )
        out = save_figure(fig, args.out)
    return out



if __name__ == "__main__":
    raise SystemExit(main())
