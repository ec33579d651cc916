"""The paper's asymptotic claims decided by finite-size scaling, at three parent sets.

What it shows
-------------
``gflow limit`` (docs/guides/limits.md) at the paper's default setting (parents (1, 2)) and at
parents (1, 3) and (2, 3), every other field the default's (d = 3, α = 0.1, N = 10⁴, the
staged schedule), over L = 50, 100, 200, 400 with R = 4 replicates a size: each claim's
measured value at every size, its extrapolated limit with a 95 % interval, and the verdict.
It writes each setting's folder (``limit.json``, ``limit.md``, ``figures/``) and prints one
table of every claim's limit and verdict at the three parent sets (the table of
docs/results/limits.md), with each setting's wall time and its sizes' costs.

Resumable: run it again and the complete replicate runs are reused (``--resume``).

Runtime: about 12 minutes a parent set on 2 quiet cores (four sizes, four replicates each,
checks included).

Usage::

    python scripts/studies/limits.py --out runs/limits
    python scripts/studies/limits.py --out runs/limits --parents 1,2 --Ls 50 100 200 400
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import gflow


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/limits", help="folder of the settings' limit folders")
    p.add_argument("--parents", nargs="+", default=["1,2", "1,3", "2,3"], help="parent sets (default 1,2 1,3 2,3)")
    p.add_argument("--Ls", type=int, nargs="+", default=[50, 100, 200, 400], help="context lengths")
    p.add_argument("--R", type=int, default=4, help="replicates a size (default 4)")
    p.add_argument("--executor", default=None, help="gflow's --executor for the replicates")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = _args(argv)
    out = Path(args.out)
    rows = {}
    for par in args.parents:
        parents = [int(h) for h in par.split(",")]
        cfg = gflow.Config().replace(data={"parents": parents})
        folder = out / f"parents_{'_'.join(map(str, parents))}"
        resume = (folder / "points").exists()
        res = gflow.run_limit(cfg, [("data.L", args.Ls)], out=folder, R=args.R, resume=resume,
                              executor=args.executor, verbose=True)  # fmt: skip
        rows[par] = res
        print(f"parents {par}: {res.wall:.0f} s; sizes " + ", ".join(
            f"L={p['point']['data.L']} {p['wall']:.0f} s" for p in res.points), flush=True)  # fmt: skip
    print()
    print("| claim | " + " | ".join(f"parents ({p})" for p in rows) + " |")
    print("|---|" + "---|" * len(rows))
    for k, c0 in enumerate(next(iter(rows.values())).claims):
        cells = []
        for res in rows.values():
            c = res.claims[k]
            f = c["fit"]
            lim = "—" if f is None else f"{f['limit']:.3g} [{f['interval'][0]:.3g}, {f['interval'][1]:.3g}]"
            vs = f" vs {c['value']:.3g}" if c["key"] in ("stage1_rate", "stage1_gap") else ""
            cells.append(f"{lim}{vs}, {f['model'] if f else '—'}: **{c['verdict']}**")
        want = "> 0" if c0["kind"] == "gt" else ("= Ĩ's" if c0["key"].startswith("stage1") else f"= {c0['value']:.4g}")
        print(f"| `{c0['key']}` (q∞ {want}) | " + " | ".join(cells) + " |")
    (out / "summary.json").write_text(json.dumps({p: r.to_json() for p, r in rows.items()}, indent=1, default=str))


if __name__ == "__main__":
    main()
