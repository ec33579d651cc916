"""Online SGD against the gradient flow and its diffusion limit (docs/guides/stochastic.md).

Setting (cheap on purpose, for the figure): the published run's model and loss
(d = 3, a 3-gram, uniform start, ``ce_on_probs``, M = H = 3, D = 2, joint schedule,
Λ = 1, a₀ = c₀ = 0.01) at L = 40 instead of 100; the flow and the SME on a fixed
sample of N = 1000 sequences; online SGD (``sampling = "fresh"``: new sequences at
every step) with η = 0.1 and B ∈ {100, 10, 2} (η/B = 0.001, 0.01, 0.05), R = 8 seeds
each, to t = ``--t1`` (default 100, 1000 steps); the SME with the same η/B, dt = η/2,
R = 8 paths, Σ(θ) from the first M = 200 sequences of the fixed sample
(``SDEConfig.sigma_sample``, ``--sigma-sample``; the drift uses all N). ``--parents``
changes the data's parent set (e.g. ``1 3``), ``--no-sde`` skips the SME (SGD seeds
only, e.g. to count which set many seeds select).

Figure ``figures/sgd_vs_flow.png``: one column per η/B; rows a, the flow's selected
c_S/Σc and the loss L̂_N (the fixed sample's), against t (log scale): the flow (black),
SGD's mean over seeds with a band of ± one standard deviation (blue), the SME's
(orange). Printed: at a few times, the flow's value and SGD's and the SME's mean ± std.

Usage::

    python scripts/studies/sgd_vs_flow.py [--t1 100] [--out figures/sgd_vs_flow.png]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

import gflow
from gflow.core._model import subset_label
from gflow.dynamics._sde import SDEConfig, sde
from gflow.dynamics._sgd import SGDConfig, sgd


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--t1", type=float, default=100.0)
    ap.add_argument("--L", type=int, default=40)
    ap.add_argument("--N", type=int, default=1000)
    ap.add_argument("--eta", type=float, default=0.1)
    ap.add_argument("--batches", type=int, nargs="+", default=[100, 10, 2])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--sigma-sample", type=int, default=200, help="sequences for Σ in the SME (0: all N)")
    ap.add_argument("--parents", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--no-sde", action="store_true")
    ap.add_argument("--out", default="figures/sgd_vs_flow.png")
    args = ap.parse_args()

    cfg = gflow.Config().replace(
        data={"L": args.L, "start": "uniform", "parents": args.parents},
        estimator={"N": args.N, "loss": "ce_on_probs"},
        schedule={"kind": "joint", "t1": args.t1},
    )
    loss = gflow.make_loss(cfg.data, cfg.model, cfg.estimator)
    t_start = t0 = time.perf_counter()
    flow = gflow.integrate(cfg, loss=loss)
    print(f"flow: {flow.stages[0].nfev} evaluations, {time.perf_counter() - t0:.1f} s")
    sel = int(np.argmax(flow.c_frac[-1]))
    label = subset_label(cfg.model.subsets[sel])
    steps = round(args.t1 / args.eta)
    runs = {}
    for B in args.batches:
        t0 = time.perf_counter()
        s = sgd(cfg, SGDConfig(eta=args.eta, batch=B, steps=steps, seeds=args.seeds, sampling="fresh"), loss=loss)
        t1 = time.perf_counter()
        e = s if args.no_sde else sde(cfg, SDEConfig(eta=args.eta, batch=B, t1=args.t1, dt=args.eta / 2, seeds=args.seeds,
                                                     sigma_sample=args.sigma_sample), loss=loss)  # fmt: skip
        print(f"B = {B}: SGD {t1 - t0:.1f} s, SME {time.perf_counter() - t1:.1f} s")
        runs[B] = (s, e)

    def q(run, name):
        return {"a": run.a, "c": run.c_frac[..., sel], "loss": run.loss}[name]

    fq = {"a": flow.a, "c": flow.c_frac[:, sel], "loss": flow.loss}
    order = np.argsort(flow.c_frac[-1])[::-1]
    print(f"selected set (flow): {label}; flow's c_S/Σc at t1: "
          + ", ".join(f"{subset_label(cfg.model.subsets[x])} {flow.c_frac[-1, x]:.4f}" for x in order[:3])
          + f"; load average {os.getloadavg()}")  # fmt: skip
    for B, (s, e) in runs.items():
        for t in (1.0, 10.0, args.t1):
            i, j, k = (int(np.argmin(abs(np.log(x.ts[1:] / t)))) + 1 for x in (s, e, flow))
            row = [f"η/B = {args.eta / B:.3g}, t = {s.ts[i]:.3g}:"]
            for name in ("a", "c", "loss"):
                sme = "" if args.no_sde else f" SME {q(e, name)[:, j].mean():.4f}±{q(e, name)[:, j].std():.4f};"
                row.append(f"{name}: flow {fq[name][k]:.4f}, SGD {q(s, name)[:, i].mean():.4f}±{q(s, name)[:, i].std():.4f};"
                           + sme)  # fmt: skip
            print(" ".join(row))
        for name, run in (("SGD", s), ("SME", e)) if not args.no_sde else (("SGD", s),):
            picks = [subset_label(cfg.model.subsets[x]) for x in np.argmax(run.c_frac[:, -1], -1)]
            agree = sum(p == label for p in picks)
            print(f"  η/B = {args.eta / B:.3g}: sets selected at t1 by the {name} seeds: {picks} "
                  f"({agree}/{len(picks)} the flow's)")  # fmt: skip
    print(f"total {time.perf_counter() - t_start:.1f} s")
    if args.no_sde:
        return

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [("a", "a"), ("c", f"c_S/Σc, S = {label}"), ("loss", "loss L̂_N")]
    fig, axes = plt.subplots(3, len(runs), figsize=(4.2 * len(runs), 8), sharex=True, squeeze=False)
    for col, (B, (s, e)) in enumerate(runs.items()):
        for row, (name, ylabel) in enumerate(names):
            ax = axes[row, col]
            ax.plot(flow.ts[1:], fq[name][1:], "k-", lw=1.5, label="flow")
            for run, color, lab in ((s, "C0", "SGD"), (e, "C1", "SME")):
                m, sd = q(run, name)[:, 1:].mean(0), q(run, name)[:, 1:].std(0)
                ax.plot(run.ts[1:], m, color=color, lw=1.2, label=f"{lab} mean ± sd ({args.seeds} seeds)")
                ax.fill_between(run.ts[1:], m - sd, m + sd, color=color, alpha=0.25, lw=0)
            ax.set_xscale("log")
            if col == 0:
                ax.set_ylabel(ylabel)
            if row == 0:
                ax.set_title(f"η = {args.eta:g}, B = {B} (η/B = {args.eta / B:.3g})")
            if row == 2:
                ax.set_xlabel("t = kη")
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(f"online SGD vs flow vs SME (d = 3, L = {args.L}, fixed sample N = {args.N} for flow/SME/loss)")
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
