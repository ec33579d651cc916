"""Where is the gradient flow a faithful model of gradient descent? (README "When GD follows the flow")

GD ``θ_{k+1} = θ_k − ηΛ∇L̂(θ_k)`` on ``t = kη`` against the flow ``dθ/dt = −Λ∇L̂`` and
GD's first-order modified flow ``dθ/dt = −Λg − (η/2)ΛHΛg`` (``solver.method =
"modified"``), with GD's stability edge ``η_c = 2/λ_max(Λ^{1/2}HΛ^{1/2})`` from the
Hessian spectrum (:func:`gflow.hessian_spectrum`). Two settings:

- **staged**: the paper's default staged schedule, compared at the end of a Stage I of
  fixed length ``T`` (events off, so every run switches stage at the same time; Λ is
  the Stage I mask, only C moves);
- **published**: the published run's setting (joint, ``estimator.loss =
  "ce_on_probs"``, uniform start, L = 100, Λ = I, a₀ = c₀ = 0.01; the plain model —
  ``--official`` adds the official code's head norm, shifted windows and drawn target),
  compared at ``t = T``.

Part 1 (η scan): for η from 2η_c(0) down to η_c(0)/128 (``η = T/n``, whole steps), the
distance ``‖θ_GD(T) − θ(T)‖`` (all of θ) to the flow and to the modified flow at the same
η, on log-log axes with the slopes fitted on the η below ``η_c(0)/4`` (GD is within
O(η) of the flow and O(η²) of the modified flow on bounded times below the edge).

Part 2 (published setting, GD at η = 1, past the edge at the start): a(t), c_{1,2}/Σc and
‖C‖ of GD beside the flow and the modified flow at η = 1, and ``η·λ_max(t)`` along GD's
saved states (GD is linearly stable where it is below 2). Printed: the epoch from which
GD follows the flow (|Δa|/a < 5 % and |Δ c_{1,2}/Σc| < 0.05 from then on), the epoch
from which η·λ_max stays below 2, and the epoch at which ‖C‖ has made 95 % of its jump.

Runtime: with the defaults (N = 2,000 sequences per setting instead of 10⁴ and 9,000,
T = 2, GD at η = 1 to t = 200) about 4–6 minutes on two shared cores; ``--full`` uses
N = 10⁴ (staged) and 9,000 (published) and GD at η = 1 to t = 1000; ``--full --official``
took 6 minutes (figures/gd_faithful_official.png; 23 minutes when the official setting
used the heads layout, before its Hessian went through the κ table).
Runs are kept as run folders under ``--out`` (``--plot-only`` redraws from them).

Usage::

    python scripts/studies/gd_faithful.py                 # figures/gd_faithful.png
    python scripts/studies/gd_faithful.py --full
    python scripts/studies/gd_faithful.py --plot-only
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from _study import save_figure

import gflow
from gflow.dynamics import step_scales

ROOT = Path(__file__).resolve().parents[2]
_WIN = (1, 2)  # the published run's winner
_N_ETA = 9  # η = η_c(0)·2^{1..−7}
_FIT_BELOW = 0.25  # slopes fitted on η <= this fraction of η_c(0)
_TOL = {"rtol": 1e-11, "atol": 1e-13}  # the flows of the η scan: far below GD's O(η²) distances


def configs(full: bool, official: bool, T: float) -> dict[str, gflow.Config]:
    n_staged, n_pub = (10_000, 9000) if full else (2000, 2000)
    staged = gflow.Config().replace(
        schedule={"kind": "staged", "events": False, "durations": [T, 1e-6, 1e-6]},
        estimator={"N": n_staged},
    )
    model = {"head_norm": True, "windows": "shifted"} if official else {}
    est = {"N": n_pub, "loss": "ce_on_probs"}
    if official:  # the layout stays "auto": sparse for the shifted windows' span 5, whose Hessian and
        est.update(target="drawn")  # modified field go through the κ table (heads: 5.5x slower spectra)
    published = gflow.Config().replace(
        data={"d": 3, "parents": [1, 2], "alpha": 0.1, "L": 100, "start": "uniform"},
        model=model,
        init={"w_plus": 3.0, "w_minus": 0.1, "c0": 0.01, "a0": 0.01},
        schedule={"kind": "joint", "t1": T, "eta_w": 1.0, "eta_C": 1.0, "eta_a": 1.0},
        estimator=est,
    )
    return {"staged": staged, "published": published}


def with_method(cfg: gflow.Config, method: str, eta: float | None = None, t_end: float | None = None,
                per_decade: int = 4) -> gflow.Config:  # fmt: skip
    solver = {"method": method, "save_per_decade": per_decade}
    if method != "gd":
        solver.update(_TOL)
    if eta is not None:
        solver["eta"] = float(eta)
    out = cfg.replace(solver=solver)
    if t_end is not None and cfg.schedule.kind == "joint":
        out = out.replace(schedule={"t1": float(t_end)})
    return out


def theta_at(traj, t: float) -> np.ndarray:
    """All of θ (w, C, a) at the last saved row with time t (the end of Stage I for a staged run)."""
    i = int(np.flatnonzero(np.isclose(traj.ts, t, rtol=1e-9, atol=0))[-1])
    return np.concatenate([traj.w[i].ravel(), traj.C[i], [traj.a[i]]])


def fit_slope(eta, dist, below):
    keep = (eta <= below) & (dist > 0)
    if keep.sum() < 2:
        return None
    k, b = np.polyfit(np.log(eta[keep]), np.log(dist[keep]), 1)
    return {"slope": float(k), "intercept": float(b), "eta_max": float(eta[keep].max()), "n": int(keep.sum())}


def run(path: Path, cfg, loss, *, resume: bool):
    if resume and (path / "run.json").exists():
        tr = gflow.load(path)
        if tr.status == "complete":
            return tr
    return gflow.integrate(cfg, out=path, overwrite=True, loss=loss)


def eta_scan(name: str, cfg: gflow.Config, T: float, out: Path, *, resume: bool) -> dict:
    """Part 1 for one setting."""
    loss = gflow.make_loss(cfg.data, cfg.model, cfg.estimator)
    stage = "I" if cfg.schedule.kind == "staged" else "joint"
    p0 = gflow.init_params(cfg.model, cfg.init)
    lam0 = float(np.linalg.eigvalsh(gflow.loss_hessian(loss, p0, step_scales(cfg, stage)))[-1])
    eta_c = 2.0 / lam0
    etas = []
    for k in range(1, 1 - _N_ETA, -1):
        n = int(np.ceil(T / (eta_c * 2.0**k)))
        etas.append(T / n)
    etas = np.array(sorted(set(etas), reverse=True))
    t0 = time.perf_counter()
    flow = run(out / name / "flow", with_method(cfg, "tsit5", t_end=T), loss, resume=resume)
    th_flow = theta_at(flow, T)
    d_flow, d_mod, norm_C = [], [], []
    for eta in etas:
        gd = run(out / name / f"gd_{eta:.6g}", with_method(cfg, "gd", eta, t_end=T), loss, resume=resume)
        mod = run(out / name / f"modified_{eta:.6g}", with_method(cfg, "modified", eta, t_end=T), loss,
                  resume=resume)  # fmt: skip
        th_gd = theta_at(gd, T)
        d_flow.append(float(np.linalg.norm(th_gd - th_flow)))
        d_mod.append(float(np.linalg.norm(th_gd - theta_at(mod, T))))
        norm_C.append(float(np.linalg.norm(th_gd[cfg.model.H * cfg.model.M: -1])))
        print(f"  {name}: η = {eta:.4g} (η/η_c = {eta / eta_c:.3g}): |GD − flow| = {d_flow[-1]:.3g}, "
              f"|GD − modified| = {d_mod[-1]:.3g}, ‖C_GD(T)‖ = {norm_C[-1]:.4g}  [{time.perf_counter() - t0:.0f} s]",
              flush=True)  # fmt: skip
    d_flow, d_mod = np.array(d_flow), np.array(d_mod)
    below = _FIT_BELOW * eta_c
    return {
        "T": T, "N": cfg.estimator.N, "lam_max0": lam0, "eta_c0": eta_c, "eta": etas.tolist(),
        "dist_flow": d_flow.tolist(), "dist_modified": d_mod.tolist(), "norm_C_gd": norm_C,
        "norm_C_flow": float(np.linalg.norm(th_flow[cfg.model.H * cfg.model.M: -1])),
        "fit_flow": fit_slope(etas, d_flow, below), "fit_modified": fit_slope(etas, d_mod, below),
        "gain_below_edge": (d_flow[etas <= below] / d_mod[etas <= below]).tolist(),
        "wall_s": time.perf_counter() - t0,
    }  # fmt: skip


def published_eta1(cfg: gflow.Config, t_end: float, out: Path, *, resume: bool, max_times: int) -> dict:
    """Part 2: GD at η = 1 in the published setting beside both flows, with η·λ_max along GD."""
    loss = gflow.make_loss(cfg.data, cfg.model, cfg.estimator)
    t0 = time.perf_counter()
    runs = {}
    for key, method in (("gd", "gd"), ("flow", "tsit5"), ("modified", "modified")):
        c = with_method(cfg, method, 1.0, t_end=t_end, per_decade=24).replace(solver={"tau_min": 1.0})
        if method != "gd":
            c = c.replace(solver={"rtol": 1e-8, "atol": 1e-10})
        runs[key] = run(out / "published_eta1" / key, c, loss, resume=resume)
        print(f"  published, η = 1: {key} to t = {runs[key].ts[-1]:g} [{time.perf_counter() - t0:.0f} s]", flush=True)
    spec = gflow.hessian_spectrum(runs["gd"].config, runs["gd"], loss=loss, max_times=max_times)
    print(f"  spectrum along GD at {len(spec.ts)} saved times [{time.perf_counter() - t0:.0f} s]", flush=True)
    gd, fl = runs["gd"], runs["flow"]
    win = gd.subsets.index(_WIN)
    # the flow at GD's saved epochs (both save on the same grid of whole epochs: interpolate in log t anyway)
    def at(tr, y, ts):
        return np.interp(np.log(np.maximum(ts, 1e-300)), np.log(np.maximum(tr.ts, 1e-300)), y)

    ep = gd.ts[gd.ts >= 1]
    rows = np.flatnonzero(gd.ts >= 1)
    da = np.abs(gd.a[rows] - at(fl, fl.a, ep)) / np.abs(at(fl, fl.a, ep))
    dc = np.abs(gd.c_frac[rows, win] - at(fl, fl.c_frac[:, win], ep))
    ok = (da < 0.05) & (dc < 0.05)
    follows = next((float(ep[i]) for i in range(len(ep)) if ok[i:].all()), None)
    eta_lam = spec.eta * spec.lam_max if spec.eta is not None else spec.lam_max
    below = eta_lam < 2.0
    edge = next((float(spec.ts[i]) for i in range(len(spec.ts)) if below[i:].all()), None)
    nC = np.linalg.norm(gd.C, axis=1)
    jump = nC - nC[0]
    j95 = float(gd.ts[int(np.flatnonzero(jump >= 0.95 * jump[-1])[0])]) if jump[-1] > 0 else None
    return {
        "t_end": t_end, "N": cfg.estimator.N,
        "epoch_gd_follows_flow": follows, "epoch_eta_lam_below_2": edge, "epoch_C_jump_95pct": j95,
        "eta_lam0": float(eta_lam[0]), "norm_C_gd_end": float(nC[-1]), "norm_C_flow_end": float(np.linalg.norm(fl.C[-1])),
        "norm_C_modified_end": float(np.linalg.norm(runs["modified"].C[-1])),
        "spectrum": {"ts": spec.ts.tolist(), "lam_max": spec.lam_max.tolist()},
        "wall_s": time.perf_counter() - t0,
    }  # fmt: skip


# ---------------------------------------------------------------------------
# The figure
# ---------------------------------------------------------------------------


def plot(res: dict, out: Path, path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(16, 8.5), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[1.05, 1])
    axs = top.subplots(1, 2)
    titles = {"staged": "staged default, Stage I (C moves; Λ = Stage I mask), at t = T",
              "published": "published setting (joint, ce_on_probs, Λ = I), at t = T"}  # fmt: skip
    for ax, name in zip(axs, ("staged", "published")):
        r = res.get(name)
        if r is None:
            ax.set_axis_off()
            continue
        eta = np.array(r["eta"])
        for key, lab, col, mk in (("flow", "‖θ_GD − θ_flow‖", "C0", "o"),
                                  ("modified", "‖θ_GD − θ_modified‖", "C3", "s")):  # fmt: skip
            d = np.array(r[f"dist_{key}"])
            ax.plot(eta, d, mk, color=col, label=lab)
            fit = r[f"fit_{key}"]
            if fit is not None:
                xx = np.geomspace(eta.min(), eta.max(), 50)
                ax.plot(xx, np.exp(fit["intercept"]) * xx ** fit["slope"], "-", color=col, lw=1,
                        label=f"fit on η ≤ η_c/4: slope {fit['slope']:.2f}")  # fmt: skip
        ax.axvline(r["eta_c0"], color="k", ls="--", lw=1.2, label=f"η_c(0) = 2/λ_max = {r['eta_c0']:.3g}")
        ax.axvspan(r["eta_c0"], eta.max() * 1.5, color="0.85", alpha=0.5, lw=0)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("GD step η")
        ax.set_ylabel("distance at t = T (all of θ)")
        ax.set_title(f"{titles[name]}; T = {r['T']:g}, N = {r['N']}", fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8, loc="upper left")
    p = res.get("published_eta1")
    bx = bottom.subplots(1, 4)
    if p is not None:
        trs = {k: gflow.load(out / "published_eta1" / k) for k in ("gd", "flow", "modified")}
        style = {"gd": dict(color="C3", lw=1.6, label="GD, η = 1"),
                 "flow": dict(color="C0", lw=2.0, label="gradient flow"),
                 "modified": dict(color="C2", lw=1.4, ls="--", label="modified flow, η = 1")}  # fmt: skip
        for k, tr in trs.items():
            win = tr.subsets.index(_WIN)
            t = np.where(tr.ts > 0, tr.ts, np.nan)
            bx[0].plot(t, tr.a, **style[k])
            bx[1].plot(t, tr.c_frac[:, win], **style[k])
            bx[2].plot(t, np.linalg.norm(tr.C, axis=1), **style[k])
        st = np.array(p["spectrum"]["ts"])
        lam = np.array(p["spectrum"]["lam_max"])
        ok = st > 0
        bx[3].plot(st[ok], lam[ok], "-o", color="C3", ms=3, label="η·λ_max(t) along GD (η = 1)")
        bx[3].axhline(2.0, color="k", ls="--", lw=1.2, label="2: GD's stability edge")
        for ax in bx:
            for key, col in (("epoch_eta_lam_below_2", "0.4"), ("epoch_gd_follows_flow", "C0")):
                if p.get(key):
                    ax.axvline(p[key], color=col, ls=":", lw=1.2)
        for ax, title in zip(bx, ("a(t)", "c_{1,2}/Σc", "‖C‖ (log)", "η·λ_max(ΛH) along GD")):
            ax.set_xscale("log")
            ax.set_xlabel("t (epochs; t = kη)")
            ax.set_title(title, fontsize=10)
            ax.grid(alpha=0.3)
        bx[2].set_yscale("log")
        bx[0].legend(fontsize=8)
        bx[3].legend(fontsize=8)
        bottom.suptitle(
            f"published setting, GD at η = 1 (N = {p['N']}): dotted lines: η·λ_max < 2 from t = "
            f"{p['epoch_eta_lam_below_2']}, GD follows the flow (|Δa|/a, |Δc| < 5 %) from t = {p['epoch_gd_follows_flow']}",
            fontsize=10,
        )  # fmt: skip
    fig.suptitle("When does GD follow the gradient flow? Distance to the flow (order 1) and to GD's modified "
                 "flow (order 2) below the stability edge η_c = 2/λ_max(ΛH)", fontsize=12)  # fmt: skip
    save_figure(fig, path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "runs" / "gd_faithful"))
    ap.add_argument("--figure", default=str(ROOT / "figures" / "gd_faithful.png"))
    ap.add_argument("--full", action="store_true", help="N = 10^4 / 9000 and GD at η = 1 to t = 1000")
    ap.add_argument("--official", action="store_true", help="the official model's head norm, shifted windows, drawn target")
    ap.add_argument("--T", type=float, default=2.0, help="the time of the η scan's comparison")
    ap.add_argument("--which", choices=("all", "staged", "published", "eta1"), default="all")
    ap.add_argument("--resume", action="store_true", help="reuse completed run folders under --out")
    ap.add_argument("--plot-only", action="store_true")
    args = ap.parse_args(argv)
    if not (np.isfinite(args.T) and args.T > 0):
        print(f"--T must be a finite time > 0, got {args.T}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res_path = out / "results.json"
    res = json.loads(res_path.read_text()) if res_path.exists() else {}
    if not args.plot_only:
        cfgs = configs(args.full, args.official, args.T)
        t_end = 1000.0 if args.full else 200.0
        t0 = time.perf_counter()
        for name in ("staged", "published"):
            if args.which in ("all", name):
                print(f"η scan, {name}:", flush=True)
                res[name] = eta_scan(name, cfgs[name], args.T, out, resume=args.resume)
                res_path.write_text(json.dumps(res, indent=1))
        if args.which in ("all", "eta1"):
            print("published setting, GD at η = 1:", flush=True)
            res["published_eta1"] = published_eta1(cfgs["published"], t_end, out, resume=args.resume,
                                                   max_times=60)  # fmt: skip
            res_path.write_text(json.dumps(res, indent=1))
        print(f"total {time.perf_counter() - t0:.0f} s")
    for name in ("staged", "published"):
        r = res.get(name)
        if r:
            ff, fm = r["fit_flow"], r["fit_modified"]
            print(f"{name}: λ_max(0) = {r['lam_max0']:.4g}, η_c(0) = {r['eta_c0']:.4g}; slopes on η <= η_c/4: "
                  f"to the flow {ff and round(ff['slope'], 3)}, to the modified flow {fm and round(fm['slope'], 3)}; "
                  f"distance ratio flow/modified below η_c/4: {np.round(r['gain_below_edge'], 1).tolist()}")  # fmt: skip
    p = res.get("published_eta1")
    if p:
        print(f"published, η = 1 (N = {p['N']}, to t = {p['t_end']:g}): η·λ_max(0) = {p['eta_lam0']:.3g}; "
              f"η·λ_max < 2 from t = {p['epoch_eta_lam_below_2']}; ‖C‖ reaches 95 % of its jump at "
              f"t = {p['epoch_C_jump_95pct']} (‖C‖: GD {p['norm_C_gd_end']:.3g}, flow {p['norm_C_flow_end']:.3g}, "
              f"modified {p['norm_C_modified_end']:.3g}); GD follows the flow from t = {p['epoch_gd_follows_flow']}")  # fmt: skip
    plot(res, out, Path(args.figure))
    print(f"wrote {args.figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
