"""Gradient descent against the gradient flow on one sample: how far, and of what order in η.

What it shows
-------------
Discrete gradient descent θ_{k+1} = θ_k − η Λ ∇L̂(θ_k) (``solver.method = "gd"``,
docs/theory/mathematics.md §M4 extension) is explicit Euler for the flow dθ/dt = −Λ ∇L̂(θ), run on the
same time axis t = kη. This script runs both on one sample (one
``PopulationLoss``, passed to every run: common random numbers) and reports

1. the distance ‖θ_GD(t) − θ_flow(t)‖₂ (over all blocks w, C, a) at GD's
   saved times t = kη, for several step sizes η;
2. the order in η: the least-squares slope of log ‖θ_GD(T) − θ_flow(T)‖
   against log η at the end time T (expected 1: Euler is a first-order
   method, and the flow is smooth and non-stiff on [0, T]), and the same for
   the largest distance over [0, T].

Configuration (cheap: d = 3, L = 40, N = 2000). The *joint* schedule (every
block moves, Λ = I) from the paper's initialisation, except the selector
scale c₀ = 0.1 instead of 0.01 (``--c0``), up to T = 20: over that horizon a
grows from 0.01 to about 2, c/Σc concentrates on S* = {1,2} and the copier
starts to sharpen, so there is real motion in every block. Why c₀ = 0.1: the
selector's rate is ∝ a/‖C‖² (docs/theory/mathematics.md §M6.2), so with the paper's c₀ = 0.01
(‖C‖² = 7e-4) the joint flow is stiff as soon as a = O(1) — the largest
Hessian eigenvalue λ_max grows from 4 at t = 0 to ~500 near t = 30 (a ≈ 3;
measured at L = 40, N = 2000), GD is only stable for η < 2/λ_max ≈ 0.004,
and an explicit adaptive solver crawls (Tsit5: ~9,000 steps to t = 100). The script prints
λ_max of Λ∇²L̂ along the flow and the stability bound 2/λ_max, so ``--c0 0.01``
shows that regime.

The flow is integrated with Tsit5 at tight tolerances (rtol 1e-10, atol
1e-12) and saved densely (48 points a decade); it is evaluated at GD's
times by cubic Hermite interpolation in t, with the exact derivative
dθ/dt = −Λ∇L̂ saved at every point. The interpolation error is estimated by
interpolating from every other saved point onto the ones left out (an upper
bound: halving the spacing divides a cubic Hermite error by ~16) and printed;
it is far below every distance measured. The end time T is a multiple of
every η and a saved time of every run, so the end-time errors involve no
interpolation at all.

Output: ``figures/gd_vs_gf.png`` (left: distance against t for each η,
log-log, with the flow's own displacement ‖θ_flow(t) − θ(0)‖ for scale;
right: the error at T and the largest error over [0, T] against η with the
fitted slopes), and a table of the numbers.

Runtime: about a minute on 2 CPU cores at the default (much of it compilation).

Usage::

    python scripts/studies/gd_vs_gf.py
    python scripts/studies/gd_vs_gf.py --etas 0.2 0.1 0.05 0.025 0.0125 --T 40
    python scripts/studies/gd_vs_gf.py --c0 0.01 --T 2 --etas 0.02 0.01 0.005   # the paper's c0: stiff
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from _study import save_figure
from jax.flatten_util import ravel_pytree

import gflow
from gflow.core._model import Params

ROOT = Path(__file__).resolve().parents[2]


def _theta(traj) -> np.ndarray:
    """All parameters at every saved time, flattened: ``(T, H·M + |𝒮| + 1)``."""
    n = len(traj)
    return np.concatenate([traj.w.reshape(n, -1), traj.C, traj.a[:, None]], axis=1)


def _dtheta(traj) -> np.ndarray:
    """dθ/dt = −Λ∇L̂ at every saved time (same layout as :func:`_theta`)."""
    sc = traj.config.schedule
    n = len(traj)
    return np.concatenate(
        [-sc.eta_w * traj.grad_w.reshape(n, -1), -sc.eta_C * traj.grad_C, -sc.eta_a * traj.grad_a[:, None]],
        axis=1,
    )


def hermite(ts: np.ndarray, ys: np.ndarray, dys: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Cubic Hermite interpolation of ``y(t)`` through ``(ts, ys)`` with slopes ``dys``
    (rows = times); ``t`` must lie in ``[ts[0], ts[-1]]``."""
    t = np.asarray(t, float)
    i = np.clip(np.searchsorted(ts, t, side="right") - 1, 0, len(ts) - 2)
    h = ts[i + 1] - ts[i]
    s = ((t - ts[i]) / h)[:, None]
    h = h[:, None]
    h00 = 2 * s**3 - 3 * s**2 + 1
    h10 = s**3 - 2 * s**2 + s
    h01 = -2 * s**3 + 3 * s**2
    h11 = s**3 - s**2
    return h00 * ys[i] + h10 * h * dys[i] + h01 * ys[i + 1] + h11 * h * dys[i + 1]


