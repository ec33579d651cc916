"""Why tsit5 stalls on the official Full model past t ≈ 8.4 (docs/results/official-full.md,
"What this costs"): from a saved state of the w₊ = 3 flow (default: sample 0 at t = 8,
``runs/official_full/w3_seed0``), in the solver's coordinates (log|C| for the selector),

- the largest |eigenvalue| of the field's Jacobian (108 forward-mode columns, sparse layout);
- tsit5 steps at the given tolerances over one time unit (``--steps`` at most): accepted,
  rejected, and the last step sizes;
- along those steps, how many of each head's second-layer inner products ⟨u_q, u_l⟩ (every
  (query window, key window, key token) of the 364 windows) change sign between steps.

Usage::

    python3 scripts/studies/official_full_steps.py --rtol 1e-6 --atol 1e-9   # stalls near t + 0.44
    python3 scripts/studies/official_full_steps.py --rtol 1e-4 --atol 1e-6   # the shipped tolerances
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

import gflow
from gflow.core import Params, StageLoss, make_loss, member_of
from gflow.core._paper import sparse_windows
from gflow.dynamics._flow import stage_blocks
from gflow.dynamics._solve import LogC, VectorField, block_scales

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, default=ROOT / "runs" / "official_full" / "w3_seed0")
    ap.add_argument("--rtol", type=float, default=1e-6)
    ap.add_argument("--atol", type=float, default=1e-9)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--no-jacobian", action="store_true")
    ap.add_argument("--solver", default="tsit5", choices=("tsit5", "bosh3", "heun", "ralston", "midpoint"))
    ap.add_argument("--t", type=float, default=1.0, help="how far to integrate (default one time unit)")
    args = ap.parse_args()
    jax.config.update("jax_enable_x64", True)
    cfg = gflow.load_config(ROOT / "scripts" / "configs" / "official_full.toml")
    tr = gflow.load(args.run)
    cfg = cfg.replace(estimator={"seed": tr.config.estimator.seed, "layout": "sparse"})
    loss = make_loss(cfg.data, cfg.model, cfg.estimator)
    p = Params.from_blocks({b: jnp.asarray(v) for b, v in tr.state(len(tr.ts) - 1).items()})
    # the joint flow's own field (gflow.dynamics: every block moving, the selector in log|C|)
    moves = stage_blocks(cfg, "joint")
    sign, ell = LogC.to_log(np.asarray(p.C))
    vf = VectorField(stage_loss=StageLoss(loss, p, moves), scale=block_scales(cfg, moves, jnp.float64),
                     sign_C=jnp.asarray(sign))  # fmt: skip
    flat, unr = ravel_pytree({b: jnp.asarray(ell) if b == "C" else p.get(b) for b in moves})

    def field(t, fl, args):
        return ravel_pytree(vf(t, unr(fl), args))[0]

    print(f"from t = {tr.ts[-1]:.4g} ({args.run.name}), {flat.size} parameters")
    if not args.no_jacobian:
        jv = jax.jit(lambda v: jax.jvp(lambda f: field(0.0, f, None), (flat,), (v,))[1])
        J = np.stack([np.asarray(jv(jnp.eye(flat.size)[j])) for j in range(flat.size)], 1)
        print(f"largest |eigenvalue| of the field's Jacobian: {np.abs(np.linalg.eigvals(J)).max():.3g}")
    solver = {"tsit5": diffrax.Tsit5, "bosh3": diffrax.Bosh3, "heun": diffrax.Heun, "ralston": diffrax.Ralston,
              "midpoint": diffrax.Midpoint}[args.solver]()
    t0 = time.perf_counter()
    sol = jax.jit(lambda y: diffrax.diffeqsolve(
        diffrax.ODETerm(field), solver, 0.0, args.t, None, y, saveat=diffrax.SaveAt(steps=True),
        stepsize_controller=diffrax.PIDController(rtol=args.rtol, atol=args.atol), max_steps=args.steps,
        throw=False))(flat)  # fmt: skip
    ts = np.asarray(sol.ts)
    print(f"{args.solver}: {time.perf_counter() - t0:.1f} s (with compilation)")
    ok = np.isfinite(ts)
    ts, ys = ts[ok], np.asarray(sol.ys)[ok]
    print(f"rtol {args.rtol:g}, atol {args.atol:g}: {int(sol.stats['num_accepted_steps'])} accepted, "
          f"{int(sol.stats['num_rejected_steps'])} rejected steps reach t + {ts[-1]:.4g}; "
          f"last steps {np.round(np.diff(ts)[-3:], 5).tolist()}")  # fmt: skip
    m, d = member_of(cfg.model), cfg.data.d
    W = sparse_windows(d, m.span)
    wins, own = np.repeat(W, d, axis=0), np.tile(np.arange(d), len(W))

    def inner(fl):
        y = unr(jnp.asarray(fl))
        th = p.with_blocks({**y, "C": jnp.asarray(LogC.from_log(sign, y["C"]))})
        K = np.asarray(m.vectors(th, jnp.asarray(wins), jnp.asarray(own), query=False, d=d))
        Q = np.asarray(m.vectors(th, jnp.asarray(W), jnp.zeros(len(W), int), query=True, d=d))
        return [Q[h] @ K[h].T > 0 for h in range(1, cfg.model.H + 1)]

    prev = inner(ys[0])
    for k in range(1, len(ts)):
        now = inner(ys[k])
        flips = [int((a != b).sum()) for a, b in zip(now, prev)]
        if any(flips):
            print(f"  step to t + {ts[k]:.5f} (dt {ts[k] - ts[k - 1]:.2e}): sign changes per head {flips}")
        prev = now


if __name__ == "__main__":
    main()
