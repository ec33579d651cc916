"""Joint training of all blocks against the paper's staged schedule, on one sample.

What it shows
-------------
The paper trains the transformer in three stages (Stage I: only the selector
C; Stage II: only the copier w; Stage III: only the classifier scale a).
The joint schedule (docs/theory/mathematics.md §M4, extension) moves every block at once,
dθ/dt = −Λ∇L̂(θ), Λ = diag(η_w, η_C, η_a). On one sample (one
``PopulationLoss`` shared by every run) this script asks: does training all
blocks at once select the same set S* of parents, and does it reach the same
limit (a → a*, the loss → inf_a L_GIH of the generalized induction head)?

Runs (default d = 3, L = 40, N = 2000; ``--L``, ``--N``):

- **staged**: ``gflow.Config()``'s schedule (Stages I and II end at their
  events, δ = 0.01; Stage III runs 1e4), Tsit5;
- **joint** for each ``--joint η_w,η_C,η_a`` (default ``1,1,1`` and
  ``1,0.001,1``), up to ``--t1`` (default 1e6), with Kvaerno5 (implicit) at
  rtol 1e-5, atol 1e-8 (1e-6/1e-9 change the end state by ~1e-6). The joint flow is stiff: the selector's rate is
  ∝ a/‖C‖² (docs/theory/mathematics.md §M6.2) with ‖C‖² = 7e-4 at the paper's c₀ = 0.01, so once a
  has grown the weights C_S of the losing sets decay at rates of hundreds;
  Tsit5 needs ~9,000 steps just to reach t = 100, Kvaerno5 ~300 to t = 1e6.
  The horizon: by t ≈ 1e4 the joint loss is within 1e-4 of its limit, and by
  1e6 the gradient norm is ~1e-6 (printed: the last decade's change of loss
  and the final ‖∇L̂‖). The second setting slows the selector by 1e3, so that
  C no longer concentrates long before w and a move (with η_C = 1 it does,
  within t ≈ 1: Stage I happens first by itself).

Printed, per run: the selected set (argmax c/Σc) and its weight, the
runner-up set, s^(h)_h for h ∈ S*, the final a, the final loss, the time at
which the loss first comes within 1e-3 of inf_a L_GIH, solver statistics; and
the theory: S* = argmax Ĩ, a* and inf_a L_GIH of the GIH on S* (same sample).

Figure ``figures/joint_vs_staged.png``: against t (log scale; the staged
run's stage boundaries dotted): 1 − c_{S*}/Σc, 1 − s^(h)_h for h ∈ S*, a (with
a*), and L̂ − inf_a L_GIH (symmetric-log scale: it may end below 0).

Runtime: ~4–5 minutes on 2 quiet CPU cores at the default (~5 CPU-minutes,
mostly the two implicit joint runs; 7 minutes on a loaded machine);
``--joint 1,1,1`` alone takes about half. The runs are saved
under ``--out`` (default ``runs/joint_vs_staged``); ``--reuse`` loads complete
runs with the same configuration from there instead of integrating again.

Usage::

    python scripts/studies/joint_vs_staged.py
    python scripts/studies/joint_vs_staged.py --joint 1,1,1 1,0.001,1 1,1,0.01 --reuse
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from _study import save_figure

import gflow
from gflow.core._model import subset_label

ROOT = Path(__file__).resolve().parents[2]


def _etas(s: str) -> tuple[float, float, float]:
    try:
        v = tuple(float(x) for x in s.split(","))
    except ValueError:
        v = ()
    if len(v) != 3:
        raise argparse.ArgumentTypeError(f"expected three numbers η_w,η_C,η_a, got {s!r}")
    return v


def _run(cfg, loss, out: Path, reuse: bool, name: str):
    if reuse:
        try:
            tr = gflow.load(out)
            if tr.status == "complete" and tr.config.to_dict() == cfg.to_dict():
                print(f"  {name}: reused {out}", flush=True)
                return tr, 0.0
        except FileNotFoundError:
            pass
    t0 = time.perf_counter()
    tr = gflow.integrate(cfg, out=out, overwrite=True, loss=loss)
    wall = time.perf_counter() - t0
    st = tr.stages
    print(f"  {name}: {sum(s.steps for s in st)} steps (+{sum(s.rejected for s in st)} rejected), "
          f"{sum(s.nfev for s in st)} evaluations, {wall:.1f} s", flush=True)  # fmt: skip
    return tr, wall


def _fmt_eta(v: float) -> str:
    return f"{v:g}"


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--N", type=int, default=2000, help="sequences in the sample (default 2000)")
    p.add_argument("--L", type=int, default=40, help="context length (default 40)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sample (default 0)")
    p.add_argument("--joint", type=_etas, nargs="+", default=[(1.0, 1.0, 1.0), (1.0, 1e-3, 1.0)],
                   metavar="ETA_W,ETA_C,ETA_A", help="time scales of each joint run (default 1,1,1 1,0.001,1)")  # fmt: skip
    p.add_argument("--t1", type=float, default=1e6, help="end time of the joint runs (default 1e6)")
    p.add_argument("--rtol", type=float, default=1e-5, help="rtol of the joint runs' Kvaerno5 (default 1e-5)")
    p.add_argument("--atol", type=float, default=1e-8, help="atol of the joint runs' Kvaerno5 (default 1e-8)")
    p.add_argument("--n-pi", type=int, default=500, help="prior kernels for the Ĩ ranking (default 500)")
    p.add_argument("--out", default=str(ROOT / "runs" / "joint_vs_staged"), help="folder of the runs")
    p.add_argument(
        "--reuse", action="store_true", help="load complete runs with the same configuration from --out"
    )
    p.add_argument("--fig", default=str(ROOT / "figures" / "joint_vs_staged.png"), help="figure path")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = _args(argv)
    t_start = time.perf_counter()
    base = gflow.Config().replace(data={"L": args.L}, estimator={"N": args.N, "seed": args.seed})
    loss = gflow.make_loss(base.data, base.model, base.estimator)
    out = Path(args.out)
    print(f"joint_vs_staged: d={base.data.d}, parents {base.data.parents}, L={args.L}, N={args.N}, "
          f"seed={args.seed}; joint settings (η_w, η_C, η_a): {args.joint}, t1={args.t1:g}", flush=True)  # fmt: skip

    # theory on the same sample: S* = argmax Ĩ, and the GIH's a*, limit loss
    t0 = time.perf_counter()
    th = gflow.theory_report(base.data, base.model, base.estimator, base.init, n_pi=args.n_pi, loss=loss)
    S_star = tuple(th["mi"]["S_star"])
    s3 = th["stage3"]
    a_star, lim, lim_se = s3["a_star"], s3["limit_loss"], s3["limit_loss_se"]
    print(f"theory ({time.perf_counter() - t0:.1f} s): S* = argmax Ĩ = {subset_label(S_star)}; GIH on S*: "
          f"a* = {a_star:.4f} ± {s3['a_star_se']:.2g}, inf_a L_GIH = {lim:.5f} ± {lim_se:.2g}", flush=True)  # fmt: skip

    runs = _runs(args, base, loss, out)
    iS = list(runs[0]["traj"].subsets).index(S_star)
    _print_numbers(runs, iS, S_star, a_star, lim)
    figpath = _figure(args, base, runs, iS, S_star, a_star, lim)
    print(f"\nfigure: {figpath}\ntime: total {time.perf_counter() - t_start:.1f} s")
    return 0


def _runs(args, base, loss, out: Path) -> list[dict]:
    """The staged run and each joint run (integrated, or loaded with ``--reuse``), with their colours."""
    runs = []
    tr, wall = _run(base, loss, out / "staged", args.reuse, "staged")
    runs.append({"name": "staged (paper)", "traj": tr, "wall": wall, "color": "black"})
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"]
    for k, (ew, ec, ea) in enumerate(args.joint):
        cfg = base.replace(
            schedule={"kind": "joint", "t1": args.t1, "eta_w": ew, "eta_C": ec, "eta_a": ea},
            solver={"method": "kvaerno5", "rtol": args.rtol, "atol": args.atol, "save_per_decade": 6,
                    "tau_min": 0.1},
        )  # fmt: skip
        name = f"joint, (η_w, η_C, η_a) = ({_fmt_eta(ew)}, {_fmt_eta(ec)}, {_fmt_eta(ea)})"
        tr, wall = _run(
            cfg, loss, out / f"joint_{_fmt_eta(ew)}_{_fmt_eta(ec)}_{_fmt_eta(ea)}", args.reuse, name
        )
        runs.append({"name": name, "traj": tr, "wall": wall, "color": colors[k % len(colors)]})
    return runs


def _print_numbers(runs, iS, S_star, a_star, lim) -> None:
    """The table: each run's selected set, copier, a and loss at its end, against the theory."""
    print(f"\n{'run':<44} {'argmax c/Σc':>12} {'c_S*/Σc':>9} {'runner-up':>15} "
          + " ".join(f"{'s^(' + str(h) + ')_' + str(h):>9}" for h in S_star)
          + f" {'a(end)':>8} {'loss(end)':>10} {'− inf L_GIH':>12} {'t: loss ≤ lim+1e-3':>19} {'t end':>8}")  # fmt: skip
    for r in runs:
        tr = r["traj"]
        cf = tr.c_frac[-1]
        order = np.argsort(-cf)
        top, second = order[0], order[1]
        within = np.flatnonzero(tr.loss <= lim + 1e-3)
        t_conv = f"{tr.ts[within[0]]:.3g}" if within.size else "never"
        s = tr.s[-1]
        r.update(top=tr.subsets[top], t_conv=t_conv)
        print(f"{r['name']:<44} {tr.labels[top]:>12} {cf[iS]:>9.4f} "
              f"{tr.labels[second] + f' ({cf[second]:.2g})':>15} "
              + " ".join(f"{s[h - 1, h - 1]:>9.4f}" for h in S_star)
              + f" {tr.a[-1]:>8.4f} {tr.loss[-1]:>10.5f} {tr.loss[-1] - lim:>+12.2e} {t_conv:>19} "
              f"{tr.ts[-1]:>8.3g}")  # fmt: skip
    print(f"theory{'':<38} {subset_label(S_star):>12} {'':>9} {'':>15} "
          + " ".join(f"{'1':>9}" for _ in S_star) + f" {a_star:>8.4f} {lim:>10.5f}")  # fmt: skip
    print(f"(loss SE ≈ {runs[0]['traj'].loss_se[-1]:.2g}, but every run and the GIH share one sample: "
          f"differences between them are exact for that sample)")  # fmt: skip
    for r in runs[1:]:
        tr = r["traj"]
        i_dec = np.searchsorted(tr.ts, tr.ts[-1] / 10)
        print(f"  convergence of {r['name']}: loss change over the last decade {tr.loss[-1] - tr.loss[i_dec]:+.2e}, "
              f"‖∇L̂‖ at the end {tr.grad_norm[-1]:.2e}")  # fmt: skip
    same = all(tuple(r["top"]) == S_star for r in runs)
    print(f"same S* in every run: {'yes' if same else 'NO'}")


