"""Why the modified χ²-MI? Where the rankings of parent sets disagree, which one the flow follows.

What it shows
-------------
gflow ranks the selector's sets 𝒮 four ways: the paper's modified χ²-mutual information Ĩ(S)
(its Stage I prediction, argmax over the prior average), the finite-size J(S) = −∂L̂/∂a at the
initial copier (gflow's own Stage I law, on the run's sample), the ordinary χ²-MI I_χ²(S) and
the ordinary mutual information I(S). The ordinary two never decrease when an offset is added
and take the same value on every superset of the parents, so with the default D = 2 heads a set
and two parents they agree with Ĩ by construction. This script takes the cases where they do
not coincide:

- ``supersets``: D = 3, so that 𝒮 holds supersets of the parents. I_χ² and I tie the parents
  with each superset exactly (the table names the smallest tied set and the tie); Ĩ, penalising
  a set by μ_S(z)², prefers the parents strictly;
- fixed kernels (a point-mass prior, where every ranking is exact), found by ``--search``
  among 3,000 Dirichlet(0.5) draws where argmax Ĩ and argmax I_χ² or I differ by more than
  15 % both ways: parents (1, 2, 3) with D = 2 (no set of 𝒮 holds every parent, so the
  rankings trade one missing parent against another) and parents (1, 2) with D = 1; the three
  kernels where J and Ĩ differ at L = 40 again at L = 200. (With the symmetric Dirichlet prior
  itself the prior averages agree but for the superset ties or within a few SE.)

For each case it integrates the paper's staged flow through Stage I (Stages II and III cut to
10⁻⁶: the question is which set Stage I selects) on the case's sample, and reports the set
Stage I selected and its share of c, beside each ranking's winner and its gap to the runner-up
in paired standard errors.

Usage::

    python3 scripts/studies/mi_question.py                  # the results page's cases (a few minutes)
    python3 scripts/studies/mi_question.py --search         # the kernels where the rankings differ
    python3 scripts/studies/mi_question.py --table-only     # re-render the table from the json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

import gflow
from gflow.core import sample_kernels, subset_label
from gflow.theory import theory_report

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

# (name, data fields, model.D): each case at N = 1000 and L = 40 (--N, --L) unless it sets L. A "kernel" case is a
# fixed kernel (a point-mass prior, where every ranking is exact): draw `index` of 3000 kernels
# from Dirichlet(0.5) rows with jax.random.key(1), chosen (by scripts/studies/mi_question.py
# --search) where argmax Ĩ and argmax I_χ², I differ by more than 15 % of the winner's value
CASES = (
    ("supersets", {"d": 3, "parents": [1, 2], "alpha": 1.0}, 3),
    ("supersets", {"d": 2, "parents": [1], "alpha": 0.3}, 3),
    ("kernel 21", {"d": 2, "parents": [1, 2, 3], "kernel_index": 21}, 2),
    ("kernel 63", {"d": 2, "parents": [1, 2, 3], "kernel_index": 63}, 2),
    ("kernel 77", {"d": 2, "parents": [1, 2, 3], "kernel_index": 77}, 2),
    ("kernel 102", {"d": 3, "parents": [1, 2], "kernel_index": 102}, 1),
    ("kernel 228", {"d": 3, "parents": [1, 2], "kernel_index": 228}, 1),
    # the three kernels where J and Ĩ differ at L = 40, again at a longer context
    ("kernel 63", {"d": 2, "parents": [1, 2, 3], "kernel_index": 63, "L": 200}, 2),
    ("kernel 77", {"d": 2, "parents": [1, 2, 3], "kernel_index": 77, "L": 200}, 2),
    ("kernel 228", {"d": 3, "parents": [1, 2], "kernel_index": 228, "L": 200}, 1),
)
KERNEL_DRAWS, KERNEL_ALPHA, KERNEL_SEED = 3000, 0.5, 1


def kernel_of(d: int, parents, index: int) -> np.ndarray:
    """Kernel `index` of the search's draws (``gflow.core.sample_kernels``, deterministic)."""
    import jax

    cfg = gflow.DataConfig(d=d, parents=tuple(parents), alpha=KERNEL_ALPHA, L=40)
    return np.asarray(sample_kernels(cfg, KERNEL_DRAWS, key=jax.random.key(KERNEL_SEED))[index])


def search(margin: float = 0.15) -> None:
    """Print the draws where the winners differ by more than `margin` (relative) both ways."""
    import itertools

    import jax

    from gflow.theory import chi2_mi, mutual_information

    for d, P, D in ((2, (1, 2, 3), 2), (3, (1, 2), 1)):
        cfg = gflow.DataConfig(d=d, parents=P, alpha=KERNEL_ALPHA, L=40)
        sets = [S for k in range(1, D + 1) for S in itertools.combinations((1, 2, 3), k)]
        pis = sample_kernels(cfg, KERNEL_DRAWS, key=jax.random.key(KERNEL_SEED))
        f = jax.jit(jax.vmap(lambda p, cfg=cfg, sets=sets: (*chi2_mi(p, cfg, sets), mutual_information(p, cfg, sets))))
        vals = [np.asarray(v) for v in f(pis)]
        win, rel = [], []
        for v in vals:
            o = np.argsort(-v, axis=1)
            top, second = np.take_along_axis(v, o[:, :2], axis=1).T
            win.append(o[:, 0])
            rel.append((top - second) / top)
        for i in np.flatnonzero(((win[0] != win[1]) | (win[0] != win[2])) & (rel[0] > margin)
                                & (np.minimum(rel[1], rel[2]) > margin)):  # fmt: skip
            print(f"d={d} parents={P} D={D} kernel {i}: Ĩ {sets[win[0][i]]}, χ²-MI {sets[win[1][i]]}, "
                  f"MI {sets[win[2][i]]}")


