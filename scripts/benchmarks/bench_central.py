"""What GD's central flow costs against GD and the flow, and how close each is to GD
(docs/theory/central-flow.md).

For each η of a grid, three runs of the same joint schedule on one sample (the flow's default data
at d = 3, L = 20, N = 300, t₁ = 20 unless changed), saved at t = 1, 2, …, t₁ (GD's iterates):
the flow (Tsit5), GD at η, and the central flow at η. Printed per η: each run's field
evaluations and wall time (compilation included: one process, runs in this order), the central
flow's evaluations in gradients' work (each evaluation: a gradient, the structured Hessian, and
past the edge one third-derivative product, timed on their own below), and the mean and final
‖θ − θ_GD‖ of the flow and the central flow over the saved times.

Then where the central flow's time goes, at a state past the edge: one gradient, the Hessian,
one evaluation of the field below the edge (no eigenvalue held) and one at the edge (one held),
each the median of `--reps` timed calls after an untimed one.

Usage::

    python scripts/benchmarks/bench_central.py                      # η = 0.1, 0.03
    python scripts/benchmarks/bench_central.py --eta 0.3 0.1 0.03 0.01 --t1 20
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
from _bench import print

jax.config.update("jax_enable_x64", True)

import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import gflow  # noqa: E402
from gflow.core import Params, StageLoss, make_loss, table_hessian  # noqa: E402
from gflow.dynamics import block_scales  # noqa: E402
from gflow.dynamics._central import edge_terms  # noqa: E402


def _median(fn, reps: int) -> float:
    jax.block_until_ready(fn())
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--eta", type=float, nargs="+", default=[0.1, 0.03])
    ap.add_argument("--t1", type=float, default=20.0)
    ap.add_argument("--L", type=int, default=20)
    ap.add_argument("--N", type=int, default=300)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    times = [float(t) for t in range(1, int(args.t1) + 1)]
    cfg = gflow.Config().replace(data={"L": args.L}, estimator={"N": args.N}, schedule={"kind": "joint", "t1": args.t1})
    loss = make_loss(cfg.data, cfg.model, cfg.estimator)
    print(f"joint flow, d = {cfg.data.d}, L = {args.L}, N = {args.N}, t1 = {args.t1:g}; distances at t = 1..{int(args.t1)}")

    def theta(tr, at):
        i = [int(np.argmin(np.abs(tr.ts - t))) for t in at]
        assert np.allclose(tr.ts[i], at, rtol=0, atol=1e-9), "a time was not saved"
        return np.concatenate([tr.w[i].reshape(len(i), -1), tr.C[i], tr.a[i, None]], axis=1)

    last = None
    for eta in args.eta:
        runs, wall = {}, {}
        at = [round(t / eta) * eta for t in times]  # GD's iterates nearest t = 1, 2, …
        for m in ("tsit5", "gd", "central"):
            t = time.perf_counter()
            runs[m] = gflow.integrate(cfg.replace(solver={"method": m, "eta": eta, "save_times": at}), loss=loss)
            wall[m] = time.perf_counter() - t
        gd = theta(runs["gd"], at)
        d = {m: np.linalg.norm(theta(runs[m], at) - gd, axis=1) for m in ("tsit5", "central")}
        nfev = {m: sum(r.nfev for r in runs[m].stages) for m in runs}
        print(f"\nη = {eta:g} (edge 2/η = {2 / eta:g})")
        for m, name in (("gd", "GD"), ("tsit5", "flow"), ("central", "central flow")):
            dist = "" if m == "gd" else f"; ‖θ − θ_GD‖ mean {d[m].mean():.4g}, end {d[m][-1]:.4g}, max {d[m].max():.4g}"
            print(f"  {name:13s} {nfev[m]:6d} evaluations, {wall[m]:6.1f} s{dist}")
        print(f"  central flow / flow distance to GD: mean {d['central'].mean() / d['tsit5'].mean():.3f}, "
              f"end {d['central'][-1] / d['tsit5'][-1]:.3f}")  # fmt: skip
        last = (eta, runs["central"])

    # where the time goes, at the central run's last state (past the edge)
    eta, tr = last
    p = Params.from_blocks({b: jnp.asarray(v) for b, v in tr.state(-1).items()})
    moves = ("w", "C", "a")
    sl = StageLoss(loss, p, moves)
    sc = block_scales(cfg, moves, jnp.float64)
    x = {b: p.get(b) for b in moves}
    grad = eqx.filter_jit(lambda sl, x: jax.grad(sl)(x))
    hess = eqx.filter_jit(lambda loss, p: table_hessian(loss, p))
    field = eqx.filter_jit(lambda sl, x, e: edge_terms(sl, sc, x, e, 2).push)
    held = int(eqx.filter_jit(lambda sl, x, e: edge_terms(sl, sc, x, e, 2).k)(sl, x, jnp.asarray(eta)))
    tg = _median(lambda: grad(sl, x), args.reps)
    th = _median(lambda: hess(loss, p), args.reps)
    t_below = _median(lambda: field(sl, x, jnp.asarray(1e-6)), args.reps)
    t_edge = _median(lambda: field(sl, x, jnp.asarray(eta)), args.reps)
    print(f"\nat the central run's last state (η = {eta:g}, {held} eigenvalue(s) held), median of {args.reps}:")
    print(f"  gradient {tg * 1e3:.2f} ms; structured Hessian {th * 1e3:.2f} ms ({th / tg:.1f} gradients)")
    print(f"  central field below the edge {t_below * 1e3:.2f} ms ({t_below / tg:.1f} gradients), "
          f"at the edge {t_edge * 1e3:.2f} ms ({t_edge / tg:.1f} gradients)")  # fmt: skip
    c = sum(r.nfev for r in tr.stages)
    print(f"  the central run's {c} evaluations ≈ {c * t_edge / tg:.0f} gradients at most, against GD's "
          f"{int(round(args.t1 / eta))}: ≤ {c * t_edge / tg / (args.t1 / eta):.0f}× GD's gradient evaluations")  # fmt: skip


if __name__ == "__main__":
    main()
