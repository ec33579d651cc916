"""The Hessian of the official Full model in its shipped setting (scripts/configs/official_full.toml)
at the initialisation: how many Hessian-vector products gflow vmaps at once to stay within
``gflow.dynamics._spectrum.HVP_MEMORY`` (4 GiB), the time of the probe and of the Hessian, and λ_max.
Run it under ``/usr/bin/time -v`` for the peak resident memory (the target: within 8 GiB at N = 9,000).

Usage::

    /usr/bin/time -v python3 scripts/benchmarks/bench_spectrum_full.py [--N 9000] [--layout auto]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

import gflow
from gflow.dynamics import _spectrum as sp

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--N", type=int, default=9000)
    ap.add_argument("--layout", default="auto")
    args = ap.parse_args()
    cfg = gflow.load_config(ROOT / "scripts" / "configs" / "official_full.toml")
    cfg = cfg.replace(estimator={"N": args.N, "layout": args.layout})
    loss = gflow.make_loss(cfg.data, cfg.model, cfg.estimator)
    p = gflow.init_params(cfg.model, cfg.init, d=cfg.data.d, L=cfg.data.L)
    theta = sp.flatten(p)
    H, M = p.w.shape
    shapes = tuple((b, tuple(np.shape(p.get(b)))) for b in p.names)
    t0 = time.perf_counter()
    b = sp.hvp_batch(loss, theta, tuple(range(theta.shape[0])), H, M, shapes)
    t1 = time.perf_counter()
    hess = sp.loss_hessian(loss, p)
    t2 = time.perf_counter()
    print(f"N = {args.N}, layout {type(loss.feats).__name__}: dim θ = {theta.shape[0]}, {b} HVPs at once "
          f"(probe {t1 - t0:.1f} s), Hessian {t2 - t1:.1f} s, λ_max = {np.linalg.eigvalsh(hess)[-1]:.4g}")


if __name__ == "__main__":
    main()