@eqx.filter_jit
def _hessian(loss, flat, unravel):
    return jax.hessian(lambda x: loss(unravel(x)))(flat)


def lambda_max(loss, traj, i: int) -> float:
    """Largest eigenvalue of Λ∇²L̂ at saved index ``i`` (Λ diagonal, so the
    eigenvalues are those of Λ^½∇²L̂Λ^½): GD is linearly stable for η < 2/λ_max."""
    st = traj.state(i)
    p = Params(w=jnp.asarray(st["w"]), C=jnp.asarray(st["C"]), a=jnp.asarray(st["a"]))
    flat, unravel = ravel_pytree(p)
    Hm = np.asarray(_hessian(loss, flat, unravel))
    sc = traj.config.schedule
    lam = np.concatenate(
        [np.full(st["w"].size, sc.eta_w), np.full(st["C"].size, sc.eta_C), np.full(1, sc.eta_a)]
    )
    r = np.sqrt(lam)
    return float(np.linalg.eigvalsh(r[:, None] * Hm * r[None, :]).max())


def loglog_slope(x, y) -> float:
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--N", type=int, default=2000, help="sequences in the sample (default 2000)")
    p.add_argument("--L", type=int, default=40, help="context length (default 40)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sample (default 0)")
    p.add_argument(
        "--c0", type=float, default=0.1, help="initial selector weight C_S (default 0.1; paper 0.01)"
    )
    p.add_argument("--a0", type=float, default=0.01, help="initial a (default 0.01, the paper's)")
    p.add_argument("--T", type=float, default=20.0, help="horizon, a multiple of every η (default 20)")
    p.add_argument("--etas", type=float, nargs="+", default=[0.2, 0.1, 0.05, 0.025, 0.0125],
                   help="GD step sizes (default 0.2 0.1 0.05 0.025 0.0125)")  # fmt: skip
    p.add_argument("--out", default=str(ROOT / "figures" / "gd_vs_gf.png"), help="figure path")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = _args(argv)
    t_start = time.perf_counter()
    etas = sorted(args.etas, reverse=True)
    T = args.T
    for eta in etas:
        if abs(T / eta - round(T / eta)) > 1e-9 * T / eta:
            raise SystemExit(f"--T {T} must be a multiple of every step size; {eta} does not divide it")
    base = gflow.Config().replace(
        data={"L": args.L},
        estimator={"N": args.N, "seed": args.seed},
        init={"c0": args.c0, "a0": args.a0},
        schedule={"kind": "joint", "t1": T},
    )
    loss = gflow.make_loss(base.data, base.model, base.estimator)
    print(f"gd_vs_gf: joint schedule (Λ = I), d={base.data.d}, L={args.L}, N={args.N}, "
          f"c0={args.c0:g}, a0={args.a0:g}, T={T:g}; η = {', '.join(f'{e:g}' for e in etas)}", flush=True)  # fmt: skip

    ref = _reference(base, loss, etas)
    runs, worst = _gd_runs(base, loss, etas, T, ref)
    e = np.array([r["eta"] for r in runs])
    err_end = np.array([r["end"] for r in runs])
    err_max = np.array([r["max"] for r in runs])
    p_end, p_max = loglog_slope(e, err_end), loglog_slope(e, err_max)
    print(f"\n{'η':>8} {'steps':>6} {'wall s':>7} {'‖Δθ(T)‖':>10} {'‖Δθ(T)‖/η':>10} {'max_t ‖Δθ‖':>11} "
          f"{'rel. to ‖θ(T)−θ(0)‖':>20} {'loss(T) GD − flow':>18}")  # fmt: skip
    for r in runs:
        print(f"{r['eta']:>8g} {r['steps']:>6d} {r['wall']:>7.1f} {r['end']:>10.3e} {r['end'] / r['eta']:>10.4f} "
              f"{r['max']:>11.3e} {r['end'] / ref['disp'][-1]:>20.2e} {r['loss'] - ref['flow'].loss[-1]:>18.2e}")  # fmt: skip
    print(f"interpolation error bound / distance: at most {worst:.2g} over every GD point")
    print(f"order in η (least-squares log-log slope): at t = T: {p_end:.3f}; max over t ≤ T: {p_max:.3f} "
          f"(Euler: 1)")  # fmt: skip
    out = _figure(args, base, ref, runs, (e, err_end, err_max, p_end, p_max))
    print(f"\nfigure: {out}\ntime: flow {ref['t_flow']:.1f} s, total {time.perf_counter() - t_start:.1f} s")
    return 0


