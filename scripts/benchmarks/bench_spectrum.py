"""What the Hessian spectrum and GD's modified flow cost, in gradients (docs/theory/mathematics.md §M9).

Two ratios, each measured in one process with the calls interleaved (the machine is
shared: a ratio of interleaved medians is robust to load that drifts, an absolute
time is not); each timed call follows an untimed call of the same program:

1. **spectrum / gradient**: the eigenvalues of ``Λ^{1/2} H Λ^{1/2}`` at one saved
   state (:func:`gflow.hessian_spectrum`'s compiled Hessian block of the moving
   coordinates, then ``eigh`` on the host), over one gradient ``∇L̂`` (``jax.grad`` of
   the same loss, jitted). Target: at most ``2·dim θ`` (34 at the default).
2. **modified field / gradient**: one evaluation of the modified flow's vector field
   ``−Λg − (η/2)ΛHΛg`` (the joint schedule's, in the flow's log coordinates, as
   ``solver.method = "modified"`` evaluates it), over one gradient; the flow's own
   field is timed too, and both fields in θ's own coordinates (C: the staged
   schedule's, and the joint one with ``solver.joint_coords = "C"``). Target: at most 3.

At the paper's default (N = 10⁴, L = 100, d = 3, the counts layout; joint Λ = I, so
every coordinate moves: the most expensive spectrum). ``--published`` also measures
the published setting (joint, ce_on_probs, uniform start, N = 9000, head_norm,
shifted windows, drawn target) in the sparse layout (its ``"auto"`` layout) and in the
heads layout. The counts and sparse layouts compute the Hessian and the modified field
by the κ table's structure (``gflow.core.table_hessian``, ``grad_hvp``); the heads
layout by JAX's Hessian-vector products.

Usage::

    python scripts/benchmarks/bench_spectrum.py            # the default, N = 10^4
    python scripts/benchmarks/bench_spectrum.py --published --reps 15
"""

from __future__ import annotations

import argparse
import statistics
import time

from _bench import load_str, print


def _timed(fn) -> float:
    import jax

    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - t0


def measure(cfg, reps: int) -> dict:
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import numpy as np

    import gflow
    from gflow.core import StageLoss
    from gflow.dynamics import LogC, VectorField, block_scales

    loss = gflow.make_loss(cfg.data, cfg.model, cfg.estimator)
    p = gflow.init_params(cfg.model, cfg.init)
    P = p.w.size + p.C.size + 1
    grad = eqx.filter_jit(lambda loss, p: loss.grad(p))

    class _State:  # one saved state, as a trajectory holds it
        ts = np.zeros(1)
        w, C, a = np.asarray(p.w)[None], np.asarray(p.C)[None], np.asarray(p.a)[None]

    def spectrum():  # the public function at one saved time (its loss given: the run's sample)
        return gflow.hessian_spectrum(cfg, _State, loss=loss).eigvals

    moves = ("w", "C", "a")
    sl = StageLoss(loss, p, moves)
    scale = block_scales(cfg, moves, jnp.float64)
    sign, ell = LogC.to_log(np.asarray(p.C))
    y = {"w": p.w, "C": jnp.asarray(ell), "a": p.a}
    flow = VectorField(stage_loss=sl, scale=scale, sign_C=jnp.asarray(sign))
    modified = VectorField(stage_loss=sl, scale=scale, sign_C=jnp.asarray(sign), eta_mod=jnp.asarray(0.5))
    f_flow = eqx.filter_jit(lambda v, y: v(0.0, y, None))
    f_mod = eqx.filter_jit(lambda v, y: v(0.0, y, None))
    # the same fields in θ's own coordinates (the staged schedule's, and the joint one with joint_coords = "C")
    yc = {"w": p.w, "C": p.C, "a": p.a}
    flow_c = VectorField(stage_loss=sl, scale=scale)
    modified_c = VectorField(stage_loss=sl, scale=scale, eta_mod=jnp.asarray(0.5))
    f_flow_c = eqx.filter_jit(lambda v, y: v(0.0, y, None))
    f_mod_c = eqx.filter_jit(lambda v, y: v(0.0, y, None))

    calls = {
        "gradient": lambda: grad(loss, p),
        "spectrum": spectrum,
        "flow field": lambda: f_flow(flow, y),
        "modified field": lambda: f_mod(modified, y),
        "flow field (C)": lambda: f_flow_c(flow_c, yc),
        "modified (C)": lambda: f_mod_c(modified_c, yc),
    }
    for fn in calls.values():  # compile
        jax.block_until_ready(fn())
    times = {k: [] for k in calls}
    for _ in range(reps):
        for k, fn in calls.items():
            # one untimed call first: a solve evaluates its field again and again, so each call is
            # timed with its own working set warm (timed right after another program, the first
            # call ran up to 1.5x slower, whatever the program: an artefact of the order)
            jax.block_until_ready(fn())
            times[k].append(_timed(fn))
    med = {k: statistics.median(v) for k, v in times.items()}
    # ratios of interleaved pairs, then their median: robust to load that drifts within the run
    ratio = {k: statistics.median(a / b for a, b in zip(times[k], times["gradient"])) for k in calls}
    return {"P": P, "median_s": med, "ratio": ratio}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--N", type=int, default=10_000)
    ap.add_argument("--published", action="store_true", help="also the published setting (N = 9000; sparse and heads layouts)")
    args = ap.parse_args(argv)

    import gflow

    settings = {"default (joint, Λ = I)": gflow.Config().replace(schedule={"kind": "joint"},
                                                                 estimator={"N": args.N})}  # fmt: skip
    if args.published:
        for layout in ("sparse", "heads"):
            settings[f"published (joint, {layout} layout)"] = gflow.Config().replace(
                data={"start": "uniform"}, model={"head_norm": True, "windows": "shifted"},
                schedule={"kind": "joint"},
                estimator={"N": 9000, "loss": "ce_on_probs", "target": "drawn", "layout": layout},
            )  # fmt: skip
    print(f"bench_spectrum: {args.reps} interleaved repetitions; {load_str()}")
    for name, cfg in settings.items():
        r = measure(cfg, args.reps)
        P = r["P"]
        m, q = r["median_s"], r["ratio"]
        print(f"\n{name}: N = {cfg.estimator.N}, L = {cfg.data.L}, dim θ = {P}")
        for k in m:
            print(f"  {k:15s} median {1e3 * m[k]:8.2f} ms   ratio to one gradient {q[k]:6.2f}")
        print(f"  spectrum at one saved time / one gradient = {q['spectrum']:.2f} "
              f"(target <= 2·dim θ = {2 * P}): {'OK' if q['spectrum'] <= 2 * P else 'OVER'}")  # fmt: skip
        print(f"  one modified-field evaluation / one gradient = {q['modified field']:.2f} "
              f"(target <= 3): {'OK' if q['modified field'] <= 3 else 'OVER'}; "
              f"/ one flow-field evaluation = {q['modified field'] / q['flow field']:.2f}; in θ's own coordinates "
              f"{q['modified (C)']:.2f} (/ flow field {q['modified (C)'] / q['flow field (C)']:.2f})")  # fmt: skip
    print(f"\n{load_str()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
