"""Four theories of the induction head measured side by side (docs/results/comparison.md): Bietti et
al.'s headline on their triggers as a flow, each work's model on the others' data, and the n-gram
hurdle (which model learns the conjunction of two parents).

    python3 scripts/studies/comparison.py --out runs/comparison            # everything (~15 min on 2 cores)
    python3 scripts/studies/comparison.py --out runs/comparison --only bietti
    python3 scripts/studies/comparison.py --render figures/comparison.json  # the page's tables

``bietti``: the shipped ``scripts/configs/bietti.toml`` (d = 8, one fixed trigger, T = 64, the
loss at every position, a small random start) and its variants: the zero start, one layer (layer 1
frozen uniform: ``schedule.eta_w = 0``), d = 10 with two triggers, the loss at the trigger outputs
only (their ``loss_head_only``). Per run: Bietti et al.'s probes (``gflow.probes``) and the first
time each reaches 0.5, the first time the non-trigger loss is within 0.05 of the bigram's entropy
rate and the first time the trigger-output loss is half way down, the losses at the end against
the Bayes rung; for the zero start, the slopes of log‖Δ‖ against log t of each block over the
first saved times (t < 0.05).

``cross``: Bietti's model on Edelman's chains (every position) and on Nichani's chain graph (the
last position, the graph's task), Edelman's model on the triggers (every position), the paper's
and Nichani's on the triggers (the last position, where they predict). Per run: the loss against
the Bayes rung, Edelman's strategies' phases, the attention on offset 1, and on the triggers the
trigger-output loss at the end.

Edelman's and Bietti's members with the loss at the last position run to t = 2·10⁴ (``LAST_T1``),
ten times their shipped t₁: one position carries about 1/L of the every-position loss's signal.

``hurdle``: the n-gram mixture with parents (1, 2) (d = 3, α = 0.1, L = 20, N = 1000, the loss at
the last position) and each of the four models: the loss at the end against the GIH limit of the
true parents, inf_a L_GIH({1, 2}), and of the best single parent, min over S = {1}, {2} (the GIH
rungs of the paper's loss ladder on the same sample), and Bayes.

Runs are written in OUT/<name> and reused when complete (resumable: rerun the command); the numbers
go to OUT/comparison.json (committed as figures/comparison.json) and a figure to OUT/comparison.png.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

from _study import reuse_run  # noqa: E402

import gflow  # noqa: E402
from gflow.config import load_config  # noqa: E402
from gflow.core import Params, make_loss  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "scripts" / "configs"
#: the slopes' window of the zero start (saved times t < ZERO_WINDOW)
ZERO_WINDOW = 0.05
#: a model learns the conjunction of the parents when its loss is below the best single parent's
#: GIH limit by more than this many paired standard errors
K_SE = 3.0
#: the flow time of Edelman's and Bietti's members when their loss is at the last position only: one
#: position carries about 1/L of the every-position loss's signal, so they run ten times longer than
#: their shipped t1 = 2000 (their losses change by less than 10⁻³ over the last decade of t)
LAST_T1 = 2.0e4


def run(cfg, out: Path):
    """The complete run of `cfg` in `out` (reused when it is there)."""
    return reuse_run(cfg, out)


def _theta(traj, i=-1):
    return Params.from_blocks({b: jnp.asarray(v) for b, v in traj.state(i).items()})


def _first(t, x, *, below=None, above=None):
    x = np.asarray(x, np.float64)
    hit = x <= below if below is not None else x >= above
    return float(np.asarray(t)[np.argmax(hit)]) if hit.any() else None


def _section(sec) -> dict:
    return {f.name: getattr(sec, f.name) for f in dataclasses.fields(sec)}


# -- Bietti et al.'s headline ------------------------------------------------------------------
BIETTI_VARIANTS = {
    "random start": {},
    "zero start": {"model": {"random_init": 0.0}},
    "one layer": {"schedule": {"eta_w": 0.0}},
    "d = 10, two triggers": {"data": {"d": 10, "triggers": 2}},
    "outputs loss": {"estimator": {"positions": "outputs"}},
}


def bietti(out: Path, name: str) -> dict:
    base = load_config(CONFIGS / "bietti.toml")
    cfg = base.replace(**BIETTI_VARIANTS[name])
    traj = run(cfg, out / ("bietti-" + name.replace(" ", "-").replace(",", "").replace("=", "")))
    p = gflow.probes(traj)
    t = p["t"]
    loss = make_loss(cfg.data, cfg.model, cfg.estimator)
    lad = gflow.loss_ladder(loss, cfg.data, S=(1,), params=_theta(traj), estimator=cfg.estimator)
    lo, lr, H = p["loss_outputs"], p["loss_rest"], p["entropy_rest"]
    res = {
        "case": name, "d": cfg.data.d, "K": cfg.data.triggers, "L": cfg.data.L, "N": cfg.estimator.N,
        "positions": cfg.estimator.positions, "random_init": cfg.model.random_init, "eta_w": cfg.schedule.eta_w,
        "cross_half": {k: _first(t, p[k], above=0.5) for k in ("probe_wo2", "probe_wk2", "probe_wk1")},
        "probes_end": {k: float(p[k][-1]) for k in ("probe_wo2", "probe_wk2", "probe_wk1")},
        "t_bigram": _first(t, lr, below=H + 0.05),
        "t_head": _first(t, lo, below=(lo[0] + lo[-1]) / 2) if lo[0] - lo[-1] > 0.05 else None,
        "loss_outputs": [float(lo[0]), float(lo[-1])], "loss_rest": [float(lr[0]), float(lr[-1])],
        "loss_rest_min": float(lr.min()), "entropy_rest": float(H),
        "loss_end": lad.mean("flow"), "bayes": lad.mean("bayes"), "flow_minus_bayes": lad.gap("flow", "bayes"),
        "wall_s": float(traj.wall), "t1": float(traj.ts[-1]),
    }  # fmt: skip
    if name == "zero start":
        ts = np.asarray(traj.ts)
        keep = (ts > 0) & (ts < ZERO_WINDOW)
        res["slopes"] = {}
        for b in ("WO", "WF", "WK", "v"):
            x = np.asarray(traj.x[b])
            n = np.sqrt(((x - x[0]) ** 2).reshape(len(ts), -1).sum(-1))
            res["slopes"][b] = float(np.polyfit(np.log(ts[keep]), np.log(n[keep]), 1)[0])
        res["slope_window"] = [float(ts[keep][0]), float(ts[keep][-1])]
    res["_curves"] = {"t": t.tolist(), **{k: np.asarray(p[k]).tolist() for k in
                                           ("probe_wo2", "probe_wk2", "probe_wk1", "loss_outputs", "loss_rest")}}  # fmt: skip
    return res


# -- each model on the others' data ------------------------------------------------------------
def cross_cases() -> dict:
    edel = load_config(CONFIGS / "edelman.toml")
    nich = load_config(CONFIGS / "nichani.toml")
    biet = load_config(CONFIGS / "bietti.toml")
    last = {"positions": "last"}
    return {
        "Bietti's model on Edelman's chains": biet.replace(data=_section(edel.data)),
        "Bietti's model on Nichani's chain graph": biet.replace(
            data=_section(nich.data), estimator={**last, "N": nich.estimator.N}, schedule={"t1": LAST_T1}),
        "Edelman's model on Bietti's triggers": edel.replace(data=_section(biet.data)),
        "the paper's model on Bietti's triggers": gflow.Config().replace(
            data=_section(biet.data), estimator={"N": biet.estimator.N}),
        "Nichani's model on Bietti's triggers": nich.replace(data=_section(biet.data), estimator={"N": biet.estimator.N}),
    }  # fmt: skip


def cross(out: Path, name: str) -> dict:
    cfg = cross_cases()[name]
    slug = "cross-" + "-".join(w.strip("'s").lower() for w in name.split()[:1] + name.split()[-2:])
    traj = run(cfg, out / slug)
    loss = make_loss(cfg.data, cfg.model, cfg.estimator)
    lad = gflow.loss_ladder(loss, cfg.data, S=(1,), params=_theta(traj), estimator=cfg.estimator)
    st = gflow.strategies(traj)
    A = gflow.attention(traj)
    L = cfg.data.L
    if cfg.model.member == "paper":  # the query on offset 1, the best head
        att1 = float(np.max(A[:, -1, -2]))
    else:  # every position on its predecessor
        att1 = float(np.mean([A[0, i, i - 1] for i in range(1, L - (1 if cfg.data.kind == "graph" else 0))]))
    sel = gflow.trajectory.selected_set(traj)
    res = {
        "case": name, "member": cfg.model.member, "data_kind": cfg.data.kind, "positions": cfg.estimator.positions,
        "selected": None if sel is None else list(sel), "attention_offset1_end": att1,
        "loss_start": float(traj.loss[0]), "loss_end": float(traj.loss[-1]), "bayes": lad.mean("bayes"),
        "flow_minus_bayes": lad.gap("flow", "bayes"), "bigram+1": lad.mean("bigram+1"),
        "phases": [list(p) for p in st["phases"]], "wall_s": float(traj.wall),
    }  # fmt: skip
    if cfg.data.kind == "triggers":
        p = gflow.probes(traj)
        res["loss_outputs"] = [float(p["loss_outputs"][0]), float(p["loss_outputs"][-1])]
    return res


# -- the n-gram hurdle -------------------------------------------------------------------------
HURDLE_DATA = {"d": 3, "parents": [1, 2], "alpha": 0.1, "L": 20}


def hurdle_cases() -> dict:
    edel = load_config(CONFIGS / "edelman.toml")
    nich = load_config(CONFIGS / "nichani.toml")
    biet = load_config(CONFIGS / "bietti.toml")
    est = {"N": 1000, "positions": "last"}
    ngram = {**_section(gflow.Config().data), **HURDLE_DATA}
    return {
        "the paper's": gflow.Config().replace(data=ngram, estimator={"N": 1000}),
        "Nichani's": nich.replace(data={**ngram, "graph": "chain"}, estimator={"N": 1000}),
        "Edelman's": edel.replace(data=ngram, estimator=est, schedule={"t1": LAST_T1}),
        "Bietti's": biet.replace(data={**ngram, "triggers": 0}, estimator=est, schedule={"t1": LAST_T1}),
    }


def hurdle(out: Path, name: str, rungs: dict) -> dict:
    cfg = hurdle_cases()[name]
    traj = run(cfg, out / ("hurdle-" + name.split("'")[0].lower().replace("the paper", "paper")))
    loss = make_loss(cfg.data, cfg.model, cfg.estimator)
    lad = gflow.loss_ladder(loss, cfg.data, S=(1,), params=_theta(traj), estimator=cfg.estimator)
    flow = np.asarray(lad.values["flow"])
    best1 = min(("{1}", "{2}"), key=lambda s: float(np.mean(rungs[s])))
    gap = flow - rungs[best1]
    se = float(np.std(gap, ddof=1) / math.sqrt(len(gap)))
    sel = gflow.trajectory.selected_set(traj)
    return {
        "case": name, "member": cfg.model.member, "selected": None if sel is None else list(sel),
        "loss_end": float(flow.mean()), "gih_12": float(np.mean(rungs["{1,2}"])), "best_single": best1,
        "gih_best_single": float(np.mean(rungs[best1])), "minus_best_single": [float(gap.mean()), se],
        "bayes": lad.mean("bayes"), "conjunction": bool(gap.mean() < -K_SE * se), "wall_s": float(traj.wall),
    }  # fmt: skip


def hurdle_rungs() -> dict:
    """The GIH rungs inf_a L_GIH(S) per sequence for S = {1, 2}, {1}, {2} on the hurdle's sample
    (the paper's loss ladder: the GIH is a property of the sample alone)."""
    cfg = hurdle_cases()["the paper's"]
    loss = make_loss(cfg.data, cfg.model, cfg.estimator)
    out = {}
    for S in ((1, 2), (1,), (2,)):
        lad = gflow.loss_ladder(loss, cfg.data, S=S, estimator=cfg.estimator)
        out["{" + ",".join(map(str, S)) + "}"] = np.asarray(lad.values["gih"])
    return out


# -- the page's tables -------------------------------------------------------------------------
def _t(x) -> str:
    return "not reached" if x is None else f"{x:.3g}"


def render_tables(res: dict) -> str:
    """The tables of docs/results/comparison.md from the study's json."""
    out = []
    if res.get("bietti"):
        out += ["| run | W_O2 probe ≥ 0.5 | W_K2 probe ≥ 0.5 | layer 1 ≥ 0.5 | bigram learned | output loss half way "
                "| output loss start → end | non-trigger loss end (entropy rate) | flow − Bayes |",
                "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        for r in res["bietti"]:
            c = r["cross_half"]
            fb = r["flow_minus_bayes"]
            out.append(f"| {r['case']} | {_t(c['probe_wo2'])} | {_t(c['probe_wk2'])} | {_t(c['probe_wk1'])} | "
                       f"{_t(r['t_bigram'])} | {_t(r['t_head'])} | {r['loss_outputs'][0]:.3f} → {r['loss_outputs'][1]:.3f} | "
                       f"{r['loss_rest'][1]:.3f} ({r['entropy_rest']:.3f}) | {fb[0]:.3f} ± {fb[1]:.3f} |")  # fmt: skip
        z = next((r for r in res["bietti"] if "slopes" in r), None)
        if z is not None:
            out += ["", "| block | slope of log‖Δ‖ against log t from zero | forced |", "| --- | --- | --- |"]
            want = {"WO": "1 (gradient ≠ 0 at t = 0)", "WF": "1 (gradient ≠ 0 at t = 0)",
                    "WK": "2 (gradient ∝ W_O2)", "v": "4 (gradient ∝ W_K2·W_O2)"}  # fmt: skip
            for b in ("WO", "WF", "WK", "v"):
                out.append(f"| {b} | {z['slopes'][b]:.4f} | {want[b]} |")
    if res.get("cross"):
        out += ["", "| model on data | positions | attention on offset 1 | loss start → end | Bayes | flow − Bayes | "
                "trigger outputs' loss start → end | phases |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        for r in res["cross"]:
            lo = r.get("loss_outputs")
            ph = ", ".join(f"{k} [{a:.3g}, {b:.3g}]" for k, a, b in r["phases"]) or "none by a factor 2"
            fb = r["flow_minus_bayes"]
            out.append(f"| {r['case']} | {r['positions']} | {r['attention_offset1_end']:.2f} | {r['loss_start']:.3f} → "
                       f"{r['loss_end']:.3f} | {r['bayes']:.3f} | {fb[0]:.3f} ± {fb[1]:.3f} | "
                       f"{'—' if lo is None else f'{lo[0]:.3f} → {lo[1]:.3f}'} | {ph} |")  # fmt: skip
    if res.get("hurdle"):
        out += ["", "| model | selected | loss at the end | GIH limit of {1,2} | best single parent (its GIH limit) | "
                "loss − best single parent | Bayes | the conjunction learned |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        for r in res["hurdle"]:
            m, s = r["minus_best_single"]
            sel = "—" if r["selected"] is None else "{" + ",".join(map(str, r["selected"])) + "}"
            out.append(f"| {r['case']} | {sel} | {r['loss_end']:.4f} | {r['gih_12']:.4f} | {r['best_single']} "
                       f"({r['gih_best_single']:.4f}) | {m:+.4f} ± {s:.4f} | {r['bayes']:.4f} | "
                       f"{'yes' if r['conjunction'] else 'no'} |")  # fmt: skip
    return "\n".join(out) + "\n"


def figure(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in res.get("bietti", []) if r["case"] in ("random start", "zero start", "outputs loss", "one layer")]
    fig, axes = plt.subplots(1, len(runs), figsize=(4.2 * len(runs), 3.6), squeeze=False)
    for ax, r in zip(axes[0], runs):
        c = r["_curves"]
        t = np.maximum(np.asarray(c["t"]), 1e-3)
        for k, lab in (("probe_wo2", "W_O2 probe"), ("probe_wk2", "W_K2 probe"), ("probe_wk1", "layer 1 on offset 1")):
            ax.plot(t, c[k], label=lab)
        ax2 = ax.twinx()
        ax2.plot(t, c["loss_outputs"], "k--", lw=1, label="loss at outputs")
        ax2.plot(t, c["loss_rest"], "k:", lw=1, label="loss elsewhere")
        ax2.set_ylabel("loss")
        ax.set_xscale("log")
        ax.set_xlabel("flow time t")
        ax.set_title(r["case"])
        ax.set_ylim(-0.05, 1.05)
    axes[0][0].legend(loc="center left", fontsize=7)
    ax2.legend(loc="center right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/comparison"))
    ap.add_argument("--only", choices=("bietti", "cross", "hurdle"))
    ap.add_argument("--render", type=Path, help="print the page's tables from this json and stop")
    args = ap.parse_args(argv)
    if args.render is not None:
        print(render_tables(json.loads(args.render.read_text())), end="")
        return 0
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    path = out / "comparison.json"
    res = json.loads(path.read_text()) if path.exists() else {}
    if args.only in (None, "bietti"):
        res["bietti"] = [bietti(out, n) for n in BIETTI_VARIANTS]
        for r in res["bietti"]:
            print(json.dumps({k: v for k, v in r.items() if k != "_curves"}))
        path.write_text(json.dumps(res, indent=1))
    if args.only in (None, "cross"):
        res["cross"] = [cross(out, n) for n in cross_cases()]
        for r in res["cross"]:
            print(json.dumps(r))
        path.write_text(json.dumps(res, indent=1))
    if args.only in (None, "hurdle"):
        rungs = hurdle_rungs()
        res["hurdle"] = [hurdle(out, n, rungs) for n in hurdle_cases()]
        for r in res["hurdle"]:
            print(json.dumps(r))
        path.write_text(json.dumps(res, indent=1))
    if res.get("bietti"):
        figure(res, out / "comparison.png")
        print(f"figure: {out / 'comparison.png'}")
    print(render_tables(res), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
