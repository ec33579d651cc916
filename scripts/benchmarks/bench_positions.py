"""The loss at every position against the loss at the last token, per gradient: the members
that predict at every position (``estimator.positions = "all"``), in the layout auto takes, at
L = 100 (d = 3, bigram data, N = 2000; Edelman's setting at its size).

The target: ``"all"`` within 3× of ``"last"``. It prints the compile time of the first call,
the median of ``--reps`` warm calls, and the ratio, with the machine's load.

Usage::

    python3 scripts/benchmarks/bench_positions.py [--reps 20] [--N 2000] [--L 100]
"""

from __future__ import annotations

import argparse

import _bench
import equinox as eqx

import gflow  # noqa: F401  (float64)
from gflow.core import (
    DataConfig,
    EstimatorConfig,
    ModelConfig,
    every_position_members,
    init_params,
    make_loss,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--N", type=int, default=2000)
    ap.add_argument("--L", type=int, default=100)
    args = ap.parse_args()
    grad = eqx.filter_jit(lambda loss, p: loss.value_and_grad(p))
    data = DataConfig(d=3, parents=[1], alpha=1.0, L=args.L)
    _bench.print(f"# loss at every position vs the last token, d = 3, L = {args.L}, N = {args.N}, median of "
                 f"{args.reps}; {_bench.load_str()}")  # fmt: skip
    _bench.print(f"{'member':<10} {'last ms':>9} {'all ms':>9} {'ratio':>6} {'compile s (last, all)':>22}")
    for name in every_position_members():
        model = ModelConfig(member=name, H=1, D=1, M=1)
        p = init_params(model, d=3, L=args.L)
        out = {}
        for pos in ("last", "all"):
            loss = make_loss(data, model, EstimatorConfig(N=args.N, loss="ce_on_probs", eps=0.0, positions=pos))
            out[pos] = _bench.time_call(grad, loss, p, reps=args.reps)
        (c1, m1), (c2, m2) = out["last"], out["all"]
        _bench.print(f"{name:<10} {1e3 * m1:>9.2f} {1e3 * m2:>9.2f} {m2 / m1:>6.2f} {c1:>10.1f} {c2:>10.1f}")


if __name__ == "__main__":
    main()
