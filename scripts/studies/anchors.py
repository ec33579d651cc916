"""The anchors' headline results as flows (docs/results/anchors.md): Edelman et al.'s in-context
Markov chains with their minimal model, and Nichani et al.'s in-context causal graphs with their
reduced model, each from its shipped configuration (scripts/configs/edelman.toml, nichani.toml).

    python3 scripts/studies/anchors.py --out runs/anchors            # everything (~10 min on 2 cores)
    python3 scripts/studies/anchors.py --out runs/anchors --only nichani

Edelman (the loss at every position, L = 100): on the run's own sample, the three strategies of
their ``test_error.py`` with add-one counts (uniform; the context's unigram; the current token's
successors) as ladder rungs, and at every saved time the mean KL from each strategy's prediction
to the model's (``gflow.strategies``); a phase is a stretch of saved times where one strategy's
KL is the smallest and at most half the next one. Also the time layer 1's attention on offset 1
crosses 0.5, and W's parts along I and 11ᵀ (W = α I + β 11ᵀ + rest). For the Dirichlet and the
doubly stochastic priors, and trigram data (parents 1, 2).

Cross-runs: the paper's model on Nichani's chain graph and on Edelman's chains, Nichani's model
on the n-gram mixture (``cross``).

Nichani: the chain, icl and random graphs; at the end of Stage II (A⁽¹⁾ at the fixed a) the
attention of every non-root position on its parent (mean, min) and the time the mean crosses 0.5;
the loss against the Bayes rung of the sample; and at t = 0 whether every row's gradient on
A⁽¹⁾ is largest at the parent.

Nichani, k parents (``dag``, scripts/configs/nichani_dag.toml: their notebook's heap graph, and
the 2-parent chain): the two-head reduced model's attention of each head on each parent (mean
over the non-root positions at the end of Stage II), head 2's query row on the target's second
parent, and the loss against the exact Bayes rung and against their "one NN" baseline (the
add-α predictive from the nearest parent alone).

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

from _study import reuse_run  # noqa: E402

import gflow  # noqa: E402
from gflow.config import load_config  # noqa: E402
from gflow.core import graph_parent_sets, graph_parents, make_loss, sample  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def run(cfg, out: Path):
    """The complete run of `cfg` in `out` (reused when it is there)."""
    return reuse_run(cfg, out)


def edelman(out: Path, prior: str, parents=(1,)) -> dict:
    cfg = load_config(ROOT / "scripts" / "configs" / "edelman.toml")
    cfg = cfg.replace(data={"prior": prior, "parents": list(parents)})
    name = f"edelman-{prior}" + ("" if tuple(parents) == (1,) else "-" + "".join(map(str, parents)))
    traj = run(cfg, out / name)
    data, est = cfg.data, cfg.estimator
    loss = make_loss(data, cfg.model, est)
    theta = gflow.core.Params.from_blocks({b: jnp.asarray(v) for b, v in traj.state(-1).items()})
    lad = gflow.loss_ladder(loss, data, S=(), params=theta, estimator=est)
    ce = {k: lad.mean(r) for k, r in zip(("uniform", "unigram", "bigram"), ("uniform", "unigram+1", "bigram+1"))}
    st = gflow.strategies(traj)
    ts = np.asarray(traj.ts)
    kl = np.stack([st[f"kl_{k}"] for k in ("uniform", "unigram", "bigram")], -1)
    att1, Wparts = [], []
    d = data.d
    for i in range(len(ts)):
        att1.append(float(gflow.attention(traj, i)[0, -1, -2]))
        W = np.asarray(traj.state(i)["W"])
        off = (W.sum() - np.trace(W)) / (d * (d - 1))
        Wparts.append([float(np.trace(W) / d - off), float(off)])
    att1, Wparts = np.array(att1), np.array(Wparts)
    phases = [list(p) for p in st["phases"]]
    cross = float(ts[np.argmax(att1 >= 0.5)]) if np.any(att1 >= 0.5) else None
    # layer 2 before layer 1: the time W's I part reaches half its final value, against the crossing
    half_I = float(ts[np.argmax(Wparts[:, 0] >= 0.5 * Wparts[-1, 0])])
    plateau = [p for p in phases if p[0] == "unigram"]
    L = np.asarray(traj.loss)
    res = {
        "prior": prior, "parents": list(parents), "positions": est.positions, "L": data.L, "N": est.N,
        "strategy_ce": ce, "bayes": lad.mean("bayes"), "phases": phases, "offset1_crosses_half_at": cross,
        "W_identity_part_half_at": half_I, "loss_start": float(L[0]), "loss_end": float(L[-1]),
        "kl_end": dict(zip(("uniform", "unigram", "bigram"), kl[-1].tolist())),
        "W_parts_end": {"I": Wparts[-1, 0], "11T": Wparts[-1, 1]}, "attention_offset1_end": float(att1[-1]),
        "wall_s": float(traj.wall),
    }  # fmt: skip
    if plateau:
        a, b = plateau[0][1], plateau[0][2]
        sel = (ts >= a) & (ts <= b)
        res["plateau_loss"] = [float(L[sel].min()), float(L[sel].max())]
    res["_curves"] = {"t": ts.tolist(), "kl": kl.tolist(), "loss": L.tolist(), "att1": att1.tolist()}
    return res


def cross(out: Path) -> list[dict]:
    """Each model on another work's data: the paper's model (and its selector) on Nichani's chain
    graph and on Edelman's chains (at the last position: the paper's model predicts there only),
    Nichani's model on the n-gram mixture; the loss against the Bayes rung and Edelman's
    strategies, the phases, the attention on offset 1 (the target's parent in every case)."""
    nich = load_config(ROOT / "scripts" / "configs" / "nichani.toml")
    edel = load_config(ROOT / "scripts" / "configs" / "edelman.toml")
    paper = gflow.Config()
    cases = {
        "paper model on Nichani's chain graph": paper.replace(data=_section(nich.data), estimator={"N": 1000}),
        "paper model on Edelman's chains": paper.replace(data=_section(edel.data), estimator={"N": 2000}),
        "Nichani's model on the n-gram mixture": nich.replace(data={"kind": "ngram", "graph": "chain"}),
    }  # fmt: skip
    res = []
    for name, cfg in cases.items():
        traj = run(cfg, out / ("cross-" + name.split()[0].lower() + "-" + name.split()[-1].lower()))
        loss = make_loss(cfg.data, cfg.model, cfg.estimator)
        theta = gflow.core.Params.from_blocks({b: jnp.asarray(v) for b, v in traj.state(-1).items()})
        lad = gflow.loss_ladder(loss, cfg.data, S=(1,), params=theta, estimator=cfg.estimator)
        st = gflow.strategies(traj)
        A = gflow.attention(traj)
        sel = gflow.trajectory.selected_set(traj)
        res.append({
            "case": name, "member": cfg.model.member, "data_kind": cfg.data.kind, "L": cfg.data.L,
            "selected": None if sel is None else list(sel),
            # Nichani's model: every context position on its predecessor (the query's own row is unused);
            # the others: the query on offset 1 (the best head)
            "attention_offset1_end": float(np.mean([A[0, i, i - 1] for i in range(1, cfg.data.L - 1)])
                                           if cfg.model.member == "nichani" else np.max(A[:, -1, -2])),
            "loss_start": float(traj.loss[0]),
            "loss_end": float(traj.loss[-1]), "bayes": lad.mean("bayes"), "bigram+1": lad.mean("bigram+1"),
            "unigram+1": lad.mean("unigram+1"), "flow_minus_bayes": lad.gap("flow", "bayes"),
            "phases": [list(p) for p in st["phases"]], "wall_s": float(traj.wall),
        })  # fmt: skip
    return res


def _section(sec) -> dict:
    import dataclasses

    return {f.name: getattr(sec, f.name) for f in dataclasses.fields(sec)}


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


def dag(out: Path, graph: str) -> dict:
    cfg = load_config(ROOT / "scripts" / "configs" / "nichani_dag.toml")
    if graph == "chain":
        cfg = cfg.replace(data={"graph": "chain", "parents": [1, 2]})
    traj = run(cfg, out / f"nichani-dag-{graph}")
    data, L = cfg.data, cfg.data.L
    ps = graph_parent_sets(data)
    kids = np.flatnonzero(ps[:L, 0] > 0)  # 0-based index of every non-root context position
    II = next(r for r in traj.stages if r.name == "II")
    ts = np.asarray(traj.ts)
    s = gflow.attention(traj, int(np.searchsorted(ts, II.t1, side="right")) - 1)
    on = [[float(np.mean(s[h, kids, ps[kids, r] - 1])) for r in range(2)] for h in range(2)]
    # the loss against the exact Bayes rung and their "one NN": the add-α predictive counting the
    # positions whose nearest parent's token is the target's nearest parent's
    smp = sample(data, cfg.estimator.N, key=jax.random.key(cfg.estimator.seed))
    X, cond = np.asarray(smp.X), np.asarray(smp.cond)
    onehot = np.eye(data.d)[X]
    near = (X[:, ps[kids, 0] - 1] == X[:, [ps[-1, 0] - 1]])  # (N, #kids)
    n1 = np.einsum("nk,nkd->nd", near, onehot[:, kids])
    one_nn = (n1 + data.alpha) / (n1.sum(1, keepdims=True) + data.d * data.alpha)
    loss = make_loss(cfg.data, cfg.model, cfg.estimator)
    lad = gflow.loss_ladder(loss, cfg.data, S=(1, 2), params=gflow.core.Params.from_blocks(
        {b: jnp.asarray(v) for b, v in traj.state(-1).items()}), estimator=cfg.estimator)  # fmt: skip
    return {
        "graph": graph, "parents_of_target": ps[-1].tolist(), "data.parents": list(data.parents),
        "head_on_parent_end_of_II": {f"head {h + 1}": {f"parent {r + 1}": on[h][r] for r in range(2)} for h in range(2)},
        "head2_query_row_on_target_parent2": float(s[1, L - 1, ps[-1, 1] - 1]),
        "loss_start": float(traj.loss[0]), "loss_end": float(traj.loss[-1]),
        "bayes": float(lad.values["bayes"].mean()), "bayes_exact": bool(gflow.core.kind_of(data).bayes_exact(data)),
        "one_nn": float(np.mean(-np.sum(cond * np.log(one_nn), axis=1))),
        "flow_minus_bayes": lad.gap("flow", "bayes"),
    }  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/anchors")
    ap.add_argument("--only", choices=("edelman", "nichani", "dag", "cross"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {}
    if args.only in (None, "nichani"):
        res["nichani"] = [nichani(out, g) for g in ("chain", "icl", "random")]
        for r in res["nichani"]:
            print(json.dumps(r))
    if args.only in (None, "dag"):
        res["dag"] = [dag(out, g) for g in ("heap", "chain")]
        for r in res["dag"]:
            print(json.dumps(r))
    if args.only in (None, "edelman"):
        res["edelman"] = [edelman(out, p) for p in ("dirichlet", "doubly_stochastic")]
        res["edelman"].append(edelman(out, "dirichlet", parents=(1, 2)))  # trigram data
        for r in res["edelman"]:
            print(json.dumps({k: v for k, v in r.items() if k != "_curves"}))
    if args.only in (None, "cross"):
        res["cross"] = cross(out)
        for r in res["cross"]:
            print(json.dumps(r))
    (out / "anchors.json").write_text(json.dumps(res, indent=1, default=float))
    if "edelman" in res:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 3, figsize=(14, 3.6))
        for ax, r in zip(axes, res["edelman"]):
            c = r["_curves"]
            t = np.maximum(np.asarray(c["t"]), 1e-3)
            for k, name in enumerate(("uniform", "unigram", "bigram")):
                ax.loglog(t, np.maximum(np.asarray(c["kl"])[:, k], 1e-6), label=f"KL({name} ‖ model)")
            ax.set_xlabel("flow time t")
            ax.set_title(f"Edelman, prior = {r['prior']}, parents {tuple(r['parents'])}", fontsize=9)
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "anchors.png", dpi=110)
        print(f"figure: {out / 'anchors.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
