"""Benchmark the joint flow against gradient descent, and online SGD's step.

Part ``flow`` — the published setting's joint flow to t = 5·10⁴
------------------------------------------------------------------
The official code's run "CWa" (see ``tests/data/paper_run_CWa.csv``): d = 3, a
3-gram, L = 100, uniform start, ``estimator.loss = "ce_on_probs"``, N = 9000,
``schedule.kind = "joint"`` with every time scale 1, t₁ = 5·10⁴. One sample
(one ``PopulationLoss``) serves both runs, in one process:

1. the joint flow with the default solver (Tsit5, rtol 1e-8, atol 1e-10, the selector
   integrated in log coordinates ℓ = log|C|; CHANGELOG.md, the joint flow in log coordinates);
   ``--methods`` adds others, e.g. ``kvaerno5`` or ``tsit5:C`` (the old coordinates,
   which do not finish in reasonable time: ``--tmax`` caps their wall time);
2. gradient descent, ``solver.method = "gd"``, η = 1: 50,000 gradients.

Printed: vector-field evaluations, accepted/rejected steps and wall time (compilation
included, the first call of each in the process) of each, the ratio GD/flow of
evaluations and of wall time, and the agreement ``max |a_flow(t) − a_GD(t)|`` over
GD's saved times t ≥ 100 (the flow interpolated linearly in log t between its saved
times, 12 a decade), with the end values of a, the loss and the selected c_S/Σc.
Target: ≥ 10× fewer evaluations than GD and less wall time, at |Δa| ≤ 0.02: an adaptive
solver of the limit should reach any time far more cheaply than the training it limits,
or integrating the flow would not be worth it.

Part ``sgd`` — one online SGD step
----------------------------------
``gflow.dynamics._sgd`` on the same model (d = 3, L = 100): the wall time of one step (fresh
sequences drawn, their features, one gradient) at batch B = 1000 after compilation, as
``gflow.dynamics._sgd`` runs it: ``--fuse`` steps (default 20) in one compiled ``fori_loop`` call,
the time of a call divided by the steps; min and median over ``--reps`` calls; for one
seed and for R = 8 seeds (each seed's sequences from its own key, features and
gradients of all seeds in one call). Targets: ≤ 2 ms, and R = 8 ≤ 3× one seed.

Usage::

    python scripts/benchmarks/bench_joint.py                 # both parts (several minutes: GD is ~6 min alone)
    python scripts/benchmarks/bench_joint.py --part sgd
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import gflow


def published(t1: float = 5e4) -> gflow.Config:
    return gflow.Config().replace(
        data={"start": "uniform"},
        estimator={"N": 9000, "loss": "ce_on_probs"},
        schedule={"kind": "joint", "t1": t1},
    )


def _a_at(tr, ts):
    lt = np.log(tr.ts[1:])
    return np.interp(np.log(ts), lt, tr.a[1:])


def part_flow(args):
    cfg = published(args.t1)
    loss = gflow.make_loss(cfg.data, cfg.model, cfg.estimator)
    runs = {}
    for spec in args.methods:
        method, _, coords = spec.partition(":")
        c = cfg.replace(solver={"method": method, "joint_coords": coords or "log"})
        t0 = time.perf_counter()
        tr = _capped(c, loss, args.tmax) if coords == "C" else gflow.integrate(c, loss=loss)
        runs[spec] = (tr, time.perf_counter() - t0)
    t0 = time.perf_counter()
    gd = gflow.integrate(cfg.replace(solver={"method": "gd", "eta": 1.0}), loss=loss)
    runs["gd η=1"] = (gd, time.perf_counter() - t0)
    print(f"published joint setting to t1 = {args.t1:g}; load average {os.getloadavg()}")
    print(f"{'run':>14} {'t reached':>10} {'steps':>6} {'rejected':>8} {'nfev':>7} {'wall s':>8} "
          f"{'a(t1)':>9} {'loss(t1)':>10} {'max c_S/Σc':>10} {'max|Δa| t≥100':>13}")  # fmt: skip
    sel = gd.ts >= 100
    for name, (tr, wall) in runs.items():
        st = tr.stages[0]
        ok = sel & (gd.ts <= tr.ts[-1])
        da = np.max(np.abs(_a_at(tr, gd.ts[ok]) - gd.a[ok])) if name != "gd η=1" and ok.any() else 0.0
        print(f"{name:>14} {tr.ts[-1]:10.4g} {st.steps:6d} {st.rejected:8d} {st.nfev:7d} {wall:8.1f} "
              f"{tr.a[-1]:9.5f} {tr.loss[-1]:10.6f} {tr.c_frac[-1].max():10.6f} {da:13.2e}")  # fmt: skip
    g, gw = gd.stages[0].nfev, runs["gd η=1"][1]
    for name, (tr, wall) in runs.items():
        if name != "gd η=1" and tr.ts[-1] >= args.t1 * (1 - 1e-9):
            print(f"GD/{name}: {g / tr.stages[0].nfev:.1f}× the evaluations, {gw / wall:.2f}× the wall time")


def _capped(cfg, loss, tmax):
    """Integrate decade by decade of t (resuming); a run that exceeds ``tmax`` seconds of
    wall time is cut at the end of a decade: its trajectory so far is returned."""
    t0 = time.perf_counter()
    t_end = cfg.schedule.t1
    tr = None
    t = 1e-3
    while True:
        t = min(t * 10, t_end)
        c = cfg.replace(schedule={"t1": t})
        tr = gflow.integrate(c, loss=loss) if tr is None else _resume(tr, c, loss)
        if t >= t_end or time.perf_counter() - t0 > tmax:
            return tr


def _resume(tr, cfg, loss):
    import tempfile

    from gflow.trajectory import save

    with tempfile.TemporaryDirectory() as d:
        save(tr, d)
        return gflow.integrate(cfg, out=d, resume=True, loss=loss)


def part_sgd(args):
    """One device in this process; ``--devices D`` (D > 1) re-runs this part in a child
    process with D forced host devices (the flag must be set before JAX starts)."""
    if args.devices > 1 and not args.child:
        import subprocess
        import sys

        env = dict(os.environ)
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={args.devices}").strip()
        cmd = [sys.executable, __file__, "--part", "sgd", "--child", "--devices", str(args.devices),
               "--batch", str(args.batch), "--reps", str(args.reps), "--fuse", str(args.fuse)]  # fmt: skip
        subprocess.run(cmd, env=env, check=True)
        return
    import jax
    import jax.numpy as jnp

    from gflow.dynamics._sgd import SGDConfig, _advance, _make_stepper, _sgd_runner

    cfg = published().replace(data={"L": 100}, estimator={"N": args.batch})
    loss = gflow.make_loss(cfg.data, cfg.model, cfg.estimator)  # only a template for "fresh"
    K = args.fuse
    D = jax.device_count()
    med = {}
    for R, shard in ((1, "none" if D == 1 else "batch"), (8, "none" if D == 1 else "seeds")):
        sc = SGDConfig(eta=0.1, batch=args.batch, steps=1, seeds=R, shard=shard)
        _, (P, keys, _) = _sgd_runner(cfg, sc, loss)
        st = _make_stepper(cfg, sc, loss)
        k = 0
        jax.block_until_ready(_advance(st, P, keys, jnp.asarray(k), jnp.asarray(k + K)))  # compile
        times = []
        c0 = os.times()
        for _ in range(args.reps):
            t0 = time.perf_counter()
            P = jax.block_until_ready(_advance(st, P, keys, jnp.asarray(k), jnp.asarray(k + K)))
            times.append((time.perf_counter() - t0) / K)
            k += K
        c1 = os.times()
        med[R] = (np.min(times), np.median(times))
        cores = (c1.user - c0.user + c1.system - c0.system) / (K * np.sum(times))
        print(f"SGD step, B = {args.batch}, R = {R}, {D} device(s), sgd.shard = {shard!r} (fresh sequences; "
              f"{K} steps fused per call): min {1e3 * np.min(times):.3f} ms, median {1e3 * np.median(times):.3f} ms "
              f"a step over {args.reps} calls; process CPU time / wall time {cores:.2f}; "
              f"load average {os.getloadavg()}")  # fmt: skip
    print(f"{D} device(s): R = 8 / R = 1: {med[8][0] / med[1][0]:.2f}× (min), {med[8][1] / med[1][1]:.2f}× (median)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("flow", "sgd", "all"), default="all")
    ap.add_argument("--t1", type=float, default=5e4)
    ap.add_argument("--methods", nargs="+", default=["tsit5"],
                    help="flow solvers to time: tsit5, kvaerno5, optionally ':C' for the old coordinates")  # fmt: skip
    ap.add_argument("--tmax", type=float, default=900.0, help="wall-time cap of each flow run (s)")
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=30, help="timed calls of the SGD part")
    ap.add_argument("--fuse", type=int, default=20, help="SGD steps fused in one call (one fori_loop)")
    ap.add_argument("--devices", type=int, default=1,
                    help="SGD part: also time D forced host devices (sgd.shard: 'batch' for R = 1, 'seeds' for R = 8)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.part in ("flow", "all"):
        part_flow(args)
    if args.part in ("sgd", "all"):
        if not args.child:
            part_sgd(argparse.Namespace(**{**vars(args), "devices": 1}))
        if args.devices > 1:
            part_sgd(args)


if __name__ == "__main__":
    main()
