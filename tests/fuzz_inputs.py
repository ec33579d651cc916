"""Seeded fuzzing of gflow's input handling: generated configurations (valid and invalid),
each through ``gflow run CONFIG --out DIR --dry-run`` in this process (validation and the
memory preflight, no compute), classified as

- ``clean``: an invalid input refused with exit 2 and one message naming the key changed;
- ``clean (other key)``: refused with exit 2, naming another key (a cross-field rule, e.g.
  ``data.parents = [50]`` refused as ``data.L must be >= the largest parent offset``);
- ``accepted``: a valid input accepted (exit 0);
- ``unclear``: exit 2 with a message that names no key;
- ``traceback``: a traceback printed, an exception escaping, or exit 4;
- ``hang``: no answer within the time limit;
- ``accepted-invalid``: an invalid input accepted (exit 0);
- ``refused-valid``: a valid input refused.

    python tests/fuzz_inputs.py [--n 400] [--seed 0]

The memory budget is fixed (``GFLOW_MAX_MEMORY=8G``) so that the classes do not depend on the
machine. ``tests/test_fuzz.py`` runs the same generator (fewer cases) in the default suite.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import random
import re
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

BASE = {"data": {"L": 20}, "estimator": {"N": 200}, "schedule": {"durations": [2.0, 2.0, 2.0]}}
KEY_RE = re.compile(r"\b(data|model|init|schedule|solver|estimator)\.[A-Za-z_]+")

HUGE = [10**30, 2**63 - 1, 2**64, 10**12]
NEG = [-1, -(10**30), -(2**63)]
WRONG = ["x", True, False, 1.5, [1, 2], {"a": 1}, "", [[1]]]
NONFINITE = [math.nan, math.inf, -math.inf]

# in-range values that must be accepted (on the base configuration)
VALID = {
    "data.d": [2, 4],
    "data.parents": [[1], [1, 2], [2]],
    "data.alpha": [0.5, 2],
    "data.L": [10, 30],
    "data.start": ["uniform"],
    "data.burn_in": [0, 5],
    "model.M": [3, 4],
    "model.H": [2, 3],
    "model.D": [1, 2],
    "model.norm": ["layer"],
    "model.head_norm": [True],
    "init.w_plus": [1.0, -3.0],
    "init.w_minus": [0.0],
    "init.c0": [0.1],
    "init.a0": [0.0, 1.0, 700.0],
    "schedule.delta": [0.05],
    "schedule.events": [False],
    "schedule.eta_C": [0.5],
    "solver.method": ["kvaerno5", ["tsit5", "tsit5", "kvaerno5"], "gd"],
    "solver.rtol": [1e-6],
    "solver.max_steps": [1000, 10**9],
    "solver.save_per_decade": [3, 10**4],
    "solver.tau_min": [0.01],
    "estimator.N": [50, 1000],
    "estimator.seed": [0, 7, 2**32 - 1],
    "estimator.eps": [0.0, 1e-3],
    "estimator.loss": ["ce_on_probs"],
    "estimator.layout": ["positions", "counts", "heads"],
    "estimator.chunk": [0, 64],
    "estimator.dtype": ["float32"],
    "estimator.target": ["drawn"],
}
INT_KEYS = ["data.d", "data.L", "data.burn_in", "model.M", "model.H", "model.D", "solver.max_steps",
            "solver.save_per_decade", "estimator.N", "estimator.seed", "estimator.chunk"]  # fmt: skip
FLOAT_KEYS = ["data.alpha", "init.w_plus", "init.w_minus", "init.c0", "init.a0", "schedule.delta", "schedule.t1",
              "schedule.eta_w", "schedule.eta_C", "schedule.eta_a", "solver.rtol", "solver.atol", "solver.eta",
              "solver.tau_min", "estimator.eps"]  # fmt: skip
STR_KEYS = ["data.start", "model.norm", "model.windows", "schedule.kind", "estimator.loss", "estimator.dtype",
            "estimator.layout", "estimator.target", "solver.joint_coords"]  # fmt: skip
BOOL_KEYS = ["model.head_norm", "schedule.events", "solver.progress", "estimator.shard"]


def _nest(v, depth: int):
    for _ in range(depth):
        v = [v]
    return v


def mutation(rng: random.Random) -> tuple[str, object, str]:
    """``(key, value, expect)``, `expect` one of ``"valid"``, ``"invalid"``, ``"either"`` (valid,
    but it may be refused by the memory preflight) and ``"file"`` (refused as a whole file)."""
    r = rng.random()
    if r < 0.22:
        k = rng.choice(list(VALID))
        return k, rng.choice(VALID[k]), "valid"
    if r < 0.36:
        k = rng.choice(INT_KEYS)
        return k, rng.choice(HUGE + NEG), "invalid"
    if r < 0.50:
        k = rng.choice(INT_KEYS + FLOAT_KEYS + STR_KEYS + BOOL_KEYS + ["data.parents", "solver.method"])
        v = rng.choice([w for w in WRONG if not (isinstance(w, bool) and k in BOOL_KEYS)
                        and not (isinstance(w, float) and k in FLOAT_KEYS)])  # fmt: skip
        if k in STR_KEYS and v == "":
            v = "bogus"
        if k == "data.parents" and isinstance(v, list) and v == [1, 2]:
            v = [2, 1]
        if k == "solver.method" and v == "x":
            v = "euler"
        return k, v, "invalid"
    if r < 0.60:
        k = rng.choice(FLOAT_KEYS + ["schedule.durations"])
        v = rng.choice(NONFINITE)
        return k, ([1.0, v, 1.0] if k == "schedule.durations" else v), "invalid"
    if r < 0.68:
        k = rng.choice(["init.a0", "init.w_plus", "init.w_minus", "init.c0"])
        return k, rng.choice([1e308, -1e308] if k == "init.c0" else [1e308, -1e308, 1e30, 800.0]), "invalid"
    if r < 0.78:
        kind = rng.randrange(6)
        if kind == 0:
            return "data.kernel", [[1.0, 0.0, 0.0]] * 8 + [[0.5, 0.5]], "invalid"  # ragged
        if kind == 1:
            return "data.kernel", _nest(0.5, rng.choice([40, 200, 400])), "invalid"  # too deep
        if kind == 2:
            return "data.kernel", _nest(0.5, 3000), "file"  # deeper than a TOML parser recurses
        if kind == 3:
            return "data.kernel", [["a"] * 3] * 9, "invalid"
        if kind == 4:
            return "data.kernel", [[1 / 3] * 3] * 9, "valid"
        return "data.kernel", [[math.nan] * 3] * 9, "invalid"
    if r < 0.86:
        v = rng.choice([["tsit5"], ["tsit5", "tsit5"], ["gd", "tsit5", "tsit5"], [], ["tsit5"] * 4, "euler", ["sgd"] * 3])
        return "solver.method", v, "invalid"
    if r < 0.90:
        return rng.choice(["data.foo", "model.heads", "solver.methods"]), 1, "invalid"
    if r < 0.95:
        k = rng.choice(["data.parents", "model.M", "model.H", "data.burn_in", "data.L", "estimator.N"])
        v = {"data.parents": [[20], list(range(1, 21)), [1, 2, 3, 4, 5, 6, 7, 8]],
             "model.M": [8, 12], "model.H": [30], "data.burn_in": [10**6, 10**7], "data.L": [10**6, 10**7],
             "estimator.N": [10**6, 10**8]}[k]  # fmt: skip
        return k, rng.choice(v), "either"
    if r < 0.97:
        return "solver.eta", rng.choice([1e-300, 1e-20]), "either"  # "gd" would take > 2^53 steps: refused
    return "schedule.durations", rng.choice([[1.0], [1.0, 2.0, 3.0, 4.0], [-1.0, 1.0, 1.0], "x"]), "invalid"


def generate(n: int, seed: int) -> list[tuple[dict, list[str], str]]:
    """`n` cases ``(config dict, changed keys, expect)``: 1 to 3 mutations of a small base."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        d = json.loads(json.dumps(BASE))
        by_key: dict[str, str] = {}  # the last mutation of a key is the one that counts
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            k, v, e = mutation(rng)
            sec, key = k.split(".")
            if k == "model.H" and v in (30,):
                d.setdefault("model", {}).update({"M": 30, "D": 30})
            if k == "solver.eta":
                d.setdefault("solver", {})["method"] = "gd"
                by_key["solver.method"] = "valid"
            d.setdefault(sec, {})[key] = v
            by_key[k] = e
        keys, expects = list(by_key), list(by_key.values())
        if "file" in expects:
            expect = "file"
        elif "invalid" in expects:
            expect = "invalid"
        elif "either" in expects:
            expect = "either"
        else:
            expect = "valid"
        out.append((d, keys, expect))
    return out


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"
    depth, x = 0, v  # a deep single-element nest is written iteratively (no recursion limit here)
    while isinstance(x, list) and len(x) == 1 and isinstance(x[0], list):
        depth, x = depth + 1, x[0]
    if depth > 20:
        return "[" * depth + _toml_value(x) + "]" * depth
    return "[" + ", ".join(_toml_value(x) for x in v) + "]"


