"""How accurate the shipped Euler step is on the official Full model, where its field switches
(docs/results/official-full.md, "The integration's error"): the w₊ = 3 run of
``scripts/configs/official_full.toml`` to ``--t-from`` (default 8.2, where head 2's second-layer
inner products start to cross 0 by the hundred), then the same window of flow time (``--window``,
default 0.5) from that one state by

- explicit Euler at the shipped step η = 5·10⁻³ divided by each of ``--divisors`` (default
  1, 2, 4, 10, 100): the observed order ``log2(e(η)/e(η/2))`` and each step's error against η/100
  (Euler's own error at η/100 is estimated from the order: a hundredth of η's);
- diffrax's adaptive Heun (``solver.method = "heun"``, Euler's step its error estimate) at each of
  ``--heun`` (relative tolerances; absolute 10⁻³ of it), its steps, rejections and wall time;

at every 0.05 of the window: a, the selector's {1,2} share and each head's ``‖W_OV,h P⊥‖_F`` (the
part of its value matrix the LayerNorm keeps: head 3's is the dead head's). Writes
``figures/official_full_order.json`` and prints the page's table. Resumable (each run in its
folder under ``--out``). About 20 minutes on 2 cores (η/100: 10,000 steps of 0.07 s).

Usage::

    python3 scripts/studies/official_full_order.py --out runs/official_full_order
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np

import gflow
from gflow.core import Params, make_loss

sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "scripts" / "configs" / "official_full.toml"
EVERY = 0.05  # the window's saved times (a multiple of every Euler step compared)


def window_run(base: gflow.Config, p0: Params, folder: Path, window: float, loss, **solver) -> dict:
    """One run of the window from `p0` (``solver``: the solver section's keys), its rows at the
    window's saved times, wall time and counts (the wall of a run loaded from its folder is the
    stored one)."""
    from _study import reuse_run
    from official_full import value_norms  # (on use: the tests hold another module of that name)

    times = [round(EVERY * k, 10) for k in range(1, int(round(window / EVERY)) + 1)]
    cfg = base.replace(schedule={"t1": window}, solver={"tau_min": EVERY, "save_per_decade": 1, "save_times": times,
                                                        **solver})  # fmt: skip
    t0 = time.perf_counter()
    tr = reuse_run(cfg, folder, params0=p0, loss=loss)
    idx = [int(np.argmin(np.abs(tr.ts - t))) for t in times]
    j12 = [tuple(s) for s in tr.subsets].index((1, 2))
    st = tr.stages[0]
    return {"ts": times, "a": tr.a[idx].tolist(), "share12": tr.c_frac[idx, j12].tolist(),
            "heads": value_norms(tr.x["V"][idx]).tolist(), "steps": int(st.steps), "rejected": int(st.rejected),
            "nfev": int(st.nfev), "wall": float(st.wall), "wall_here": time.perf_counter() - t0}  # fmt: skip


def errors(r: dict, ref: dict) -> dict:
    """The largest differences over the window against `ref`: a (relative), the {1,2} share, and
    each head's ``‖W_OV,h P⊥‖_F`` (absolute)."""
    a, ra = np.asarray(r["a"]), np.asarray(ref["a"])
    h, rh = np.asarray(r["heads"]), np.asarray(ref["heads"])
    return {"a_rel": float(np.max(np.abs(a - ra) / ra)),
            "share": float(np.max(np.abs(np.asarray(r["share12"]) - np.asarray(ref["share12"])))),
            "heads": np.max(np.abs(h - rh), axis=0).tolist()}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "official_full_order")
    ap.add_argument("--t-from", type=float, default=8.2)
    ap.add_argument("--window", type=float, default=0.5)
    ap.add_argument("--divisors", default="1,2,4,10,100")
    ap.add_argument("--heun", default="1e-3,1e-4")
    ap.add_argument("--json", type=Path, default=ROOT / "figures" / "official_full_order.json")
    args = ap.parse_args()
    from official_full import run

    base = gflow.load_config(CONFIG)
    eta = float(base.solver.eta)
    loss = make_loss(base.data, base.model, base.estimator)
    head = run(base.replace(schedule={"t1": args.t_from}, solver={"save_per_decade": 1}), args.out / "head")
    p0 = Params.from_blocks({b: jnp.asarray(v) for b, v in head.state(len(head.ts) - 1).items()})
    res = {"t_from": float(head.ts[-1]), "window": args.window, "eta": eta, "euler": {}, "heun": {}}
    for k in [int(x) for x in args.divisors.split(",")]:
        res["euler"][str(k)] = window_run(base, p0, args.out / f"euler_{k}", args.window, loss, eta=eta / k)
        print(f"Euler η/{k}: {res['euler'][str(k)]['wall']:.1f} s", flush=True)
    for r in [float(x) for x in args.heun.split(",")]:
        res["heun"][f"{r:g}"] = window_run(base, p0, args.out / f"heun_{r:g}", args.window, loss, method="heun",
                                           rtol=r, atol=r * 1e-3, max_steps=20000)  # fmt: skip
        print(f"heun rtol {r:g}: {res['heun'][f'{r:g}']['wall']:.1f} s", flush=True)
    ks = sorted(res["euler"], key=int)
    ref = res["euler"][ks[-1]]
    for group in ("euler", "heun"):
        for key, r in res[group].items():
            if r is not ref:
                r["error"] = errors(r, ref)
    e1, e2 = (res["euler"][k]["error"]["a_rel"] for k in ("1", "2"))
    res["order_a"] = float(np.log2(e1 / e2))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(res, indent=1))
    print(table(res))


def table(res: dict) -> str:
    """The page's table (rendered from the JSON the script writes; the tests check the page)."""
    lines = ["| run | steps (rejected) | field evaluations | wall | largest relative error of a | of the {1,2} share "
             "| of ‖W_OV,h P⊥‖_F, h = 1, 2, 3 | head 3's ‖W_OV,3 P⊥‖_F at the end |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    rows = [(f"Euler η/{k}" if k != "1" else "Euler η (shipped)", r) for k, r in sorted(res["euler"].items(), key=lambda x: int(x[0]))]
    rows += [(f"Heun, rtol {k}", r) for k, r in res["heun"].items()]
    for name, r in rows:
        e = r.get("error")
        err = (f"{e['a_rel']:.2e} | {e['share']:.2e} | " + ", ".join(f"{x:.1e}" for x in e["heads"])) if e else "reference | — | —"
        lines.append(f"| {name} | {r['steps']} ({r['rejected']}) | {r['nfev']} | {r['wall']:.0f} s | {err} | {r['heads'][-1][2]:.2e} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