def _reference(base, loss, etas) -> dict:
    """The reference flow (tight tolerances, dense saves for the interpolant), the interpolant's error
    bound and the stiffness along the path, printed; returns the flow and what the comparisons need."""
    t0 = time.perf_counter()
    ref_cfg = base.replace(solver={"rtol": 1e-10, "atol": 1e-12, "save_per_decade": 48, "tau_min": min(etas)})
    flow = gflow.integrate(ref_cfg, loss=loss)
    t_flow = time.perf_counter() - t0
    tf, yf, dyf = flow.ts, _theta(flow), _dtheta(flow)
    rec = flow.stages[0]
    print(f"flow (Tsit5, rtol 1e-10): {rec.steps} steps, {rec.nfev} evaluations, {t_flow:.1f} s; "
          f"a: {flow.a[0]:.3g} -> {flow.a[-1]:.4g}, max c/Σc: {flow.c_frac[0].max():.3f} -> "
          f"{flow.c_frac[-1].max():.4f} ({flow.labels[int(flow.c_frac[-1].argmax())]}), "
          f"s^(1)_1: {flow.s[0, 0, 0]:.4f} -> {flow.s[-1, 0, 0]:.4f}, loss {flow.loss[0]:.4f} -> {flow.loss[-1]:.4f}")  # fmt: skip
    # interpolation error: from every other point onto the left-out ones (an upper bound)
    odd = np.arange(1, len(tf) - 1, 2)
    interp_err = np.linalg.norm(hermite(tf[::2], yf[::2], dyf[::2], tf[odd]) - yf[odd], axis=1)
    interp_err = np.maximum(interp_err, 1e-300)
    print(f"interpolant: {len(tf)} saved points; error bound (from every other point) "
          f"{interp_err.max():.2g} at most")  # fmt: skip
    # stiffness along the path: linear stability of GD needs η < 2/λ_max
    picks = np.unique(np.linspace(0, len(tf) - 1, 8).round().astype(int))
    lams = np.array([lambda_max(loss, flow, int(i)) for i in picks])
    k = int(np.argmax(lams))
    print(f"stiffness: λ_max(Λ∇²L̂) along the flow from {lams[0]:.3g} (t = 0) to {lams[-1]:.3g} (t = T), "
          f"largest {lams[k]:.3g} at t = {tf[picks[k]]:.3g}: GD linearly stable for η < 2/λ_max = "
          f"{2 / lams.max():.3g}")  # fmt: skip
    disp = np.linalg.norm(yf - yf[0], axis=1)
    return {"flow": flow, "t_flow": t_flow, "tf": tf, "yf": yf, "dyf": dyf, "odd": odd, "interp_err": interp_err, "disp": disp}


def _gd_runs(base, loss, etas, T, ref) -> tuple[list[dict], float]:
    """Gradient descent at each η on the same sample, and its distance to the flow; also the largest
    (interpolation error bound)/(distance) over every GD point."""
    tf, yf, dyf = ref["tf"], ref["yf"], ref["dyf"]
    runs = []
    worst = 0.0  # largest (interpolation error bound)/(distance) over every GD point
    for eta in etas:
        cfg = base.replace(solver={"method": "gd", "eta": eta, "save_per_decade": 24, "tau_min": eta})
        t0 = time.perf_counter()
        g = gflow.integrate(cfg, loss=loss)
        wall = time.perf_counter() - t0
        tg, yg = g.ts, _theta(g)
        m = tg > 0
        dist = np.linalg.norm(yg[m] - hermite(tf, yf, dyf, np.clip(tg[m], tf[0], tf[-1])), axis=1)
        if not np.isclose(tg[-1], T, rtol=1e-12) or not np.isclose(tf[-1], T, rtol=1e-12):
            raise SystemExit(f"GD (η = {eta}) or the flow did not end at T = {T}: {tg[-1]}, {tf[-1]}")
        end = float(np.linalg.norm(yg[-1] - yf[-1]))  # both exactly at T: no interpolation
        bound = np.exp(np.interp(np.log(tg[m]), np.log(tf[ref["odd"]]), np.log(ref["interp_err"])))
        worst = max(worst, float(np.max(bound / dist)))
        runs.append({"eta": eta, "t": tg[m], "dist": dist, "end": end, "max": float(dist.max()),
                     "steps": g.stages[0].steps, "wall": wall, "loss": float(g.loss[-1])})  # fmt: skip
    return runs, worst


