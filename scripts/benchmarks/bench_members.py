"""One loss + gradient, and the statistics at one saved time, for every member of the model
family at the default size (d = 3, L = 100, H = M = 3, D = 2, N = 10⁴; the official Full model
also in its own setting, N = 9000, uniform start, drawn target, ce_on_probs).

For each member and layout it prints the compile time of the first call, the median of
``--reps`` calls after it (the warm cost), and the ratio to the paper's model in the counts
layout. The target: every member that computes in the counts layout within 2× of the paper's
model; absolute positions (positions layout only) stated.

Usage::

    python3 scripts/benchmarks/bench_members.py [--reps 20] [--N 10000] [--members token,full] [--d 3] [--L 100] [--stats]
"""

from __future__ import annotations

import argparse

import _bench
import equinox as eqx
import jax

import gflow
from gflow.core import (
    MEMBERS,
    DataConfig,
    EstimatorConfig,
    InitConfig,
    ModelConfig,
    init_params,
    make_loss,
    member_of,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--N", type=int, default=10_000)
    ap.add_argument("--members", default=",".join(MEMBERS))
    ap.add_argument("--stats", action="store_true", help="also time the statistics at one saved time")
    ap.add_argument("--d", type=int, default=3, help="vocabulary size (default 3)")
    ap.add_argument("--L", type=int, default=100, help="context length (default 100)")
    args = ap.parse_args()
    grad = eqx.filter_jit(lambda loss, p: loss.value_and_grad(p))
    stats = eqx.filter_jit(lambda loss, p: loss.stats(p))
    cases = []
    for name in args.members.split(","):
        model = ModelConfig(member=name)
        data, est = DataConfig(d=args.d, L=args.L), EstimatorConfig(N=args.N)
        for layout in member_of(model).layouts:
            if layout == "heads":
                continue
            cases.append((name, layout, data, model, est.__class__(N=args.N, layout=layout)))
        if name == "full":
            cases.append(("full (official setting)", "auto", DataConfig(d=args.d, L=args.L, start="uniform"), model,
                          EstimatorConfig(N=9000, loss="ce_on_probs", target="drawn")))  # fmt: skip
    print(f"gflow {gflow.__version__}, jax {jax.__version__}, {jax.device_count()} device(s); "
          f"median of {args.reps} calls after the first (the compile)")  # fmt: skip
    print(f"{'member':>24} {'layout':>9} {'compile s':>9} {'grad ms':>9} {'x paper':>8}" + (" stats ms" if args.stats else ""))
    ref = None
    for name, layout, data, model, est in cases:
        loss = make_loss(data, model, est)
        p = init_params(model, InitConfig(), d=data.d, L=data.L)
        first, med = _bench.time_call(grad, loss, p, reps=args.reps)
        if name == "paper" and layout == "counts":
            ref = med
        ratio = f"{med / ref:8.2f}" if ref else f"{'':>8}"
        line = f"{name:>24} {type(loss.feats).name:>9} {first:9.1f} {1e3 * med:9.2f} {ratio}"
        if args.stats:
            line += f" {1e3 * _bench.time_call(stats, loss, p, reps=max(3, args.reps // 4))[1]:9.1f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
