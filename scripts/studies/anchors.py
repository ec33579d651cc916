"""The anchors' headline results as flows (docs/results/anchors.md): Edelman et al.'s in-context
Markov chains with their minimal model, and Nichani et al.'s in-context causal graphs with their
reduced model, each from its shipped configuration (scripts/configs/edelman.toml, nichani.toml).

    python3 scripts/studies/anchors.py --out runs/anchors            # everything (~10 min on 2 cores)
    python3 scripts/studies/anchors.py --out runs/anchors --only nichani

Edelman: on the run's own sample (the last position), the three strategies of their
``test_error.py`` with add-one counts (uniform; the context's unigram; the context's bigram of the
query token), their cross-entropies, and at every saved time the mean KL from each strategy's
prediction to the model's; a phase is a stretch of saved times where one strategy's KL is the
smallest and at most half the next one. Also the time layer 1's attention on offset 1 crosses 0.5,
and W's parts along I and 11ᵀ (W = α I + β 11ᵀ + rest). For the Dirichlet and the doubly
stochastic priors.

Nichani: the chain, icl and random graphs; at the end of Stage II (A⁽¹⁾ at the fixed a) the
attention of every non-root position on its parent (mean, min) and the time the mean crosses 0.5;
the loss against the Bayes rung of the sample; and at t = 0 whether every row's gradient on
A⁽¹⁾ is largest at the parent.

Runs are written in OUT/<name> and reused when complete (resumable: rerun the command); the
numbers go to OUT/anchors.json and a figure to OUT/anchors.png.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import gflow  # noqa: E402
from gflow.config import load_config  # noqa: E402
from gflow.core import graph_parents, make_loss, sample  # noqa: E402
from gflow.core._member_edelman import logits  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def run(cfg, out: Path):
    """The complete run of `cfg` in `out` (reused when it is there)."""
    try:
        traj = gflow.load(out)
        if traj.status == "complete" and traj.config == cfg:
            return traj
    except Exception:  # noqa: BLE001  (absent or unreadable: integrated again)
        pass
    return gflow.integrate(cfg, out=out, overwrite=True)


def strategies(X, d):
    """Uniform, unigram and bigram predictions of every sequence (add-one counts), ``(3, N, d)``."""
    X = np.asarray(X)
    N, L = X.shape
    E = np.eye(d)[X]
    uni = (E.sum(1) + 1) / (L + d)
    nxt = (X[:, :-1] == X[:, -1:])[:, :, None] * E[:, 1:]
    big = (nxt.sum(1) + 1) / (nxt.sum((1, 2))[:, None] + d)
    return np.stack([np.full((N, d), 1.0 / d), uni, big])


def edelman(out: Path, prior: str) -> dict:
    cfg = load_config(ROOT / "scripts" / "configs" / "edelman.toml")
    cfg = cfg.replace(data={"prior": prior})
    traj = run(cfg, out / f"edelman-{prior}")
    data, model, est = cfg.data, cfg.model, cfg.estimator
    smp = sample(data, est.N, key=jax.random.key(est.seed))
    cond = np.asarray(smp.cond)
    S = strategies(smp.X, data.d)
    ce = {k: float(-(cond * np.log(S[i])).sum(-1).mean()) for i, k in enumerate(("uniform", "unigram", "bigram"))}
    member = gflow.core.member_of(model)

    @jax.jit
    def predict(v, W):
        p = gflow.core.init_params(model, d=data.d, L=data.L).with_blocks({"v": v, "W": W})

        def one(x):
            return jax.nn.softmax(logits(W, member.positions_z(p, x, None, None, data.d), x, data.d))

        return jax.vmap(one)(smp.X)

    ts = np.asarray(traj.ts)
    kl, att1, Wparts = [], [], []
    d = data.d
    for i in range(len(ts)):
        st = traj.state(i)
        q = np.asarray(predict(jnp.asarray(st["v"]), jnp.asarray(st["W"])))
        kl.append([float((S[k] * np.log(S[k] / q)).sum(-1).mean()) for k in range(3)])
        att1.append(float(gflow.attention(traj, i)[0, -1, -2]))
        W = np.asarray(st["W"])
        off = (W.sum() - np.trace(W)) / (d * (d - 1))
        Wparts.append([float(np.trace(W) / d - off), float(off)])
    kl, att1, Wparts = np.array(kl), np.array(att1), np.array(Wparts)
    names = ("uniform", "unigram", "bigram")
    phases = []
    for i in range(len(ts)):
        order = np.argsort(kl[i])
        best = names[order[0]] if kl[i, order[0]] <= 0.5 * kl[i, order[1]] else None
        if best and (not phases or phases[-1][0] != best):
            phases.append([best, float(ts[i]), float(ts[i])])
        elif best:
            phases[-1][2] = float(ts[i])
    cross = float(ts[np.argmax(att1 >= 0.5)]) if np.any(att1 >= 0.5) else None
    # layer 2 before layer 1: the time W's I part reaches half its final value, against the crossing
    half_I = float(ts[np.argmax(Wparts[:, 0] >= 0.5 * Wparts[-1, 0])])
    plateau = [p for p in phases if p[0] == "unigram"]
    loss = np.asarray(traj.loss)
    res = {
        "prior": prior, "strategy_ce": ce, "phases": phases, "offset1_crosses_half_at": cross,
        "W_identity_part_half_at": half_I, "loss_start": float(loss[0]), "loss_end": float(loss[-1]),
        "kl_end": dict(zip(names, kl[-1].tolist())), "W_parts_end": {"I": Wparts[-1, 0], "11T": Wparts[-1, 1]},
        "attention_offset1_end": float(att1[-1]),
    }  # fmt: skip
    if plateau:
        a, b = plateau[0][1], plateau[0][2]
        sel = (ts >= a) & (ts <= b)
        res["plateau_loss"] = [float(loss[sel].min()), float(loss[sel].max())]
    res["_curves"] = {"t": ts.tolist(), "kl": kl.tolist(), "loss": loss.tolist(), "att1": att1.tolist()}
    return res


def nichani(out: Path, graph: str) -> dict:
    cfg = load_config(ROOT / "scripts" / "configs" / "nichani.toml")
    cfg = cfg.replace(data={"graph": graph})
    traj = run(cfg, out / f"nichani-{graph}")
    par = graph_parents(cfg.data)
    kids = np.flatnonzero(par > 0)  # 0-based index of every non-root position
    ts = np.asarray(traj.ts)
    onpar = []
    for i in range(len(ts)):
        s = gflow.attention(traj, i)[0]
        onpar.append(s[kids, par[kids] - 1])
    onpar = np.array(onpar)
    II = next(r for r in traj.stages if r.name == "II")
    iend = int(np.searchsorted(ts, II.t1, side="right")) - 1
    mean = onpar.mean(1)
    cross = float(ts[np.argmax(mean >= 0.5)]) if np.any(mean >= 0.5) else None
    # the gradient at t = 0: every row's largest −∂L̂/∂A⁽¹⁾[i, j<i] at the parent j = p(i)?
    loss = make_loss(cfg.data, cfg.model, cfg.estimator)
    p0 = gflow.core.init_params(cfg.model, cfg.init, d=cfg.data.d, L=cfg.data.L)
    g = -np.asarray(jax.grad(lambda q: loss(q))(p0).get("A1"))[0]
    at_parent = [bool(np.argmax(g[i, :i]) == par[i] - 1) for i in kids if i >= 1]
    # the order of every row's gradient against the χ²-MI between x_i and x_j (pairs of earlier
    # positions with different informations: the fraction ordered alike)
    mi = gflow.graph_chi2_mi(cfg.data, n_pi=500)
    agree = total = 0
    for i in range(1, cfg.data.L - 1):
        for j in range(i):
            for k in range(j + 1, i):
                if abs(mi[i, j] - mi[i, k]) > 1e-9:
                    total += 1
                    agree += (mi[i, j] > mi[i, k]) == (g[i, j] > g[i, k])
    lad = gflow.loss_ladder(loss, cfg.data, S=(1,), params=gflow.core.Params.from_blocks(
        {b: jnp.asarray(v) for b, v in traj.state(-1).items()}), estimator=cfg.estimator)  # fmt: skip
    return {
        "graph": graph, "parents": par.tolist(),
        "attention_on_parent_end_of_II": {"mean": float(onpar[iend].mean()), "min": float(onpar[iend].min())},
        "mean_crosses_half_at": cross, "grad_argmax_at_parent_at_t0": f"{sum(at_parent)}/{len(at_parent)}",
        "grad_order_as_chi2_mi_at_t0": f"{agree}/{total}",
        "loss_start": float(traj.loss[0]), "loss_end": float(traj.loss[-1]),
        "bayes": float(lad.values["bayes"].mean()), "oracle": float(lad.values["oracle"].mean()),
        "flow_minus_bayes": lad.gap("flow", "bayes"),
    }  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/anchors")
    ap.add_argument("--only", choices=("edelman", "nichani"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {}
    if args.only in (None, "nichani"):
        res["nichani"] = [nichani(out, g) for g in ("chain", "icl", "random")]
        for r in res["nichani"]:
            print(json.dumps(r))
    if args.only in (None, "edelman"):
        res["edelman"] = [edelman(out, p) for p in ("dirichlet", "doubly_stochastic")]
        for r in res["edelman"]:
            print(json.dumps({k: v for k, v in r.items() if k != "_curves"}))
    (out / "anchors.json").write_text(json.dumps(res, indent=1, default=float))
    if "edelman" in res:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
        for ax, r in zip(axes, res["edelman"]):
            c = r["_curves"]
            t = np.maximum(np.asarray(c["t"]), 1e-3)
            for k, name in enumerate(("uniform", "unigram", "bigram")):
                ax.loglog(t, np.maximum(np.asarray(c["kl"])[:, k], 1e-6), label=f"KL({name} ‖ model)")
            ax.set_xlabel("flow time t")
            ax.set_title(f"Edelman, prior = {r['prior']}")
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "anchors.png", dpi=110)
        print(f"figure: {out / 'anchors.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