N_PI = 4000


def config_of(data: dict, D: int, N: int, L: int) -> gflow.Config:
    data = dict(data)
    L = data.pop("L", L)
    if "kernel_index" in data:
        data["kernel"] = kernel_of(data["d"], data["parents"], data.pop("kernel_index")).tolist()
    return gflow.Config().replace(data={**data, "L": L}, model={"D": D}, estimator={"N": N},
                                  schedule={"durations": [1e3, 1e-6, 1e-6]})  # fmt: skip


def _label(S) -> str:
    return subset_label(tuple(S))


def study_case(name: str, data: dict, D: int, N: int, L: int, out: Path) -> dict:
    cfg = config_of(data, D, N, L)
    L = cfg.data.L
    t0 = time.perf_counter()
    th = theory_report(cfg, n_pi=N_PI)
    rk, rt = th.ranking, th.rates
    sets = list(rk.sets)
    J = np.asarray(rt.J)
    iJ, _, J_gap, J_gap_se = rt.top_two()
    S_J = sets[iJ]
    what = f"k{data['kernel_index']}" if "kernel_index" in data else f"a{data['alpha']:g}"
    folder = out / f"d{data['d']}_p{''.join(map(str, data['parents']))}_{what}_D{D}_L{L}"
    tr = gflow.integrate(cfg, out=folder, resume=folder.exists())
    i1 = int(np.flatnonzero(tr.stage == 1)[-1])
    frac = np.asarray(tr.c_frac[i1])
    order = np.argsort(-frac)
    selected = tuple(tr.subsets[int(order[0])])
    row = {
        "case": name, "d": data["d"], "parents": list(data["parents"]), "alpha": data.get("alpha"),
        "kernel_index": data.get("kernel_index"), "D": D,
        "N": N, "L": L, "n_pi": N_PI,
        "S_Itilde": list(rk.S_star), "Itilde_gap_se": None if not rk.gap_se else rk.gap / rk.gap_se,
        "S_chi2": list(rk.S_chi2), "chi2_tied": [list(S) for S in rk.chi2_tied],
        "S_mi": list(rk.S_mi), "mi_tied": [list(S) for S in rk.mi_tied],
        "S_J": list(S_J), "J_gap_se": J_gap / J_gap_se if J_gap_se else None,
        "selected": list(selected), "share": float(frac[order[0]]),
        "runner_up": list(tr.subsets[int(order[1])]), "runner_up_share": float(frac[order[1]]),
        "t_stage1": float(tr.ts[i1]),
        "Itilde": {_label(S): float(v) for S, v in zip(sets, rk.Itilde)},
        "chi2": {_label(S): float(v) for S, v in zip(sets, rk.chi2)},
        "mi": {_label(S): float(v) for S, v in zip(sets, rk.mi)},
        "J": {_label(S): float(v) for S, v in zip(sets, J)},
        "wall": time.perf_counter() - t0,
    }  # fmt: skip
    row["follows"] = [k for k, key in (("Ĩ", "S_Itilde"), ("J", "S_J"), ("χ²-MI", "S_chi2"), ("MI", "S_mi"))
                      if tuple(row[key]) == selected]  # fmt: skip
    return row


def _ties(S, tied) -> str:
    rest = [_label(T) for T in tied if tuple(T) != tuple(S)]
    return _label(S) + (f" = {' = '.join(rest)}" if rest else "")


def _prior(r) -> str:
    return "fixed kernel" if r.get("kernel_index") is not None else f"Dirichlet({r['alpha']:g})"


def _se(x) -> str:
    return "exact" if x is None else f"{x:.1f}"


def table(rows: list[dict]) -> str:
    """The results page's table (markdown), one row per case."""
    out = [
        "| case | d | parents | prior | D | L | argmax Ĩ (gap, SE) | argmax J (gap, SE) | argmax χ²-MI | argmax MI "
        "| Stage I selects (share) | follows |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        out.append(
            f"| {r['case']} | {r['d']} | {_label(r['parents'])} | {_prior(r)} | {r['D']} | {r['L']} "
            f"| {_label(r['S_Itilde'])} ({_se(r['Itilde_gap_se'])}) | {_label(r['S_J'])} ({_se(r['J_gap_se'])}) "
            f"| {_ties(r['S_chi2'], r['chi2_tied'])} | {_ties(r['S_mi'], r['mi_tied'])} "
            f"| {_label(r['selected'])} ({r['share']:.3f}) | {', '.join(r['follows']) or 'none'} |"
        )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--N", type=int, default=1000)
    ap.add_argument("--L", type=int, default=40)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "mi_question")
    ap.add_argument("--json", type=Path, default=ROOT / "figures" / "mi_question.json")
    ap.add_argument("--table-only", action="store_true")
    ap.add_argument("--search", action="store_true", help="print the kernels where the rankings differ")
    args = ap.parse_args()
    if args.search:
        search()
        return
    if args.table_only:
        rows = json.loads(args.json.read_text())
    else:
        rows = []
        for name, data, D in CASES:
            rows.append(study_case(name, data, D, args.N, args.L, args.out))
            r = rows[-1]
            print(f"{name}: d={r['d']} parents={_label(r['parents'])} {_prior(r)} D={D}: Stage I selects "
                  f"{_label(r['selected'])} ({r['share']:.3f}), follows {r['follows']} ({r['wall']:.0f} s)", flush=True)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1))
    print(table(rows))


if __name__ == "__main__":
    main()
