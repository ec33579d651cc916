"""Benchmark the official code's model options (head_norm, shifted windows) against the paper's model.

The published setting (the official run "CWa"): d = 3, parents (1, 2), α = 0.1,
L = 100, uniform start, N = 9000, ``estimator.loss = "ce_on_probs"``, drawn target,
M = H = 3, D = 2, θ at the paper's initialisation, float64.

Part ``eval`` — one loss + gradient
-----------------------------------
``PopulationLoss.value_and_grad`` (jitted, after compilation) of

- ``plain``: the paper's model (aligned windows, no head norm), layout auto = counts;
- ``head_norm``: head norm only (aligned windows: span 3, layout auto = counts);
- ``shifted``: shifted windows only (span H+M−1 = 5), layout auto = sparse;
- ``official``: both options, layout auto = sparse, and, for where the cost
  went, the same model in the other layouts: ``heads`` (per-position codes of
  each head, κ from per-head tables: the layout the published-run script used),
  ``positions`` (per-position match tensors) and ``counts`` (dense counts over
  all (d+1)^5 = 1,024 windows).

Timed in rounds, every case once a round in a fixed order (paired: load changes
hit every case alike); printed the median and min over the rounds, and the
median over the rounds of each case's time / plain's time in the same round.
Target: official (auto) ≤ 3× plain.

Part ``flow`` — the joint flow to t = 5·10⁴
-------------------------------------------
``gflow.integrate`` of the published setting (Tsit5, the default tolerances, joint
schedule with every time scale 1) for plain and for official (layout auto):
evaluations and wall time (compilation included), and the wall time per
evaluation. Several minutes.

Usage::

    python scripts/benchmarks/bench_official.py                 # part eval (about a minute)
    python scripts/benchmarks/bench_official.py --part both
    python scripts/benchmarks/bench_official.py --rounds 40 --N 9000
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from _bench import load_str, print

CASES = (
    # name, head_norm, windows, layout
    ("plain", False, "aligned", "auto"),
    ("head_norm", True, "aligned", "auto"),
    ("shifted", False, "shifted", "auto"),
    ("official", True, "shifted", "auto"),
    ("official heads", True, "shifted", "heads"),
    ("official positions", True, "shifted", "positions"),
    ("official counts", True, "shifted", "counts"),
)
TARGET = 3.0


def published(head_norm: bool, windows: str, layout: str, N: int, t1: float = 5e4):
    import gflow

    return gflow.Config().replace(
        data={"d": 3, "parents": [1, 2], "alpha": 0.1, "L": 100, "start": "uniform"},
        model={"M": 3, "H": 3, "D": 2, "head_norm": head_norm, "windows": windows},
        schedule={"kind": "joint", "t1": t1},
        estimator={"N": N, "loss": "ce_on_probs", "target": "drawn", "layout": layout},
    )


def part_eval(N: int, rounds: int, skip: set[str]) -> None:
    import equinox as eqx
    import jax

    import gflow
    from gflow.core import resolve_layout

    vg = eqx.filter_jit(lambda f, p: f.value_and_grad(p))
    cases, losses = {}, {}
    for name, hn, win, layout in CASES:
        if name in skip:
            continue
        cfg = published(hn, win, layout, N)
        f = gflow.make_loss(cfg.data, cfg.model, cfg.estimator)
        p = gflow.init_params(cfg.model, cfg.init)
        jax.block_until_ready(vg(f, p))
        lay = resolve_layout(layout, 3, cfg.model.span)
        cases[name] = (lay, lambda f=f, p=p: vg(f, p))
        losses[name] = float(vg(f, p)[0])
    ts = {k: [] for k in cases}
    print(f"part eval: one loss + gradient, N = {N}, L = 100, {rounds} rounds; {load_str()}")
    for _ in range(rounds):
        for k, (_, fn) in cases.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            ts[k].append(time.perf_counter() - t0)
    base = ts["plain"]
    print(f"   {'case':<20}{'layout':<11}{'median ms':>10}{'min ms':>9}{'× plain':>9}   loss")
    for k, (lay, _) in cases.items():
        ratio = statistics.median(t / b for t, b in zip(ts[k], base))
        print(f"   {k:<20}{lay:<11}{1e3 * statistics.median(ts[k]):10.1f}{1e3 * min(ts[k]):9.1f}"
              f"{ratio:9.2f}   {losses[k]:.15f}")  # fmt: skip
    print(f"   after: {load_str()}")
    ratio = statistics.median(t / b for t, b in zip(ts["official"], base))
    verdict = "meets" if ratio <= TARGET else "MISSES"
    print(f"official (head_norm + shifted, layout auto) / plain: {ratio:.2f}×, {verdict} the ≤ {TARGET:.0f}× target")


def part_flow(N: int) -> None:
    import gflow

    print(f"part flow: the joint flow to t = 5·10⁴, Tsit5, N = {N}; {load_str()}")
    print(f"   {'case':<12}{'t reached':>10}{'nfev':>7}{'wall s':>8}{'ms/eval':>9}")
    for name, hn, win in (("plain", False, "aligned"), ("official", True, "shifted")):
        cfg = published(hn, win, "auto", N)
        t0 = time.perf_counter()
        tr = gflow.integrate(cfg)
        wall = time.perf_counter() - t0
        nfev = sum(st.nfev for st in tr.stages)
        print(f"   {name:<12}{tr.ts[-1]:10.4g}{nfev:7d}{wall:8.1f}{1e3 * wall / nfev:9.1f}")
    print(f"   after: {load_str()}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("eval", "flow", "both"), default="eval")
    ap.add_argument("--N", type=int, default=9000)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--skip", default="", help="comma-separated cases not to time (e.g. 'official counts')")
    args = ap.parse_args(argv)
    import jax

    import gflow

    print(f"gflow {gflow.__version__}, jax {jax.__version__}, {jax.devices()[0].platform} ({os.cpu_count()} cores)")
    if args.part in ("eval", "both"):
        part_eval(args.N, args.rounds, {s.strip() for s in args.skip.split(",") if s.strip()})
    if args.part in ("flow", "both"):
        part_flow(args.N)


if __name__ == "__main__":
    main()