def to_toml(d: dict) -> str:
    lines = []
    for sec, vals in d.items():
        lines.append(f"[{sec}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in vals.items()]
    return "\n".join(lines) + "\n"


class _Hang(Exception):
    pass


def classify(d: dict, keys: list[str], expect: str, folder: Path, timeout: float = 20.0) -> tuple[str, str]:
    """Run one case; ``(class, the output)``."""
    from gflow.cli import main

    path = folder / "case.toml"
    path.write_text(to_toml(d))
    buf_out, buf_err = io.StringIO(), io.StringIO()

    def alarm(*_):
        raise _Hang

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        with contextlib.redirect_stdout(buf_out), contextlib.redirect_stderr(buf_err):
            rc = main(["run", str(path), "--out", str(folder / "out"), "--dry-run"])
    except _Hang:
        return "hang", buf_err.getvalue()
    except BaseException as e:  # noqa: BLE001 (escaping the command is the failure being measured)
        return "traceback", f"{type(e).__name__}: {e}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    err = buf_err.getvalue() + buf_out.getvalue()
    if "Traceback" in err or rc not in (0, 2):
        return "traceback", err
    if rc == 0:
        return ("accepted" if expect in ("valid", "either") else "accepted-invalid"), err
    if expect == "valid":
        return "refused-valid", err
    if expect == "file":
        return ("clean" if str(path) in err else "unclear"), err
    named = [m.group(0) for m in KEY_RE.finditer(err)]
    if any(k in err for k in keys):
        return "clean", err
    return ("clean (other key)" if named else "unclear"), err


def run(n: int, seed: int, verbose: bool = False) -> Counter:
    os.environ["GFLOW_MAX_MEMORY"] = "8G"
    os.environ.setdefault("GFLOW_CACHE", "none")
    counts: Counter = Counter()
    with tempfile.TemporaryDirectory() as tmp:
        for i, (d, keys, expect) in enumerate(generate(n, seed)):
            cls, out = classify(d, keys, expect, Path(tmp))
            counts[cls] += 1
            if verbose or cls not in ("clean", "clean (other key)", "accepted"):
                print(f"[{i}] {cls} ({expect}, {keys}): {out.strip()[:300]}")
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 1000))
    t0 = time.perf_counter()
    counts = run(a.n, a.seed, a.verbose)
    print(f"{a.n} configurations (seed {a.seed}) in {time.perf_counter() - t0:.1f} s:")
    for cls in ("clean", "clean (other key)", "accepted", "unclear", "traceback", "hang", "accepted-invalid",
                "refused-valid"):  # fmt: skip
        print(f"  {cls:18s} {counts.get(cls, 0)}")


if __name__ == "__main__":
    main()