def _plot_runs(axes, runs, iS, S_star, lim) -> None:
    """Every run's curves: the weight off S*, the copier off its offsets, a, and the loss above the limit."""
    (ax1, ax2), (ax3, ax4) = axes
    for r in runs:
        tr, c = r["traj"], r["color"]
        m = tr.ts > 0
        t = tr.ts[m]
        # Σ_{S≠S*} c_S/Σc, not 1 − c_S*/Σc: no cancellation when it is tiny
        cf = tr.c_frac[m]
        ax1.plot(t, np.delete(cf, iS, axis=1).sum(-1), color=c, lw=1.8)
        for h, ls in zip(S_star, ("-", "--", ":")):
            ax2.plot(t, 1 - tr.s[m, h - 1, h - 1], color=c, lw=1.6, ls=ls)
        ax3.plot(t, tr.a[m], color=c, lw=1.8)
        ax4.plot(t, tr.loss[m] - lim, color=c, lw=1.8)


def _decorate_top(ax1, ax2, runs, iS, S_star) -> None:
    """The selector and copier panels' scales, off-scale notes and titles."""
    ax1.set_yscale("log")
    ax1.set_ylim(1e-12, 2.0)
    notes = []
    for r in runs:
        v = float(np.delete(r["traj"].c_frac[-1], iS).sum())
        if v < 1e-12:
            notes.append(
                f"{r['name'].split(',')[0]} {r['name'].split('= ')[-1]}: down to {v:.0e} (off scale)"
            )
    if notes:
        ax1.text(
            0.98,
            0.03,
            "\n".join(notes),
            transform=ax1.transAxes,
            ha="right",
            va="bottom",
            fontsize=9,
            bbox={"facecolor": "white", "edgecolor": "0.7", "alpha": 0.9},
        )
    ax1.set_ylabel(r"$1 - c_{S^*}/\Sigma c$")
    ax1.set_title(rf"selector: weight off $S^*$ = {subset_label(S_star)}", fontsize=11)
    ax2.set_yscale("log")
    ax2.set_ylabel(r"$1 - s^{(h)}_h$")
    hs = ", ".join(f"h = {h}: {ls}" for h, ls in zip(S_star, ("solid", "dashed", "dotted")))
    ax2.set_title(rf"copier: attention off offset $h$, $h \in S^*$ ({hs})", fontsize=11)


