"""Length generalisation: the flow trained at L = 100, evaluated at L = 25 … 1,600.

What it shows
-------------
The paper's default staged flow (d = 3, parents (1, 2), α = 0.1) is trained at
the default context length L = 100, then its final parameters θ are evaluated
(:func:`gflow.evaluate`, docs/theory/mathematics.md §M8.4) at L = 25, 50, 100, 200, 400, 800,
1600 on held-out sequences (``estimator.seed = --eval-seed``, not the
training sample), each against the loss ladder of its own sample
(:mod:`gflow.theory._ladder`, docs/theory/mathematics.md §M8.3): the oracle E H(π(·|z_q)), the Bayes
(Dirichlet posterior predictive) in-context predictor, the generalized
induction head on the selected set at *its own* a* for that L
(argmin_a L_GIH), and the context unigram (the GIH at a = 0).

The trained model is close to the GIH at a fixed a (the a the flow reached at
L = 100): shorter contexts want a smaller a (more shrinkage towards the
unigram), longer ones a larger a, so the gap "flow − GIH at its own a*"
measures what a fixed a costs off the training length, and "flow − Bayes"
how far the induction head is from the best in-context predictor.

Output: ``figures/length_generalization.png`` (loss against L with the
ladder; the gaps flow − Bayes and GIH − Bayes with paired ±2 SE bands; the
GIH's a* against L with the trained a) and a table.

Size: the training run uses ``--N`` sequences (default 4,000, not the
paper-default 10,000, to keep the run to a few minutes on a busy 2-core
machine; ``--N 10000`` is the default run); each evaluation draws ``--eval-N``
(default 4,000) fresh sequences.

Usage::

    python scripts/studies/length_generalization.py
    python scripts/studies/length_generalization.py --N 10000 --eval-N 10000
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

import gflow
from gflow import evaluate
from gflow.core._model import subset_label

ROOT = Path(__file__).resolve().parents[2]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--N", type=int, default=4000, help="training sequences (default 4000)")
    ap.add_argument("--eval-N", type=int, default=4000, help="held-out sequences per evaluated L")
    ap.add_argument("--eval-seed", type=int, default=1000, help="seed of the held-out samples")
    ap.add_argument("--Ls", type=int, nargs="+", default=[25, 50, 100, 200, 400, 800, 1600])
    ap.add_argument("--run", default=str(ROOT / "runs" / "length_generalization"), help="training run folder")
    ap.add_argument("--out", default=str(ROOT / "figures" / "length_generalization.png"))
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    cfg = gflow.Config().replace(estimator={"N": args.N})
    run = Path(args.run)
    try:
        traj = gflow.load(run)
        if traj.status != "complete" or traj.config.to_dict() != cfg.to_dict():
            raise FileNotFoundError
        print(f"reusing the training run in {run}")
    except (FileNotFoundError, ValueError, KeyError):
        print(f"training the default staged flow at L = {cfg.data.L}, N = {args.N} -> {run}", flush=True)
        traj = gflow.integrate(cfg, out=run, overwrite=True)
    t1 = time.perf_counter()
    a_run = float(traj.a[-1])
    print(f"  trained: loss {traj.loss[-1]:.5f} ± {traj.loss_se[-1]:.2g}, a = {a_run:.4g} ({t1 - t0:.0f} s)")

    res = evaluate(
        traj, {"data.L": args.Ls, "estimator.N": [args.eval_N], "estimator.seed": [args.eval_seed]},
        out=run / "eval", plot=False, verbose=True,
    )  # fmt: skip
    t2 = time.perf_counter()
    print(res.table())
    L = np.array([r["data.L"] for r in res.rows], float)
    get = lambda k: (np.array([r[k] for r in res.rows]), np.array([r[f"{k}_se"] for r in res.rows]))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(16, 4.8))
    styles = {
        "oracle": ("oracle E H(π(·|z_q))", "0.4", ":"),
        "bayes": ("Bayes: Dirichlet posterior predictive", "tab:green", "--"),
        "gih": ("GIH on S at its own a*(L)", "tab:orange", "-."),
        "unigram": ("context unigram (GIH at a = 0)", "tab:purple", (0, (1, 1))),
    }
    for k, (lab, col, ls) in styles.items():
        m, s = get(k)
        ax[0].plot(L, m, ls=ls, color=col, label=lab)
        ax[0].fill_between(L, m - 2 * s, m + 2 * s, color=col, alpha=0.15, lw=0)
    m, s = get("loss")
    ax[0].errorbar(L, m, yerr=2 * s, fmt="o-", color="tab:blue", ms=4, capsize=2, label="trained TF(θ), held out")
    ax[0].plot([traj.config.data.L], [traj.loss[-1]], "k*", ms=10, label="training loss (in-sample)")
    ax[0].set_ylabel("loss  −Σ π(e|z_q) log(p_e + ε)")
    ax[0].set_title("loss against the context length", fontsize=10)

    for k, lab, col in (("flow_minus_bayes", "flow − Bayes", "tab:blue"), ("gih_minus_bayes", "GIH(a*) − Bayes",
                                                                            "tab:orange"),
                        ("flow_minus_gih", "flow − GIH(a*)", "tab:red")):  # fmt: skip
        m, s = get(k)
        ax[1].plot(L, m, "o-", color=col, ms=3, label=lab)
        ax[1].fill_between(L, m - 2 * s, m + 2 * s, color=col, alpha=0.2, lw=0)
    ax[1].axhline(0, color="k", lw=0.6)
    ax[1].set_ylabel("gap (paired ±2 SE)")
    ax[1].set_title("what the trained induction head leaves on the table", fontsize=10)

    a_star = np.array([r["a_gih"] for r in res.rows], float)
    ax[2].plot(L, a_star, "o-", color="tab:orange", label="GIH's loss-minimising a*(L)")
    ax[2].axhline(a_run, color="tab:blue", ls="--", label=f"the trained a = {a_run:.3g} (fixed)")
    ax[2].set_ylabel("a")
    ax[2].set_title("classifier scale: trained vs the GIH's optimum", fontsize=10)
    for x in ax:
        x.set_xscale("log")
        x.set_xticks(L)
        x.set_xticklabels([str(int(v)) for v in L])
        x.minorticks_off()
        x.set_xlabel("context length L (trained at L = 100)")
        x.grid(alpha=0.3)
        x.legend(fontsize=8)
    fig.suptitle(
        f"Length generalisation of the default staged flow (d = 3, parents (1,2), α = 0.1; trained at L = 100, "
        f"N = {args.N}; evaluated on {args.eval_N} held-out sequences per L; S = {subset_label(res.S)})",
        fontsize=10,
    )
    fig.tight_layout()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"figure {out}; training {t1 - t0:.0f} s, evaluation {t2 - t1:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
