"""Benchmark the default staged run (``gflow.Config()``) as the sample grows.

For N = 10⁴, 10⁵ and 10⁶ sequences (by default), each in a fresh subprocess:

- the wall time of the default staged run (the paper's configuration: d = 3,
  trigram, L = 100, TF(3, 3, 3, 2), events on), split into drawing the sample
  and its features, and each stage (compilation included, as a user sees it);
- the peak memory of the child (``ru_maxrss`` from ``os.wait4``, i.e. the
  child's own peak resident set, not the parent's), and the resident set
  after JAX's start-up (the baseline every run pays);
- the throughput in sequence-gradient evaluations per second, two ways:
  end to end, ``N × (vector-field evaluations) / (wall time of the stages)``
  (this includes compilation and the loss/gradient/standard-error statistics
  computed at every saved time), and for the vector field alone,
  ``N / (time of one jitted loss + gradient)`` after compilation.

The sample's loss is evaluated in chunks of ``--chunk`` sequences
(``estimator.chunk``) when N is larger than that, so the working memory of an
evaluation is bounded; the sample itself (window counts
float64, ``(N, 3, 64)``: 1.5 kB a sequence) is held in memory whole.

``--max-minutes``: a size of at least ``--short-from`` (10⁶) whose predicted
full run (extrapolated linearly in N from the largest full run before it)
exceeds this budget (default 60 min; the full N = 10⁶ run takes about 37 min
here) runs a shortened schedule instead — Stage I for one time unit (its
event comes at t ≈ 5), then Stages II and III for a token ``1e-3``, saving at
τ = 0.1, 0.32 and 1 — and the table says so.

The "one block of 32 saved-time statistics" figure is the cost of the loss,
gradient and standard errors at 32 saved states (the flow computes them in
blocks of one solve's saved points, ``solver.save_per_decade + 1``).

``--devices 4``: also run the default configuration at N = ``--devices-N``
sharded over 4 forced host devices (``XLA_FLAGS=
--xla_force_host_platform_device_count=4``, ``estimator.shard = true``) and
compare its trajectory with the single-device one. On a CPU these "devices"
share the same cores: their speed means nothing; only the equality of the
results does.

Usage::

    python scripts/benchmarks/bench_scale.py                       # 1e4, 1e5, 1e6 and the 4-device check
    python scripts/benchmarks/bench_scale.py --sizes 1e4 --devices 0
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from _bench import median_s, rss_mb

# The shortened run (see the module docstring): Stage I for one time unit
# (about a fifth of the way to its event at the default), Stages II and III
# for a token 1e-3, saving at τ = 0.1, 0.32, 1 (and 1e-3 in II and III).
SHORT_DURATIONS = (1.0, 1e-3, 1e-3)
SHORT_SOLVER = {"tau_min": 0.1, "save_per_decade": 2}


def child(job: dict) -> dict:
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import numpy as np

    import gflow
    from gflow.core._loss import StageLoss
    from gflow.core._model import Params
    from gflow.dynamics import _flow as gflow_flow

    jax.block_until_ready(jnp.ones(3) + 1)
    rss0 = rss_mb("VmRSS")
    N = int(job["N"])
    cfg = gflow.Config().replace(estimator={"N": N, "chunk": int(job["chunk"]), "shard": bool(job["shard"])})
    if job["short"]:
        cfg = cfg.replace(schedule={"durations": list(SHORT_DURATIONS)}, solver=dict(SHORT_SOLVER))
    t0 = time.perf_counter()
    loss = gflow.make_loss(cfg.data, cfg.model, cfg.estimator)
    jax.block_until_ready(loss)
    t_sample = time.perf_counter() - t0
    rss_sample = rss_mb("VmRSS")

    t1 = time.perf_counter()
    traj = gflow.integrate(cfg, loss=loss, out=job.get("out"), overwrite=True)
    t_run = time.perf_counter() - t1

    def timed(fn, *a):
        return median_s(lambda: fn(*a), 3)

    # The vector fields alone, after compilation. Each stage's field is the
    # gradient of the loss in the moving block only, with what depends on the
    # frozen blocks computed once at the stage's start (gflow.core._loss.StageLoss):
    # Stage I (C) and III (a) are much cheaper than the full gradient, which
    # Stage II (w) and the joint schedule need.
    p = Params(**{k: jnp.asarray(v) for k, v in traj.state(0).items()})
    t_vg = timed(eqx.filter_jit(lambda f, q: f.value_and_grad(q)), loss, p)
    t_stage = {}
    for name, moves in (("I", ("C",)), ("II", ("w",)), ("III", ("a",))):
        sl = eqx.filter_jit(lambda f, q, m=moves: StageLoss(f, q, m))(loss, p)
        t_stage[name] = timed(eqx.filter_jit(lambda s_: jax.grad(s_)(s_.init())), sl)
    # one block of saved-time statistics (loss, gradient, standard errors of
    # 32 saved states: what every solve of a stage costs after it)
    blk = Params(**{k: jnp.broadcast_to(jnp.asarray(v), (32,) + np.shape(v)) for k, v in traj.state(0).items()})
    jax.block_until_ready(gflow_flow._stats_at(loss, blk))
    t = time.perf_counter()
    jax.block_until_ready(gflow_flow._stats_at(loss, blk))
    t_stats32 = time.perf_counter() - t

    nfev = sum(s.nfev for s in traj.stages)
    return {
        "N": N,
        "chunk": int(job["chunk"]),
        "shard": bool(job["shard"]),
        "devices": len(jax.devices()),
        "short": bool(job["short"]),
        "t_sample": t_sample,
        "t_run": t_run,
        "stages": [
            {"name": s.name, "t0": s.t0, "t1": s.t1, "ended_by": s.ended_by, "steps": s.steps,
             "rejected": s.rejected, "nfev": s.nfev, "wall": s.wall}
            for s in traj.stages
        ],  # fmt: skip
        "n_saved": len(traj.ts),
        "nfev": nfev,
        "t_vg": t_vg,
        "t_stage_vf": t_stage,
        "t_stats32": t_stats32,
        "final": {"a": float(traj.a[-1]), "loss": float(traj.loss[-1]), "loss_se": float(traj.loss_se[-1]),
                  "c_frac_max": float(traj.c_frac[-1].max())},  # fmt: skip
        "rss_baseline_mb": rss0,
        "rss_after_sample_mb": rss_sample,
        "vm_hwm_mb": rss_mb("VmHWM"),
        "status": traj.status,
    }


def spawn(job: dict, *, devices: int = 1) -> tuple[dict, float, float]:
    """Run one job in a fresh interpreter: (its result, its peak RSS in MB from
    ``os.wait4``, wall time)."""
    env = dict(os.environ)
    if devices > 1:
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices}").strip()
        env["JAX_PLATFORMS"] = "cpu"
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out:
        p = subprocess.Popen([sys.executable, __file__, "--child", json.dumps(job)], stdout=out, env=env)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        out.seek(0)
        text = out.read()
    if p.returncode != 0:
        raise RuntimeError(f"child {job} failed with exit code {p.returncode}:\n{text[-3000:]}")
    res = json.loads(next(x for x in text.splitlines()[::-1] if x.startswith("{")))
    return res, ru.ru_maxrss / 1024.0, wall  # ru_maxrss is in kB on Linux


def _fmt_row(r: dict, peak: float, wall: float) -> str:
    N = r["N"]
    stage_wall = sum(s["wall"] for s in r["stages"])
    e2e = N * r["nfev"] / stage_wall
    vf = N / r["t_vg"]
    tv = r["t_stage_vf"]
    per_stage = ", ".join(f"{k} {tv[k] * 1e3:.1f} ms ({N / tv[k]:,.0f} /s)" for k in ("I", "II", "III"))
    st = "; ".join(f"{s['name']} {s['t1'] - s['t0']:.4g} ({s['ended_by']}, nfev {s['nfev']}, {s['wall']:.0f} s)"
                   for s in r["stages"])  # fmt: skip
    return (
        f"N = {N:>9,}  chunk {r['chunk'] or '—':>7}  {'SHORTENED (Stage I to t = 1, token II/III)' if r['short'] else 'full'}\n"
        f"    wall: process {wall:.0f} s = sample+features {r['t_sample']:.1f} s + run {r['t_run']:.0f} s (+ start-up, timing)\n"
        f"    stages: {st}\n"
        f"    saved times {r['n_saved']}, vector-field evaluations {r['nfev']}\n"
        f"    peak RSS (ru_maxrss of the child) {peak:,.0f} MB; baseline after JAX start-up {r['rss_baseline_mb']:.0f} MB;"
        f" after the sample {r['rss_after_sample_mb']:.0f} MB\n"
        f"    throughput: end to end {e2e:,.0f} sequence-gradients/s (N·nfev / stage wall, compilation and"
        f" saved-time statistics included)\n"
        f"    one evaluation of each stage's vector field: {per_stage}; the full loss+gradient"
        f" {r['t_vg'] * 1e3:.1f} ms ({vf:,.0f} /s); one block of 32 saved-time statistics {r['t_stats32']:.2f} s\n"
        f"    end: a = {r['final']['a']:.6f}, loss = {r['final']['loss']:.6f} ± {r['final']['loss_se']:.2g},"
        f" max c/Σc = {r['final']['c_frac_max']:.4f}; status {r['status']}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--sizes", default="1e4,1e5,1e6", help="sample sizes N (comma-separated)")
    ap.add_argument("--chunk", type=int, default=50_000, help="estimator.chunk for N above it (default 50,000)")
    ap.add_argument("--max-minutes", type=float, default=60.0,
                    help="shorten a run whose extrapolated time exceeds this (default 60)")  # fmt: skip
    ap.add_argument("--short-from", type=float, default=1e6, help="smallest N that may be shortened (default 1e6)")
    ap.add_argument("--devices", type=int, default=4, help="forced host devices for the sharding check (0: skip)")
    ap.add_argument("--devices-N", type=float, default=1e4, help="N of the sharding check (default 1e4)")
    ap.add_argument("--json", help="also write every measurement to this file")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))), flush=True)
        return

    print(f"bench_scale: gflow.Config() (d=3, parents (1,2), L=100, M=H=3, D=2, float64, staged, events on); "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start", flush=True)  # fmt: skip
    results = []
    last = None
    for N in (int(float(x)) for x in args.sizes.split(",")):
        chunk = args.chunk if N > args.chunk else 0
        short = False
        if last is not None:
            predicted = last["t_run"] * N / last["N"] / 60
            short = predicted > args.max_minutes and N >= args.short_from
            if short:
                print(f"  N = {N:,}: the full run extrapolates to ~{predicted:.0f} min (> {args.max_minutes:g}): "
                      f"running the shortened schedule instead (durations {SHORT_DURATIONS}, solver {SHORT_SOLVER})",
                      flush=True)  # fmt: skip
        load0 = os.getloadavg()[0]
        r, peak, wall = spawn({"N": N, "chunk": chunk, "shard": False, "short": short})
        results.append({"result": r, "peak_mb": peak, "wall": wall, "load": [load0, os.getloadavg()[0]]})
        print(_fmt_row(r, peak, wall) + f"\n    load average {load0:.1f} at start, {os.getloadavg()[0]:.1f} at end",
              flush=True)  # fmt: skip
        if not r["short"]:
            last = r
    if args.devices > 1:
        N = int(args.devices_N)
        with tempfile.TemporaryDirectory() as tmp:
            one, _, _ = spawn({"N": N, "chunk": 0, "shard": False, "short": False, "out": f"{tmp}/one"})
            many, peak, wall = spawn({"N": N, "chunk": 0, "shard": True, "short": False, "out": f"{tmp}/many"},
                                     devices=args.devices)  # fmt: skip
            import numpy as np

            a = np.load(f"{tmp}/one/trajectory.npz")
            b = np.load(f"{tmp}/many/trajectory.npz")
            same_len = a["ts"].shape == b["ts"].shape
            dev = {}
            if same_len:
                for k in a.files:
                    x, y = np.asarray(a[k], float), np.asarray(b[k], float)
                    scale = max(float(np.max(np.abs(x))), 1e-300)
                    dev[k] = float(np.max(np.abs(x - y)) / scale)
        steps_one = [s["steps"] for s in one["stages"]]
        steps_many = [s["steps"] for s in many["stages"]]
        print(f"sharding check: N = {N:,} on {many['devices']} forced host devices (estimator.shard = true)", flush=True)
        print(f"    solver steps per stage: 1 device {steps_one}, {many['devices']} devices {steps_many}")
        if same_len:
            worst = max(dev, key=dev.get)
            print(f"    same saved times ({len(a['ts'])}); largest relative deviation over every trajectory array: "
                  f"{dev[worst]:.2e} ({worst}); loss at the end {one['final']['loss']:.12f} vs {many['final']['loss']:.12f}")
        else:
            print(f"    different numbers of saved times: {a['ts'].shape} vs {b['ts'].shape}")
        print(f"    wall: 1 device {one['t_run']:.0f} s, {many['devices']} fake devices {many['t_run']:.0f} s — "
              "the fake devices share this machine's cores: their speed means nothing")
        results.append({"sharding": {"one": one, "many": many, "deviation": dev if same_len else None}})
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
