"""GD, the flow and the central flow side by side past the edge of stability, and the catapult law
(docs/results/gd-at-the-edge.md).

On one sample (the flow's default data, joint schedule; d = 3, L = 20, N = 300, t₁ = 20 unless
changed), for each η of a geometric grid between the edge at the start, η_c(0) = 2/λ_max(0),
and the flow's smallest edge min_t η_c(t):

- GD at η saved at every step, the central flow at η and the flow, each saved at GD's iterates
  nearest t = 1, …, t₁;
- ‖θ_GD − θ_CF‖ and ‖θ_GD − θ_GF‖ at those times (mean, end, max);
- GD's loss averaged over the steps within ±1/2 of each time against the central flow's
  prediction L̂ + ½ Σ X_ii λ_i and the flow's L̂; the predicted oscillation X (top direction)
  against the mean of (v₁ᵀ(θ_GD − θ_CF))² over the same steps;
- the first GD step past the edge (η λ_max > 2), the central flow's first time at the edge, and
  where the flow's own η λ_max(t) passes 2;
- every catapult of GD (find_catapults at every step): s_peak, s_after against the one-direction
  map's s_after, ‖C‖ before and after, and where the flow predicts it to start (the first τ with
  η λ^{flow}(τ)‖C₀‖²/‖C_before‖² ≥ 2);
- GD's final ‖C‖ against the bound ‖C₀‖√(η/min η_c^{flow}) and the law's √(2/s_after) correction
  (with the last catapult's measured s_after, and with the map of its s_peak);
- the cost of each: field evaluations and wall time.

Each η is written to OUT/eta_<η>.json when done (a rerun skips it: resumable); OUT/summary.json
collects them and the tables are printed in markdown.

Usage::

    python scripts/studies/gd_edge.py --out studies/gd_edge
    python scripts/studies/gd_edge.py --out studies/gd_edge --eta 0.4 0.2 0.1 0.05 0.025
    python scripts/studies/gd_edge.py --out studies/gd_edge_13 --t1 50 --parents 1,3 --alpha 1   # a second data setting
    python scripts/studies/gd_edge.py --out studies/gd_edge_pub --published --grid 3   # the published run's setting
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

import gflow  # noqa: E402
from gflow.core import make_loss  # noqa: E402
from gflow.dynamics._catapult import find_catapults, predicted_final_norm  # noqa: E402


def _theta(tr, times):
    i = [int(np.argmin(np.abs(tr.ts - t))) for t in times]
    assert np.allclose(tr.ts[i], times, rtol=0, atol=1e-9), "a time was not saved"
    return np.concatenate([tr.w[i].reshape(len(i), -1), tr.C[i], tr.a[i, None]], axis=1), i


def _flat(tr):
    return np.concatenate([tr.w.reshape(len(tr.ts), -1), tr.C, tr.a[:, None]], axis=1)


def one_eta(cfg, loss, eta: float, times, flow_sp) -> dict:
    t1 = times[-1]
    steps = [k * eta for k in range(1, int(np.ceil(t1 / eta - 1e-9)) + 1)]
    times = [round(t / eta) * eta for t in times]  # GD's iterates nearest to t = 1, 2, …
    if times[-1] > cfg.schedule.t1:  # the last one after t₁ (η not dividing t₁): every run goes on to it
        cfg = cfg.replace(schedule={"t1": times[-1]})
    flow = gflow.integrate(cfg.replace(solver={"save_times": times}), loss=loss)
    t = time.perf_counter()
    gd = gflow.integrate(cfg.replace(solver={"method": "gd", "eta": eta, "save_times": steps}), loss=loss)
    wall_gd = time.perf_counter() - t
    t = time.perf_counter()
    cf = gflow.integrate(cfg.replace(solver={"method": "central", "eta": eta, "save_times": times}), loss=loss)
    wall_cf = time.perf_counter() - t
    th_gd, _ = _theta(gd, times)
    th_cf, icf = _theta(cf, times)
    th_gf, _ = _theta(flow, times)
    d_cf = np.linalg.norm(th_cf - th_gd, axis=1)
    d_gf = np.linalg.norm(th_gf - th_gd, axis=1)
    # GD's spectrum at every step, the central flow's terms at its saved times 1..t1
    sp = gflow.hessian_spectrum(None, gd, loss=loss)
    cats = find_catapults(gd.ts, eta, sp.lam_max, gd.C)
    es = gflow.central_predictions(cf, loss=loss, eta=eta)
    es_at = {float(t): k for k, t in enumerate(es.ts)}
    # GD's averages over the steps within ±1/2 of each time, against the predictions
    flat_gd = _flat(gd)
    loss_gd_avg, loss_pred, loss_flow, x_meas, x_pred = [], [], [], [], []
    cf_sp = gflow.hessian_spectrum(None, cf, loss=loss, indices=icf, vectors=1)
    for k, (tt, i) in enumerate(zip(times, icf)):
        win = (gd.ts >= tt - 0.5) & (gd.ts <= tt + 0.5)
        loss_gd_avg.append(float(np.mean(gd.loss[win])))
        j = es_at[float(cf.ts[i])]
        loss_pred.append(float(es.loss_gd[j]))
        loss_flow.append(float(flow.loss[_theta(flow, [tt])[1][0]]))
        v = cf_sp.vectors[k, 0]  # Λ = I (joint): u = v
        x_meas.append(float(np.mean(((flat_gd[win] - th_cf[k]) @ v) ** 2)))
        x_pred.append(float(es.X[j, 0, 0]))
    lam_gf = flow_sp.lam_max
    cross_gf = flow_sp.ts[np.flatnonzero(eta * lam_gf > 2)]
    n0 = float(np.linalg.norm(gd.C[0]))
    prev_end = 0.0
    for c in cats:  # the flow's prediction of when each catapult starts, given ‖C‖ before it
        s_flow = eta * lam_gf * (n0 / c.norm_before) ** 2
        past = flow_sp.ts[(s_flow >= 2) & (flow_sp.ts >= prev_end)]
        c.__dict__["t_start_flow"] = float(past[0]) if past.size else float("nan")
        prev_end = c.t_end if np.isfinite(c.t_end) else prev_end
    eta_c_min = float(flow_sp.eta_c_min)
    last = [c for c in cats if np.isfinite(c.s_after)]
    norm_gd = float(np.linalg.norm(gd.C[-1]))
    norm_cf = float(np.linalg.norm(cf.C[-1]))
    bound = predicted_final_norm(n0, eta, eta_c_min, 2.0)
    return {
        "eta": eta, "edge": 2 / eta,
        "distance": {"central_mean": float(d_cf.mean()), "central_end": float(d_cf[-1]), "central_max": float(d_cf.max()),
                     "flow_mean": float(d_gf.mean()), "flow_end": float(d_gf[-1]), "flow_max": float(d_gf.max())},
        "loss": {"gd_avg": loss_gd_avg, "central_pred": loss_pred, "flow": loss_flow,
                 "central_err_mean": float(np.mean(np.abs(np.subtract(loss_pred, loss_gd_avg)))),
                 "flow_err_mean": float(np.mean(np.abs(np.subtract(loss_flow, loss_gd_avg))))},
        "X": {"pred": x_pred, "measured": x_meas},
        "edge_times": {"gd_first_step_past": float(gd.ts[np.argmax(eta * sp.lam_max > 2)]) if np.any(eta * sp.lam_max > 2) else None,
                       "central_first_held": float(es.ts[np.argmax(es.held > 0)]) if np.any(es.held > 0) else None,
                       "flow_crosses": float(cross_gf[0]) if cross_gf.size else None},
        "catapults": [c.__dict__ for c in cats],
        "norm": {"C0": n0, "gd_end": norm_gd, "central_end": norm_cf, "bound": bound,
                 "law_measured_s_after": predicted_final_norm(n0, eta, eta_c_min, last[-1].s_after) if last else None,
                 "law_map_s_peak": predicted_final_norm(n0, eta, eta_c_min, last[-1].s_after_map) if last else None,
                 "eta_c_min_flow": eta_c_min},
        "cost": {"gd_evaluations": int(sum(r.nfev for r in gd.stages)), "gd_wall": wall_gd,
                 "central_evaluations": int(sum(r.nfev for r in cf.stages)), "central_wall": wall_cf,
                 "flow_evaluations": int(sum(r.nfev for r in flow.stages))},
    }  # fmt: skip


def _t(x) -> str:
    return "—" if x is None else f"{x:.3g}"


def render_tables(summary: dict) -> str:
    """The page's two tables (markdown) from OUT/summary.json: the runs side by side, and the
    catapults with the law."""
    results = summary["runs"]
    out = []
    out.append("| η | ‖θ_GD − θ_CF‖ mean / end | ‖θ_GD − θ_GF‖ mean / end | ratio (mean) | mean error of GD's averaged "
               "loss: CF / GF | first past the edge: GD / CF / flow | evaluations GD / CF (wall s) |")
    out.append("|---|---|---|---|---|---|---|")
    for r in results:
        d, lo, e, c = r["distance"], r["loss"], r["edge_times"], r["cost"]
        out.append(f"| {r['eta']:g} | {d['central_mean']:.4f} / {d['central_end']:.4f} | {d['flow_mean']:.4f} / "
              f"{d['flow_end']:.4f} | {d['central_mean'] / d['flow_mean']:.3f} | {lo['central_err_mean']:.2e} / "
              f"{lo['flow_err_mean']:.2e} | {_t(e['gd_first_step_past'])} / {_t(e['central_first_held'])} / "
                   f"{_t(e['flow_crosses'])} | "
              f"{c['gd_evaluations']} / {c['central_evaluations']} ({c['gd_wall']:.1f} / {c['central_wall']:.1f}) |")  # fmt: skip
    out.append("")
    out.append("| η | catapults (t_start, s_peak → s_after [angle map], small-angle map, ‖C‖ before → after, flow's start) "
               "| final ‖C‖ GD / CF | bound | law (measured s_after) | law (angle map of s_peak) |")
    out.append("|---|---|---|---|---|---|")
    for r in results:
        n = r["norm"]
        cs = "; ".join(f"t {c['t_start']:.3g}, {c['s_peak']:.3g} → {c['s_after']:.3g} [{c['s_after_map']:.3g}], "
                       f"lin {c['s_after_linear']:.3g}, {c['norm_before']:.4g} → {c['norm_after']:.4g}, flow {c['t_start_flow']:.3g}"
                       for c in r["catapults"]) or "none"  # fmt: skip
        law = lambda v: "—" if v is None else f"{v:.4g}"  # noqa: E731
        out.append(f"| {r['eta']:g} | {cs} | {n['gd_end']:.4g} / {n['central_end']:.4g} | {n['bound']:.4g} | "
              f"{law(n['law_measured_s_after'])} | {law(n['law_map_s_peak'])} |")  # fmt: skip
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--eta", type=float, nargs="+", default=[0.4, 0.2, 0.1, 0.05, 0.025])
    ap.add_argument("--t1", type=float, default=20.0)
    ap.add_argument("--L", type=int, default=20)
    ap.add_argument("--N", type=int, default=300)
    ap.add_argument("--parents", default="1,2", help="the chain's parent offsets, comma-separated (default 1,2)")
    ap.add_argument("--alpha", type=float, default=None, help="the Dirichlet prior's α (default: the paper's 0.1)")
    ap.add_argument("--published", action="store_true",
                    help="the official published run's setting (uniform start, normalised heads, shifted windows, "
                         "cross-entropy on the drawn token's probability, its initialisation) at --L, --N")
    ap.add_argument("--grid", type=int, default=None,
                    help="instead of --eta: this many η on a geometric grid from the edge at the start η_c(0) "
                         "(excluded) down to the flow's min_t η_c (included)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    times = [float(t) for t in range(1, int(args.t1) + 1)]
    data = {"L": args.L, "parents": [int(p) for p in args.parents.split(",")]}
    if args.alpha is not None:
        data["alpha"] = args.alpha
    cfg = gflow.Config().replace(data=data, estimator={"N": args.N}, schedule={"kind": "joint", "t1": args.t1})
    if args.published:  # the reference-compatible options of scripts/studies/reproduce_published_run.py
        cfg = cfg.replace(data={"start": "uniform"}, model={"head_norm": True, "windows": "shifted"},
                          init={"w_plus": 3.0, "w_minus": 0.1, "c0": 0.01, "a0": 0.01},
                          estimator={"loss": "ce_on_probs", "target": "drawn"})  # fmt: skip
    loss = make_loss(cfg.data, cfg.model, cfg.estimator)
    fine = [round(0.05 * k, 10) for k in range(1, int(args.t1 / 0.05) + 1)]
    flow = gflow.integrate(cfg.replace(solver={"save_times": fine}), loss=loss)
    flow_sp = gflow.hessian_spectrum(None, flow, loss=loss)
    print(f"flow: η_c(0) = {float(flow_sp.eta_c[0]):.4g}, min_t η_c = {flow_sp.eta_c_min:.4g} at t = "
          f"{flow_sp.where_eta_c_min[0]:.4g}")  # fmt: skip
    etas = args.eta
    if args.grid:
        etas = [float(f"{e:.4g}") for e in np.geomspace(float(flow_sp.eta_c[0]), flow_sp.eta_c_min, args.grid + 1)[1:]]
        print(f"η grid: {etas}", flush=True)
    results = []
    for eta in etas:
        f = out / f"eta_{eta:g}.json"
        if f.is_file():
            results.append(json.loads(f.read_text()))
            continue
        t = time.perf_counter()
        r = one_eta(cfg, loss, eta, times, flow_sp)
        r["wall"] = time.perf_counter() - t
        f.write_text(json.dumps(r, indent=1))
        results.append(r)
        print(f"η = {eta:g} done in {r['wall']:.0f} s", flush=True)
    (out / "summary.json").write_text(json.dumps({"config": cfg.to_dict(), "eta_c0": float(flow_sp.eta_c[0]),
                                                  "eta_c_min": flow_sp.eta_c_min, "runs": results}, indent=1))  # fmt: skip
    print(render_tables(json.loads((out / "summary.json").read_text())))


if __name__ == "__main__":
    main()