def _decorate_bottom(ax3, ax4, runs, a_star, lim) -> None:
    """The classifier-scale and loss panels: the GIH's a* and limit loss."""
    ax3.axhline(a_star, color="tab:red", ls="--", lw=1.2)
    ax3.text(
        0.03,
        a_star + 0.1,
        rf"GIH $a^*$ = {a_star:.3f}",
        color="tab:red",
        va="bottom",
        fontsize=10,
        transform=ax3.get_yaxis_transform(),
    )
    ax3.set_ylabel("$a$")
    ax3.set_title("classifier scale $a$", fontsize=11)
    ax4.set_yscale("symlog", linthresh=1e-5)
    lo = min(float(np.min(r["traj"].loss - lim)) for r in runs)
    ax4.set_ylim(min(-1e-4, 3 * lo), 1.0)
    ax4.axhline(0.0, color="tab:red", ls="--", lw=1.2)
    ax4.set_ylabel(r"$\hat L(t) - \inf_a L_{\rm GIH}$  (symlog)")
    ax4.set_title(rf"loss above the GIH limit $\inf_a L_{{\rm GIH}}$ = {lim:.5f}", fontsize=11)


def _figure(args, base, runs, iS, S_star, a_star, lim) -> Path:
    import matplotlib as mpl
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    stg = runs[0]["traj"]
    bounds = [s.t1 for s in stg.stages[:-1]]
    with mpl.rc_context({"font.size": 11}):
        fig = Figure(figsize=(12, 8.6), dpi=120, layout="constrained")
        axes = fig.subplots(2, 2, sharex=True)
        (ax1, ax2), (ax3, ax4) = axes
        _plot_runs(axes, runs, iS, S_star, lim)
        _decorate_top(ax1, ax2, runs, iS, S_star)
        _decorate_bottom(ax3, ax4, runs, a_star, lim)
        for ax in axes.ravel():
            ax.set_xscale("log")
            ax.set_xlim(0.1, None)
            ax.grid(alpha=0.3)
            for b in bounds:
                ax.axvline(b, color="0.5", ls=":", lw=1.2)
        for ax in axes[1]:
            ax.set_xlabel("time $t$ (log scale)")
        handles = [Line2D([], [], color=r["color"], lw=2) for r in runs]
        labels = [r["name"] for r in runs]
        handles.append(Line2D([], [], color="0.5", ls=":", lw=1.2))
        labels.append("staged: end of Stage I, of Stage II")
        fig.legend(handles, labels, loc="outside lower center", ncol=2, fontsize=10)
        fig.suptitle(
            rf"joint vs staged training on one sample: d = {base.data.d}, parents {tuple(base.data.parents)}, "
            rf"L = {args.L}, N = {args.N}",
            fontsize=12,
        )
        figpath = save_figure(fig, args.fig)
    return figpath



if __name__ == "__main__":
    raise SystemExit(main())