def _panel_distance(ax1, ref, runs, cols) -> None:
    """GD's distance to the flow against t, next to the flow's own motion."""
    tf, disp = ref["tf"], ref["disp"]
    m = tf > 0
    ax1.plot(tf[m], disp[m], color="0.45", ls="--", lw=1.6,
             label=r"flow's own motion $\|\theta_{\rm flow}(t)-\theta(0)\|$")  # fmt: skip
    for r, c in zip(runs, cols):
        ax1.plot(r["t"], r["dist"], "o-", ms=2.5, lw=1.4, color=c, label=rf"GD, $\eta$ = {r['eta']:g}")
    ax1.set_xscale("log")
    ax1.set_yscale("log")
    ax1.set_xlabel(r"time $t = k\eta$")
    ax1.set_ylabel(r"$\|\theta_{\rm GD}(t) - \theta_{\rm flow}(t)\|_2$")
    ax1.set_title("distance between gradient descent and the flow", fontsize=11)
    ax1.grid(alpha=0.3)
    # room below the curves for the legend (the distances grow with t)
    lo = min(float(r["dist"].min()) for r in runs)
    ax1.set_ylim(lo / 1000, 3 * max(float(disp.max()), max(r["max"] for r in runs)))
    ax1.legend(fontsize=9, loc="lower right")


def _panel_order(ax2, order) -> None:
    """The distance at T and its maximum against η, with their log-log fits."""
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

    e, err_end, err_max, p_end, p_max = order
    ax2.loglog(e, err_end, "o", ms=7, color="tab:blue", label=r"at $t = T$")
    ax2.loglog(e, err_max, "s", ms=6, mfc="none", color="tab:orange", label=r"max over $t \leq T$")
    ee = np.geomspace(e.min() / 1.3, e.max() * 1.3, 50)
    for err, pslope, c in ((err_end, p_end, "tab:blue"), (err_max, p_max, "tab:orange")):
        k, b = np.polyfit(np.log(e), np.log(err), 1)
        ax2.loglog(ee, np.exp(b) * ee**k, "-", color=c, lw=1.2, label=f"fit: slope {pslope:.3f}")
    ax2.xaxis.set_major_locator(FixedLocator(e))
    ax2.xaxis.set_minor_locator(NullLocator())
    ax2.xaxis.set_minor_formatter(NullFormatter())
    ax2.set_xticklabels([f"{x:g}" for x in e])
    ax2.set_xlabel(r"step size $\eta$")
    ax2.set_ylabel(r"$\|\theta_{\rm GD} - \theta_{\rm flow}\|_2$")
    ax2.set_title(r"order in $\eta$ (Euler: slope 1)", fontsize=11)
    ax2.grid(alpha=0.3, which="both")
    ax2.legend(fontsize=9, loc="upper left")


def _figure(args, base, ref, runs, order) -> Path:
    import matplotlib as mpl
    from matplotlib.figure import Figure

    with mpl.rc_context({"font.size": 11}):
        fig = Figure(figsize=(11.5, 4.6), dpi=120, layout="constrained")
        ax1, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.25, 1]})
        cmap = mpl.colormaps["viridis"]
        cols = [cmap(0.85 * k / max(len(runs) - 1, 1)) for k in range(len(runs))]
        _panel_distance(ax1, ref, runs, cols)
        _panel_order(ax2, order)
        fig.suptitle(
            rf"GD vs gradient flow on one sample: joint schedule ($\Lambda = I$), d = {base.data.d}, "
            rf"L = {args.L}, N = {args.N}, $c_0$ = {args.c0:g}, $a_0$ = {args.a0:g}, T = {args.T:g}",
            fontsize=12,
        )
        out = save_figure(fig, args.out)
    return out



if __name__ == "__main__":
    raise SystemExit(main())
